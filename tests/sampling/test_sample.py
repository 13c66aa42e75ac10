import copy

import numpy as np
import pytest
from mixture import cfg_denoiser, initial_noise, make_testbed, model_for

from anima_rknn.errors import AnimaError
from anima_rknn.sampling.caches import CACHE_NAMES, make_cache
from anima_rknn.sampling.sample import sample, step_noise
from anima_rknn.sampling.samplers import SAMPLERS, call_sigmas, history_layout
from anima_rknn.sampling.schedule import flow_sigmas


@pytest.fixture(scope="module")
def denoise():
    cond, uncond = make_testbed(dim=16, components=8, std=0.35, seed=0)
    return cfg_denoiser(cond, uncond, 4.0)


def test_cache_none_is_bit_identical_to_a_plain_euler_loop(denoise):
    sigmas = flow_sigmas(20)
    noise = initial_noise(16, range(5))
    x = noise.copy()
    for i in range(20):
        sigma, sigma_next = float(sigmas[i]), float(sigmas[i + 1])
        x0 = denoise(x, sigma)
        x = x + (sigma_next - sigma) * ((x - x0) / sigma)
    result = sample(SAMPLERS["euler"], denoise, noise, sigmas, make_cache("none", 20))
    assert x.dtype == np.float32 and result.latent.dtype == np.float32
    assert np.array_equal(result.latent, x)
    assert result.model_calls == 20 and result.computed_steps == list(range(1, 21))
    assert result.skipped_steps == [] and result.recomputed_steps == [] and result.finite


def test_spectrum_run_reports_every_step_as_an_event(denoise):
    events = []
    result = sample(SAMPLERS["euler"], denoise, initial_noise(16, [0]), flow_sigmas(20), make_cache("spectrum", 20),
                          callback=events.append)
    assert result.computed_steps == [1, 2, 3, 4, 6, 8, 11, 14, 18, 19, 20]
    assert result.skipped_steps == [5, 7, 9, 10, 12, 13, 15, 16, 17]
    assert result.model_calls == 11 and result.finite
    assert [(e.step, e.total, e.computed) for e in events] == [(s, 20, s in result.computed_steps)
                                                               for s in range(1, 21)]
    sigmas = flow_sigmas(20)
    assert [(e.sigma, e.sigma_next) for e in events] == [(sigmas[i], sigmas[i + 1]) for i in range(20)]
    assert np.array_equal(events[-1].x, result.latent) and events[0].x0.shape == (1, 16)
    assert all(e.seconds >= 0 and e.eta_s >= 0 for e in events) and events[-1].eta_s == 0
    assert (events[5].cache_state["computed"], events[5].cache_state["skipped"]) == ([1, 2, 3, 4, 6], [5])
    # The x of each event is the Euler update of the previous one with that event's x0.
    for before, after in zip(events, events[1:]):
        expected = before.x + (after.sigma_next - after.sigma) * ((before.x - after.x0) / after.sigma)
        np.testing.assert_array_equal(after.x, expected.astype(np.float32))


def test_cached_run_stays_close_to_uncached(denoise):
    noise, sigmas = initial_noise(16, range(8)), flow_sigmas(20)
    reference = sample(SAMPLERS["euler"], denoise, noise, sigmas, make_cache("none", 20)).latent
    cached = sample(SAMPLERS["euler"], denoise, noise, sigmas, make_cache("spectrum-plus", 20)).latent
    assert np.linalg.norm(cached - reference) / np.linalg.norm(reference) < 0.05


def spiking_denoiser(dtype, peak, sigmas):
    """x0 that swings from -peak to +peak on steps 3-4, so step 5's extrapolation overflows dtype."""

    def denoise(x, sigma):
        step = list(sigmas).index(sigma) + 1
        value = {3: -peak, 4: peak}.get(step, 0.0)
        return np.full(x.shape, value, dtype=dtype)

    return denoise


@pytest.mark.parametrize("cache_name", ["spectrum", "spectrum-plus"])
@pytest.mark.parametrize("dtype, peak", [(np.float16, 60000.0), (np.float32, 3e38)])
def test_non_finite_forecast_is_recomputed_and_reported(cache_name, dtype, peak):
    calls, sigmas = [], flow_sigmas(20)
    model = spiking_denoiser(dtype, peak, sigmas)

    def denoise(x, sigma):
        calls.append(list(sigmas).index(sigma) + 1)
        return model(x, sigma)

    cache = make_cache(cache_name, 20)
    result = sample(SAMPLERS["euler"], denoise, np.zeros((2, 3), np.float32), sigmas, cache)
    assert result.recomputed_steps[0] == 5
    assert 5 in result.computed_steps and 5 not in result.skipped_steps
    assert result.model_calls == len(calls) == len(result.computed_steps)
    assert calls == result.computed_steps
    assert sorted(result.computed_steps + result.skipped_steps) == list(range(1, 21))
    assert result.finite and np.isfinite(result.latent).all()


