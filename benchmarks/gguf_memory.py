"""What a quantized GGUF DiT costs in memory and time on the torch backend, against the same weights in bf16 and
fp32 safetensors.

A full-width random DiT (Anima's hidden 2048, 16 heads, MLP 8192, the whole LLM adapter) with a few blocks is
written in bf16 and fp32 safetensors and quantized by `anima-rknn quantize` (Q8_0, Q4_K), at two block counts.
Each case runs in a fresh process: load as the denoising loop does (denoise_only, just_in_time), one warm-up pass
at 512x512 (1024 tokens, batch 1), then timed passes (the larger model only). DiT memory = peak RSS minus the RSS
just before loading (imports, inputs). A few blocks leave the activations and buffers, the same in every case, a
large share of that; the two block counts give memory per block, and from it the 28-block model's.

    python benchmarks/gguf_memory.py [--blocks 2 4] [--passes 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

PRESETS_BLOCKS = 28  # the real model's
CASES = [  # (label, file, bodies' dtype)
    ("bf16 safetensors", "bf16.safetensors", "bf16"),
    ("fp32 safetensors", "fp32.safetensors", "fp32"),
    ("Q8_0 GGUF, bf16 compute", "q8_0.gguf", "bf16"),
    ("Q8_0 GGUF, fp32 compute", "q8_0.gguf", "fp32"),
    ("Q4_K GGUF, bf16 compute", "q4_k.gguf", "bf16"),
]


def _status(field: str) -> int:
    """VmRSS / VmHWM (the peak) of this process, in bytes."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def _reset_peak() -> None:
    """Start the peak (VmHWM) afresh: imports and input set-up are not the DiT's."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def measure(dit: str, dtype: str, passes: int) -> dict:
    """One case, in this (fresh) process."""
    from anima_rknn.generation.params import DTYPES
    from anima_rknn.model.io import load_dit, read_dit_config

    config = read_dit_config(dit)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 16, 64, 64, generator=g)  # 512x512 pixels
    context = torch.randn(1, config.context_tokens, config.context_dim, generator=g)
    sigma = torch.tensor([0.7])
    _reset_peak()
    before = _status("VmRSS")
    model = load_dit(dit, DTYPES[dtype], denoise_only=True, just_in_time=True)
    times = []
    with torch.no_grad():
        out = model(x, sigma, context)
        for _ in range(passes):
            start = time.perf_counter()
            model(x, sigma, context)
            times.append(time.perf_counter() - start)
    peak = _status("VmHWM")
    return {"dit_memory": peak - before, "pass_s": min(times, default=float("nan")), "out": out.flatten()[:4096].tolist()}


def write_files(folder: Path, blocks: int) -> None:
    from anima_rknn.model.config import PRESETS
    from anima_rknn.model.io import random_dit, save_dit
    from anima_rknn.model.quantize import quantize_checkpoint

    folder.mkdir()
    model = random_dit(dataclasses.replace(PRESETS["full"], blocks=blocks))
    save_dit(model, folder / "bf16.safetensors", torch.bfloat16)
    save_dit(model, folder / "fp32.safetensors", torch.float32)
    del model
    for qtype in ("q8_0", "q4_k"):
        quantize_checkpoint(folder / "bf16.safetensors", folder / f"{qtype}.gguf", qtype)


def run_case(path: Path, dtype: str, passes: int) -> dict:
    return json.loads(subprocess.run([sys.executable, __file__, "--case", str(path), dtype, "--passes", str(passes)],
                                     check=True, capture_output=True, text=True).stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, nargs=2, default=[2, 4])
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--case", nargs=2, help=argparse.SUPPRESS)  # file dtype: run one case here
    args = parser.parse_args()
    if args.case:
        print(json.dumps(measure(*args.case, args.passes)))
        return
    few, more = sorted(args.blocks)
    with tempfile.TemporaryDirectory() as tmp:
        for blocks in (few, more):
            write_files(Path(tmp) / str(blocks), blocks)
        mib, full = 2**20, PRESETS_BLOCKS
        print(f"full-width DiT + LLM adapter, {few} and {more} blocks; 512x512, batch 1; torch threads "
              f"{torch.get_num_threads()}; best of {args.passes} passes ({more} blocks)")
        print(f"| case | DiT file ({more} blocks) | DiT memory ({few} / {more} blocks) | per block | "
              f"{full} blocks (extrapolated) | vs bf16 | pass ({more} blocks) | pass vs bf16 | max abs diff vs bf16 |")
        print("|---|---|---|---|---|---|---|---|---|")
        base = None
        for label, name, dtype in CASES:
            small = run_case(Path(tmp) / str(few) / name, dtype, 0)
            run = run_case(Path(tmp) / str(more) / name, dtype, args.passes)
            per_block = (run["dit_memory"] - small["dit_memory"]) / (more - few)
            whole = run["dit_memory"] + per_block * (full - more)
            base = base or {**run, "whole": whole}
            size = (Path(tmp) / str(more) / name).stat().st_size
            diff = max(abs(a - b) for a, b in zip(run["out"], base["out"]))
            print(f"| {label} | {size / mib:.0f} MiB | {small['dit_memory'] / mib:.0f} / {run['dit_memory'] / mib:.0f}"
                  f" MiB | {per_block / mib:.0f} MiB | {whole / 2**30:.2f} GiB | {whole / base['whole']:.2f}x | "
                  f"{run['pass_s']:.2f} s | {run['pass_s'] / base['pass_s']:.2f}x | {diff:.3g} |", flush=True)


if __name__ == "__main__":
    main()
