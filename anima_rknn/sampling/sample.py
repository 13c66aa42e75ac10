"""One loop for every sampler: the step cache wraps the denoiser, the noise is keyed by (seed, step), and every
finished step is reported through one callback.

The cache decides per model call whether the network runs or its forecast of x0 stands in (as
stable-diffusion.cpp's caches do), so no sampler knows which cache runs: a cache's steps are model calls, one
per sampler step for most samplers, two for heun, dpmpp_sde and sa_solver_pece (their warm-up, window and stop
count calls). The progress bar, the bench's per-step data, live previews and resume checkpoints all listen to
the StepEvents, and nothing else reaches into the loop.

Asked to (keep_snapshot), the loop keeps a snapshot of itself after the last step before the cache's first
forecast, and hands it back with the result: what auto's verify re-runs uncached from (sampling/rerun.py).

A run ends early in two ways: at the first step whose latent is not finite (no later step could mend it, and no
listener is told of it, so no checkpoint holds it), and when `interrupt()` turns true after a step, with that
step's x0 as its result (as WebUI answers an interrupt: the picture as far as it got).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import AnimaError
from .cache_seam import CachePolicy
from .inpaint import Inpaint
from .samplers import History, Sampler, StepContext, call_sigmas

# denoise(x, sigma) -> guided x0: one run of the network (two passes under CFG); for a guided sampler
# (Sampler.guided) -> (guided x0, unconditional x0) of that run, the same array twice where CFG is off.
Denoiser = Callable[[np.ndarray, float], np.ndarray | tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class StepEvent:
    """One finished sampler step. The arrays are the sampler's own: read them, copy them, never change them."""

    step: int  # 1-based
    total: int
    sigma: float  # this step went from sigma ...
    sigma_next: float  # ... to sigma_next
    x: np.ndarray  # the latent after the step (float32)
    x0: np.ndarray  # the denoised estimate the step reported: the model's, or the cache's forecast
    computed: bool  # the model ran for every call of this step (False: a forecast stood in for one at least)
    recomputed: bool  # a non-finite forecast was refused and the model ran instead
    seconds: float  # wall time of this step
    elapsed_s: float  # wall time of this call's steps so far (a resumed run counts from where it resumed)
    eta_s: float  # seconds left at this run's mean step time so far
    cache_state: dict[str, Any]  # the cache after this step, for a resume (CachePolicy.state())
    model_calls: int = 1  # times the network ran in this step (heun: 2, a forecast step: 0)
    sampler_state: dict[str, Any] | None = None  # the sampler's history and refused forecasts, for a resume


StepCallback = Callable[[StepEvent], None]


@dataclass
class SampleResult:
    latent: np.ndarray  # float32
    computed_steps: list[int]  # the cache's model calls that ran the network, 1-based (= steps for one call a step)
    skipped_steps: list[int]  # ... and those a forecast stood in for
    recomputed_steps: list[int]  # ... forecasts refused as non-finite, the network run instead
    model_calls: int  # in this call (a resumed run counts from where it resumed)
    finite: bool
    error_estimate: float | None = None  # the cache's own estimate of its distance from the uncached run
    may_differ: bool | None = None  # the cache's flag: the image may differ visibly from the uncached one
    rerun_from: int | None = None  # verify re-ran the steps after this one uncached (model_calls counts both)
    interrupted_at: int | None = None  # interrupted after this step: `latent` is that step's x0
    nonfinite_at: int | None = None  # the step whose latent turned NaN/Inf: the run ended there
    # keep_snapshot's: the loop after the last step before the first forecast ({"step", "latent", "recomputed",
    # "history"}; None: not kept, or the run forecast nothing before it ended)
    snapshot: dict[str, Any] | None = None


def step_noise(seed: int, shape: tuple[int, ...]) -> Callable[[int, int], np.ndarray]:
    """noise(step index, draw) of a run of `seed`: drawn from a generator keyed by (seed, step, draw) alone, so a
    forecast step, a resume or another sampler's number of draws cannot shift what any step draws."""

    def draw(index: int, number: int) -> np.ndarray:
        return np.random.default_rng([seed, index, number]).standard_normal(shape, dtype=np.float32)

    return draw


