"""How far a cached run lands from the baseline: images, latents, x0 trajectories."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image
from skimage.metrics import peak_signal_noise_ratio, structural_similarity


def _pixels(image: Image.Image | np.ndarray) -> np.ndarray:
    return np.asarray(image.convert("RGB") if isinstance(image, Image.Image) else image)


def psnr(reference: Image.Image | np.ndarray, other: Image.Image | np.ndarray) -> float:
    """PSNR in dB of two 8-bit images; inf when they are identical."""
    a, b = _pixels(reference), _pixels(other)
    with np.errstate(divide="ignore"):  # identical images: MSE 0, and inf is the right answer
        return float(peak_signal_noise_ratio(a, b, data_range=255))


def ssim(reference: Image.Image | np.ndarray, other: Image.Image | np.ndarray) -> float:
    """Mean SSIM of two 8-bit RGB images (7x7 window, per channel); 1.0 when identical."""
    a, b = _pixels(reference), _pixels(other)
    return float(structural_similarity(a, b, data_range=255, channel_axis=-1))


def difference_map(reference: Image.Image | np.ndarray, other: Image.Image | np.ndarray) -> np.ndarray:
    """Per-pixel absolute difference, averaged over the colour channels, in 0..255."""
    return np.abs(_pixels(reference).astype(np.float32) - _pixels(other).astype(np.float32)).mean(axis=-1)


def relative_l2(reference: np.ndarray, other: np.ndarray) -> float:
    """||other - reference|| / ||reference|| (the test bed's error measure); 0 for identical arrays."""
    reference, other = np.asarray(reference, np.float64), np.asarray(other, np.float64)
    norm = np.linalg.norm(reference)
    return float(np.linalg.norm(other - reference) / norm) if norm > 0 else float(np.linalg.norm(other))


@dataclass
class LatentError:
    relative_l2: float
    max_abs: float
    rmse: float


def latent_error(reference: np.ndarray, other: np.ndarray) -> LatentError:
    difference = np.asarray(other, np.float64) - np.asarray(reference, np.float64)
    return LatentError(relative_l2(reference, other), float(np.abs(difference).max()),
                       float(np.sqrt(np.mean(difference**2))))


def x0_distances(reference: Sequence[np.ndarray], other: Sequence[np.ndarray]) -> list[float]:
    """Relative L2 distance between the x0 the two runs used at each step."""
    if len(reference) != len(other):
        raise ValueError(f"x0 histories differ in length: {len(reference)} vs {len(other)}")
    return [relative_l2(a, b) for a, b in zip(reference, other)]


def spearman(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Spearman rank correlation of two equally long series (ties share their mean rank); None when either
    series is constant, where no ranking exists."""
    from scipy.stats import spearmanr  # scipy comes with scikit-image

    rho = float(spearmanr(a, b).statistic)
    return rho if math.isfinite(rho) else None
