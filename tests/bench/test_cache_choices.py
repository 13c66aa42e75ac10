"""calibrate-cache's choices (bench.cache_choices): a budget's plan found before any run is the plan a run makes;
the flag's threshold and flag_sigma and the plan pair are picked by the research's criteria."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from anima_rknn.bench.cache_choices import (
    RESEARCH_PLAN,
    Run,
    choose_flag,
    choose_plan,
    plan_candidates,
    planned_calls,
    unflagging,
    with_plan,
)
from anima_rknn.bench.calibrate import planning_fit
from anima_rknn.sampling.caches import make_cache
from anima_rknn.sampling.sample import sample
from anima_rknn.sampling.samplers import SAMPLERS
from anima_rknn.sampling.schedule import flow_sigmas

STEPS = 20


def bending_denoiser(x: np.ndarray, sigma: float) -> np.ndarray:
    """A smooth x0 that bends with sigma (no model: the plan does not read the image)."""
    return np.tanh(x) * (1.0 - sigma) + np.sin(3 * x) * sigma**2


@pytest.mark.parametrize("budget", [6, 8, 10, 14])
def test_planned_calls_are_the_calls_a_run_computes(budget):
    sigmas = flow_sigmas(STEPS)
    noise = np.random.default_rng(budget).standard_normal((1, 4, 4, 4)).astype(np.float32)
    schedules = set()
    for pair in plan_candidates()[::3]:
        fit = with_plan(planning_fit((0.5, 1.2)), pair)
        done = sample(SAMPLERS["euler"], bending_denoiser, noise, sigmas,
                      make_cache("auto", STEPS, {"budget": budget}, fit))
        planned = planned_calls([*sigmas], budget, fit)
        assert tuple(done.computed_steps) == planned and len(planned) == budget
        schedules.add(planned)
    if budget == 8:  # the pairs do move the plan: else comparing them would be no choice
        assert len(schedules) > 1


def run(score: float, psnr: float, at_sigma: float = 0.3) -> Run:
    """A run whose one measured call (step 3, at `at_sigma`) missed by `score`: its score under a typical miss of
    1 (typical_miss all zero) is `score` wherever flag_sigma >= at_sigma."""
    return Run((1, 2, 3), (None, None, score), (0.95, 0.9, at_sigma, 0.0), psnr, 3)


TYPICAL_ONE = (0.0, 0.0, 0.0, 0.0)
LOW = [run(s, 20.0) for s in (3.0, 2.5, 2.0, 1.5, 0.5)]


def test_the_flag_catches_80_percent_of_the_low_runs_at_the_best_precision():
    fine = [run(s, 40.0) for s in (1.2, 1.0, 0.8, 0.6)]
    # the threshold that catches 4 of 5 low runs is 1.5; a fine run scoring 1.8 is a false flag, unless its
    # measured call (at sigma 0.7) lies above flag_sigma: at 0.4 and 0.6 the precision is 1, at 0.8 and 1 it is 0.8
    choice = choose_flag([*LOW, *fine, run(1.8, 40.0, at_sigma=0.7)], TYPICAL_ONE, 30.0)
    assert (choice.flag_sigma, choice.flag_score) == (0.6, 1.5)  # ties go to the one nearest the research's 0.8
    assert dataclasses.astuple(choice.counts) == (10, 4, 5, 4) and 0 < choice.spread < 1

    everywhere = choose_flag([*LOW, *fine, run(1.8, 40.0)], TYPICAL_ONE, 30.0)
    assert (everywhere.flag_sigma, everywhere.flag_score) == (0.8, 1.5)
    assert dataclasses.astuple(everywhere.counts) == (10, 5, 5, 4)


def test_with_no_low_run_the_flag_flags_none_of_the_fit_runs():
    fine = [run(s, 40.0) for s in (1.2, 1.0, 0.8)]
    assert choose_flag(fine, TYPICAL_ONE, 30.0) is None
    choice = unflagging(fine, TYPICAL_ONE)
    assert choice.flag_score > 1.2 and choice.flag_sigma == 0.8 and choice.counts.flagged == 0


def test_the_plan_keeps_the_research_pair_unless_another_is_clearly_better():
    draws = np.random.default_rng(0)
    base = 35 + 3 * draws.standard_normal(16)
    noisy = {pair: base + 0.3 * draws.standard_normal(16) for pair in plan_candidates()}
    assert choose_plan(noisy).plan == RESEARCH_PLAN  # within noise: kept
    better = (3.0, 0.6)
    clearly = {**noisy, better: noisy[RESEARCH_PLAN] + 2.0 + 0.1 * draws.standard_normal(16)}
    choice = choose_plan(clearly)
    assert choice.plan == choice.best == better and RESEARCH_PLAN not in choice.within
    identical = {pair: np.full(16, np.inf) for pair in plan_candidates()}  # every image equal to the uncached
    assert choose_plan(identical).plan == RESEARCH_PLAN
