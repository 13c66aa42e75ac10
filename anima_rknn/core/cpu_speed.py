"""Which dtype this CPU runs the bodies fastest in: a short matmul probe, measured once per machine and cached.

bf16 is 3x faster than fp32 where the CPU has native bf16 (AVX-512 BF16, AMX) and hundreds of times slower where
it has not (AVX2-only x86, the RK3588's Cortex-A76): torch then emulates it. CPU flags do not say which path a
given torch build takes, so the choice is measured: the same matmul in fp32 and bf16, best of a few runs.
"""

from __future__ import annotations

import hashlib
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..checks import is_number
from ..errors import AnimaError
from .files import Unreadable, cache_dir, read_small_json, write_json

AUTO = "auto"
BF16_MIN_GAIN = 1.2  # bf16 is chosen only when clearly faster: it also rounds more
SLOW_WARNING = 0.5  # an explicitly asked dtype slower than this fraction of fp32's speed gets a warning
_SHAPE = (128, 512, 512)  # tokens x in x out: fast enough on a CPU that emulates bf16 (~10 ms at 3 GFLOP/s)
_CACHE_FORMAT = "anima-rknn-dtype-probe/1"
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def machine_key(extra: str = "") -> str:
    """CPU model and flags, torch version, threads and oneDNN's ISA limit: what a probe's answer depends on
    (`extra`: whatever else a probe's answer depends on, e.g. another runtime's version)."""
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            lines = [line for line in f if line.startswith(("model name", "flags", "Features", "CPU part"))]
        cpu = "".join(sorted(set(lines)))
    except OSError:
        cpu = platform.processor()
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or ""  # limits oneDNN's kernels
    text = f"{platform.machine()}|{cpu}|{torch.__version__}|{torch.get_num_threads()}|{isa}"
    if extra:
        text += f"|{extra}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_path() -> Path:
    return cache_dir() / "dtype-probe.json"


def cached_measurement(path: Path, form: str, key: str, field: str, valid: Callable[[Any], bool],
                       measure: Callable[[], Any]) -> Any:
    """measure(), kept in `path` (JSON: the `form` name, the machine `key`, the value under `field`) and read from
    there while it is `valid` for this machine: a damaged or foreign cache is measured again, never an error, and a
    read-only one only costs measuring again next time."""
    try:
        cached = read_small_json(path, 4096)
        if (isinstance(cached, dict) and cached.get("format") == form and cached.get("machine") == key
                and valid(cached.get(field))):
            return cached[field]
    except Unreadable:
        pass
    value = measure()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, {"format": form, "machine": key, field: value}, overwrite=True)
    except (OSError, AnimaError):
        pass  # a read-only home only costs the measurement next time
    return value


def _gflops(dtype: torch.dtype, repeats: int = 3) -> float:
    rows, inner, cols = _SHAPE
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(rows, inner, generator=g).to(dtype), torch.randn(inner, cols, generator=g).to(dtype)
    a @ b  # first call: allocator and kernel choice
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * rows * inner * cols / max(best, 1e-9) / 1e9


def measure() -> dict[str, float]:
    """GFLOP/s of the probe matmul per dtype, on this machine now."""
    with torch.inference_mode():
        return {name: _gflops(dtype) for name, dtype in _DTYPES.items()}


def _valid_speeds(value: Any) -> bool:
    return isinstance(value, dict) and all(is_number(value.get(d)) and value[d] > 0 for d in _DTYPES)


def probe() -> dict[str, float]:
    """measure(), cached per machine."""
    speeds = cached_measurement(cache_path(), _CACHE_FORMAT, machine_key(), "gflops", _valid_speeds, measure)
    return {d: float(speeds[d]) for d in _DTYPES}


def fastest_dtype(speeds: dict[str, float]) -> str:
    return "bf16" if speeds["bf16"] >= BF16_MIN_GAIN * speeds["fp32"] else "fp32"


def resolve_dtype(dtype: str) -> str:
    """AUTO becomes the fastest body dtype for this CPU; any other name is kept."""
    return fastest_dtype(probe()) if dtype == AUTO else dtype


def slow_dtype_warning(dtype: str) -> str | None:
    """One line when an explicitly asked dtype runs much slower than fp32 here; None otherwise."""
    if dtype in (AUTO, "fp32"):
        return None
    speeds = probe()
    ratio = speeds[dtype] / speeds["fp32"]
    if ratio >= SLOW_WARNING:
        return None
    return (f"warning: {dtype} matmuls run {1 / ratio:.0f}x slower than fp32 on this CPU "
            f"({speeds[dtype]:.1f} vs {speeds['fp32']:.1f} GFLOP/s); --dtype auto would pick "
            f"{fastest_dtype(speeds)}")
