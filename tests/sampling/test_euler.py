import copy

import numpy as np
import pytest
from mixture import cfg_denoiser, initial_noise, make_testbed

from anima_rknn.errors import AnimaError
from anima_rknn.sampling.caches import CACHE_NAMES, make_cache
from anima_rknn.sampling.euler import sample_euler
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
        x0 = denoise(x, sigma, i + 1)
        x = x + (sigma_next - sigma) * ((x - x0) / sigma)
    result = sample_euler(denoise, noise, sigmas, make_cache("none", 20))
    assert x.dtype == np.float32 and result.latent.dtype == np.float32
    assert np.array_equal(result.latent, x)
    assert result.model_calls == 20 and result.computed_steps == list(range(1, 21))
    assert result.skipped_steps == [] and result.recomputed_steps == [] and result.finite


def test_spectrum_run_reports_every_step_as_an_event(denoise):
    events = []
    result = sample_euler(denoise, initial_noise(16, [0]), flow_sigmas(20), make_cache("spectrum", 20),
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
    reference = sample_euler(denoise, noise, sigmas, make_cache("none", 20)).latent
    cached = sample_euler(denoise, noise, sigmas, make_cache("spectrum-plus", 20)).latent
    assert np.linalg.norm(cached - reference) / np.linalg.norm(reference) < 0.05


def spiking_denoiser(dtype, peak):
    """x0 that swings from -peak to +peak on steps 3-4, so step 5's extrapolation overflows dtype."""

    def denoise(x, sigma, step):
        value = {3: -peak, 4: peak}.get(step, 0.0)
        return np.full(x.shape, value, dtype=dtype)

    return denoise


@pytest.mark.parametrize("cache_name", ["spectrum", "spectrum-plus"])
@pytest.mark.parametrize("dtype, peak", [(np.float16, 60000.0), (np.float32, 3e38)])
def test_non_finite_forecast_is_recomputed_and_reported(cache_name, dtype, peak):
    calls = []
    model = spiking_denoiser(dtype, peak)

    def denoise(x, sigma, step):
        calls.append(step)
        return model(x, sigma, step)

    cache = make_cache(cache_name, 20)
    result = sample_euler(denoise, np.zeros((2, 3), np.float32), flow_sigmas(20), cache)
    assert result.recomputed_steps[0] == 5
    assert 5 in result.computed_steps and 5 not in result.skipped_steps
    assert result.model_calls == len(calls) == len(result.computed_steps)
    assert calls == result.computed_steps
    assert sorted(result.computed_steps + result.skipped_steps) == list(range(1, 21))
    assert result.finite and np.isfinite(result.latent).all()


def test_sigma_and_cache_mismatches_are_rejected(denoise):
    noise = initial_noise(16, [0])
    with pytest.raises(AnimaError):
        sample_euler(denoise, noise, flow_sigmas(20), make_cache("none", 30))
    with pytest.raises(AnimaError):
        sample_euler(denoise, noise, np.array([1.0, 0.0, 0.5, 0.0]), make_cache("none", 3))
    with pytest.raises(AnimaError):
        sample_euler(denoise, noise, np.array([1.0]), make_cache("none", 0))


def test_a_used_cache_is_refused(denoise):
    cache = make_cache("spectrum", 4)
    sample_euler(denoise, initial_noise(16, [0]), flow_sigmas(4), cache)
    with pytest.raises(RuntimeError):
        sample_euler(denoise, initial_noise(16, [0]), flow_sigmas(4), cache)
    cache.reset()
    assert sample_euler(denoise, initial_noise(16, [0]), flow_sigmas(4), cache).model_calls == 4


class Stop(Exception):
    pass


def _interrupted_at(denoise, noise, sigmas, name, stop_after):
    """Run until step `stop_after` finished; return that step's event (what a resume state is made of)."""
    seen = []

    def listener(event):
        seen.append(event)
        if event.step == stop_after:
            raise Stop

    with pytest.raises(Stop):
        sample_euler(denoise, noise, sigmas, make_cache(name, len(sigmas) - 1), callback=listener)
    return seen[-1], [e.step for e in seen if e.recomputed]


@pytest.mark.parametrize("name", CACHE_NAMES)
def test_resuming_after_any_step_is_bit_identical(denoise, name):
    """Stopped after warm-up steps, computed steps, forecast steps or the next-to-last step, and continued
    from the event's latent and cache state, the run ends on exactly the uninterrupted latent."""
    noise, sigmas = initial_noise(16, range(3)), flow_sigmas(20)
    reference = sample_euler(denoise, noise, sigmas, make_cache(name, 20))
    for stop_after in range(1, 20):
        event, recomputed = _interrupted_at(denoise, noise, sigmas, name, stop_after)
        cache = make_cache(name, 20)
        cache.restore(copy.deepcopy(event.cache_state))
        resumed = sample_euler(denoise, event.x.copy(), sigmas, cache, start=stop_after, recomputed=recomputed)
        assert np.array_equal(resumed.latent, reference.latent), (name, stop_after)
        assert resumed.computed_steps == reference.computed_steps
        assert resumed.skipped_steps == reference.skipped_steps


@pytest.mark.parametrize("name", CACHE_NAMES)
def test_a_state_from_another_run_is_refused(name):
    cache = make_cache(name, 20)
    other = make_cache(name, 30)
    other.set_sigmas(flow_sigmas(30))
    for _ in range(25):
        if other.should_skip():
            other.forecast()
        else:
            other.record(np.zeros((1, 16), np.float32))
    with pytest.raises(AnimaError, match="cache state"):
        cache.restore(other.state())
    with pytest.raises(AnimaError, match="cache state"):
        cache.restore({"count": "many"})
