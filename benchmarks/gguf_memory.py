"""What a quantized GGUF DiT costs in memory and time on the torch backend, against the same weights in bf16 and
fp32 safetensors.

A full-width random DiT (Anima's hidden 2048, 16 heads, MLP 8192, the whole LLM adapter) with a few blocks is
written in bf16 and fp32 safetensors and quantized by `anima-rknn quantize` (Q8_0, Q4_K), at two block counts.
Each case runs in a fresh process: load as the denoising loop does (denoise_only, just_in_time), one warm-up pass
at 512x512 (1024 tokens, batch 1), then timed passes (the larger model only). DiT memory = peak RSS minus the RSS
just before loading (imports, inputs). A few blocks leave the activations and buffers, the same in every case, a
large share of that; the two block counts give memory per block, and from it the 28-block model's. With one
block count (`--blocks 28`, the real model) the memory is measured, not extrapolated; `--cases` picks the cases
(the 28-block fp32 file alone is 8 GiB) and `--files` keeps the written files for another run.

    python benchmarks/gguf_memory.py [--blocks 2 4] [--passes 3]
    python benchmarks/gguf_memory.py --blocks 28 --cases bf16 q8_0 --passes 1 --files /tmp/dit28
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
CASES = {  # key: (label, file, bodies' dtype); the first case chosen is the baseline
    "bf16": ("bf16 safetensors", "bf16.safetensors", "bf16"),
    "fp32": ("fp32 safetensors", "fp32.safetensors", "fp32"),
    "q8_0": ("Q8_0 GGUF, bf16 compute", "q8_0.gguf", "bf16"),
    "q8_0-fp32": ("Q8_0 GGUF, fp32 compute", "q8_0.gguf", "fp32"),
    "q4_k": ("Q4_K GGUF, bf16 compute", "q4_k.gguf", "bf16"),
}


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


def write_files(folder: Path, blocks: int, names: set[str]) -> None:
    """The files `names` of the cases, those not already in `folder` (the model is made once, in bf16 unless
    the fp32 file is asked for: 28 full-width blocks are 8 GiB in fp32)."""
    from anima_rknn.model.config import PRESETS
    from anima_rknn.model.io import random_dit, save_dit
    from anima_rknn.model.quantize import quantize_checkpoint

    folder.mkdir(parents=True, exist_ok=True)
    floats = {n for n in names if n.endswith(".safetensors")} | {"bf16.safetensors"}
    if any(not (folder / name).exists() for name in floats):
        model = random_dit(dataclasses.replace(PRESETS["full"], blocks=blocks))
        if "fp32.safetensors" in names:
            save_dit(model, folder / "fp32.safetensors", torch.float32)
        save_dit(model.to(torch.bfloat16), folder / "bf16.safetensors", torch.bfloat16)
        del model
    for name in sorted(names - floats):
        if not (folder / name).exists():
            quantize_checkpoint(folder / "bf16.safetensors", folder / name, name.removesuffix(".gguf"))


def run_case(path: Path, dtype: str, passes: int) -> dict:
    return json.loads(subprocess.run([sys.executable, __file__, "--case", str(path), dtype, "--passes", str(passes)],
                                     check=True, capture_output=True, text=True).stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, nargs="+", default=[2, 4], help="two counts, or one to measure")
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--files", type=Path, help="write (or reuse) the files here, not in a temporary folder")
    parser.add_argument("--case", nargs=2, help=argparse.SUPPRESS)  # file dtype: run one case here
    args = parser.parse_args()
    if args.case:
        print(json.dumps(measure(*args.case, args.passes)))
        return
    counts = sorted(set(args.blocks))
    cases = [CASES[key] for key in args.cases]
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.files or Path(tmp)
        for blocks in counts:
            write_files(folder / str(blocks), blocks, {name for _, name, _ in cases})
        if len(counts) == 1:
            measured(folder / str(counts[0]), counts[0], cases, args.passes)
        else:
            extrapolated(folder, *counts[:2], cases, args.passes)


def measured(folder: Path, blocks: int, cases: list[tuple[str, str, str]], passes: int) -> None:
    mib = 2**20
    print(f"full-width DiT + LLM adapter, {blocks} blocks; 512x512, batch 1; torch threads {torch.get_num_threads()}; "
          f"best of {passes} passes after a warm-up")
    print(f"| case | DiT file | DiT memory (peak RSS) | vs {cases[0][0]} | pass | pass vs {cases[0][0]} | "
          "max abs diff |")
    print("|---|---|---|---|---|---|---|")
    base = None
    for label, name, dtype in cases:
        run = run_case(folder / name, dtype, passes)
        base = base or run
        diff = max(abs(a - b) for a, b in zip(run["out"], base["out"]))
        print(f"| {label} | {(folder / name).stat().st_size / mib:.0f} MiB | {run['dit_memory'] / mib:.0f} MiB | "
              f"{run['dit_memory'] / base['dit_memory']:.2f}x | {run['pass_s']:.1f} s | "
              f"{run['pass_s'] / base['pass_s']:.2f}x | {diff:.3g} |", flush=True)


def extrapolated(folder: Path, few: int, more: int, cases: list[tuple[str, str, str]], passes: int) -> None:
    mib, full = 2**20, PRESETS_BLOCKS
    print(f"full-width DiT + LLM adapter, {few} and {more} blocks; 512x512, batch 1; torch threads "
          f"{torch.get_num_threads()}; best of {passes} passes ({more} blocks)")
    print(f"| case | DiT file ({more} blocks) | DiT memory ({few} / {more} blocks) | per block | "
          f"{full} blocks (extrapolated) | vs bf16 | pass ({more} blocks) | pass vs bf16 | max abs diff vs bf16 |")
    print("|---|---|---|---|---|---|---|---|---|")
    base = None
    for label, name, dtype in cases:
        small = run_case(folder / str(few) / name, dtype, 0)
        run = run_case(folder / str(more) / name, dtype, passes)
        per_block = (run["dit_memory"] - small["dit_memory"]) / (more - few)
        whole = run["dit_memory"] + per_block * (full - more)
        base = base or {**run, "whole": whole}
        size = (folder / str(more) / name).stat().st_size
        diff = max(abs(a - b) for a, b in zip(run["out"], base["out"]))
        print(f"| {label} | {size / mib:.0f} MiB | {small['dit_memory'] / mib:.0f} / {run['dit_memory'] / mib:.0f}"
              f" MiB | {per_block / mib:.0f} MiB | {whole / 2**30:.2f} GiB | {whole / base['whole']:.2f}x | "
              f"{run['pass_s']:.2f} s | {run['pass_s'] / base['pass_s']:.2f}x | {diff:.3g} |", flush=True)


if __name__ == "__main__":
    main()