class _CachedModel:
    """The model as a sampler sees it: per call, the cache's forecast of x0 or the network's. A guided sampler's
    denoiser returns (guided x0, unconditional x0), and the cache sees the two stacked as one x0 (the latent
    stacked likewise): every policy forecasts the unconditional x0 by its own rule for x0, state and resume
    included."""

    def __init__(self, denoise: Denoiser, cache: CachePolicy, recomputed: list[int], calls_before: int,
                 guided: bool = False, on_call: Callable[[int], None] | None = None) -> None:
        self.denoise, self.cache, self.recomputed = denoise, cache, recomputed
        self.guided, self.on_call = guided, on_call
        self.runs = self.forecasts = self.refusals = 0
        self.calls = calls_before

    def __call__(self, x: np.ndarray, sigma: float) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        self.calls += 1
        call = self.calls
        if self.on_call is not None:
            self.on_call(call)
        seen = np.stack([x, x]) if self.guided else x
        if self.cache.should_skip(seen):
            # A forecast that overflowed is refused just below and answered with a model call: no warning.
            with np.errstate(over="ignore", invalid="ignore"):
                x0 = self.cache.forecast(seen)
            if np.isfinite(x0).all():
                self.forecasts += 1
                return self._answer(x0)
            self.cache.withdraw_forecast()
            self.recomputed.append(call)
            self.refusals += 1
        x0 = self.denoise(x, sigma)
        if self.guided:
            x0 = _stacked_pair(x0, x)
        self.runs += 1
        self.cache.record(seen, x0)
        return self._answer(x0)

    def _answer(self, x0: np.ndarray) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        return (x0[0], x0[1]) if self.guided else x0


def _stacked_pair(pair: object, x: np.ndarray) -> np.ndarray:
    """A guided denoiser's answer as one array [guided, unconditional], refused if it is not such a pair."""
    if not (isinstance(pair, tuple) and len(pair) == 2 and all(
            isinstance(a, np.ndarray) and a.shape == x.shape for a in pair)):
        raise TypeError("a guided sampler's denoiser returns (guided x0, unconditional x0), each shaped like x")
    return np.stack(pair)


class _MaskedModel:
    """The model inpainting `inpaint`'s mask: outside it, the original on its trajectory in, the original out (both
    x0 of a guided sampler's pair)."""

    def __init__(self, model: _CachedModel, inpaint: Inpaint) -> None:
        self.model, self.inpaint = model, inpaint

    def __call__(self, x: np.ndarray, sigma: float) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        x0 = self.model(self.inpaint.blend(x, sigma), sigma)
        if isinstance(x0, tuple):
            return self.inpaint.blend(x0[0], 0.0), self.inpaint.blend(x0[1], 0.0)
        return self.inpaint.blend(x0, 0.0)


def _check_inputs(sigmas: np.ndarray, cache: CachePolicy, calls: int, start: int) -> None:
    if sigmas.ndim != 1 or len(sigmas) < 2:
        raise AnimaError("sigmas must be a 1-D list of at least two values")
    if not (np.isfinite(sigmas).all() and (sigmas[:-1] > 0).all()):
        raise AnimaError("every sigma but the last must be a positive finite number")
    if not 0 <= start < len(sigmas) - 1:
        raise AnimaError(f"a run of {len(sigmas) - 1} steps cannot start after step {start}")
    if cache.num_steps != calls:
        raise AnimaError(f"cache is set up for {cache.num_steps} model calls but the sampler makes {calls}")


