"""The `auto` cache: it measures its forecaster on every computed step and schedules the model calls from
those errors. Its decisions depend on the values, so every run here is one noise row (a batch would share
one schedule)."""

import itertools
import json

import numpy as np
import pytest
from mixture import cfg_denoiser, initial_noise, make_testbed, model_for

from anima_rknn.errors import AnimaError
from anima_rknn.model.model_set import DEMO_MODEL
from anima_rknn.sampling import caches
from anima_rknn.sampling.auto_cache import probe_miss
from anima_rknn.sampling.cache_fit import fit_path, read_fit
from anima_rknn.sampling.cache_seam import ChecksForecasts
from anima_rknn.sampling.caches import parse_cache_options
from anima_rknn.sampling.rerun import sample_verified
from anima_rknn.sampling.sample import sample
from anima_rknn.sampling.samplers import SAMPLERS
from anima_rknn.sampling.schedule import flow_sigmas


# The demo model's fit: these runs are scored with the numbers the library ships for it.
DEMO_FIT = read_fit(fit_path(DEMO_MODEL / "split_files" / "diffusion_models" / "anima-demo.safetensors"))


def make_cache(name, steps, options=None, fit=DEMO_FIT):
    return caches.make_cache(name, steps, options, fit)


@pytest.fixture(scope="module")
def denoise():
    cond, uncond = make_testbed(dim=64, components=8, std=1.0, seed=0)
    return cfg_denoiser(cond, uncond, 4.0)


def run(denoise, seed, options=None, steps=20):
    noise = initial_noise(64, [seed])
    return sample(SAMPLERS["euler"], denoise, noise, flow_sigmas(steps), make_cache("auto", steps, options))


def uncached(denoise, seed, steps=20):
    return sample(SAMPLERS["euler"], denoise, initial_noise(64, [seed]), flow_sigmas(steps),
                  make_cache("none", steps)).latent


