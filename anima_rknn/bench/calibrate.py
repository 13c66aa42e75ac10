"""`anima-rknn calibrate-cache`: fit a model's cache numbers (sampling.cache_fit) from uncached and cached runs.

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
written into fit_error. With fit "all" (the default), flag_sigma, flag_score, plan_gain and plan_sigma are chosen
too, by the image-quality criteria of docs/research/auto-cache-constants.md (bench.cache_choices): before the
budgets' runs, the fit prompts run at two budgets under each plan pair of a small grid (pairs that place the calls
alike are one run), each image's PSNR against its uncached one; the flag's two from the budgets' runs. With fit
"curves" those four are kept as chosen on the demo model, and the file says so in fitted_on. A run is fixed by the
calls it computes, so one that two phases ask for runs once.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from PIL import Image

from ..core.tensorfile import fingerprint
from ..engine.vae_plan import DecodePlan
from ..errors import AnimaError
from ..generation.params import GenerationParams, uncached
from ..generation.pipeline import AnimaPipeline
from ..generation.result import Conditioning
from ..sampling.auto_cache import AutoCache
from ..sampling.cache_fit import CacheFit
from ..sampling.sample import StepCallback
from ..sampling.samplers import SAMPLERS, call_sigmas
from .cache_choices import (
    LOW_PSNR,
    RESEARCH_PLAN,
    FlagChoice,
    FlagCounts,
    PlanChoice,
    Run,
    choose_flag,
    choose_plan,
    flag_counts,
    plan_candidates,
    planned_calls,
    unflagging,
    with_plan,
)
from .cache_curves import Recorder, Rows, fit_rows, measured, replay, residual_sd
from .metrics import psnr

MIN_FIT_PROMPTS, MIN_HELD_OUT = 2, 1
FITS = ("all", "curves")  # what calibrate() fits: every number, or the three regressions alone (module docstring)
# What fit "curves" keeps: the choices of the demo model's quality sweeps (docs/research/auto-cache-constants.md).
CHOSEN = {"flag_sigma": 0.8, "flag_score": 1.3, "plan_gain": 1.0, "plan_sigma": 0.8}
# Only to count the runs before this model's growth is fitted (the demo model's; counted again once fitted).
GUESSED_GROWTH = (0.5, 1.2)


def split_prompts(prompts: Sequence[str], held_out: int) -> tuple[list[str], list[str]]:
    """(fit prompts, held-out prompts): the last `held_out` are held out."""
    prompts = [p for p in prompts if p.strip()]
    if held_out < MIN_HELD_OUT or len(prompts) - held_out < MIN_FIT_PROMPTS:
        raise AnimaError(f"calibrate-cache needs at least {MIN_FIT_PROMPTS} prompts to fit on and "
                         f"{MIN_HELD_OUT} held out to check the fit on; got {len(prompts)} prompts, "
                         f"{held_out} held out")
    return prompts[:-held_out], prompts[-held_out:]


def _shares(steps: int, shares: Sequence[float]) -> list[int]:
    return sorted({min(steps - 1, max(3, round(steps * share))) for share in shares})


def budgets(steps: int) -> list[int]:
    """The budgets the flag's misses are measured at: 30-80 % of the steps (6-16 of 20, as first fitted)."""
    return _shares(steps, (0.3, 0.4, 0.5, 0.6, 0.8))


def plan_budgets(steps: int) -> list[int]:
    """The budgets the plan's pairs are compared at: 40 and 50 % of the steps (8 and 10 of 20, as on the demo)."""
    return _shares(steps, (0.4, 0.5))


def cache_sigmas(params: GenerationParams) -> tuple[float, ...]:
    """What a step cache of a run of `params` plans over: every model call's sigma, and the last."""
    sigmas = params.passes()[-1].sigmas
    return (*call_sigmas(SAMPLERS[params.sampler], sigmas), float(sigmas[-1]))


