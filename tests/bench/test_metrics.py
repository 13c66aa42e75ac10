"""Image and latent metrics against values worked out from their definitions."""

import math

import numpy as np
import pytest
from PIL import Image

from anima_rknn.bench import metrics


def _image(seed: int = 0, size: int = 64) -> np.ndarray:
    # Mid-range values so added noise is never clipped at 0 or 255.
    return np.random.default_rng(seed).integers(64, 192, size=(size, size, 3), dtype=np.uint8)


def test_identical_images_have_infinite_psnr_and_ssim_one():
    image = _image()
    assert metrics.psnr(image, image.copy()) == math.inf
    assert metrics.ssim(Image.fromarray(image), Image.fromarray(image)) == pytest.approx(1.0)


def test_psnr_of_known_gaussian_noise_matches_the_formula():
    rng = np.random.default_rng(1)
    clean = _image(1, 128)
    sigma = 5.0
    noisy = np.clip(np.round(clean + rng.normal(0, sigma, clean.shape)), 0, 255).astype(np.uint8)
    mse = np.mean(((clean / 255.0) - (noisy / 255.0)) ** 2)
    assert metrics.psnr(clean, noisy) == pytest.approx(10 * math.log10(1 / mse), abs=1e-9)
    # Rounding adds 1/12 to the noise variance: 20 log10(255 / sqrt(25 + 1/12)) = 34.14 dB.
    assert metrics.psnr(clean, noisy) == pytest.approx(20 * math.log10(255 / math.sqrt(sigma**2 + 1 / 12)), abs=0.1)


def test_ssim_drops_with_more_noise():
    rng = np.random.default_rng(2)
    clean = _image(2)
    scores = [metrics.ssim(clean, np.clip(np.round(clean + rng.normal(0, s, clean.shape)), 0, 255).astype(np.uint8))
              for s in (2, 8, 32)]
    assert 1 > scores[0] > scores[1] > scores[2] > 0


def test_ssim_of_two_flat_images_is_the_luminance_term():
    # Flat images have no variance, so SSIM is (2ab + C1) / (a^2 + b^2 + C1) with C1 = (0.01 * 255)^2.
    a, b = 100.0, 130.0
    c1 = (0.01 * 255) ** 2
    flat_a, flat_b = (np.full((32, 32, 3), v, dtype=np.uint8) for v in (a, b))
    assert metrics.ssim(flat_a, flat_b) == pytest.approx((2 * a * b + c1) / (a**2 + b**2 + c1), rel=1e-6)


def test_difference_map_is_mean_absolute_rgb_difference():
    a = np.zeros((2, 2, 3), np.uint8)
    b = a.copy()
    b[0, 1] = (30, 0, 255)
    expected = np.array([[0, 95], [0, 0]], np.float32)
    np.testing.assert_array_equal(metrics.difference_map(a, b), expected)


def test_latent_error_and_x0_distances():
    reference = np.ones((1, 4), np.float32)
    other = reference + np.array([[0, 0, 0, 2]], np.float32)
    error = metrics.latent_error(reference, other)
    # ||(0,0,0,2)|| / ||(1,1,1,1)|| = 2 / 2; RMSE = sqrt(4 / 4).
    assert (error.relative_l2, error.max_abs, error.rmse) == (1.0, 2.0, 1.0)
    assert metrics.latent_error(reference, reference.copy()).relative_l2 == 0.0
    assert metrics.x0_distances([reference, reference], [reference, other]) == [0.0, 1.0]
    with pytest.raises(ValueError):
        metrics.x0_distances([reference], [reference, other])
