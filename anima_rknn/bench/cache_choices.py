"""calibrate-cache's choices: the four numbers of a cache fit chosen by image quality, not by a regression, as
docs/research/auto-cache-constants.md chose them on the demo model, from cached runs' PSNR against their uncached
images:
  - plan_gain, plan_sigma (a budget's plan): of a small grid, the pair whose plans give the best mean PSNR;
  - flag_sigma, flag_score (the flag): the threshold that flags FLAG_RECALL of the runs under the PSNR the user
    calls a visible difference, at the flag_sigma (of a small grid) with the best precision there.
A budget's plan without check does not depend on the image (its charges are in units of the one-step error), so
the pairs of the grid that place a budget's calls alike are one run: planned_calls finds them before any run.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..sampling.auto_cache import AutoCache, late_miss_score
from ..sampling.cache_fit import CacheFit

PLAN_GAINS = (0.0, 0.5, 1.0, 2.0, 3.0)
PLAN_SIGMAS = (0.6, 0.7, 0.8, 0.9)
FLAG_SIGMAS = (0.2, 0.4, 0.6, 0.8, 1.0)
FLAG_RECALL = 0.8  # the research's: the threshold that flags 8 of tune-large's 9 images under 30 dB
LOW_PSNR = 30.0  # dB against the uncached image: under it, a cached image the flag should catch
PSNR_CAP = 100.0  # identical images' PSNR (inf) in a mean
# Ties (the data cannot tell candidates apart) go to the research's choices on the demo model.
RESEARCH_PLAN, RESEARCH_FLAG_SIGMA = (1.0, 0.8), 0.8


@dataclass(frozen=True)
class Run:
    """One cached run as the choices see it: its computed calls, their measured misses (None: not measured), the
    cache's sigmas, its image's PSNR against the uncached one, and the budget it was asked for."""

    computed: tuple[int, ...]
    errors: tuple[float | None, ...]
    sigmas: tuple[float, ...]
    psnr: float
    budget: int

    def score(self, typical_miss: tuple[float, ...], flag_sigma: float) -> float:
        """The flag's score (auto_cache.late_miss_score); -inf where nothing was measured (never flagged)."""
        score = late_miss_score(list(self.computed), list(self.errors), list(self.sigmas), typical_miss, flag_sigma)
        return -math.inf if score is None else score


def planned_calls(sigmas: Sequence[float], budget: int, fit: CacheFit) -> tuple[int, ...]:
    """The calls auto computes at `budget` under `fit`'s plan over a run's cache sigmas (one per call and the
    last): the plan run on a stand-in latent of four numbers (it does not read the image)."""
    return _planned(tuple(float(s) for s in sigmas), budget, fit.plan_growth, fit.plan_gain, fit.plan_sigma)


@functools.lru_cache(maxsize=4096)
def _planned(sigmas: tuple[float, ...], budget: int, growth: tuple[float, float], gain: float,
             plan_sigma: float) -> tuple[int, ...]:
    fit = CacheFit(typical_miss=(0.0,) * 4, flag_sigma=1.0, flag_score=1.0, typical_probe_miss=(0.0,) * 4,
                   plan_growth=growth, plan_gain=gain, plan_sigma=plan_sigma, fitted_on="", fit_error={})
    cache = AutoCache(len(sigmas) - 1, budget=budget, fit=fit)
    cache.set_sigmas(np.asarray(sigmas, dtype=np.float64))
    draws = np.random.default_rng(0)
    for _ in range(len(sigmas) - 1):
        x = draws.standard_normal(4).astype(np.float32)
        if cache.should_skip(x):
            cache.forecast(x)
        else:
            cache.record(x, draws.standard_normal(4).astype(np.float32))
    return tuple(cache.computed_steps)


def with_plan(fit: CacheFit, plan: tuple[float, float]) -> CacheFit:
    return dataclasses.replace(fit, plan_gain=plan[0], plan_sigma=plan[1])


def plan_candidates() -> list[tuple[float, float]]:
    return [(gain, sigma) for sigma in PLAN_SIGMAS for gain in PLAN_GAINS]


@dataclass(frozen=True)
class PlanChoice:
    plan: tuple[float, float]  # (plan_gain, plan_sigma) chosen
    best: tuple[float, float]  # the pair of the best mean PSNR
    means: dict[tuple[float, float], float]  # dB over the fit runs (PSNR_CAP for identical images)
    se: float  # dB: paired standard error of the best's mean minus the chosen's (0: the chosen is the best)
    within: list[tuple[float, float]]  # the pairs whose mean is within 2 paired standard errors of the best's

    def describe(self) -> str:
        best = "" if self.best == self.plan else (f" (best {self.best[0]:g} from {self.best[1]:g}: "
                                                  f"{self.means[self.best]:.1f} dB, se of the difference "
                                                  f"{self.se:.2f})")
        return (f"plan_gain {self.plan[0]:g} from plan_sigma {self.plan[1]:g}: mean {self.means[self.plan]:.1f} dB"
                f"{best}; {len(self.within)} of {len(self.means)} pairs within 2 paired se of the best")


