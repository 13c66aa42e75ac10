"""Process memory (Linux): hand freed heap back to the OS, and measure peak RSS over a block of work."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")
_MEMINFO = Path("/proc/meminfo")
_CGROUP = Path("/sys/fs/cgroup")


def _libc_malloc_trim() -> Callable[[int], int] | None:
    libc = ctypes.util.find_library("c")
    return getattr(ctypes.CDLL(libc), "malloc_trim", None) if libc else None  # glibc only


_MALLOC_TRIM = _libc_malloc_trim()


def return_freed_memory() -> None:
    """Give the memory of finished work back to the OS.

    glibc keeps freed heap blocks (a stage's many mid-sized tensors) for reuse and they still count as
    resident; without this, the text encoder's ~2 GB would sit beside the DiT.
    """
    gc.collect()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def freeze_long_lived() -> None:
    """The objects alive now (the modules of a process that has just imported what it runs) frozen out of the
    collector's later scans, once per process. return_freed_memory's gc.collect() then walks only the work's own
    objects: over a serve process's ~400,000 module objects each collection cost 0.6 s, several a generation
    (a demo-model job 2.5 s -> 1.5 s; benchmarks/gc_freeze.py). Frozen objects are still freed when their last
    reference goes; only a reference cycle among them would be kept, and modules live as long as the process."""
    if gc.get_freeze_count() == 0:
        gc.collect()
        gc.freeze()


def status_bytes(field: str) -> int | None:
    """A size from /proc/self/status (VmRSS, VmHWM, ...) in bytes; None where there is no such file or field."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # the kernel writes kB
    except OSError:
        pass
    return None


def available_bytes() -> int | None:
    """Memory a new allocation can have: the kernel's MemAvailable, lowered by a cgroup (container) limit and
    by the address-space rlimit (`ulimit -v`); None where none of them can be read."""
    import resource

    limits = []
    try:
        for line in _MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                limits.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    try:
        limit, used = (_CGROUP / "memory.max").read_text().strip(), (_CGROUP / "memory.current").read_text()
        if limit != "max":
            limits.append(int(limit) - int(used))
    except (OSError, ValueError):
        pass
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        limits.append(soft - (status_bytes("VmSize") or 0))
    return max(0, min(limits)) if limits else None


@dataclass
class PeakRSS:
    """Peak resident set size over a `with` block, in bytes; None where the kernel can't reset the mark."""

    bytes: int | None = None


@contextmanager
def peak_rss() -> Iterator[PeakRSS]:
    """Linux: writing "5" to /proc/self/clear_refs resets VmHWM to the current RSS, so the VmHWM read after
    the block is this block's peak (memory already resident when it starts counts too)."""
    result = PeakRSS()
    return_freed_memory()
    try:
        _CLEAR_REFS.write_text("5")
        resettable = True
    except OSError:
        resettable = False
    yield result
    if resettable:
        result.bytes = status_bytes("VmHWM")
