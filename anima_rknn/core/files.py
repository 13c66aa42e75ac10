"""The one output module: every file the project writes goes through here, under one set of rules.

1. Nothing is half-written: data goes to a temporary file beside the target and is published whole.
2. An existing file is replaced only when the caller says so (`overwrite`), and that is checked at the
   moment of publishing, not only at the start: a file that appears during a 25-minute run stays, and of two
   runs racing to one path without `overwrite` exactly one succeeds.
3. Temporaries never outlive an exception, Ctrl-C or SIGTERM (the CLI turns SIGTERM into an exception), and a
   published file is flushed to the disk first, so a power cut leaves the old file or the new one, whole.
4. Names are checked before any work starts: suffix, length (with the temporary's longer name), folder.
5. Space is part of the check: a write whose size is known is refused before it starts when the disk cannot take
   it, and a disk that fills up anyway (or a file size limit) is one line naming the file, the space it needed and
   the space there was.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import math
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import AnimaError

# mkstemp's temporary is "." + name + "." + 8 random characters + ".part"
_TEMP_PREFIX, _TEMP_SUFFIX = ".", ".part"
_TEMP_EXTRA = len(_TEMP_PREFIX) + 1 + 8 + len(_TEMP_SUFFIX)
# File systems that cannot hard-link (FAT on SD cards and USB sticks) answer with one of these.
_NO_HARD_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK, errno.ENOSYS}
# A disk (or a quota) that is full, or a file size limit (ulimit -f) reached.
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def cache_dir() -> Path:
    """This machine's anima-rknn cache ($XDG_CACHE_HOME or ~/.cache): measured probes, states of batch jobs run
    here, anything that is kept to save work and may be deleted at any time."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "anima-rknn"


def _folder_of(path: Path) -> Path:
    return path.parent if str(path.parent) else Path(".")


def _name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def _check_length(path: Path) -> None:
    """The whole path and each folder name in it within what file systems take (checked before anything looks
    at the path: a stat of a name too long is an OSError, not a False)."""
    if len(os.fsencode(str(path.absolute()))) + _TEMP_EXTRA >= 4096:
        raise AnimaError(f"the output path {str(path)[:60]}... is too long")
    for part in path.parent.parts:
        if len(os.fsencode(part)) > 255:
            raise AnimaError(f"the output path {str(path)[:60]}... has a folder name of {len(os.fsencode(part))} "
                             "bytes; at most 255 fit a file system")


def check_name(path: str | os.PathLike) -> Path:
    """Refuse a name the file system would refuse once the work is done: too long for its temporary, or
    not representable (invalid UTF-8 arguments arrive as lone surrogates)."""
    path = Path(path)
    try:
        name = os.fsencode(path.name)
        os.fsencode(str(path))
    except UnicodeError:
        raise AnimaError(f"the output name {path.name!r} is not valid text for this file system") from None
    if len(name) + _TEMP_EXTRA > 255:  # no file system takes more; the folder's own limit is checked below
        raise AnimaError(f"the output name {path.name[:40]}... is {len(name)} bytes long; "
                         f"at most {255 - _TEMP_EXTRA} fit a file system")
    _check_length(path)
    limit = _name_max(_folder_of(path)) if _folder_of(path).is_dir() else 255
    if len(name) + _TEMP_EXTRA > limit:
        raise AnimaError(f"the output name {path.name[:40]}... is {len(name)} bytes long; "
                         f"at most {limit - _TEMP_EXTRA} fit this file system")
    return path


def _check_target(path: str | os.PathLike, overwrite: bool) -> Path:
    path = check_name(path)
    if path.is_dir():
        raise AnimaError(f"{path} is a folder, not a file")
    if path.exists() and not overwrite:
        raise AnimaError(f"{path} exists; pass --overwrite to replace it")
    return path