def planning_fit(growth: Sequence[float], plan: tuple[float, float] = RESEARCH_PLAN,
                 probe: Sequence[float] = (0.0,) * 4) -> CacheFit:
    """A fit to plan runs with before the flag's numbers are fitted (they do not steer a plan)."""
    return CacheFit(typical_miss=(0.0,) * 4, typical_probe_miss=tuple(probe), plan_growth=tuple(growth),
                    **{**CHOSEN, "plan_gain": plan[0], "plan_sigma": plan[1]}, fitted_on="", fit_error={})


@dataclass(frozen=True)
class Work:
    runs: int
    calls: int  # model calls


def planned_work(params: GenerationParams, fit_jobs: int, held_jobs: int, choices: bool,
                 growth: Sequence[float] = GUESSED_GROWTH, plan: tuple[float, float] = RESEARCH_PLAN) -> Work:
    """The runs calibrate() makes (each job's uncached one, and its distinct cached ones) and their model calls,
    the budgets planned with `growth` and, for the budgets' runs, `plan`."""
    sigmas, fit = cache_sigmas(params), planning_fit(growth, plan)
    curve = {planned_calls(sigmas, budget, fit) for budget in budgets(params.steps)}
    sweep = {planned_calls(sigmas, budget, with_plan(fit, pair)) for budget in plan_budgets(params.steps)
             for pair in plan_candidates()} if choices else set()
    jobs, calls = fit_jobs + held_jobs, len(sigmas) - 1
    return Work(jobs + fit_jobs * len(curve | sweep) + held_jobs * len(curve),
                jobs * calls + fit_jobs * sum(map(len, curve | sweep)) + held_jobs * sum(map(len, curve)))


@dataclass
class Progress:
    """What calibrate() tells as it goes (each optional)."""

    on_step: StepCallback | None = None
    on_run: Callable[[int], None] | None = None  # before each run: the model calls it will make
    on_work: Callable[[Work], None] | None = None  # the whole work, counted again as the numbers that plan are fitted


@dataclass
class Job:
    """One prompt and seed: its settings, the rows it adds to, its uncached run's image, its cached runs."""

    params: GenerationParams
    rows: Rows
    held_out: bool
    conditioning: Conditioning | None = None
    decode: DecodePlan | None = None
    reference: Image.Image | None = None
    runs: dict[tuple[int, ...], Run] = field(default_factory=dict)  # by the calls computed
    measured: list[Run] = field(default_factory=list)  # the runs at the flag's budgets


class Calibrator:
    """The runs of one calibration (module docstring), counted as they are made."""

    def __init__(self, pipeline: AnimaPipeline, images: bool, progress: Progress) -> None:
        self.pipeline, self.images, self.progress = pipeline, images, progress
        self.runs = self.calls = 0

    def _started(self, calls: int) -> None:
        self.runs += 1
        if self.progress.on_run is not None:
            self.progress.on_run(calls)

    def _image(self, job: Job, latent: np.ndarray) -> Image.Image | None:
        return self.pipeline.decode(latent, job.decode)[0] if self.images else None

    def uncached(self, job: Job) -> None:
        params = job.params
        job.decode = self.pipeline.prepare(params).decode
        job.conditioning = self.pipeline.encode(params.prompt, params.negative, params.dtype, params.loras,
                                                params.lora_ignore_unmatched)
        recorder = Recorder(params.model_calls())
        self._started(params.model_calls())
        done = self.pipeline.denoise(job.conditioning, params, on_step=self.progress.on_step, policy=recorder)
        job.reference = self._image(job, done.sample.latent)
        replay(recorder.calls, job.rows)
        self.calls += len(recorder.calls)

    def cached(self, job: Job, budget: int, fit: CacheFit) -> Run:
        """The job's auto run at `budget` under `fit`'s plan, run once for every plan that computes its calls."""
        params = job.params
        planned = planned_calls(cache_sigmas(params), budget, fit)
        if planned not in job.runs:
            self._started(len(planned))
            cache = AutoCache(params.model_calls(), budget=budget, fit=fit)
            done = self.pipeline.denoise(job.conditioning, params, on_step=self.progress.on_step, policy=cache)
            image = self._image(job, done.sample.latent)
            job.runs[planned] = Run(tuple(cache.computed_steps), tuple(cache.measured_errors), tuple(cache.sigmas),
                                    psnr(job.reference, image) if image is not None else math.nan, budget)
            self.calls += len(cache.computed_steps)
        return dataclasses.replace(job.runs[planned], budget=budget)


