"""How far a cached run lands from the baseline (images, latents, x0 trajectories), and how much memory a run
takes at its peak."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image
from skimage.metrics import peak_signal_noise_ratio, structural_similarity

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


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


def _vm_hwm_bytes() -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # the kernel writes kB
    except OSError:
        pass
    return None


def _release_free_memory() -> None:
    """Hand freed heap back to the OS so one run's leftovers don't count as the next run's peak."""
    gc.collect()
    libc_name = ctypes.util.find_library("c")
    if libc_name:
        libc = ctypes.CDLL(libc_name)
        if hasattr(libc, "malloc_trim"):  # glibc only
            libc.malloc_trim(0)


@dataclass
class PeakRSS:
    """Peak resident set size over a `with` block, in bytes; None where the kernel can't reset the mark."""

    bytes: int | None = None


@contextmanager
def peak_rss() -> Iterator[PeakRSS]:
    """Linux: writing "5" to /proc/self/clear_refs resets VmHWM to the current RSS, so the VmHWM read after
    the block is this block's peak (memory already resident when it starts counts too)."""
    result = PeakRSS()
    _release_free_memory()
    try:
        _CLEAR_REFS.write_text("5")
        resettable = True
    except OSError:
        resettable = False
    yield result
    if resettable:
        result.bytes = _vm_hwm_bytes()
