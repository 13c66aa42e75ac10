"""The Euler sampler for rectified flow, with a step cache deciding which steps call the model."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import AnimaError
from .caches import CachePolicy

# denoise(x, sigma, step) -> guided x0; step is 1-based.
Denoiser = Callable[[np.ndarray, float, int], np.ndarray]
# callback(step, total, skipped); step is 1-based.
StepCallback = Callable[[int, int, bool], None]


@dataclass
class SampleResult:
    latent: np.ndarray  # float32
    computed_steps: list[int]  # 1-based, including recomputed ones
    skipped_steps: list[int]  # 1-based, forecasts that were used
    recomputed_steps: list[int]  # 1-based: forecast rejected as non-finite, model run instead
    model_calls: int
    finite: bool
    step_times: list[float]  # wall seconds per step
    x0_history: list[np.ndarray] | None = None  # the x0 each step used, when keep_x0=True


def _euler_step(x: np.ndarray, x0: np.ndarray, sigma: float, sigma_next: float) -> np.ndarray:
    velocity = (x - x0) / sigma
    return (x + (sigma_next - sigma) * velocity).astype(np.float32, copy=False)


def _check_inputs(sigmas: np.ndarray, cache: CachePolicy) -> None:
    if sigmas.ndim != 1 or len(sigmas) < 2:
        raise AnimaError("sigmas must be a 1-D list of at least two values")
    if not (np.isfinite(sigmas).all() and (sigmas[:-1] > 0).all()):
        raise AnimaError("every sigma but the last must be a positive finite number")
    if cache.num_steps != len(sigmas) - 1:
        raise AnimaError(f"cache is set up for {cache.num_steps} steps but there are {len(sigmas) - 1} sigmas")
    if cache.computed_steps or cache.skipped_steps:
        raise RuntimeError("this cache has already run; make a new cache for every run")


def sample_euler(denoise: Denoiser, x: np.ndarray, sigmas: np.ndarray, cache: CachePolicy,
                 callback: StepCallback | None = None, *, keep_x0: bool = False) -> SampleResult:
    """Integrate x from sigmas[0] down to sigmas[-1]; `x` is the initial noise (scaled by sigmas[0])."""
    sigmas = np.asarray(sigmas, dtype=np.float64)
    _check_inputs(sigmas, cache)
    x = np.asarray(x, dtype=np.float32)
    total = len(sigmas) - 1
    recomputed: list[int] = []
    step_times: list[float] = []
    x0_history: list[np.ndarray] | None = [] if keep_x0 else None
    model_calls = 0
    for index in range(total):
        step, started = index + 1, time.perf_counter()
        # Python floats keep the float32 latent float32 (NumPy scalars would promote it).
        sigma, sigma_next = float(sigmas[index]), float(sigmas[index + 1])
        skipped = cache.should_skip()
        if skipped:
            # Overflow here is caught just below and answered with a model call, so it's no warning.
            with np.errstate(over="ignore", invalid="ignore"):
                x0 = cache.forecast()
                x_next = _euler_step(x, x0, sigma, sigma_next)
            # A non-finite forecast always gives a non-finite latent, so one check covers both.
            if not np.isfinite(x_next).all():
                cache.withdraw_forecast()
                recomputed.append(step)
                skipped = False
        if not skipped:
            x0 = denoise(x, sigma, step)
            model_calls += 1
            cache.record(x0)
            x_next = _euler_step(x, x0, sigma, sigma_next)
        if x0_history is not None:
            x0_history.append(np.array(x0, copy=True))
        x = x_next
        step_times.append(time.perf_counter() - started)
        if callback is not None:
            callback(step, total, skipped)
    return SampleResult(latent=x, computed_steps=cache.computed_steps, skipped_steps=cache.skipped_steps,
                        recomputed_steps=recomputed, model_calls=model_calls, finite=bool(np.isfinite(x).all()),
                        step_times=step_times, x0_history=x0_history)
