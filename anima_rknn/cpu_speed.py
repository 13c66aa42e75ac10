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
from pathlib import Path

import torch

from .errors import AnimaError
from .files import Unreadable, read_small_json, write_json

AUTO = "auto"
BF16_MIN_GAIN = 1.2  # bf16 is chosen only when clearly faster: it also rounds more
SLOW_WARNING = 0.5  # an explicitly asked dtype slower than this fraction of fp32's speed gets a warning
_SHAPE = (128, 512, 512)  # tokens x in x out: fast enough on a CPU that emulates bf16 (~10 ms at 3 GFLOP/s)
_CACHE_FORMAT = "anima-rknn-dtype-probe/1"


def _machine_key() -> str:
    """CPU model and flags, torch version, threads and oneDNN's ISA limit: what the probe's answer depends on."""
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            lines = [line for line in f if line.startswith(("model name", "flags", "Features", "CPU part"))]
        cpu = "".join(sorted(set(lines)))
    except OSError:
        cpu = platform.processor()
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or ""  # limits oneDNN's kernels
    text = f"{platform.machine()}|{cpu}|{torch.__version__}|{torch.get_num_threads()}|{isa}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "anima-rknn" / "dtype-probe.json"


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
        return {name: _gflops(dtype) for name, dtype in
                (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16))}


def probe() -> dict[str, float]:
    """measure(), cached per machine (a damaged or foreign cache is measured again, never an error)."""
    path, key = cache_path(), _machine_key()
    try:
        cached = read_small_json(path, 4096)
        if (isinstance(cached, dict) and cached.get("format") == _CACHE_FORMAT and cached.get("machine") == key
                and isinstance(cached.get("gflops"), dict)
                and all(isinstance(cached["gflops"].get(d), (int, float)) and cached["gflops"][d] > 0
                        for d in ("fp32", "bf16", "fp16"))):
            return {d: float(cached["gflops"][d]) for d in ("fp32", "bf16", "fp16")}
    except Unreadable:
        pass
    speeds = measure()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, {"format": _CACHE_FORMAT, "machine": key, "gflops": speeds}, overwrite=True)
    except (OSError, AnimaError):
        pass  # a read-only home only costs the probe's few milliseconds next time
    return speeds


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