def check_output_file(path: str | os.PathLike, *, overwrite: bool, suffixes: Iterable[str]) -> Path:
    """Everything that can be known about writing `path` before the work starts."""
    suffixes = tuple(suffixes)
    if Path(path).suffix.lower() not in suffixes:
        raise AnimaError(f"the output must be a {' or '.join(suffixes)} file, got {path}")
    path = _check_target(path, overwrite)
    if path.exists() and not path.is_file():
        raise AnimaError(f"{path} exists and is not a regular file; it is not replaced")
    folder = _folder_of(path)
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise AnimaError(f"cannot write {path}: folder {folder} does not exist or is not writable")
    return path


def _publish(tmp: Path, target: Path, overwrite: bool) -> None:
    if overwrite:
        os.replace(tmp, target)
        return
    appeared = AnimaError(f"{target} appeared while this run was working; it was not replaced "
                          "(pass --overwrite to replace it)")
    try:
        os.link(tmp, target)  # fails if target exists: nothing is ever replaced
    except FileExistsError:
        raise appeared from None
    except OSError as e:
        if e.errno not in _NO_HARD_LINKS:
            raise
        # No hard links here: claim the name exclusively first, then move the finished file onto the claim.
        try:
            os.close(os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
        except FileExistsError:
            raise appeared from None
        try:
            os.replace(tmp, target)
        except BaseException:
            target.unlink(missing_ok=True)
            raise


def human_size(size: int) -> str:
    """`size` bytes for a person: 812 bytes, 3.4 KiB, 17.0 MiB, 2.31 GiB."""
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if size >= 1 << shift:
            return f"{size / (1 << shift):.{2 if shift == 30 else 1}f} {unit}"
    return f"{size} bytes"


def _existing(folder: str | os.PathLike) -> Path:
    """`folder`, or the nearest folder above it that exists (where its files will go)."""
    folder = Path(folder).absolute()
    while not folder.is_dir() and folder != folder.parent:
        folder = folder.parent
    return folder


def same_disk(folder: str | os.PathLike, other: str | os.PathLike) -> bool:
    """Whether files of `folder` can be hard-linked into `other` (made, or to be made): one file system."""
    return _existing(folder).stat().st_dev == _existing(other).stat().st_dev


def free_space(folder: str | os.PathLike) -> int:
    """Bytes free to this user in `folder` (or the nearest folder above it that exists)."""
    folder = _existing(folder)
    try:
        return shutil.disk_usage(folder).free
    except OSError:  # cannot tell: nothing is refused on a guess
        return 1 << 62


def check_space(folder: str | os.PathLike, needed: int, what: str) -> None:
    """Refuse, before any work, `what` that needs about `needed` bytes in `folder` where less is free."""
    free = free_space(folder)
    if needed > free:
        raise AnimaError(f"{what} needs about {human_size(needed)} in {folder}, and only {human_size(free)} is free "
                         "there: free some space or choose another folder")


def parameter_bytes(modules: Iterable[Any], bytes_each: int) -> int:
    """About the bytes of the modules' tensors (parameters and buffers) stored at `bytes_each` bytes a number, with
    a little for the files' own structure: a long writer's estimate of what it will write."""
    numbers = sum(t.numel() for module in modules for t in module.state_dict().values())
    return numbers * bytes_each * 21 // 20 + (1 << 20)


def _file_size_limit() -> int | None:
    try:
        import resource
    except ImportError:
        return None
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return None if limit == resource.RLIM_INFINITY else limit


def _write_error(e: OSError, target: Path, *, written: int = 0, size: int | None = None) -> AnimaError:
    """The one line for a write of `target` that failed with `e`; for a full disk or a file size limit it says
    how much the file needed (`size` when known, else at least the `written` bytes) and how much there was."""
    reason = e.strerror or str(e)
    if e.errno not in _NO_SPACE:
        return AnimaError(f"cannot write {target}: {reason}")
    needed = f"about {human_size(size)}" if size else f"more than the {human_size(written)} written"
    limit = _file_size_limit()
    room = (f"the file size limit is {human_size(limit)}" if e.errno == errno.EFBIG and limit is not None
            else f"{human_size(free_space(_folder_of(target)) + written)} was free there")
    return AnimaError(f"cannot write {target}: {reason} (it needs {needed}; {room})")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, overwrite: bool, durable: bool = True,
                size: int | None = None) -> Iterator[Path]:
    """Yield a temporary path beside `path`; publish it as `path` only if the block succeeds.

    Without `overwrite` an existing `path` is never replaced, even one that appears while the block runs.
    A write error (disk full, file too large, read-only file system) becomes one AnimaError line (_write_error).
    `durable` flushes the file to the disk around the publish (off only for scratch files rewritten every step).
    `size`: the file's expected size, if known: refused up front when the disk has not that much free.
    """
    target = _check_target(path, overwrite)
    folder = _folder_of(target)
    if not folder.is_dir():
        raise AnimaError(f"cannot write {target}: folder {folder} does not exist")
    if size is not None:
        check_space(folder, size, f"writing {target}")
    tmp: Path | None = None
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f"{_TEMP_PREFIX}{target.name}.", suffix=_TEMP_SUFFIX, dir=folder)
        tmp = Path(tmp_name)
        os.close(fd)
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600 files; give the usual permissions
        if durable:
            _sync(tmp)
        _publish(tmp, target, overwrite)
        if durable:
            _sync(folder)
    except OSError as e:
        written = tmp.stat().st_size if tmp is not None and tmp.exists() else 0
        raise _write_error(e, target, written=written, size=size) from None
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (an empty file, created if needed, only ever locked) for the block: one
    process at a time, released when the block ends or the process dies."""
    import fcntl  # POSIX only, and only where a lock is taken

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


@contextlib.contextmanager
def replaced_folder(folder: Path) -> Iterator[Path]:
    """Yield a fresh hidden staging folder beside `folder` (not yet made) for the block to fill; when the block
    succeeds it takes `folder`'s place whole, replacing what was there. A failed block, or a process killed at any
    moment, never leaves a half-written `folder`: a failed block's staging folder is removed, a killed one's is
    hidden and cleared by the next attempt. One writer at a time: hold exclusive_lock (or held_folder) around it."""
    staging, stale = (folder.with_name(f".{folder.name}.{kind}") for kind in ("staging", "stale"))
    for leftover in (staging, stale):  # a killed attempt's
        shutil.rmtree(leftover, ignore_errors=True)
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if folder.exists():
        folder.rename(stale)
    staging.rename(folder)
    shutil.rmtree(stale, ignore_errors=True)


def move_files(moves: Iterable[tuple[Path, Path, bool]]) -> None:
    """Finished files (`source`, `target`, `overwrite`), each moved into place by a rename (no space needed, so no
    full disk stops it half-way): every target is checked first, under atomic_path's rules, so one that may not be
    replaced refuses them all before any moves; a target that appears meanwhile is refused and stays as it is."""
    moves = list(moves)
    for _, target, overwrite in moves:
        _check_target(target, overwrite)
    for source, target, overwrite in moves:
        target.parent.mkdir(parents=True, exist_ok=True)
        _publish(source, target, overwrite)
        source.unlink(missing_ok=True)  # still there after a hard link
        _sync(target.parent)


def link_or_copy(source: str | os.PathLike, target: str | os.PathLike, *, overwrite: bool) -> None:
    """`target` with `source`'s bytes: a hard link where the file system allows (no second copy of a large
    file), else a copy; published whole, under atomic_path's rules."""
    with atomic_path(target, overwrite=overwrite) as tmp:
        tmp.unlink()
        try:
            os.link(source, tmp)
        except OSError as e:
            if e.errno not in _NO_HARD_LINKS:
                raise
            shutil.copyfile(source, tmp)


