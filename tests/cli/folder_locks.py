"""What the tests of commands that hold a folder (serve's data dir, batch's --out) ask of a running process."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


def held(folder: Path) -> bool:
    """Whether another process holds `folder`'s lock (core.files.held_folder's flock of the folder itself)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
