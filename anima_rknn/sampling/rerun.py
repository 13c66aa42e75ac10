"""auto's verify, above the sampler loop: a run its cache flags (may_differ) after forecasting is thrown away from
its first forecast on and run again uncached from the snapshot the loop handed back (sample(keep_snapshot=True)),
the listeners told those steps again. The cache's own seam knows nothing of it: the re-run is a second sample()
with an UncachedRerun policy.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from .cache_seam import CachePolicy
from .caches import UncachedRerun
from .sample import Denoiser, SampleResult, StepCallback, StepEvent, sample
from .samplers import Sampler, call_sigmas


def sample_verified(sampler: Sampler, denoise: Denoiser, x: np.ndarray, sigmas: np.ndarray, cache: CachePolicy,
                    callback: StepCallback | None = None, *, verify: bool, start: int = 0,
                    state: dict[str, Any] | None = None, **options: Any) -> SampleResult:
    """sample(), and with `verify` the flagged run re-run uncached from its snapshot. `options` are sample()'s
    (seed, eta, s_noise, inpaint, interrupt). A run resumed inside a re-run (its cache an UncachedRerun) reports
    the step it re-ran from."""
    sigmas = np.asarray(sigmas, dtype=np.float64)
    began = time.perf_counter()
    first = sample(sampler, denoise, x, sigmas, cache, callback, start=start, state=state,
                   keep_snapshot=verify, **options)
    if isinstance(cache, UncachedRerun):
        return dataclasses.replace(first, rerun_from=_step_of_call(sampler, sigmas, cache.kept), snapshot=None)
    snapshot = first.snapshot
    if not (verify and first.may_differ and first.skipped_steps and snapshot is not None and first.finite
            and first.interrupted_at is None):
        return dataclasses.replace(first, snapshot=None)
    step = snapshot["step"]
    rerun = UncachedRerun(cache.num_steps, len(call_sigmas(sampler, sigmas[: step + 1])), True)
    spent = time.perf_counter() - began
    listener = None if callback is None else _later(callback, spent)
    again = sample(sampler, denoise, np.array(snapshot["latent"], copy=True), sigmas, rerun, listener, start=step,
                   state={"history": snapshot["history"], "recomputed": snapshot["recomputed"]}, **options)
    return dataclasses.replace(again, model_calls=first.model_calls + again.model_calls, rerun_from=step)


def _later(callback: StepCallback, spent: float) -> StepCallback:
    """The re-run's events with the first run's time in their elapsed time, as one call's events."""
    def listen(event: StepEvent) -> None:
        callback(dataclasses.replace(event, elapsed_s=event.elapsed_s + spent))
    return listen


def _step_of_call(sampler: Sampler, sigmas: np.ndarray, calls: int) -> int:
    """The step whose end `calls` model calls reach."""
    return next(k for k in range(len(sigmas)) if len(call_sigmas(sampler, sigmas[: k + 1])) == calls)