@dataclass
class HeldOut:
    """The new numbers on the held-out prompts' runs at the flag's budgets."""

    flag: FlagCounts | None  # None: the flag's numbers were not fitted
    exact: int  # runs that computed the budget asked
    runs: int
    asked: int  # calls asked, over those runs
    achieved: int  # calls computed

    def describe(self) -> str:
        plan = (f"the plan computed the asked budget in {self.exact} of {self.runs} runs ({self.achieved} calls of "
                f"{self.asked} asked)")
        return plan if self.flag is None else f"the flag {self.flag.describe()}; {plan}"


@dataclass
class Calibration:
    fit: CacheFit
    runs: int
    calls: int
    held_out: HeldOut
    plan: PlanChoice | None = None
    flag: FlagChoice | None = None
    flag_fitted: bool = False  # False: no fit run fell under the PSNR threshold (the flag set to flag none of them)
    fit_runs: list[Run] = field(default_factory=list)  # the runs at the flag's budgets, of the fit prompts
    held_runs: list[Run] = field(default_factory=list)  # ... and of the held-out ones


def calibrate(pipeline: AnimaPipeline, base: GenerationParams, prompts: Sequence[str], seeds: Sequence[int],
              held_out: int, progress: Progress | None = None, fit: str = "all",
              low_psnr: float = LOW_PSNR) -> Calibration:
    """Fit the cache numbers of `pipeline`'s model on runs of `base` at each fit prompt and seed (`fit`: "all", or
    "curves" to keep the four choices as chosen on the demo), and check them on the held-out prompts. `low_psnr`:
    under it (dB against the uncached image), a cached image the flag should catch."""
    if base.hires or base.init_image is not None:
        raise AnimaError("calibrate-cache runs text to image in one pass: drop the hires fix and the init image")
    if fit not in FITS:
        raise AnimaError(f"unknown fit {fit!r}; choose one of {', '.join(FITS)}")
    progress, choices = progress or Progress(), fit == "all"
    fit_prompts, check_prompts = split_prompts(prompts, held_out)
    base = uncached(base)
    fitted, checked = Rows(), Rows()
    jobs = [Job(dataclasses.replace(base, prompt=prompt, seed=seed), rows, rows is checked)
            for rows, group in ((fitted, fit_prompts), (checked, check_prompts)) for prompt in group for seed in seeds]
    fit_jobs = [job for job in jobs if not job.held_out]
    calibrator = Calibrator(pipeline, choices, progress)
    for job in jobs:
        calibrator.uncached(job)
    coefs = {kind: fit_rows(kind, getattr(fitted, kind)) for kind in ("tokens", "growth")}
    planning = planning_fit(coefs["growth"], probe=coefs["tokens"])

    def recount(plan: tuple[float, float]) -> None:
        if progress.on_work is not None:
            progress.on_work(planned_work(base, len(fit_jobs), len(jobs) - len(fit_jobs), choices,
                                          tuple(coefs["growth"]), plan))

    recount(RESEARCH_PLAN)
    plan_choice = None
    if choices:
        sweep = {pair: [calibrator.cached(job, budget, with_plan(planning, pair)).psnr
                        for job in fit_jobs for budget in plan_budgets(base.steps)] for pair in plan_candidates()}
        plan_choice = choose_plan(sweep)
        planning = with_plan(planning, plan_choice.plan)
        recount(plan_choice.plan)
    for job in jobs:
        for budget in budgets(base.steps):
            job.measured.append(calibrator.cached(job, budget, planning))
            measured(job.measured[-1], job.rows)
    coefs["x0"] = fit_rows("x0", fitted.x0)
    typical = _rounded(coefs["x0"])
    fit_runs = [run for job in fit_jobs for run in job.measured]
    held_runs = [run for job in jobs if job.held_out for run in job.measured]
    flag = (choose_flag(fit_runs, typical, low_psnr) or unflagging(fit_runs, typical)) if choices else None
    errors = _errors(coefs, fitted, checked)
    chosen = CHOSEN if flag is None else {"flag_sigma": flag.flag_sigma, "flag_score": flag.flag_score,
                                          "plan_gain": plan_choice.plan[0], "plan_sigma": plan_choice.plan[1]}
    if flag is not None:
        errors.update(flag_score=round(flag.spread, 4), flag_sigma=round(flag.sigma_spread, 4),
                      plan_psnr_se=round(min(plan_choice.se, 100.0), 4))
    check = HeldOut(None if flag is None else flag_counts(held_runs, typical, flag.flag_sigma, flag.flag_score,
                                                          low_psnr),
                    sum(len(r.computed) == r.budget for r in held_runs), len(held_runs),
                    sum(r.budget for r in held_runs), sum(len(r.computed) for r in held_runs))
    notes = _notes(pipeline, base, len(fit_prompts), len(seeds), len(check_prompts), plan_choice, flag, low_psnr,
                   check)
    made = CacheFit(typical_miss=typical, typical_probe_miss=_rounded(coefs["tokens"]),
                    plan_growth=_rounded(coefs["growth"]), **chosen, fitted_on=notes, fit_error=errors,
                    dit=fingerprint(pipeline.files.dit, "DiT"))
    return Calibration(made, calibrator.runs, calibrator.calls, check, plan_choice, flag,
                       flag is not None and flag.counts.low > 0, fit_runs, held_runs)


