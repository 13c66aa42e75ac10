"""The Euler sampler for rectified flow, with a step cache deciding which steps call the model.

Every finished step is reported through one callback with a StepEvent: the progress bar, the bench's per-step
data, live previews and resume checkpoints all listen there, and nothing else reaches into the loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import AnimaError
from .caches import CachePolicy

# denoise(x, sigma, step) -> guided x0; step is 1-based.
Denoiser = Callable[[np.ndarray, float, int], np.ndarray]


@dataclass(frozen=True)
class StepEvent:
    """One finished sampler step. The arrays are the sampler's own: read them, copy them, never change them."""

    step: int  # 1-based
    total: int
    sigma: float  # this step went from sigma ...
    sigma_next: float  # ... to sigma_next
    x: np.ndarray  # the latent after the step (float32)
    x0: np.ndarray  # the denoised estimate the step used: the model's, or the cache's forecast
    computed: bool  # the model ran on this step (False: a forecast was used)
    recomputed: bool  # a non-finite forecast was refused and the model ran instead
    seconds: float  # wall time of this step
    elapsed_s: float  # wall time of this call's steps so far (a resumed run counts from where it resumed)
    eta_s: float  # seconds left at this run's mean step time so far
    cache_state: dict[str, Any]  # the cache after this step, for a resume (CachePolicy.state())


StepCallback = Callable[[StepEvent], None]


@dataclass
class SampleResult:
    latent: np.ndarray  # float32
    computed_steps: list[int]  # 1-based, including recomputed ones
    skipped_steps: list[int]  # 1-based, forecasts that were used
    recomputed_steps: list[int]  # 1-based: forecast rejected as non-finite, model run instead
    model_calls: int  # in this call (a resumed run counts from where it resumed)
    finite: bool
    error_estimate: float | None = None  # the cache's own estimate of its distance from the uncached run


def _euler_step(x: np.ndarray, x0: np.ndarray, sigma: float, sigma_next: float) -> np.ndarray:
    velocity = (x - x0) / sigma
    return (x + (sigma_next - sigma) * velocity).astype(np.float32, copy=False)


def _check_inputs(sigmas: np.ndarray, cache: CachePolicy, start: int) -> None:
    if sigmas.ndim != 1 or len(sigmas) < 2:
        raise AnimaError("sigmas must be a 1-D list of at least two values")
    if not (np.isfinite(sigmas).all() and (sigmas[:-1] > 0).all()):
        raise AnimaError("every sigma but the last must be a positive finite number")
    if cache.num_steps != len(sigmas) - 1:
        raise AnimaError(f"cache is set up for {cache.num_steps} steps but there are {len(sigmas) - 1} sigmas")
    if not 0 <= start < len(sigmas) - 1:
        raise AnimaError(f"a run of {len(sigmas) - 1} steps cannot start after step {start}")
    if len(cache.computed_steps) + len(cache.skipped_steps) != start:
        raise RuntimeError("this cache has already run; make a new cache for every run (or restore its state)")


def sample_euler(denoise: Denoiser, x: np.ndarray, sigmas: np.ndarray, cache: CachePolicy,
                 callback: StepCallback | None = None, *, start: int = 0,
                 recomputed: list[int] | None = None) -> SampleResult:
    """Integrate x from sigmas[start] down to sigmas[-1].

    `x` is the initial noise (scaled by sigmas[0]), or, resuming, the latent after `start` steps with the cache
    restored to its state after that step and `recomputed` holding the steps recomputed so far.
    """
    sigmas = np.asarray(sigmas, dtype=np.float64)
    _check_inputs(sigmas, cache, start)
    cache.set_sigmas(sigmas)
    x = np.asarray(x, dtype=np.float32)
    total = len(sigmas) - 1
    recomputed = list(recomputed or [])
    model_calls, began = 0, time.perf_counter()
    for index in range(start, total):
        step, started = index + 1, time.perf_counter()
        # Python floats keep the float32 latent float32 (NumPy scalars would promote it).
        sigma, sigma_next = float(sigmas[index]), float(sigmas[index + 1])
        skipped = cache.should_skip()
        refused = False
        if skipped:
            # Overflow here is caught just below and answered with a model call, so it's no warning.
            with np.errstate(over="ignore", invalid="ignore"):
                x0 = cache.forecast()
                x_next = _euler_step(x, x0, sigma, sigma_next)
            # A non-finite forecast always gives a non-finite latent, so one check covers both.
            if not np.isfinite(x_next).all():
                cache.withdraw_forecast()
                recomputed.append(step)
                skipped, refused = False, True
        if not skipped:
            x0 = denoise(x, sigma, step)
            model_calls += 1
            cache.record(x0)
            x_next = _euler_step(x, x0, sigma, sigma_next)
        x = x_next
        if callback is not None:
            now = time.perf_counter()
            done = step - start
            callback(StepEvent(step, total, sigma, sigma_next, x, x0, not skipped, refused, now - started,
                               now - began, (now - began) / done * (total - step), cache.state()))
    return SampleResult(latent=x, computed_steps=cache.computed_steps, skipped_steps=cache.skipped_steps,
                        recomputed_steps=recomputed, model_calls=model_calls, finite=bool(np.isfinite(x).all()),
                        error_estimate=cache.error_estimate)