def sample(sampler: Sampler, denoise: Denoiser, x: np.ndarray, sigmas: np.ndarray, cache: CachePolicy,
           callback: StepCallback | None = None, *, seed: int | None = None, eta: float = 1.0, s_noise: float = 1.0,
           start: int = 0, state: dict[str, Any] | None = None, inpaint: Inpaint | None = None,
           interrupt: Callable[[], bool] | None = None, keep_snapshot: bool = False,
           on_call: Callable[[int], None] | None = None) -> SampleResult:
    """Run `sampler` from sigmas[start] down to sigmas[-1].

    `x` is the initial noise (scaled by sigmas[0]), or, resuming, the latent after `start` steps with the cache
    restored to its state after that step and `state` the sampler_state of that step's event. The noise is
    drawn by step_noise(seed); a sampler that draws none needs no seed. A guided sampler's `denoise` returns
    (guided x0, unconditional x0) (Denoiser). The cache is made for
    len(call_sigmas(sampler, sigmas)) calls. `inpaint` holds the part outside its mask on the original's
    trajectory (sampling.inpaint); `x` is then the original noised to sigmas[start]. `interrupt()`, asked after
    every step but the last (once its listener is told), ends the run there with the step's x0 as the latent.
    `keep_snapshot`: keep the snapshot (SampleResult.snapshot), also in every event's sampler_state["trusted"] so
    that a resume brings it along (a resumed run keeps it on only when its state holds one). `on_call(n)` is told
    the number of each model call (1-based, as the cache counts them) before the cache decides it: prompt editing's
    conditioning per call listens (generation/prompt_schedule.py).
    """
    sigmas = np.asarray(sigmas, dtype=np.float64)
    planned = call_sigmas(sampler, sigmas) if sigmas.ndim == 1 and len(sigmas) >= 2 else []
    _check_inputs(sigmas, cache, len(planned), start)
    done_before = len(call_sigmas(sampler, sigmas[: start + 1]))
    cache.set_sigmas(np.array([*planned, sigmas[-1]]), fresh_noise=sampler.adds_noise(eta, s_noise))
    if cache.report().calls != done_before:
        raise RuntimeError("this cache has already run; make a new cache for every run (or restore its state)")
    state = state or {}
    history: History = {key: [np.array(a, copy=True) for a in arrays]
                        for key, arrays in state.get("history", {}).items()}
    recomputed = [int(call) for call in state.get("recomputed", [])]
    x = np.asarray(x, dtype=np.float32)
    draw_noise = _no_noise if seed is None else step_noise(seed, x.shape)
    model = _CachedModel(denoise, cache, recomputed, done_before, sampler.guided, on_call)
    step_model = model if inpaint is None else _MaskedModel(model, inpaint)
    trusted: dict[str, Any] | None = state.get("trusted")  # the snapshot (a resume brings it along)
    snapshotting = keep_snapshot and (start == 0 or trusted is not None)
    total, began = len(sigmas) - 1, time.perf_counter()
    for index in range(start, total):
        step, started = index + 1, time.perf_counter()
        runs, forecasts, refusals = model.runs, model.forecasts, model.refusals
        ctx = StepContext(sigmas, index, draw_noise, float(eta), float(s_noise))
        x, x0, history = sampler.step(step_model, x, ctx, history)
        if inpaint is not None:
            x = inpaint.blend(x, float(sigmas[index + 1]))
        if not np.isfinite(x).all():
            return _result(x, cache, recomputed, model, trusted, nonfinite_at=step)
        sampler_state: dict[str, Any] = {"history": history, "recomputed": list(recomputed)}
        if snapshotting:
            if not cache.report().skipped_steps:
                trusted = {"step": step, "latent": np.array(x, copy=True), "recomputed": list(recomputed),
                           "history": {key: list(arrays) for key, arrays in history.items()}}
            sampler_state["trusted"] = trusted
        if callback is not None:
            now = time.perf_counter()
            callback(StepEvent(step, total, float(sigmas[index]), float(sigmas[index + 1]), x, x0,
                               model.forecasts == forecasts, model.refusals > refusals, now - started,
                               now - began, (now - began) / (step - start) * (total - step), cache.state(),
                               model.runs - runs, sampler_state))
        if interrupt is not None and step < total and interrupt():
            return _result(np.array(x0, dtype=np.float32), cache, recomputed, model, trusted, interrupted_at=step)
    return _result(x, cache, recomputed, model, trusted)


def _result(latent: np.ndarray, cache: CachePolicy, recomputed: list[int], model: _CachedModel,
            snapshot: dict[str, Any] | None, interrupted_at: int | None = None,
            nonfinite_at: int | None = None) -> SampleResult:
    report = cache.report()
    return SampleResult(latent=latent, computed_steps=report.computed_steps, skipped_steps=report.skipped_steps,
                        recomputed_steps=list(recomputed), model_calls=model.runs,
                        finite=bool(np.isfinite(latent).all()), error_estimate=report.error_estimate,
                        may_differ=report.may_differ, interrupted_at=interrupted_at, nonfinite_at=nonfinite_at,
                        snapshot=snapshot)


def _no_noise(index: int, draw: int) -> np.ndarray:
    raise RuntimeError("this sampler draws noise: give the run a seed")