def choose_plan(psnrs: dict[tuple[float, float], Sequence[float]]) -> PlanChoice:
    """The plan pair by mean PSNR over the same fit runs (one list per pair, in the same order): the research's
    pair where its mean is within 2 paired standard errors of the best one's (the runs cannot tell them apart, as
    the demo's tuning runs could not: docs/research), else the best (ties to the one nearest the research's)."""
    capped = {pair: np.minimum(np.asarray(v, dtype=np.float64), PSNR_CAP) for pair, v in psnrs.items()}
    means = {pair: float(v.mean()) for pair, v in capped.items()}
    top = max(means.values())
    best = min((pair for pair, mean in means.items() if mean >= top - 1e-9),
               key=lambda p: (abs(p[1] - RESEARCH_PLAN[1]), abs(p[0] - RESEARCH_PLAN[0])))

    def paired_se(pair: tuple[float, float]) -> float:
        differences = capped[best] - capped[pair]
        return float(differences.std(ddof=1) / math.sqrt(len(differences))) if len(differences) > 1 else 0.0

    within = [pair for pair in capped if means[best] - means[pair] <= 2 * paired_se(pair) + 1e-9]
    chosen = RESEARCH_PLAN if RESEARCH_PLAN in within else best
    return PlanChoice(chosen, best, means, paired_se(chosen), within)


@dataclass(frozen=True)
class FlagCounts:
    runs: int
    flagged: int
    low: int  # under the PSNR threshold
    caught: int  # flagged and low

    def describe(self) -> str:
        return (f"caught {self.caught} of {self.low} runs under the threshold, {self.flagged - self.caught} false "
                f"flags of {self.runs - self.low} other runs")


def flag_counts(runs: Sequence[Run], typical_miss: tuple[float, ...], flag_sigma: float, flag_score: float,
                low_psnr: float) -> FlagCounts:
    flagged = [run.score(typical_miss, flag_sigma) >= flag_score for run in runs]
    low = [run.psnr < low_psnr for run in runs]
    return FlagCounts(len(runs), sum(flagged), sum(low), sum(f and b for f, b in zip(flagged, low)))


@dataclass(frozen=True)
class FlagChoice:
    flag_sigma: float
    flag_score: float
    spread: float  # sd of ln flag_score over bootstrap resamples of the fit runs: its fit error
    sigma_spread: float  # sd of the flag_sigma chosen over those resamples: its fit error
    counts: FlagCounts


def _threshold(scores: np.ndarray, low: np.ndarray) -> float:
    """The highest threshold that flags FLAG_RECALL of the low runs (nan: none low)."""
    ranked = np.sort(scores[low])[::-1]
    return float(ranked[math.ceil(FLAG_RECALL * len(ranked)) - 1]) if len(ranked) else math.nan


def _choice(scores: np.ndarray, low: np.ndarray) -> tuple[int, float] | None:
    """(index in FLAG_SIGMAS, threshold) from the runs' scores ([flag_sigma, run]) and which runs are low."""
    best = None
    for index, flag_sigma in enumerate(FLAG_SIGMAS):
        threshold = _threshold(scores[index], low)
        if not (math.isfinite(threshold) and threshold > 0):
            continue
        threshold = math.floor(threshold * 1e4) / 1e4  # as written, and still flagging the run that set it
        flagged = scores[index] >= threshold
        caught = int((flagged & low).sum())
        key = (caught / max(int(flagged.sum()), 1), caught, -abs(flag_sigma - RESEARCH_FLAG_SIGMA))
        if best is None or key > best[0]:
            best = key, index, threshold
    return None if best is None else best[1:]


def choose_flag(runs: Sequence[Run], typical_miss: tuple[float, ...], low_psnr: float,
                resamples: int = 200) -> FlagChoice | None:
    """At each flag_sigma of the grid, the highest threshold that flags FLAG_RECALL of the runs under `low_psnr`;
    the flag_sigma of the best precision there (then the most caught, then the research's). Its fit error: the
    spread of the choice over bootstrap resamples of the runs. None: no run is under `low_psnr`, or none of those
    has a score."""
    low = np.array([run.psnr < low_psnr for run in runs], dtype=bool)
    scores = np.array([[run.score(typical_miss, flag_sigma) for run in runs] for flag_sigma in FLAG_SIGMAS])
    chosen = _choice(scores, low) if low.any() else None
    if chosen is None:
        return None
    index, threshold = chosen
    draws, sigmas, logs = np.random.default_rng(0), [], []
    for _ in range(resamples):
        pick = draws.integers(0, len(runs), len(runs))
        again = _choice(scores[:, pick], low[pick])
        if again is not None:
            sigmas.append(FLAG_SIGMAS[again[0]])
        if math.isfinite(t := _threshold(scores[index, pick], low[pick])) and t > 0:
            logs.append(math.log(t))
    spread = float(np.std(logs)) if len(logs) > 1 else 100.0
    sigma_spread = float(np.std(sigmas)) if len(sigmas) > 1 else 1.0
    return FlagChoice(FLAG_SIGMAS[index], threshold, min(spread, 100.0), sigma_spread,
                      flag_counts(runs, typical_miss, FLAG_SIGMAS[index], threshold, low_psnr))


def unflagging(runs: Sequence[Run], typical_miss: tuple[float, ...]) -> FlagChoice:
    """Where no fit run fell under the PSNR threshold: the research's flag_sigma and a threshold just above every
    fit run's score (it flags none of them, all of which were fine)."""
    top = max((run.score(typical_miss, RESEARCH_FLAG_SIGMA) for run in runs), default=-math.inf)
    top = top if math.isfinite(top) and top > 0 else 1.0
    return FlagChoice(RESEARCH_FLAG_SIGMA, math.ceil(top * 1.001 * 1e4) / 1e4, 100.0, 1.0,
                      FlagCounts(len(runs), 0, 0, 0))