def _sync(path: Path) -> None:
    """Flush a file (or a folder's entries) to the disk: a published file, or a checkpoint, must survive a power
    cut whole, not as the empty file a rename of unflushed data can leave."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):  # file systems that cannot sync
            raise
    finally:
        os.close(fd)


def is_temporary(path: Path) -> bool:
    """A temporary of atomic_path (left only by a process killed with SIGKILL or a power cut)."""
    return path.name.startswith(_TEMP_PREFIX) and path.name.endswith(_TEMP_SUFFIX)


def output_folder(folder: str | os.PathLike, *, overwrite: bool, holds: str, resumable: str | None = None,
                  names: Iterable[str] = ()) -> Path:
    """`folder`, created if needed, for an output that must not mix with an earlier one unasked.

    A file in its place is refused, and so is a non-empty folder (described by `holds`) unless `overwrite`,
    or unless it holds `resumable`, the marker file of this command's own interrupted work. `names` are the
    files the command will create there, checked now rather than after the work.
    """
    folder = check_name(folder)  # a folder's name too: before anything looks at it
    if folder.exists() and not folder.is_dir():
        raise AnimaError(f"{folder} is a file, not a folder")
    own_work = resumable is not None and (folder / resumable).is_file() and not (folder / resumable).is_symlink()
    if folder.is_dir() and not overwrite and not own_work and any(folder.iterdir()):
        raise AnimaError(f"{folder} is not empty (it holds {holds}); pass --overwrite to replace it")
    for name in names:
        check_name(folder / name)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise AnimaError(f"cannot create folder {folder}: {e.strerror}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise AnimaError(f"cannot write into folder {folder}")
    return folder


# File systems that cannot lock (some network mounts) answer flock with one of these. There, held_folder goes on
# unguarded and tells the caller: the publishing rules above still keep every file whole and unreplaced, only a
# second run is not refused up front. Any other error is refused: a lock that failed for a reason not known to
# mean "no locks here" is no reason to run without one.
_NO_LOCKS = {errno.ENOLCK, errno.EBADF, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS}
WRITING_INTO = "another anima-rknn run is writing into {folder}; wait for it to end, or choose another folder"


@contextlib.contextmanager
def held_folder(open_folder: Callable[[], Path], *, busy: str = WRITING_INTO,
                unguarded: Callable[[str], None] | None = None) -> Iterator[Path]:
    """The folder `open_folder()` checks and makes (output_folder, or a caller's rules over it), held by this
    process for the block: a second process holding it is refused in one line, `busy` with its "{folder}" filled
    in, instead of mixing its files with this one's or emptying the folder under it. On a file system that cannot
    lock, the block runs unguarded, and `unguarded` (if given) is handed a warning line saying so.

    The lock is an flock of the folder itself, not of a lock file in it (a file there would become part of the
    set and of its listing, and a new data dir must stay empty until its job store marks it); it goes when the
    block ends or the process dies. The folder is checked again once the lock is held: the first check is one that
    another run may have passed too."""
    import fcntl  # POSIX only, and only where a folder is written

    folder = open_folder()
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise AnimaError(f"cannot open the folder {folder}: {e.strerror or e}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise AnimaError(busy.format(folder=folder)) from None
        except OSError as e:
            if e.errno not in _NO_LOCKS:
                raise AnimaError(f"cannot lock the folder {folder}: {e.strerror or e}") from None
            if unguarded is not None:
                unguarded(f"warning: cannot lock {folder} ({e.strerror}): a second run on it would not be refused")
        yield open_folder()
    finally:
        os.close(fd)  # releases the lock


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _strict(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _strict(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(item) for item in value]
    return value


def json_text(value: Any, indent: int | None = None) -> str:
    """Strict JSON of `value`, valid for any parser: a non-finite number is written as the string "inf",
    "-inf" or "nan" (e.g. the PSNR of identical images), never as a bare NaN/Infinity token."""
    return json.dumps(_strict(value), indent=indent, allow_nan=False)


def write_json(path: str | os.PathLike, value: Any, *, overwrite: bool) -> None:
    write_text(path, json_text(value, indent=1) + "\n", overwrite=overwrite)


def _png_info(parameters: str | None) -> Any:
    from PIL import PngImagePlugin

    info = PngImagePlugin.PngInfo()
    if parameters is not None:
        info.add_text("parameters", parameters)
    return info


def save_png(image: Any, path: str | os.PathLike, *, overwrite: bool, parameters: str | None = None,
             durable: bool = True) -> None:
    """A PIL image as PNG, with the A1111/ComfyUI `parameters` text chunk that image tools read back."""
    with atomic_path(path, overwrite=overwrite, durable=durable) as tmp:
        image.save(tmp, format="PNG", pnginfo=_png_info(parameters))


def png_bytes(image: Any, parameters: str | None = None) -> bytes:
    """The file save_png would write, as bytes: what a remote worker sends back for the driver to write."""
    import io

    buffer = io.BytesIO()
    image.save(buffer, format="PNG", pnginfo=_png_info(parameters))
    return buffer.getvalue()


def write_bytes(path: str | os.PathLike, data: bytes, *, overwrite: bool) -> None:
    with atomic_path(path, overwrite=overwrite) as tmp:
        tmp.write_bytes(data)


def write_text(path: str | os.PathLike, text: str, *, overwrite: bool) -> None:
    with atomic_path(path, overwrite=overwrite) as tmp:
        tmp.write_text(text, encoding="utf-8")


class Unreadable(Exception):
    """Why a small file could not be read; the caller names the file in its own words."""


def _size(limit: int) -> str:
    return next(f"{limit >> shift} {unit}" for shift, unit in ((20, "MiB"), (10, "KiB"), (0, "bytes"))
                if limit >> shift and not limit & ((1 << shift) - 1))


@contextlib.contextmanager
def open_small_file(path: str | os.PathLike, limit: int, *, no_links: bool = False) -> Iterator[BinaryIO]:
    """A small file a user may have been handed (a manifest, a state, a tokenizer, a batch's records), open for
    reading: a regular file of at most `limit` bytes by its size now (a FIFO or a 16 GiB sparse file is not waited
    on or read), for a caller that reads it in parts; it may still grow, so a caller bounds what it reads too.
    `no_links`: a file that is a link, symbolic or hard (another name of a file elsewhere), is refused too."""
    try:
        # Non-blocking, then checked on the open file: a FIFO swapped in after a look would block a plain open.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | (os.O_NOFOLLOW if no_links else 0))
    except OSError as e:
        raise Unreadable("not a regular file" if e.errno in (errno.ENOENT, errno.EISDIR, errno.ENXIO, errno.ELOOP)
                         else f"cannot read it: {e.strerror or e}") from None
    found = os.fstat(fd)
    if not stat.S_ISREG(found.st_mode) or (no_links and found.st_nlink != 1):
        os.close(fd)
        raise Unreadable("not a regular file")
    if found.st_size > limit:
        os.close(fd)
        raise Unreadable(f"larger than {_size(limit)}")
    with os.fdopen(fd, "rb") as f:
        yield f


def read_small_file(path: str | os.PathLike, limit: int, *, no_links: bool = False) -> bytes:
    """The bytes of open_small_file's file, never more than `limit` read."""
    with open_small_file(path, limit, no_links=no_links) as f:
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise Unreadable(f"cannot read it: {e.strerror or e}") from None
    if len(data) > limit:
        raise Unreadable(f"larger than {_size(limit)}")
    return data


def read_small_json(path: str | os.PathLike, limit: int) -> Any:
    """read_small_file, parsed as UTF-8 JSON (nesting too deep for the parser is refused too)."""
    data = read_small_file(path, limit)
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise Unreadable("not valid JSON (not UTF-8 text)") from None
    except (ValueError, RecursionError) as e:
        raise Unreadable(f"not valid JSON: {e}") from None


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


@functools.lru_cache(maxsize=256)
def _sha256_of_version(path: Path, size: int, mtime_ns: int) -> str:
    return sha256_file(path)


def cached_sha256(path: str | os.PathLike) -> str:
    """sha256, hashed once per file version per process (a 4 GB DiT takes seconds; the bench loads sets often)."""
    path = Path(path)
    info = path.stat()
    return _sha256_of_version(path.resolve(), info.st_size, info.st_mtime_ns)
