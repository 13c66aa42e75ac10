"""The exceptions the CLI turns into a single line and a non-zero exit (the checks that raise them: checks.py)."""


class AnimaError(Exception):
    """A problem the user can fix (bad file, bad option); its message is the whole story."""


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived: unwind like Ctrl-C, so that every temporary file is removed on the way out."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
