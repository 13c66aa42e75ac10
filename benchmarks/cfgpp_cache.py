"""The step caches under CFG++ UD10 AB, which reads the unconditional x0 of every call beside the guided one: what
forecasting both costs, and how far the cached runs land from the uncached ones, on the Gaussian-mixture bed.

The sampling loop hands a cache the two x0 stacked as one array (sampling/sample.py), so every policy forecasts the
unconditional x0 by its own rule for x0. Compared here, per cache, at CFG 2 and the same noise:
- `cfgpp, both`: what ships (both forecast);
- `cfgpp, held`: the guided x0 forecast, the unconditional one held at its last computed value (what a cache that
  knew only the guided x0 could do), to show what forecasting both buys;
- `euler`: the same cache under euler, the error users already accept from it.
The error is ||x_cached - x_uncached|| / ||x_uncached|| of the final latent, per noise row (median and worst), over
three beds (make_testbed seeds 0-2, dim 64). The fixed schedules run all rows as one batch (their forecast weights
do not depend on the values); auto decides from the values, so it runs row by row (fewer rows). The cost: one
forecast's time and the cache state's bytes for a 1024x1024 image's latent (16x128x128), one x0 against two.

    python benchmarks/cfgpp_cache.py [--rows 64] [--auto-rows 12]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from anima_rknn.sampling.caches import make_cache
from anima_rknn.sampling.sample import sample
from anima_rknn.sampling.samplers import SAMPLERS
from anima_rknn.sampling.schedule import flow_sigmas

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "sampling"))
from mixture import cfg_denoiser, initial_noise, make_testbed, model_for  # noqa: E402

CACHES = ("spectrum", "spectrum-plus", "reuse", "auto")
CFG = 2.0


class HeldUncond:
    """A cache that forecasts the guided half of the stacked pair and holds the unconditional half at its last
    computed value (the comparison, not a shipped policy)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.num_steps = inner, inner.name, inner.num_steps
        self.last: np.ndarray | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def record(self, x: np.ndarray, x0: np.ndarray) -> None:
        self.last = np.array(x0[1], copy=True)
        self.inner.record(x, x0)

    def forecast(self, x: np.ndarray) -> np.ndarray:
        forecast = self.inner.forecast(x)
        forecast[1] = self.last
        return forecast


def _run(name: str, denoise: Any, noise: np.ndarray, steps: int, cache: str, held: bool = False) -> np.ndarray:
    sampler, sigmas = SAMPLERS[name], flow_sigmas(steps, 3.0)
    policy = make_cache(cache, steps)
    return sample(sampler, model_for(sampler, denoise), noise, sigmas, HeldUncond(policy) if held else policy).latent


def errors(name: str, denoise: Any, noise: np.ndarray, steps: int, cache: str, held: bool = False) -> np.ndarray:
    rows = [noise] if cache != "auto" else [row[None] for row in noise]
    reference = _run(name, denoise, noise, steps, "none")
    cached = np.concatenate([_run(name, denoise, r, steps, cache, held) for r in rows])
    return np.linalg.norm(cached - reference, axis=1) / np.linalg.norm(reference, axis=1)


def cost(cache: str, guided: bool, repeats: int = 5) -> tuple[float, int]:
    """One forecast's milliseconds (best of `repeats`) and the state's bytes, a 16x128x128 latent after 6 calls."""
    rng = np.random.default_rng(0)
    latent = rng.standard_normal((1, 16, 128, 128)).astype(np.float32)
    seen = np.stack([latent, latent]) if guided else latent
    policy = make_cache(cache, 20)
    policy.set_sigmas(flow_sigmas(20, 3.0))
    for _ in range(6):
        policy.record(seen, rng.standard_normal(seen.shape).astype(np.float32))
    state = policy.state()
    size = sum(a.nbytes for v in state.values() for a in (v if isinstance(v, list) else [v])
               if isinstance(a, np.ndarray))
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        policy.forecast(seen)
        best = min(best, time.perf_counter() - began)
        policy.withdraw_forecast()
    return best * 1e3, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--auto-rows", type=int, default=12)
    parser.add_argument("--steps", type=int, nargs="+", default=[20, 30])
    args = parser.parse_args()
    beds = [make_testbed(dim=64, components=8, std=0.35, seed=seed) for seed in range(3)]
    print("| cache | steps | cfgpp, both: median / worst | cfgpp, held: median / worst | euler: median / worst |")
    print("|---|---|---|---|---|")
    for cache in CACHES:
        rows = args.auto_rows if cache == "auto" else args.rows
        for steps in args.steps:
            found = {key: [] for key in ("both", "held", "euler")}
            for seed, (cond, uncond) in enumerate(beds):
                denoise = cfg_denoiser(cond, uncond, CFG)
                noise = initial_noise(64, range(100 * seed, 100 * seed + rows))
                found["both"].append(errors("cfgpp_ud10_ab", denoise, noise, steps, cache))
                found["held"].append(errors("cfgpp_ud10_ab", denoise, noise, steps, cache, held=True))
                found["euler"].append(errors("euler", denoise, noise, steps, cache))
            cells = [f"{np.median(np.concatenate(v)):.4f} / {np.max(np.concatenate(v)):.4f}" for v in found.values()]
            print(f"| {cache} | {steps} | " + " | ".join(cells) + " |")
    print("\n| cache | forecast ms, one x0 | forecast ms, two | state MiB, one x0 | state MiB, two |")
    print("|---|---|---|---|---|")
    for cache in CACHES:
        (one_ms, one_bytes), (two_ms, two_bytes) = cost(cache, False), cost(cache, True)
        print(f"| {cache} | {one_ms:.1f} | {two_ms:.1f} | {one_bytes / 2**20:.0f} | {two_bytes / 2**20:.0f} |")


if __name__ == "__main__":
    main()
