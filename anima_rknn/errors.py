"""The exceptions the CLI turns into a single line and a non-zero exit, and the two checks options share."""

import numpy as np


class AnimaError(Exception):
    """A problem the user can fix (bad file, bad option); its message is the whole story."""


def require(ok: bool, message: str) -> None:
    """Raise AnimaError(message) unless `ok`: option checks read as a list of rules."""
    if not ok:
        raise AnimaError(message)


def is_integer(value: object) -> bool:
    """A Python or NumPy integer, not a bool (which Python counts as one)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived: unwind like Ctrl-C, so that every temporary file is removed on the way out."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
