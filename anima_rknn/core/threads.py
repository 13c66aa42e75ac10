"""How many CPU threads a model runs on, and setting torch and ONNX Runtime to them together.

The default ("auto", 0) is one thread per physical core, and on a big.LITTLE CPU (the RK3588: 4x Cortex-A76 at
2.4 GHz, 4x A55 at 1.8 GHz) the big cores only: a step split evenly over cores of unequal speed waits for the
slowest, and a second hardware thread of one core adds little to matmul-bound work. Both are read from sysfs
(cpufreq's cpuinfo_max_freq, topology's thread siblings), within the CPUs this process may run on.

ONNX Runtime's pool threads spin while waiting for work by default; on a machine busy with other processes the
spinning threads take the CPU the working ones need (benchmarks/threads.py), so sessions are made without it, and
OpenMP's (torch's) wait passively (anima_rknn/__init__.py sets OMP_WAIT_POLICY=PASSIVE before torch starts).

The default is load-aware too: the cores that the machine's other work leaves idle (its 1-minute load average
subtracted), at least one, read when a run starts. A step split over threads waits for the slowest at every
operation, and a thread that shares its core with other work is often not running: on a machine whose other work
uses every core, one thread is several times faster than two (benchmarks/threads_loaded.py).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

AUTO_THREADS = 0  # --threads 0: chosen for this CPU by auto_threads()
MAX_THREADS = 1024
SYSFS_CPU = Path("/sys/devices/system/cpu")


def parse_cpu_list(text: str) -> set[int]:
    """sysfs's CPU list format, "0-3,8,10-11", as a set of CPU numbers."""
    cpus: set[int] = set()
    for item in text.strip().split(","):
        if item:
            low, _, high = item.partition("-")
            cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _core(root: Path, cpu: int) -> object:
    """What names `cpu`'s physical core: its set of hardware threads (SMT siblings), else its package and core
    id, else the CPU itself (a core of its own)."""
    topology = root / f"cpu{cpu}" / "topology"
    for name in ("core_cpus_list", "thread_siblings_list"):
        text = _read(topology / name)
        if text:
            try:
                return frozenset(parse_cpu_list(text))
            except ValueError:
                pass
    package, core = _read(topology / "physical_package_id"), _read(topology / "core_id")
    return ("core", package, core) if package is not None and core is not None else ("cpu", cpu)


def _number(path: Path) -> int | None:
    text = _read(path)
    return int(text) if text and text.isdigit() else None


def auto_threads(root: Path = SYSFS_CPU, allowed: Iterable[int] | None = None) -> int:
    """The physical cores among the CPUs `allowed` (default: this process's affinity), counting only the fastest
    ones where their speeds differ: the highest cpufreq cpuinfo_max_freq, or without cpufreq the highest
    cpu_capacity (the scheduler's relative speed of each core on ARM). At least 1; without sysfs, the allowed
    CPUs."""
    if allowed is None:
        allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    cpus = sorted(set(allowed))
    if not cpus:
        return 1
    for speed in ("cpufreq/cpuinfo_max_freq", "cpu_capacity"):
        speeds = {cpu: _number(root / f"cpu{cpu}" / speed) for cpu in cpus}
        if all(value is not None for value in speeds.values()):  # an unknown speed could be either: not this one
            cpus = [cpu for cpu in cpus if speeds[cpu] == max(speeds.values())]
            break
    return max(1, len({_core(root, cpu) for cpu in cpus}))


@functools.lru_cache(maxsize=1)
def _cores() -> int:
    return auto_threads()


def idle_cores(cores: int, load: float | None = None) -> int:
    """Of `cores`, those the machine's other work leaves idle by its 1-minute load average (`load`, default
    os.getloadavg's), rounded to the nearest; at least 1."""
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (OSError, AttributeError):  # no load average here: every core
            load = 0.0
    return max(1, min(cores, round(cores - load)))


def _omp_threads() -> int | None:
    omp = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(omp) if omp.isdigit() and int(omp) >= 1 else None


def _auto() -> int:
    return _omp_threads() or idle_cores(_cores())


def machine_threads() -> int:
    """Auto without the load: OMP_NUM_THREADS where it is set, else auto_threads(). For counts that name work
    (a batch job's id), which must not change with the load of the moment."""
    return _omp_threads() or _cores()


def resolve_threads(threads: int | None) -> int | None:
    """A threads setting as the number that runs: AUTO_THREADS -> OMP_NUM_THREADS where it is set (the usual
    way to size a CPU program), else idle_cores() of auto_threads() (this machine's cores that other work leaves
    idle now); any other value as it is (None: as torch is set when the run starts; validate() checks the rest)."""
    if threads == AUTO_THREADS and not isinstance(threads, bool):
        return _auto()
    return threads


def use_threads(threads: int) -> None:
    """Run this thread's torch work on `threads` intra-op threads; ONNX Runtime sessions opened after it take
    the same number (session_options). Torch's inter-op pool is left alone: nothing here runs ops in parallel
    across it, and it can only be sized before its first use."""
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def session_options(onnxruntime: Any, *, spinning: bool = False) -> Any:
    """ONNX Runtime session options on as many intra-op threads as torch has in this thread (use_threads), one
    inter-op thread (a subgraph is one chain), and no spinning unless asked (see the module docstring)."""
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = torch.get_num_threads(), 1
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return options