def test_sigma_and_cache_mismatches_are_rejected(denoise):
    noise = initial_noise(16, [0])
    with pytest.raises(AnimaError):
        sample(SAMPLERS["euler"], denoise, noise, flow_sigmas(20), make_cache("none", 30))
    with pytest.raises(AnimaError):
        sample(SAMPLERS["euler"], denoise, noise, np.array([1.0, 0.0, 0.5, 0.0]), make_cache("none", 3))
    with pytest.raises(AnimaError):
        sample(SAMPLERS["euler"], denoise, noise, np.array([1.0]), make_cache("none", 0))


def test_a_used_cache_is_refused(denoise):
    cache = make_cache("spectrum", 4)
    sample(SAMPLERS["euler"], denoise, initial_noise(16, [0]), flow_sigmas(4), cache)
    with pytest.raises(RuntimeError):
        sample(SAMPLERS["euler"], denoise, initial_noise(16, [0]), flow_sigmas(4), cache)
    cache.reset()
    assert sample(SAMPLERS["euler"], denoise, initial_noise(16, [0]), flow_sigmas(4), cache).model_calls == 4


class Stop(Exception):
    pass


def run(name, denoise, noise, sigmas, cache_name="none", **kwargs):
    sampler = SAMPLERS[name]
    cache = make_cache(cache_name, len(call_sigmas(sampler, sigmas)))
    return sample(sampler, model_for(sampler, denoise), noise, sigmas, cache, seed=7, **kwargs)


def _interrupted_at(name, denoise, noise, sigmas, cache_name, stop_after):
    """Run until step `stop_after` finished; return that step's event (what a resume state is made of)."""
    seen = []

    def listener(event):
        seen.append(event)
        if event.step == stop_after:
            raise Stop

    with pytest.raises(Stop):
        run(name, denoise, noise, sigmas, cache_name, callback=listener)
    return seen[-1]


@pytest.mark.parametrize("name", SAMPLERS)
@pytest.mark.parametrize("cache_name", CACHE_NAMES)
def test_resuming_after_any_step_is_bit_identical(denoise, name, cache_name):
    """Stopped after warm-up steps, computed steps, forecast steps or the next-to-last step, and continued from
    the event's latent, cache state and sampler state, every sampler ends on exactly the uninterrupted latent:
    the noise of a step is drawn again from (seed, step), the history is the state's."""
    noise, sigmas = initial_noise(16, range(3)), flow_sigmas(12)
    reference = run(name, denoise, noise, sigmas, cache_name)
    for stop_after in range(1, 12):
        event = _interrupted_at(name, denoise, noise, sigmas, cache_name, stop_after)
        sampler = SAMPLERS[name]
        cache = make_cache(cache_name, len(call_sigmas(sampler, sigmas)))
        cache.restore(copy.deepcopy(event.cache_state))
        resumed = sample(sampler, model_for(sampler, denoise), event.x.copy(), sigmas, cache, seed=7, start=stop_after,
                         state=copy.deepcopy(event.sampler_state))
        assert np.array_equal(resumed.latent, reference.latent), (name, cache_name, stop_after)
        assert resumed.computed_steps == reference.computed_steps
        assert resumed.skipped_steps == reference.skipped_steps


@pytest.mark.parametrize("name", SAMPLERS)
def test_history_layout_is_what_the_sampler_keeps(denoise, name):
    """What a resume state must hold after k steps, found by a dry run, is what a real run's events hold."""
    sigmas, events = flow_sigmas(8), []
    run(name, denoise, initial_noise(16, [0]), sigmas, callback=events.append)
    for event in events:
        history = event.sampler_state["history"]
        assert history_layout(SAMPLERS[name], sigmas, event.step) == {k: len(v) for k, v in history.items()}
        assert all(a.dtype == np.float32 and a.shape == (1, 16) for v in history.values() for a in v)


@pytest.mark.parametrize("name", SAMPLERS)
def test_events_count_the_model_calls_of_every_step(denoise, name):
    """heun, dpmpp_sde and sa_solver_pece run the network twice a step; the events and the result say so, and
    the cache plans over exactly those calls."""
    sampler, sigmas, events, calls = SAMPLERS[name], flow_sigmas(10), [], []

    def counting(x, sigma):
        calls.append(sigma)
        return denoise(x, sigma)

    result = run(name, counting, initial_noise(16, [0]), sigmas, callback=events.append)
    assert calls == call_sigmas(sampler, sigmas)
    assert [e.model_calls for e in events] == [len(sampler.calls(sigmas, i)) for i in range(10)]
    assert result.model_calls == len(calls) == sum(e.model_calls for e in events)
    twice = name in ("heun", "dpmpp_sde", "sa_solver_pece")
    assert (len(calls) > 10) == twice


