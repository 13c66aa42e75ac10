"""What a resume checkpoint costs, against one sampler step of the mid model at the same size.

A checkpoint writes the resume state: the latent, both prompts' full-size contexts (512 x 1024 float32 each) and
Spectrum's six stored x0, as one safetensors file through the atomic writer. One step is two DiT passes (CFG) of
the mid random model on the torch backend, fp32, one thread. Prints a Markdown table.

    .venv/bin/python benchmarks/checkpoint_cost.py --sizes 512 1024
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from anima_rknn.engine import make_engine
from anima_rknn.generation.params import GenerationParams
from anima_rknn.generation.result import Conditioning
from anima_rknn.generation.resume import write_state
from anima_rknn.model.config import PRESETS
from anima_rknn.model.io import random_dit
from anima_rknn.sampling.caches import make_cache
from anima_rknn.sampling.sample import StepEvent

FULL_CONTEXT = (1, 512, 1024)  # the real model's context rows x width


def spectrum_state(latent_shape: tuple[int, ...], steps: int = 20) -> dict:
    """A Spectrum cache just before its first forecast after a full history, as in a real run."""
    cache = make_cache("spectrum", steps)
    rng = np.random.default_rng(0)
    while len(cache.state()["history"]) < cache.history_len:
        x0 = rng.standard_normal(latent_shape, dtype=np.float32)
        if cache.should_skip():
            cache.forecast(x0)
        else:
            cache.record(x0, x0)
    return cache.state()


def checkpoint_seconds(size: int, folder: Path, repeats: int) -> tuple[float, int]:
    latent_shape = (1, 16, size // 8, size // 8)
    x = np.random.default_rng(1).standard_normal(latent_shape, dtype=np.float32)
    event = StepEvent(10, 20, 0.5, 0.45, x, x, True, False, 1.0, 10.0, spectrum_state(latent_shape))
    conditioning = Conditioning(torch.randn(FULL_CONTEXT), torch.randn(FULL_CONTEXT), 0.0)
    params = GenerationParams(prompt="a cat", width=size, height=size, cache="spectrum")
    prints = {"dit": "0" * 64, "text_encoder": "1" * 64, "vae": "2" * 64, "subgraphs": None}
    path = folder / f"x{size}.png.state"
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        write_state(path, params, prints, event, conditioning, [], 1.0)
        best = min(best, time.perf_counter() - start)
    return best, path.stat().st_size


def step_seconds(size: int, repeats: int) -> float:
    config = PRESETS["mid"]
    dit = random_dit(config, seed=0)
    engine = make_engine(dit, "torch", width=size, height=size)
    x = torch.randn(1, 16, size // 8, size // 8)
    cond, uncond = torch.randn(1, config.context_tokens, config.context_dim), torch.zeros(1, config.context_tokens,
                                                                                           config.context_dim)
    best = float("inf")
    with torch.no_grad():
        for i in range(repeats + 1):  # the first is a warm-up
            start = time.perf_counter()
            engine.velocity(x, 0.9 - 0.01 * i, cond)
            engine.velocity(x, 0.9 - 0.01 * i, uncond)
            best = min(best, time.perf_counter() - start) if i else best
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[512, 1024])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| size | state file | checkpoint (write) | one mid-model step (2 passes) | checkpoint / step |")
    print("|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as folder:
        for size in args.sizes:
            write_s, nbytes = checkpoint_seconds(size, Path(folder), args.repeats)
            step_s = step_seconds(size, max(1, args.repeats - 1))
            print(f"| {size}x{size} | {nbytes / 2**20:.1f} MiB | {write_s * 1000:.1f} ms | {step_s:.2f} s | "
                  f"{write_s / step_s:.2%} |", flush=True)


if __name__ == "__main__":
    main()
