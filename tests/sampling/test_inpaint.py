"""Inpainting as a wrapper of the model: every sampler keeps the unmasked part on the original's trajectory.

The checks are closed forms: outside the mask the last latent is the original exactly, a mask of ones is plain
sampling, a mask of zeros returns the original, and under Euler the run equals diffusers' flow inpainting loop
(blend the latent after each step with the original noised to the step's new sigma) written out here.
"""

import numpy as np
import pytest
from mixture import cfg_denoiser, initial_noise, make_testbed, model_for

from anima_rknn.errors import AnimaError
from anima_rknn.sampling.caches import CACHE_NAMES, make_cache
from anima_rknn.sampling.inpaint import Inpaint
from anima_rknn.sampling.sample import sample
from anima_rknn.sampling.samplers import SAMPLERS, call_sigmas
from anima_rknn.sampling.schedule import flow_sigmas, strength_start

DIM = 16


@pytest.fixture(scope="module")
def denoise():
    cond, uncond = make_testbed(dim=DIM, components=8, std=0.35, seed=0)
    return cfg_denoiser(cond, uncond, 4.0)


def _case(rows: int = 6, seed: int = 3):
    rng = np.random.default_rng(seed)
    original = (0.6 * rng.standard_normal((rows, DIM))).astype(np.float32)
    noise = initial_noise(DIM, range(rows))
    mask = np.zeros((1, DIM), dtype=np.float32)
    mask[:, : DIM // 2] = 1.0  # repaint the first half of every row
    mask[:, DIM // 2] = 0.5  # one soft column
    return original, noise, mask


def _run(name, denoise, original, noise, mask, sigmas, cache="none", seed=5):
    sampler = SAMPLERS[name]
    inpaint = Inpaint(original, noise, mask)
    x = inpaint.known(float(sigmas[0]))
    calls = len(call_sigmas(sampler, sigmas))
    return sample(sampler, model_for(sampler, denoise), x, sigmas, make_cache(cache, calls), seed=seed,
                  inpaint=inpaint)


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_outside_the_mask_every_sampler_ends_on_the_original(name, denoise):
    original, noise, mask = _case()
    sigmas = flow_sigmas(12)[strength_start(12, 0.75):]
    result = _run(name, denoise, original, noise, mask, sigmas)
    assert result.finite
    np.testing.assert_array_equal(result.latent[:, DIM // 2 + 1:], original[:, DIM // 2 + 1:])
    # Inside, the model repainted it: far from the original there.
    assert np.abs(result.latent[:, : DIM // 2] - original[:, : DIM // 2]).mean() > 0.05


@pytest.mark.parametrize("name", ["euler", "dpmpp_2m", "er_sde"])
def test_a_mask_of_ones_is_plain_sampling_and_of_zeros_the_original(name, denoise):
    original, noise, _ = _case()
    sigmas = flow_sigmas(10)
    sampler = SAMPLERS[name]
    plain = sample(sampler, denoise, noise, sigmas, make_cache("none", len(call_sigmas(sampler, sigmas))), seed=5)
    ones = _run(name, denoise, original, noise, np.ones((1, DIM), np.float32), sigmas)
    np.testing.assert_allclose(ones.latent, plain.latent, rtol=0, atol=1e-6)
    zeros = _run(name, denoise, original, noise, np.zeros((1, DIM), np.float32), sigmas)
    np.testing.assert_array_equal(zeros.latent, original)


def test_euler_inpainting_with_a_hard_mask_is_diffusers_flow_inpaint_loop(denoise):
    original, noise, mask = _case()
    mask = np.round(mask + 0.1)  # 0 or 1: on a soft edge the two ways of blending differ (sampling/inpaint.py)
    sigmas = flow_sigmas(10)[strength_start(10, 0.6):]
    x = ((1 - sigmas[0]) * original + sigmas[0] * noise).astype(np.float32)
    for i in range(len(sigmas) - 1):
        sigma, sigma_next = float(sigmas[i]), float(sigmas[i + 1])
        x0 = denoise(x, sigma)
        x = (x + (sigma_next - sigma) * ((x - x0) / sigma)).astype(np.float32)
        known = ((1 - sigma_next) * original + sigma_next * noise).astype(np.float32)
        x = (mask * x + (1 - mask) * known).astype(np.float32)
    ours = _run("euler", denoise, original, noise, mask, sigmas)
    np.testing.assert_allclose(ours.latent, x, rtol=0, atol=2e-6)


@pytest.mark.parametrize("cache", [c for c in CACHE_NAMES if c != "none"])
def test_every_cache_inpaints_over_the_truncated_schedule(cache, denoise):
    original, noise, mask = _case()
    sigmas = flow_sigmas(20)[strength_start(20, 0.8):]
    result = _run("euler", denoise, original, noise, mask, sigmas, cache=cache)
    assert len(result.computed_steps) + len(result.skipped_steps) == 16
    np.testing.assert_array_equal(result.latent[:, DIM // 2 + 1:], original[:, DIM // 2 + 1:])


def test_a_mask_that_does_not_fit_the_latent_is_refused():
    original, noise, _ = _case()
    with pytest.raises(AnimaError, match="does not fit"):
        Inpaint(original, noise, np.ones((1, DIM + 1), np.float32))
    with pytest.raises(AnimaError, match="differ in shape"):
        Inpaint(original, noise[:2], np.ones((1, DIM), np.float32))
