import numpy as np
import pytest

from anima_rknn.errors import AnimaError
from anima_rknn.sampling.caches import make_cache
from anima_rknn.sampling.euler import sample_euler
from anima_rknn.sampling.mixture import cfg_denoiser, initial_noise, make_testbed
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


def test_spectrum_run_reports_steps_calls_and_progress(denoise):
    progress = []
    result = sample_euler(denoise, initial_noise(16, [0]), flow_sigmas(20), make_cache("spectrum", 20),
                          callback=lambda step, total, skipped: progress.append((step, total, skipped)),
                          keep_x0=True)
    assert result.computed_steps == [1, 2, 3, 4, 6, 8, 11, 14, 18, 19, 20]
    assert result.skipped_steps == [5, 7, 9, 10, 12, 13, 15, 16, 17]
    assert result.model_calls == 11 and result.finite
    assert progress == [(s, 20, s in result.skipped_steps) for s in range(1, 21)]
    assert len(result.step_times) == 20 and all(t >= 0 for t in result.step_times)
    assert len(result.x0_history) == 20 and result.x0_history[0].shape == (1, 16)


def test_x0_history_only_on_request(denoise):
    result = sample_euler(denoise, initial_noise(16, [0]), flow_sigmas(4), make_cache("none", 4))
    assert result.x0_history is None


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
    cache.spectrum.reset()
    assert sample_euler(denoise, initial_noise(16, [0]), flow_sigmas(4), cache).model_calls == 4
