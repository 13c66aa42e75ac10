"""The cache cut where the conditioning changes (sampling/cache_segments.py), on the Gaussian-mixture bed: a run
whose conditioning switches at a call equals two separate runs, each with a fresh cache, joined at that call
(nothing is forecast across it); its state comes back whole; auto's budget is shared out."""

from __future__ import annotations

import numpy as np
import pytest
from mixture import cfg_denoiser, initial_noise, make_testbed

from anima_rknn.errors import AnimaError
from anima_rknn.sampling.cache_segments import SegmentedCache, part_options
from anima_rknn.sampling.caches import make_cache
from anima_rknn.sampling.sample import sample
from anima_rknn.sampling.samplers import SAMPLERS
from anima_rknn.sampling.schedule import flow_sigmas

STEPS, CHANGE = 20, 9  # the conditioning changes at call 9


@pytest.fixture(scope="module")
def denoisers():
    cond_a, uncond = make_testbed(dim=16, components=4, std=1.0, seed=0)
    cond_b, _ = make_testbed(dim=16, components=4, std=1.0, seed=1)
    return cfg_denoiser(cond_a, uncond, 4.0), cfg_denoiser(cond_b, uncond, 4.0)


@pytest.mark.parametrize("name", ["spectrum", "spectrum-plus", "reuse", "auto"])
def test_a_change_splits_the_run_into_two_fresh_caches(denoisers, name):
    sigmas, noise = flow_sigmas(STEPS), initial_noise(16, [1])
    call = [1]

    def denoise(x, sigma):
        return denoisers[0 if call[0] < CHANGE else 1](x, sigma)

    cache = SegmentedCache(lambda calls: make_cache(name, calls), STEPS, [CHANGE])
    joined = sample(SAMPLERS["euler"], denoise, noise, sigmas, cache, on_call=lambda n: call.__setitem__(0, n))
    first = sample(SAMPLERS["euler"], denoisers[0], noise, sigmas[:CHANGE], make_cache(name, CHANGE - 1))
    second = sample(SAMPLERS["euler"], denoisers[1], first.latent, sigmas[CHANGE - 1:],
                    make_cache(name, STEPS - CHANGE + 1))
    assert np.array_equal(joined.latent, second.latent)
    assert joined.computed_steps == [*first.computed_steps, *(s + CHANGE - 1 for s in second.computed_steps)]
    assert CHANGE in joined.computed_steps and joined.skipped_steps  # skipped inside the parts only


def test_every_step_a_change_skips_nothing():
    cache = SegmentedCache(lambda calls: make_cache("spectrum", calls), 10, list(range(2, 11)))
    cache.set_sigmas(np.linspace(1.0, 0.0, 11))
    x = np.zeros(4, np.float32)
    for _ in range(10):
        assert not cache.should_skip(x)
        cache.record(x, x)
    assert cache.report().computed_steps == list(range(1, 11)) and cache.report().skipped_steps == []


def test_a_state_comes_back_and_a_damaged_one_is_refused(denoisers):
    sigmas, noise, events = flow_sigmas(STEPS), initial_noise(16, [2]), []
    make = lambda calls: make_cache("spectrum", calls)
    whole = sample(SAMPLERS["euler"], denoisers[0], noise, sigmas, SegmentedCache(make, STEPS, [CHANGE]),
                   events.append)
    at = events[13]
    cache = SegmentedCache(make, STEPS, [CHANGE])
    cache.restore(at.cache_state)
    resumed = sample(SAMPLERS["euler"], denoisers[0], at.x, sigmas, cache, start=14, state=at.sampler_state)
    assert np.array_equal(resumed.latent, whole.latent) and resumed.computed_steps == whole.computed_steps
    for damaged in ({**at.cache_state, "parts_done": "x"}, {**at.cache_state, "parts_done": [[[1, 2], [3], None, None]]},
                    {k: v for k, v in at.cache_state.items() if k != "parts_done"}):
        with pytest.raises(AnimaError, match="prompt editing"):
            SegmentedCache(make, STEPS, [CHANGE]).restore(damaged)


@pytest.mark.parametrize("budget, calls, total, expected", [(10, 5, 20, 3), (10, 15, 20, 8), (20, 2, 20, 2)])
def test_autos_budget_is_shared_out_by_calls(budget, calls, total, expected):
    assert part_options({"budget": budget}, calls, total) == {"budget": expected}
    assert part_options({"tol": 0.1}, calls, total) == {"tol": 0.1}
