"""Denoise time with and without Spectrum, beside the ideal speedup steps / computed steps.

Process CPU time on one thread is measured, not wall time: these machines are shared, and CPU time of a
single-threaded run is what the work costs, whatever else runs. Runs are interleaved (none, spectrum,
none, spectrum, ...) and the best of each is kept. Also: the cost of one forecast (Spectrum.predict) on
the latent, which is all a skipped step adds.

    python benchmarks/spectrum_speed.py [--model DIR] [--preset mid] [--steps 20] [--repeat 2]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from anima_rknn.demo.tiny_set import write_model_set
from anima_rknn.generation.params import GenerationParams
from anima_rknn.generation.pipeline import AnimaPipeline, initial_noise
from anima_rknn.model.model_set import from_model_dir
from anima_rknn.sampling.spectrum import Spectrum


def forecast_ms(steps: int, latent: np.ndarray, rounds: int = 200) -> float:
    """Mean CPU milliseconds of one forecast() with a full history, on a latent of this shape."""
    spectrum = Spectrum(steps)
    rng = np.random.default_rng(0)
    while not spectrum.should_skip():
        spectrum.record(latent, rng.standard_normal(latent.shape, dtype=np.float32))
    start = time.process_time()
    for _ in range(rounds):
        spectrum.forecast(latent)
        spectrum.withdraw_forecast()
    return (time.process_time() - start) / rounds * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="model directory (default: a random set of --preset)")
    parser.add_argument("--preset", default="mid")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)

    with tempfile.TemporaryDirectory() as tmp:
        files = from_model_dir(args.model) if args.model else write_model_set(Path(tmp) / args.preset, args.preset)
        pipeline = AnimaPipeline(files, keep_dit=True)
        conditioning = pipeline.encode("a cute anime girl in a flower field", "worst quality")
        best: dict[str, float] = {}
        computed: dict[str, int] = {}
        for _ in range(args.repeat):
            for cache in ("none", "spectrum"):
                params = GenerationParams(prompt="", width=args.size, height=args.size, steps=args.steps,
                                          cache=cache)
                start = time.process_time()
                denoised = pipeline.denoise(conditioning, params)
                elapsed = time.process_time() - start
                best[cache] = min(best.get(cache, float("inf")), elapsed)
                computed[cache] = len(denoised.sample.computed_steps)

    ideal = computed["none"] / computed["spectrum"]
    measured = best["none"] / best["spectrum"]
    skipped = args.steps - computed["spectrum"]
    per_forecast = forecast_ms(args.steps, initial_noise(0, args.size, args.size))
    print(f"{args.preset} model, {args.size}x{args.size}, {args.steps} steps, CFG 4, 1 thread, "
          f"process CPU time, best of {args.repeat} interleaved runs\n")
    print("| | uncached | spectrum |")
    print("|---|---|---|")
    print(f"| computed steps | {computed['none']} | {computed['spectrum']} |")
    print(f"| denoise CPU time | {best['none']:.2f} s | {best['spectrum']:.2f} s |")
    print(f"| speedup (ideal {ideal:.3f}x) | | {measured:.3f}x = {measured / ideal:.3f} of ideal |")
    print(f"| forecast per skipped step | | {per_forecast:.2f} ms ({skipped} skipped: "
          f"{per_forecast * skipped / 1e3 / best['spectrum'] * 100:.3f}% of denoise) |")


if __name__ == "__main__":
    main()
