import numpy as np
import pytest
from mixture import GaussianMixture, cfg_denoiser, initial_noise, make_testbed, relative_errors

from anima_rknn.errors import AnimaError
from anima_rknn.sampling.caches import make_cache
from anima_rknn.sampling.sample import sample
from anima_rknn.sampling.samplers import SAMPLERS
from anima_rknn.sampling.schedule import flow_sigmas


@pytest.mark.parametrize("sigma", [0.0, 1e-9, 0.2, 0.5, 0.9, 1.0 - 1e-9, 1.0])
def test_single_gaussian_matches_linear_gaussian_posterior(sigma):
    rng = np.random.default_rng(1)
    mean, std = rng.standard_normal(5), 0.7
    x_t = rng.standard_normal((4, 5))
    # x0 ~ N(mean, std^2), x_t = (1-s) x0 + s eps: E[x0|x_t] = E x0 + Cov(x0, x_t) / Var(x_t) (x_t - E x_t).
    covariance = (1 - sigma) * std**2
    variance = (1 - sigma) ** 2 * std**2 + sigma**2
    expected = mean + covariance / variance * (x_t - (1 - sigma) * mean)
    got = GaussianMixture(mean[None], std).denoise(x_t, sigma)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_mixture_denoiser_matches_monte_carlo_posterior_mean():
    rng = np.random.default_rng(2)
    mixture = GaussianMixture(np.array([[-2.0, 0.0], [2.0, 1.0], [0.0, -2.5]]), 0.5, np.array([0.2, 0.5, 0.3]))
    x0 = mixture.sample(400_000, rng)
    for sigma, x_t in [(0.3, np.array([0.8, 0.4])), (0.6, np.array([-0.5, -0.6])), (0.85, np.array([0.1, 0.2]))]:
        # Self-normalised importance sampling with the likelihood N(x_t; (1-s) x0, s^2 I).
        log_likelihood = -np.sum((x_t - (1 - sigma) * x0) ** 2, axis=1) / (2 * sigma**2)
        weights = np.exp(log_likelihood - log_likelihood.max())
        estimate = weights @ x0 / weights.sum()
        effective_samples = weights.sum() ** 2 / (weights**2).sum()
        posterior_std = np.sqrt(weights @ (x0 - estimate) ** 2 / weights.sum())
        tolerance = 5 * posterior_std / np.sqrt(effective_samples)  # five standard errors, 0.007-0.014
        error = np.abs(mixture.denoise(x_t, sigma) - estimate)
        assert np.all(error < tolerance), (sigma, error, tolerance)


def test_denoiser_limits_and_far_inputs_are_stable():
    mixture = GaussianMixture(np.array([[0.0, 0.0], [10.0, 10.0]]), 0.1, np.array([0.25, 0.75]))
    x_t = np.array([[3.0, -1.0], [1e4, -1e4], [-1e6, 1e6]])
    np.testing.assert_allclose(mixture.denoise(x_t, 1.0), [[7.5, 7.5]] * 3)  # prior mean
    np.testing.assert_allclose(mixture.denoise(x_t, 0.0), x_t)  # no noise: x_t is x0
    assert np.isfinite(mixture.denoise(x_t, 0.5)).all()


def test_sample_moments():
    mixture = GaussianMixture(np.array([[-3.0], [3.0]]), 0.3, np.array([0.25, 0.75]))
    samples = mixture.sample(20_000, np.random.default_rng(3))
    assert abs((samples > 0).mean() - 0.75) < 0.015
    assert abs(samples[samples > 0].std() - 0.3) < 0.01


def test_exact_denoiser_with_euler_reproduces_the_mixture():
    # Independent truth for sampler + schedule + denoiser: the sampled distribution is the data's.
    mixture = GaussianMixture(np.array([[-3.0], [3.0]]), 0.3, np.array([0.25, 0.75]))
    noise = np.random.default_rng(4).standard_normal((4000, 1)).astype(np.float32)
    denoise = cfg_denoiser(mixture, mixture, 1.0)
    samples = sample(SAMPLERS["euler"], denoise, noise, flow_sigmas(200), make_cache("none", 200)).latent
    assert abs((samples > 0).mean() - 0.75) < 0.03
    assert abs(samples[samples > 0].std() - 0.3) < 0.03
    assert abs(samples[samples > 0].mean() - 3.0) < 0.03


def test_cfg_on_x0_equals_cfg_on_velocity():
    cond, uncond = make_testbed(dim=8, components=8, std=0.35, seed=5)
    x = initial_noise(8, range(3))
    sigma, scale = 0.6, 4.0
    x0 = cfg_denoiser(cond, uncond, scale)(x, sigma)
    v_cond, v_uncond = (x - cond.denoise(x, sigma)) / sigma, (x - uncond.denoise(x, sigma)) / sigma
    np.testing.assert_allclose((x - x0) / sigma, v_uncond + scale * (v_cond - v_uncond), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(cfg_denoiser(cond, uncond, 1.0)(x, sigma), cond.denoise(x, sigma), rtol=1e-6)


def test_testbed_conditional_is_a_reweighted_subset():
    cond, uncond = make_testbed(dim=64, components=8, std=0.35, seed=0)
    assert uncond.means.shape == (8, 64) and cond.means.shape == (2, 64)
    assert all(any(np.array_equal(m, u) for u in uncond.means) for m in cond.means)
    np.testing.assert_allclose([cond.weights.sum(), uncond.weights.sum()], [1.0, 1.0])
    again, _ = make_testbed(dim=64, components=8, std=0.35, seed=0)
    assert np.array_equal(again.means, cond.means) and np.array_equal(again.weights, cond.weights)


def test_relative_errors_of_cache_none_are_zero():
    cond, uncond = make_testbed(dim=16, components=8, std=0.35, seed=0)
    assert np.array_equal(relative_errors("none", cond, uncond, 4.0, 20, range(4)), np.zeros(4))


def test_batched_seeds_match_single_runs():
    cond, uncond = make_testbed(dim=16, components=8, std=0.35, seed=0)
    batch = relative_errors("spectrum", cond, uncond, 4.0, 20, [3, 7, 11])
    single = [relative_errors("spectrum", cond, uncond, 4.0, 20, [seed])[0] for seed in (3, 7, 11)]
    np.testing.assert_allclose(batch, single, rtol=1e-4)


@pytest.mark.parametrize("means, std, weights", [
    (np.zeros(3), 1.0, None), (np.zeros((2, 3)), 0.0, None), (np.zeros((2, 3)), 1.0, np.array([1.0, -1.0])),
    (np.zeros((2, 3)), 1.0, np.ones(3)),
])
def test_bad_mixtures_rejected(means, std, weights):
    with pytest.raises(AnimaError):
        GaussianMixture(means, std, weights)