def relative_error(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_warm_up_steps_run_the_model_and_the_run_saves_calls(denoise):
    result = run(denoise, 0)
    assert result.computed_steps[:3] == [1, 2, 3]
    assert 8 <= len(result.computed_steps) < 20
    assert sorted(result.computed_steps + result.skipped_steps) == list(range(1, 21))


def test_tolerance_zero_is_the_uncached_run_bit_for_bit(denoise):
    result = run(denoise, 0, {"tol": 0.0})
    assert result.computed_steps == list(range(1, 21))
    assert np.array_equal(result.latent, uncached(denoise, 0))


def test_a_looser_tolerance_computes_fewer_steps_and_lands_further_off(denoise):
    tight, loose = run(denoise, 1, {"tol": 0.01}), run(denoise, 1, {"tol": 0.2})
    reference = uncached(denoise, 1)
    assert len(loose.computed_steps) < len(tight.computed_steps)
    assert relative_error(tight.latent, reference) < relative_error(loose.latent, reference)


@pytest.mark.parametrize("budget", [3, 5, 8, 11, 30])
def test_the_budget_is_never_exceeded(denoise, budget):
    for seed in range(5):
        result = run(denoise, seed, {"budget": budget})
        assert len(result.computed_steps) == min(budget, 20)  # and spent whole: tol is 0 under a budget


@pytest.mark.parametrize("steps, budget", [(10, 5), (12, 7), (20, 8)])
def test_a_budget_takes_the_cheapest_plan_of_all(denoise, steps, budget):
    """The plan re-made before every step (dynamic programming) ends on the schedule with the least total charge
    among all schedules that spend the budget after the warm-up, found here by trying every one of them."""
    from itertools import combinations

    result = run(denoise, 3, {"budget": budget}, steps=steps)
    cache = make_cache("auto", steps, {"budget": budget})
    cache.set_sigmas(flow_sigmas(steps))
    charges = cache._plan_charges()

    def charge(computed):
        last, total = 0, 0.0
        for step in range(1, steps + 1):
            if step in computed:
                last = step
            else:
                total += charges[step - 1, step - last - 1]
        return total

    plans = [{1, 2, 3, *rest} for rest in combinations(range(4, steps + 1), budget - 3)]
    assert len(result.computed_steps) == budget
    assert charge(set(result.computed_steps)) == pytest.approx(min(charge(plan) for plan in plans), rel=1e-12)


def test_the_same_inputs_give_the_same_steps_and_the_same_bits(denoise):
    first, second = run(denoise, 2), run(denoise, 2)
    assert first.computed_steps == second.computed_steps
    assert np.array_equal(first.latent, second.latent)
    assert first.error_estimate == second.error_estimate


def test_the_error_estimate_ranks_the_true_error(denoise):
    """Made from the forecasts' measured errors alone, without the uncached run; over 12 noise seeds its
    ranking agrees with the true final error's (Spearman 0.57 here, 0.96 at budget 12: the plan's longer runs
    grow faster than the estimate's linear charge; reported per run by generate and bench)."""
    from scipy.stats import spearmanr

    estimates, errors = [], []
    for seed in range(12):
        result = run(denoise, seed, {"budget": 10})
        estimates.append(result.error_estimate)
        errors.append(relative_error(result.latent, uncached(denoise, seed)))
    assert spearmanr(estimates, errors).statistic > 0.4
    assert 0.2 < np.median(np.array(estimates) / np.array(errors)) < 5  # the right order of magnitude too


def test_a_forecast_that_follows_the_trajectory_exactly_measures_zero_error():
    """Data that is one point c: x0 = c on every step and x is a straight line in sigma. Both halves of the
    forecast (x0 and the noise, the latter rebuilt from the x0 history alone) are then exact."""
    point = np.linspace(-1, 1, 8, dtype=np.float32)
    cache = make_cache("auto", 20)
    result = sample(SAMPLERS["euler"], lambda x, sigma: point.copy(), initial_noise(8, [0])[0], flow_sigmas(20), cache)
    measured = [e for e in cache.measured_errors if e is not None]
    assert max(measured) < 1e-6 and result.error_estimate < 1e-6
    assert len(result.skipped_steps) > 5


@pytest.mark.parametrize("fresh_noise", [False, True])
def test_under_fresh_noise_the_forecast_holds_the_last_computed_x0(fresh_noise):
    """A sampler that re-draws part of the latent's noise every step (er_sde and the like) leaves no line through
    eps to follow, and its x0 jitters: the forecast is then the last computed x0, whatever latent it is asked
    about; without fresh noise it is the damped line, and the latent at hand enters through eps."""
    sigmas = flow_sigmas(20)
    cache = make_cache("auto", 20)
    cache.set_sigmas(sigmas, fresh_noise=fresh_noise)
    rng = np.random.default_rng(3)
    x0s = [rng.standard_normal(8).astype(np.float32) for _ in range(2)]
    for x0 in x0s:
        cache.record(rng.standard_normal(8).astype(np.float32), x0)
    forecasts = []
    for _ in range(2):  # the same step 3, asked about two different latents
        forecasts.append(cache.forecast(rng.standard_normal(8).astype(np.float32)).astype(np.float64))
        cache.withdraw_forecast()
    if fresh_noise:
        np.testing.assert_array_equal(forecasts[0], x0s[1])
        np.testing.assert_array_equal(forecasts[1], x0s[1])
    else:
        assert not np.allclose(forecasts[0], forecasts[1])
        assert not np.allclose(forecasts[0], x0s[1])


@pytest.mark.parametrize("name, fresh", [("euler", False), ("er_sde", True), ("euler_ancestral", True)])
def test_the_sampler_loop_tells_the_cache_about_fresh_noise(denoise, name, fresh):
    """What sample() hands set_sigmas, seen in what the cache then forecasts: under er_sde and euler a a forecast
    step's x0 is the last computed step's, under euler it moves on."""
    cache = make_cache("auto", 20, {"budget": 8})
    steps = {}
    sample(SAMPLERS[name], denoise, initial_noise(64, [0]), flow_sigmas(20), cache, seed=1,
           callback=lambda event: steps.update({event.step: (event.computed, np.array(event.x0))}))
    first = min(s for s, (c, _) in steps.items() if not c)
    last = max(s for s, (c, _) in steps.items() if c and s < first)
    assert np.array_equal(steps[first][1], steps[last][1]) == fresh


def test_the_guard_computes_after_a_forecast_gone_wrong():
    """A trajectory that turns sharply after step 9: the forecast measured on the next computed step is far off,
    so the step after it runs the model too, though the tolerance alone would have let it be forecast."""
    cache = make_cache("auto", 20, {"tol": 1.0, "guard": 0.2})
    cache.set_sigmas(flow_sigmas(20))
    for step in range(1, 21):
        x0 = np.full(4, 1.0 if step <= 9 else -3.0, np.float32)
        if cache.should_skip():
            cache.forecast(x0)
        else:
            cache.record(x0, x0)
    turned = min(s for s in cache.computed_steps if s > 9)
    assert cache.measured_errors[cache.computed_steps.index(turned)] > 0.2
    assert turned + 1 in cache.computed_steps


@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_a_non_finite_measurement_makes_the_next_step_computed(bad):
    cache = make_cache("auto", 20, {"tol": 1.0})
    cache.set_sigmas(flow_sigmas(20))
    one = np.full(4, 1.0, np.float32)
    for step in range(1, 5):
        cache.record(one, one)
    assert cache.should_skip()  # the forecast of a constant x0 is exact
    cache.forecast(one)
    cache.record(one, np.full(4, bad, np.float32))  # as if the model had returned it on step 6
    assert cache.measured_errors[-1] is None
    assert not cache.should_skip()


@pytest.mark.parametrize("options", [{}, {"budget": 9}])
def test_state_is_strict_json_and_arrays_and_restores_exactly(denoise, options):
    """What resume.py stores: JSON scalars (no NaN, no None inside lists) and lists of float32 arrays. A budget's
    plan is made again from the restored steps, so it needs nothing more."""
    cache = make_cache("auto", 20, options)
    cache.set_sigmas(flow_sigmas(20))
    values = [np.full(64, np.cos(step / 4), np.float32) for step in range(1, 21)]
    for step, value in enumerate(values[:12], start=1):
        cache.forecast(value) if cache.should_skip() else cache.record(value, value)
    state = cache.state()
    arrays = {k: v for k, v in state.items() if isinstance(v, list) and v and isinstance(v[0], np.ndarray)}
    scalars = {k: v for k, v in state.items() if k not in arrays}
    json.dumps(scalars, allow_nan=False)
    assert not any(None in v for v in scalars.values() if isinstance(v, list))
    assert all(a.dtype == np.float32 for v in arrays.values() for a in v)
    restored = make_cache("auto", 20, options)
    restored.restore(state)
    restored.set_sigmas(flow_sigmas(20))
    for value in values[12:]:
        for c in (cache, restored):
            if c.should_skip():
                c.forecast(value)
            else:
                c.record(value, value)
    assert restored.computed_steps == cache.computed_steps and restored.error_estimate == cache.error_estimate
    assert len(cache.computed_steps) == options.get("budget", len(cache.computed_steps))


def test_a_state_that_does_not_fit_is_refused():
    cache = make_cache("auto", 20)
    cache.set_sigmas(flow_sigmas(20))
    for _ in range(3):
        cache.record(np.ones(4, np.float32), np.ones(4, np.float32))
    state = cache.state()
    for change in ({"measured_steps": [9]}, {"measured_errors": [-0.5]}, {"computed": [1, 3, 2]},
                   {"level": -1.0},
                   {"anchor_x0": [np.ones(3)] * 2}, {"settled": float("nan")}):
        with pytest.raises(AnimaError, match="does not fit"):
            make_cache("auto", 20).restore({**state, **change})
    with pytest.raises(AnimaError, match="incomplete"):
        make_cache("auto", 20).restore({k: v for k, v in state.items() if k != "level"})


@pytest.mark.parametrize("text, message", [
    ("tol=-0.1", "tol must be a number >= 0"),
    ("guard=0", "guard must be a number > 0"),
    ("budget=2", "budget must be an integer of at least the warm-up's 3"),
    ("budget=3,warmup=4", "budget must be an integer of at least the warm-up's 4"),
    ("warmup=1", "warmup must be an integer >= 2"),
    ("budget=10,tol=0.1", "cache option tol does not apply with a budget"),
    ("guard=0.3,budget=10", "cache option guard does not apply with a budget"),
    ("w=0.5", "cache option 'w' does not apply to cache 'auto'"),
    ("stop=0.9", "cache option 'stop' does not apply to cache 'auto'"),
])
def test_bad_options_are_one_line_errors(text, message):
    with pytest.raises(AnimaError, match=message) as error:
        make_cache("auto", 20, parse_cache_options(text))
    assert "\n" not in str(error.value)


def test_auto_options_do_not_apply_to_the_fixed_schedules():
    for name in ("spectrum", "spectrum-plus", "reuse", "none"):
        with pytest.raises(AnimaError, match="does not apply"):
            make_cache(name, 20, {"tol": 0.1})


def test_a_budget_of_just_the_warm_up_forecasts_the_rest_and_says_it_measured_nothing(denoise):
    result = run(denoise, 0, {"budget": 2, "warmup": 2})
    assert result.computed_steps == [1, 2] and result.finite
    assert result.error_estimate > 1  # charged as if every forecast were off by a whole x0


# ---- the "may differ visibly" flag and verify ------------------------------------------------------------------

def test_the_flag_score_is_the_late_misses_over_the_typical_ones():
    """The geometric mean, over the computed steps at sigma <= FLAG_SIGMA, of each measured miss over the typical
    miss at its sigma and distance from the computed step before (the constants written out here)."""
    computed, sigmas = [1, 2, 3, 6, 9, 12, 15, 17, 19, 20], flow_sigmas(20)
    misses = {3: 0.3, 6: 0.5, 9: 0.4, 12: 0.6, 15: 0.2, 17: 0.15, 19: 0.1, 20: 0.05}
    cache = make_cache("auto", 20, {"budget": 10})
    cache.set_sigmas(sigmas)
    cache.restore({"computed": computed, "skipped": [s for s in range(1, 21) if s not in computed],
                   "measured_steps": list(misses), "measured_errors": list(misses.values()), "level": 0.1,
                   "settled": 0.0, "shape": [4], "anchor_steps": [19, 20],
                   "anchor_x0": [np.ones(4, np.float32)] * 2, "anchor_eps": [np.ones(4, np.float32)] * 2})
    ratios = []
    for before, step in itertools.pairwise(computed):
        sigma, d = sigmas[step - 1], step - before
        if step in misses and sigma <= 0.8:  # steps 12-20 (step 9 sits at sigma 0.818)
            ratios.append(misses[step] / np.exp(-3.59 + 1.85 * np.log(d) + 1.77 * sigma - 0.66 * sigma * np.log(d)))
    assert len(ratios) == 5
    assert cache.flag_score == pytest.approx(np.prod(ratios) ** (1 / len(ratios)), rel=1e-12)
    assert cache.may_differ == (cache.flag_score >= 1.3)


def test_a_run_that_measured_nothing_late_has_no_flag():
    cache = make_cache("auto", 20)
    cache.set_sigmas(flow_sigmas(20))
    for _ in range(3):
        cache.record(np.ones(4, np.float32), np.ones(4, np.float32))
    assert cache.flag_score is None and cache.may_differ is None


def turning(denoise):
    """`denoise` whose x0 swings between -1 and 3 times itself once sigma is below 0.7: the late forecasts miss
    by far more than a typical one (flag score 1.5-2.1 at budget 8, against 0.3 without the swing), so an auto
    run of it is flagged."""
    def swinging(x, sigma):
        x0 = denoise(x, sigma)
        return x0 * (1 + 2 * np.sign(np.sin(60 * sigma))) if sigma < 0.7 else x0
    return swinging


@pytest.mark.parametrize("sampler", ["euler", "dpmpp_2m", "euler_ancestral", "cfgpp_ud10_ab"])
def test_verify_reruns_a_flagged_run_uncached_from_its_last_step_before_a_forecast(denoise, sampler):
    """The re-run starts from the latent and sampler history of step 3 (the warm-up's end) and computes every
    later step, so the image is the uncached one bit for bit; the listeners are told steps 4-20 again."""
    model, noise, sigmas = model_for(SAMPLERS[sampler], turning(denoise)), initial_noise(64, [3]), flow_sigmas(20)
    plain = sample(SAMPLERS[sampler], model, noise, sigmas, make_cache("auto", 20, {"budget": 8}), seed=5)
    assert plain.may_differ and plain.rerun_from is None
    events = []
    verified = sample_verified(SAMPLERS[sampler], model, noise, sigmas, make_cache("auto", 20, {"budget": 8}),
                               events.append, verify=True, seed=5)
    reference = sample(SAMPLERS[sampler], model, noise, sigmas, make_cache("none", 20), seed=5)
    assert np.array_equal(verified.latent, reference.latent)
    assert verified.rerun_from == 3 and verified.may_differ  # the flag of the run it replaced
    assert verified.computed_steps == list(range(1, 21)) and verified.skipped_steps == []
    assert verified.model_calls == 8 + 17 and verified.error_estimate == 0.0
    assert [e.step for e in events] == [*range(1, 21), *range(4, 21)]


def test_an_unflagged_run_under_verify_is_the_plain_run(denoise):
    def steady(x, sigma):  # every forecast exact: nothing to flag
        return np.full_like(x, 0.5)

    noise, sigmas = initial_noise(64, [3]), flow_sigmas(20)
    plain = sample(SAMPLERS["euler"], steady, noise, sigmas, make_cache("auto", 20, {"budget": 8}))
    verified = sample_verified(SAMPLERS["euler"], steady, noise, sigmas, make_cache("auto", 20, {"budget": 8}),
                               verify=True)
    assert verified.may_differ is False and verified.rerun_from is None
    assert np.array_equal(verified.latent, plain.latent) and verified.model_calls == plain.model_calls == 8


def test_a_stopped_re_run_resumes_to_the_same_bits(denoise):
    """A state written in verify's re-run is the re-run's (caches.UncachedRerun): restore_cache makes it again
    from the auto cache the run's settings make, and the resumed run reports the step it re-ran from."""
    model, noise, sigmas, events = turning(denoise), initial_noise(64, [3]), flow_sigmas(20), []
    whole = sample_verified(SAMPLERS["euler"], model, noise, sigmas, make_cache("auto", 20, {"budget": 8}),
                            events.append, verify=True)
    at = events[20 + 5]  # the re-run's step 9
    assert at.step == 9 and "trusted" not in at.sampler_state
    json.dumps(at.cache_state, allow_nan=False)
    cache = caches.restore_cache(make_cache("auto", 20, {"budget": 8}), at.cache_state)
    assert isinstance(cache, caches.UncachedRerun)
    resumed = sample_verified(SAMPLERS["euler"], model, at.x, sigmas, cache, verify=True, start=9,
                              state=at.sampler_state)
    assert np.array_equal(resumed.latent, whole.latent) and resumed.rerun_from == 3
    assert resumed.computed_steps == list(range(1, 21)) and resumed.may_differ and resumed.error_estimate == 0.0
    for change in ({"count": 21}, {"flagged": "yes"}, {"rerun_after": 1}):
        with pytest.raises(AnimaError, match="re-run does not fit"):
            caches.restore_cache(make_cache("auto", 20), {**at.cache_state, **change})


def test_an_auto_state_of_an_earlier_version_in_its_re_run_is_refused_in_one_line(denoise):
    cache = make_cache("auto", 20, {"budget": 8})
    run_events = []
    sample(SAMPLERS["euler"], denoise, initial_noise(64, [3]), flow_sigmas(20), cache, run_events.append)
    state = run_events[9].cache_state
    make_cache("auto", 20, {"budget": 8}).restore({**state, "rerun_from": None, "first_score": None})  # before it
    with pytest.raises(AnimaError, match="written in verify's re-run by an earlier version"):
        make_cache("auto", 20, {"budget": 8}).restore({**state, "rerun_from": 3, "first_score": 1.5,
                                                       "anchor_steps": [], "anchor_x0": [], "anchor_eps": []})


def test_verify_is_true_or_false():
    with pytest.raises(AnimaError, match="verify='maybe' is not true or false"):
        parse_cache_options("verify=maybe")
    with pytest.raises(AnimaError, match="verify must be true or false"):
        make_cache("auto", 20, {"budget": 10, "verify": "maybe"})
    assert caches.verifies(parse_cache_options("budget=10,verify=1"))


class Watched:
    """A model and its partial pass in miniature: `features(x, sigma)` stands for the first block's tokens at the
    latent x. The probe runs it on the latent at hand; last() gives it for the last call the model ran."""

    def __init__(self, denoise, features):
        self.denoise, self.features, self.seen, self.partial = denoise, features, None, 0

    def model(self, x, sigma):
        self.seen = (np.array(x, copy=True), sigma)
        return self.denoise(x, sigma)

    def __call__(self, x, sigma):
        self.partial += 1
        return self.features(x, sigma)

    def last(self):
        return self.features(*self.seen)


def steady_features(x, sigma):  # on every damped line: the check finds nothing
    return np.ones(32, np.float32)


def breaking_features(x, sigma):  # a jump below sigma 0.5, which no line through earlier steps foresees
    return np.full(32, 11.0 if sigma < 0.5 else 1.0, np.float32)


def checked_run(denoise, features, options, callback=None):
    watched, cache = Watched(denoise, features), make_cache("auto", 20, options)
    cache.attach_probe(watched)
    result = sample(SAMPLERS["euler"], watched.model, initial_noise(64, [3]), flow_sigmas(20), cache, callback)
    return result, cache, watched


def test_probe_miss_is_the_distance_from_the_damped_line():
    a, b = np.array([1.0, 2.0, 0.0]), np.array([0.0, 3.0, 1.0])
    at, bt = a + 0.6 * b, a + 0.8 * b  # features on a line in sigma, at the last two computed sigmas 0.6 and 0.8
    found = a + 0.3 * b
    damped = at + 0.5 * (0.3 - 0.6) / (0.6 - 0.8) * (at - bt)  # half the straight line's step past 0.6
    assert probe_miss(found, 0.3, (0.6, at), (0.8, bt)) == pytest.approx(
        np.linalg.norm(damped - found) / np.linalg.norm(found))
    assert probe_miss(at, 0.6, (0.6, at), (0.8, bt)) == 0.0
    assert probe_miss(np.full(3, np.nan), 0.3, (0.6, at), (0.8, bt)) == float("inf")


def test_a_check_that_finds_nothing_keeps_the_plain_plan_bit_for_bit(denoise):
    result, cache, watched = checked_run(denoise, steady_features, {"budget": 8, "check": True})
    plain = run(denoise, 3, {"budget": 8})
    assert np.array_equal(result.latent, plain.latent) and result.computed_steps == plain.computed_steps
    assert cache.checked_steps == [] and 0 < watched.partial <= len(result.skipped_steps)


def test_a_check_that_finds_a_break_computes_those_steps_within_the_same_cap(denoise):
    """The plan moves: the first forecasts past the jump are computed, and the calls they take come off later
    forecast runs, so the budget is still spent whole and never exceeded."""
    result, cache, _ = checked_run(denoise, breaking_features, {"budget": 8, "check": True})
    plain = run(denoise, 3, {"budget": 8})
    sigmas = flow_sigmas(20)
    first_late_forecast = next(s for s in plain.skipped_steps if sigmas[s - 1] < 0.5)
    assert cache.checked_steps[0] == first_late_forecast
    assert set(cache.checked_steps) <= set(result.computed_steps)
    assert len(result.computed_steps) == 8 and result.computed_steps != plain.computed_steps


def test_a_stopped_checked_run_restores_to_the_same_bits(denoise):
    events = []
    whole, _, _ = checked_run(denoise, breaking_features, {"budget": 8, "check": True}, events.append)
    at = events[11]  # after step 12, past the break
    state = at.cache_state
    json.dumps({k: v for k, v in state.items() if not k.startswith(("anchor_", "probe_features"))}, allow_nan=False)
    assert [len(a) for a in state["probe_features"]] == [32, 32]
    cache, watched = make_cache("auto", 20, {"budget": 8, "check": True}), Watched(denoise, breaking_features)
    cache.restore(state)
    cache.attach_probe(watched)
    resumed = sample(SAMPLERS["euler"], watched.model, at.x, flow_sigmas(20), cache, start=12,
                     state=at.sampler_state)
    assert np.array_equal(resumed.latent, whole.latent) and resumed.computed_steps == whole.computed_steps
    wrong = make_cache("auto", 20, {"budget": 8, "check": True})  # tokens of another model: found at the next check
    wrong.restore({**state, "probe_features": [np.ones(31, np.float32)] * 2})
    watched = Watched(denoise, breaking_features)
    wrong.attach_probe(watched)
    with pytest.raises(AnimaError, match="first-block tokens do not fit this model"):
        sample(SAMPLERS["euler"], watched.model, at.x, flow_sigmas(20), wrong, start=12, state=at.sampler_state)
    for change in ({"probe_steps": [1, 2]}, {"probe_features": [np.ones(32, np.float32), np.ones(31, np.float32)]},
                   {"probe_features": [np.full(32, np.nan, np.float32)] * 2}, {"checked": [4.5]}):
        with pytest.raises(AnimaError, match="does not fit"):
            make_cache("auto", 20, {"budget": 8, "check": True}).restore({**state, **change})


def test_check_needs_a_budget_a_probe_and_a_yes_or_no(denoise):
    with pytest.raises(AnimaError, match="cache option check needs a budget"):
        make_cache("auto", 20, parse_cache_options("check=1"))
    with pytest.raises(AnimaError, match="check='maybe' is not true or false"):
        parse_cache_options("budget=8,check=maybe")
    with pytest.raises(RuntimeError, match="needs a probe"):
        sample(SAMPLERS["euler"], denoise, initial_noise(64, [3]), flow_sigmas(20),
               make_cache("auto", 20, {"budget": 8, "check": True}))
    assert not make_cache("auto", 20, {"budget": 8}).check
    assert all(not isinstance(make_cache(name, 20), ChecksForecasts) for name in ("none", "spectrum", "reuse"))


def test_check_stays_out_of_samplers_that_add_fresh_noise(denoise):
    """Measured on er_sde (README): the check lowers those images, so it is refused there, before any model call
    (GenerationParams.validate sets the sigmas of a cache it makes)."""
    cache = make_cache("auto", 20, {"budget": 8, "check": True})
    with pytest.raises(AnimaError, match="check does not apply to a sampler that adds fresh noise"):
        cache.set_sigmas(flow_sigmas(20), fresh_noise=True)
