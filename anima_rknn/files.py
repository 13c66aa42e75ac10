"""Writing files so that a crash or a bad input never leaves a half-written output behind."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .errors import AnimaError


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, overwrite: bool = True) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it onto `path` only if the block succeeds."""
    target = Path(path)
    if target.exists() and not overwrite:
        raise AnimaError(f"{target} exists; pass --overwrite to replace it")
    if target.is_dir():
        raise AnimaError(f"{target} is a directory, not a file")
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise AnimaError(f"cannot write {target}: folder {parent} does not exist")
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=parent)
    except OSError as e:
        raise AnimaError(f"cannot write {target}: {e.strerror}") from None
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600 files; give the usual permissions
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def output_folder(folder: str | os.PathLike, overwrite: bool, holds: str) -> Path:
    """`folder`, created if needed, for an output that must not mix with an earlier one unasked: a file in its
    place is refused, and so is a non-empty folder (described by `holds`) unless `overwrite`."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise AnimaError(f"{folder} is a file, not a folder")
    if folder.is_dir() and any(folder.iterdir()) and not overwrite:
        raise AnimaError(f"{folder} is not empty (it holds {holds}); pass --overwrite to replace it")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise AnimaError(f"cannot create folder {folder}: {e.strerror}") from None
    return folder


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()
