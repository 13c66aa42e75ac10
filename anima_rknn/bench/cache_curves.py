"""calibrate-cache's regressions (bench.calibrate runs them): the calls of uncached runs kept by a recording
policy, auto's forecasters replayed on them (the misses of the x0 forecast and of the first block's tokens at
distances 1-4), the misses cached runs measure, and least squares of their logs on sigma and ln d.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import AnimaError
from ..sampling.auto_cache import forecast_x0, probe_miss
from ..sampling.cache_fit import CacheFit
from ..sampling.cache_seam import Probe
from ..sampling.caches import NoCache
from .cache_choices import Run

DISTANCES = (1, 2, 3, 4)


@dataclass
class Call:
    sigma: float
    x: np.ndarray  # the latent the model was asked about (flat float32)
    x0: np.ndarray  # the model's x0 (flat float32)
    tokens: np.ndarray  # the first block's output of the positive prompt's pass (flat float32)


class Recorder(NoCache):
    """A step cache that computes every call and keeps it (the seam, as NoCache, and the check capability,
    ChecksForecasts, for the first block's tokens)."""

    name = "record"
    check = True

    def __init__(self, num_steps: int) -> None:
        super().__init__(num_steps)
        self.calls: list[Call] = []
        self._sigmas: list[float] = []
        self._probe: Probe | None = None

    def attach_probe(self, probe: Probe) -> None:
        self._probe = probe

    def set_sigmas(self, sigmas: np.ndarray, fresh_noise: bool = False) -> None:
        self._sigmas = [float(s) for s in sigmas]

    def record(self, x: np.ndarray, x0: np.ndarray) -> None:
        super().record(x, x0)
        tokens = self._probe.last()
        self.calls.append(Call(self._sigmas[len(self.calls)], np.asarray(x, np.float32).ravel().copy(),
                               np.asarray(x0, np.float32).ravel().copy(), np.asarray(tokens, np.float32).ravel().copy()))

    def restore(self, state: dict[str, Any]) -> None:
        raise AnimaError("a calibration run is not resumed: run calibrate-cache again")


@dataclass
class Rows:
    """The replayed misses of some trajectories: (sigma, d, miss) of the x0 forecast and of the tokens' line,
    and (sigma, d, miss at d over miss at 1) for the growth."""

    x0: list[tuple[float, int, float]] = field(default_factory=list)  # measured in cached runs
    tokens: list[tuple[float, int, float]] = field(default_factory=list)
    growth: list[tuple[float, int, float]] = field(default_factory=list)


def _eps(call: Call) -> np.ndarray:
    """The noise the call's x0 implies, as auto keeps it (float32)."""
    return ((call.x.astype(np.float64) - (1.0 - call.sigma) * call.x0) / call.sigma).astype(np.float32)


def replay(calls: Sequence[Call], rows: Rows) -> None:
    """Add one trajectory's misses to `rows` (finite, positive misses only: a log needs them)."""
    eps = [_eps(c) for c in calls]
    for k in range(2, len(calls)):
        call, first = calls[k], None
        for d in DISTANCES:
            if k - d - 1 < 0:
                break
            a, b = k - d, k - d - 1
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                predicted = forecast_x0(call.sigma, call.x, (calls[a].sigma, calls[a].x0, eps[a]),
                                        (calls[b].sigma, calls[b].x0, eps[b]))
                miss = float(np.linalg.norm(predicted - call.x0) / np.linalg.norm(call.x0.astype(np.float64)))
            token_miss = probe_miss(call.tokens, call.sigma, (calls[a].sigma, calls[a].tokens),
                                    (calls[b].sigma, calls[b].tokens))
            if math.isfinite(miss) and miss > 0:
                first = miss if d == 1 else first
                if d > 1 and first is not None:
                    rows.growth.append((call.sigma, d, miss / first))
            if math.isfinite(token_miss) and token_miss > 0:
                rows.tokens.append((call.sigma, d, token_miss))


def _design(kind: str, sigma: np.ndarray, log_d: np.ndarray) -> np.ndarray:
    if kind == "x0":  # a + b ln d + c sigma + e sigma ln d
        return np.stack([np.ones_like(sigma), log_d, sigma, sigma * log_d], 1)
    if kind == "tokens":  # a + b sigma + (c + e sigma) ln d
        return np.stack([np.ones_like(sigma), sigma, log_d, sigma * log_d], 1)
    return np.stack([log_d, sigma * log_d], 1)  # growth: (g0 + g1 sigma) ln d


def _columns(rows: list[tuple[float, int, float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r = np.array(rows, dtype=np.float64).reshape(-1, 3)
    return r[:, 0], np.log(r[:, 1]), np.log(r[:, 2])


def fit_rows(kind: str, rows: list[tuple[float, int, float]]) -> np.ndarray:
    sigma, log_d, target = _columns(rows)
    design = _design(kind, sigma, log_d)
    if len(target) < 2 * design.shape[1] or np.linalg.matrix_rank(design) < design.shape[1]:
        raise AnimaError(f"too few calls to fit the cache numbers ({len(target)} misses of the {kind} forecast): "
                         "give more prompts or more steps")
    return np.linalg.lstsq(design, target, rcond=None)[0]


def residual_sd(kind: str, coef: np.ndarray, rows: list[tuple[float, int, float]]) -> float:
    sigma, log_d, target = _columns(rows)
    return float(np.sqrt(np.mean((target - _design(kind, sigma, log_d) @ coef) ** 2)))


def measured(run: Run, rows: Rows) -> None:
    """A finished auto run's measured misses, as its flag scores them: (sigma, distance from the computed call
    before, miss)."""
    for before, step, error in zip(run.computed, run.computed[1:], run.errors[1:]):
        if error is not None and error > 0:
            rows.x0.append((run.sigmas[step - 1], step - before, error))


CURVE_GRID = [(float(sigma), d) for sigma in np.linspace(0.1, 0.8, 8) for d in DISTANCES]


def curve_distance(name: str, a: CacheFit, b: CacheFit) -> float:
    """The largest difference in ln between two fits' curve `name` (typical_miss, typical_probe_miss, plan_growth:
    ln of the growth) over sigma 0.1-0.8 and distances 1-4: what is compared with a curve's fit error."""
    kind = {"typical_miss": "x0", "typical_probe_miss": "tokens", "plan_growth": "growth"}[name]
    sigma, log_d = (np.array(column, dtype=np.float64) for column in zip(*CURVE_GRID))
    design = _design(kind, sigma, np.log(log_d))
    return float(np.abs(design @ (np.array(getattr(a, name)) - np.array(getattr(b, name)))).max())
