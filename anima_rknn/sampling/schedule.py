"""Flow-matching sigmas: ComfyUI's "simple" schedule over a shifted 1000-entry table."""

from __future__ import annotations

import numpy as np

from ..checks import is_integer, is_number, require

TRAIN_TIMESTEPS = 1000


def shift_sigma(t: np.ndarray | float, shift: float) -> np.ndarray | float:
    """Time shift of rectified flow: spends more steps at high noise when shift > 1."""
    return shift * t / (1.0 + (shift - 1.0) * t)


def flow_sigmas(steps: int, shift: float = 3.0) -> np.ndarray:
    """`steps` decreasing sigmas starting at 1.0, then a final 0; float64, length steps + 1."""
    require(is_integer(steps) and steps >= 1, f"steps must be a positive integer, got {steps!r}")
    require(is_number(shift) and shift > 0, f"sigma shift must be a positive number, got {shift!r}")
    table = shift_sigma(np.arange(1, TRAIN_TIMESTEPS + 1, dtype=np.float64) / TRAIN_TIMESTEPS, shift)
    picked = [table[-(1 + int(k * TRAIN_TIMESTEPS / steps))] for k in range(steps)]
    return np.array(picked + [0.0], dtype=np.float64)