def _errors(coefs: dict[str, np.ndarray], fitted: Rows, checked: Rows) -> dict[str, float]:
    """Each regression's residual sd (ln) on the fit prompts and on the held-out ones."""
    errors = {}
    for kind, name in (("x0", "typical_miss"), ("tokens", "typical_probe_miss"), ("growth", "plan_growth")):
        errors[name] = residual_sd(kind, coefs[kind], getattr(fitted, kind))
        errors[f"{name}_held_out"] = residual_sd(kind, coefs[kind], getattr(checked, kind)) \
            if getattr(checked, kind) else math.nan
    if not all(math.isfinite(v) for v in errors.values()):
        raise AnimaError("the held-out prompts gave no measurable forecast misses: give more steps")
    return {k: round(v, 4) for k, v in errors.items()}


def _notes(pipeline: AnimaPipeline, base: GenerationParams, fit_prompts: int, seeds: int, check_prompts: int,
           plan: PlanChoice | None, flag: FlagChoice | None, low_psnr: float, check: HeldOut) -> str:
    """fitted_on: what each number was fitted on, and how the held-out prompts took them."""
    notes = (f"calibrate-cache on {pipeline.files.dit.name}: typical_miss, typical_probe_miss and plan_growth "
             f"fitted on {fit_prompts} prompts x {seeds} seeds ({base.steps} steps, {base.sampler}, "
             f"{base.width}x{base.height}; uncached runs and auto at budgets {budgets(base.steps)}), checked on "
             f"{check_prompts} held-out prompts")
    if plan is None or flag is None:
        return notes + ("; flag_sigma, flag_score, plan_gain and plan_sigma kept as chosen on the demo model "
                        "(docs/research/auto-cache-constants.md)")
    how = (f"flag_sigma and flag_score: the threshold flagging 80% of those auto runs under {low_psnr:g} dB PSNR "
           f"against their uncached images, at the flag_sigma of the best precision ({flag.counts.describe()})"
           if flag.counts.low else f"no fit run fell under {low_psnr:g} dB: flag_score just above every fit run's "
           "score (it flags none of them)")
    return (f"{notes}; plan_gain and plan_sigma chosen by mean PSNR against the uncached images at budgets "
            f"{plan_budgets(base.steps)}: {plan.describe()}; {how}; fit_error flag_score, flag_sigma: sd of its ln, of "
            f"it, over bootstrap resamples of the fit runs; plan_psnr_se: dB; held out: {check.describe()}")


def _rounded(values: np.ndarray) -> tuple[float, ...]:
    return tuple(round(float(v), 4) for v in values)