def test_a_cache_step_is_a_model_call(denoise):
    """Under heun the cache's schedule runs over the 19 calls of 10 steps: forecasts stand in for calls, and a
    step is reported computed only when none of its calls was forecast."""
    sigmas, events = flow_sigmas(10), []
    result = run("heun", denoise, initial_noise(16, [0]), sigmas, "spectrum", callback=events.append)
    assert sorted(result.computed_steps + result.skipped_steps) == list(range(1, 20))
    assert result.skipped_steps and result.model_calls == len(result.computed_steps)
    assert sum(e.model_calls for e in events) == result.model_calls
    assert [e.computed for e in events] == [e.model_calls == len(SAMPLERS["heun"].calls(sigmas, e.step - 1))
                                            for e in events]


def test_step_noise_is_keyed_by_seed_step_and_draw():
    """The same numbers in any order of asking: a skipped step or a resume cannot shift a later draw."""
    first, again = step_noise(3, (2, 5)), step_noise(3, (2, 5))
    later = first(9, 1)
    assert np.array_equal(again(9, 1), later) and np.array_equal(first(0, 0), again(0, 0))
    assert not np.array_equal(first(9, 0), later) and not np.array_equal(step_noise(4, (2, 5))(9, 1), later)
    assert later.dtype == np.float32 and later.shape == (2, 5)


def test_a_forecast_does_not_change_what_later_steps_draw(denoise):
    """euler_ancestral with and without a cache, the denoiser a constant: every step's x0 is then the same,
    forecast or not, so the two runs must agree bit for bit only if they drew the same noise at every step."""
    constant = np.full((1, 16), 0.25, np.float32)

    def flat(x, sigma):
        return constant.copy()

    noise, sigmas = initial_noise(16, [1]), flow_sigmas(20)
    uncached = run("euler_ancestral", flat, noise, sigmas)
    cached = run("euler_ancestral", flat, noise, sigmas, "reuse")
    assert cached.skipped_steps and np.array_equal(cached.latent, uncached.latent)


def test_a_stochastic_sampler_without_a_seed_is_refused(denoise):
    sampler = SAMPLERS["euler_ancestral"]
    with pytest.raises(RuntimeError, match="seed"):
        sample(sampler, denoise, initial_noise(16, [0]), flow_sigmas(4), make_cache("none", 4))


@pytest.mark.parametrize("name", CACHE_NAMES)
def test_a_state_from_another_run_is_refused(name):
    cache = make_cache(name, 20)
    other = make_cache(name, 30)
    other.set_sigmas(flow_sigmas(30))
    for _ in range(25):
        if other.should_skip():
            other.forecast(np.zeros((1, 16), np.float32))
        else:
            other.record(np.zeros((1, 16), np.float32), np.zeros((1, 16), np.float32))
    with pytest.raises(AnimaError, match="cache state"):
        cache.restore(other.state())
    with pytest.raises(AnimaError, match="cache state"):
        cache.restore({"count": "many"})


def test_a_run_ends_at_its_first_non_finite_step_and_tells_no_listener_of_it(denoise):
    """No later step can mend a NaN latent: the run stops there, and no checkpoint or preview is told of it."""
    calls = []

    def breaks_at_the_third_call(x, sigma):
        calls.append(sigma)
        return denoise(x, sigma) * (np.nan if len(calls) == 3 else 1.0)

    events = []
    result = sample(SAMPLERS["euler"], breaks_at_the_third_call, initial_noise(16, [0]), flow_sigmas(8),
                    make_cache("none", 8), callback=events.append)
    assert len(calls) == 3 and [e.step for e in events] == [1, 2]
    assert not result.finite and result.computed_steps == [1, 2, 3] and result.interrupted_at is None


@pytest.mark.parametrize("name", ["euler", "heun", "dpmpp_2m_sde"])
def test_an_interrupt_ends_the_run_with_the_x0_of_its_step(denoise, name):
    """WebUI's interrupt: the picture as far as it got is the denoised estimate of the last step run."""
    noise, sigmas = initial_noise(16, [0]), flow_sigmas(8)
    events = []
    whole = run(name, denoise, noise, sigmas, callback=events.append)
    stopped = []
    interrupted = run(name, denoise, noise, sigmas, callback=stopped.append, interrupt=lambda: len(stopped) == 3)
    assert interrupted.interrupted_at == 3 and [e.step for e in stopped] == [1, 2, 3]
    np.testing.assert_array_equal(interrupted.latent, events[2].x0)
    assert interrupted.finite and whole.interrupted_at is None
    assert interrupted.model_calls == sum(e.model_calls for e in stopped)
    ended = []  # asked only once the last step is done: the run is whole, not interrupted
    at_the_end = run(name, denoise, noise, sigmas, callback=ended.append, interrupt=lambda: len(ended) == 8)
    assert at_the_end.interrupted_at is None and np.array_equal(at_the_end.latent, whole.latent)
