"""`anima-rknn calibrate-cache`: fit a model's cache numbers (sampling.cache_fit) from uncached runs.

First every prompt runs uncached; a recording policy (the cache seam alone, plus the check capability for the
first block's tokens) keeps each call's sigma, latent, x0 and first-block tokens. From those trajectories, for
every call k and distance d = 1-4, auto's own forecasters are replayed as if the calls k-d and k-d-1 had been the
last two computed:
  - typical_probe_miss (check): ln of the first-block tokens' miss from their damped line
    = a + b sigma + (c + e sigma) ln d;
  - plan_growth (a budget's plan): ln(x0 forecast's miss at d / its miss at d = 1) = (g0 + g1 sigma) ln d.
Then every prompt runs cached, `auto` at a few budgets planned with that growth, and the misses those runs
measure (each computed call's, against the forecast from the two computed before it, at its distance d from the
last) give what the flag compares a run with, as it was first fitted (cached runs are off the uncached path):
  - typical_miss (the flag): ln miss = a + b ln d + c sigma + e sigma ln d.
Each is least squares over the fit prompts; its residual sd (natural log) there and on the held-out prompts is
written into fit_error. flag_sigma, flag_score, plan_gain and plan_sigma are choices made by image-quality sweeps
of cached runs (docs/research/auto-cache-constants.md): they are in units of the fitted numbers, are kept as chosen
on the demo model, and the file says so in fitted_on.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.tensorfile import fingerprint
from ..errors import AnimaError
from ..generation.params import GenerationParams, uncached
from ..generation.pipeline import AnimaPipeline
from ..sampling.auto_cache import AutoCache, forecast_x0, probe_miss
from ..sampling.cache_fit import CacheFit
from ..sampling.cache_seam import Probe
from ..sampling.caches import NoCache
from ..sampling.sample import StepCallback

DISTANCES = (1, 2, 3, 4)
MIN_FIT_PROMPTS, MIN_HELD_OUT = 2, 1
# The choices (not fits) kept from the demo model's quality sweeps (docs/research/auto-cache-constants.md).
CHOSEN = {"flag_sigma": 0.8, "flag_score": 1.3, "plan_gain": 1.0, "plan_sigma": 0.8}


@dataclass
class Call:
    sigma: float
    x: np.ndarray  # the latent the model was asked about (flat float32)
    x0: np.ndarray  # the model's x0 (flat float32)
    tokens: np.ndarray  # the first block's output of the positive prompt's pass (flat float32)


class Recorder(NoCache):
    """A step cache that computes every call and keeps it (the seam, as NoCache, and the check capability,
    ChecksForecasts, for the first block's tokens)."""

    name = "record"
    check = True

    def __init__(self, num_steps: int) -> None:
        super().__init__(num_steps)
        self.calls: list[Call] = []
        self._sigmas: list[float] = []
        self._probe: Probe | None = None

    def attach_probe(self, probe: Probe) -> None:
        self._probe = probe

    def set_sigmas(self, sigmas: np.ndarray, fresh_noise: bool = False) -> None:
        self._sigmas = [float(s) for s in sigmas]

    def record(self, x: np.ndarray, x0: np.ndarray) -> None:
        super().record(x, x0)
        tokens = self._probe.last()
        self.calls.append(Call(self._sigmas[len(self.calls)], np.asarray(x, np.float32).ravel().copy(),
                               np.asarray(x0, np.float32).ravel().copy(), np.asarray(tokens, np.float32).ravel().copy()))

    def restore(self, state: dict[str, Any]) -> None:
        raise AnimaError("a calibration run is not resumed: run calibrate-cache again")


@dataclass
class Rows:
    """The replayed misses of some trajectories: (sigma, d, miss) of the x0 forecast and of the tokens' line,
    and (sigma, d, miss at d over miss at 1) for the growth."""

    x0: list[tuple[float, int, float]] = field(default_factory=list)  # measured in cached runs
    tokens: list[tuple[float, int, float]] = field(default_factory=list)
    growth: list[tuple[float, int, float]] = field(default_factory=list)


def _eps(call: Call) -> np.ndarray:
    """The noise the call's x0 implies, as auto keeps it (float32)."""
    return ((call.x.astype(np.float64) - (1.0 - call.sigma) * call.x0) / call.sigma).astype(np.float32)


def replay(calls: Sequence[Call], rows: Rows) -> None:
    """Add one trajectory's misses to `rows` (finite, positive misses only: a log needs them)."""
    eps = [_eps(c) for c in calls]
    for k in range(2, len(calls)):
        call, first = calls[k], None
        for d in DISTANCES:
            if k - d - 1 < 0:
                break
            a, b = k - d, k - d - 1
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                predicted = forecast_x0(call.sigma, call.x, (calls[a].sigma, calls[a].x0, eps[a]),
                                        (calls[b].sigma, calls[b].x0, eps[b]))
                miss = float(np.linalg.norm(predicted - call.x0) / np.linalg.norm(call.x0.astype(np.float64)))
            token_miss = probe_miss(call.tokens, call.sigma, (calls[a].sigma, calls[a].tokens),
                                    (calls[b].sigma, calls[b].tokens))
            if math.isfinite(miss) and miss > 0:
                first = miss if d == 1 else first
                if d > 1 and first is not None:
                    rows.growth.append((call.sigma, d, miss / first))
            if math.isfinite(token_miss) and token_miss > 0:
                rows.tokens.append((call.sigma, d, token_miss))


def _design(kind: str, sigma: np.ndarray, log_d: np.ndarray) -> np.ndarray:
    if kind == "x0":  # a + b ln d + c sigma + e sigma ln d
        return np.stack([np.ones_like(sigma), log_d, sigma, sigma * log_d], 1)
    if kind == "tokens":  # a + b sigma + (c + e sigma) ln d
        return np.stack([np.ones_like(sigma), sigma, log_d, sigma * log_d], 1)
    return np.stack([log_d, sigma * log_d], 1)  # growth: (g0 + g1 sigma) ln d


def _columns(rows: list[tuple[float, int, float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r = np.array(rows, dtype=np.float64).reshape(-1, 3)
    return r[:, 0], np.log(r[:, 1]), np.log(r[:, 2])


def fit_rows(kind: str, rows: list[tuple[float, int, float]]) -> np.ndarray:
    sigma, log_d, target = _columns(rows)
    design = _design(kind, sigma, log_d)
    if len(target) < 2 * design.shape[1] or np.linalg.matrix_rank(design) < design.shape[1]:
        raise AnimaError(f"too few calls to fit the cache numbers ({len(target)} misses of the {kind} forecast): "
                         "give more prompts or more steps")
    return np.linalg.lstsq(design, target, rcond=None)[0]


def residual_sd(kind: str, coef: np.ndarray, rows: list[tuple[float, int, float]]) -> float:
    sigma, log_d, target = _columns(rows)
    return float(np.sqrt(np.mean((target - _design(kind, sigma, log_d) @ coef) ** 2)))


@dataclass
class Calibration:
    fit: CacheFit
    runs: int
    calls: int


def split_prompts(prompts: Sequence[str], held_out: int) -> tuple[list[str], list[str]]:
    """(fit prompts, held-out prompts): the last `held_out` are held out."""
    prompts = [p for p in prompts if p.strip()]
    if held_out < MIN_HELD_OUT or len(prompts) - held_out < MIN_FIT_PROMPTS:
        raise AnimaError(f"calibrate-cache needs at least {MIN_FIT_PROMPTS} prompts to fit on and "
                         f"{MIN_HELD_OUT} held out to check the fit on; got {len(prompts)} prompts, "
                         f"{held_out} held out")
    return prompts[:-held_out], prompts[-held_out:]


def budgets(steps: int) -> list[int]:
    """The budgets the flag's misses are measured at: 30-80 % of the steps (6-16 of 20, as first fitted)."""
    return sorted({min(steps - 1, max(3, round(steps * share))) for share in (0.3, 0.4, 0.5, 0.6, 0.8)})


def measured(cache: AutoCache, rows: Rows) -> None:
    """A finished auto run's measured misses, as its flag scores them: (sigma, distance from the computed call
    before, miss)."""
    computed, errors, sigmas = cache.computed_steps, cache.measured_errors, cache.sigmas
    for before, step, error in zip(computed, computed[1:], errors[1:]):
        if error is not None and error > 0:
            rows.x0.append((sigmas[step - 1], step - before, error))


def calibrate(pipeline: AnimaPipeline, base: GenerationParams, prompts: Sequence[str], seeds: Sequence[int],
              held_out: int, on_step: StepCallback | None = None,
              on_run: Callable[[str, int], None] | None = None) -> Calibration:
    """Fit the cache numbers of `pipeline`'s model on runs of `base` at each fit prompt and seed, and check them on
    the held-out prompts (their residuals go into fit_error). on_run(prompt, seed) before each run."""
    if base.hires or base.init_image is not None:
        raise AnimaError("calibrate-cache runs text to image in one pass: drop the hires fix and the init image")
    fit_prompts, check_prompts = split_prompts(prompts, held_out)
    base = uncached(base)
    jobs = [(rows, dataclasses.replace(base, prompt=prompt, seed=seed)) for rows, group in
            ((Rows(), fit_prompts), (Rows(), check_prompts)) for prompt in group for seed in seeds]
    fitted, checked = jobs[0][0], jobs[-1][0]
    conditionings, calls = [], 0
    for rows, params in jobs:
        if on_run is not None:
            on_run(params.prompt, params.seed)
        pipeline.prepare(params)
        conditionings.append(pipeline.encode(params.prompt, params.negative, params.dtype, params.loras,
                                             params.lora_ignore_unmatched))
        recorder = Recorder(params.model_calls())
        pipeline.denoise(conditionings[-1], params, on_step=on_step, policy=recorder)
        replay(recorder.calls, rows)
        calls += len(recorder.calls)
    coefs = {kind: fit_rows(kind, getattr(fitted, kind)) for kind in ("tokens", "growth")}
    # the plan of the cached runs: the growth just fitted (the flag's numbers, still to fit, do not steer it)
    planning = CacheFit(typical_miss=(0.0,) * 4, typical_probe_miss=tuple(coefs["tokens"]),
                        plan_growth=tuple(coefs["growth"]), **CHOSEN, fitted_on="", fit_error={})
    for (rows, params), conditioning in zip(jobs, conditionings):
        for budget in budgets(params.steps):
            if on_run is not None:
                on_run(params.prompt, params.seed)
            cache = AutoCache(params.model_calls(), budget=budget, fit=planning)
            pipeline.denoise(conditioning, params, on_step=on_step, policy=cache)
            measured(cache, rows)
            calls += params.model_calls()
    coefs["x0"] = fit_rows("x0", fitted.x0)
    errors = {}
    for kind, name in (("x0", "typical_miss"), ("tokens", "typical_probe_miss"), ("growth", "plan_growth")):
        errors[name] = residual_sd(kind, coefs[kind], getattr(fitted, kind))
        errors[f"{name}_held_out"] = residual_sd(kind, coefs[kind], getattr(checked, kind)) \
            if getattr(checked, kind) else math.nan
    if not all(math.isfinite(v) for v in errors.values()):
        raise AnimaError("the held-out prompts gave no measurable forecast misses: give more steps")
    notes = (f"calibrate-cache on {pipeline.files.dit.name}: typical_miss, typical_probe_miss and plan_growth "
             f"fitted on {len(fit_prompts)} prompts x {len(seeds)} seeds ({base.steps} steps, {base.sampler}, "
             f"{base.width}x{base.height}; uncached runs and auto at budgets {budgets(base.steps)}), checked on "
             f"{len(check_prompts)} held-out prompts; flag_sigma, flag_score, plan_gain and plan_sigma kept as "
             "chosen on the demo model (docs/research/auto-cache-constants.md)")
    fit = CacheFit(typical_miss=_rounded(coefs["x0"]), typical_probe_miss=_rounded(coefs["tokens"]),
                   plan_growth=_rounded(coefs["growth"]), **CHOSEN, fitted_on=notes,
                   fit_error={k: round(v, 4) for k, v in errors.items()}, dit=fingerprint(pipeline.files.dit, "DiT"))
    return Calibration(fit, len(jobs) * (1 + len(budgets(base.steps))), calls)


def runs_of(prompts: int, seeds: int, steps: int) -> int:
    """How many runs calibrate() makes: one uncached and one per budget, for every prompt and seed."""
    return prompts * seeds * (1 + len(budgets(steps)))


def _rounded(values: np.ndarray) -> tuple[float, ...]:
    return tuple(round(float(v), 4) for v in values)
