"""Spectrum step caching: forecast the sampler's x0 on skipped steps from the computed ones.

A port of stable-diffusion.cpp's `src/spectrum.hpp` (itself a sampler-level version of Han et al.,
"Adaptive Spectral Feature Forecasting for Diffusion Sampling Acceleration"). With default keywords
it reproduces that code's schedule and forecast, quirks included (fixed 0..50 tau axis, ridge
shrinkage, half-step Taylor); the keyword options fix those quirks without touching the default.
The algorithm, step by step: README "Spectrum step caching" and stable-diffusion.cpp's spectrum.hpp.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from ..checks import check_bool, is_integer, is_number_in, require
from ..errors import AnimaError
from .cache_seam import CacheReport

TAU_AXES = ("fixed50", "steps")
TAYLOR_MODES = ("half", "fractional")

# Below this, rescaling the Chebyshev weights to sum to 1 would blow them up rather than fix a bias.
_MIN_WEIGHT_SUM = 1e-3
# Bounds that keep memory and arithmetic bounded: the forecaster keeps max(m+1, 6) latents, and a window
# or flex beyond any run's length changes nothing but could overflow.
MAX_DEGREE = 8
MAX_WINDOW = 1000


class SpectrumSchedule:
    """Which steps run the model and which are forecast: warmup, then a window that widens by
    `flex` after every computed step, and always compute from `stop` (a fraction of the run) on."""

    def __init__(self, num_steps: int, window: int = 2, flex: float = 0.5, warmup: int = 4,
                 stop: float = 0.9) -> None:
        require(is_integer(num_steps) and num_steps >= 1, f"number of steps must be a positive integer, got {num_steps!r}")
        require(is_integer(window) and 1 <= window <= MAX_WINDOW,
               f"cache option window must be an integer from 1 to {MAX_WINDOW}, got {window!r}")
        require(is_number_in(flex, 0, MAX_WINDOW), f"cache option flex must be in [0, {MAX_WINDOW}], got {flex!r}")
        require(is_integer(warmup) and warmup >= 0, f"cache option warmup must be an integer >= 0, got {warmup!r}")
        require(is_number_in(stop, 0.0, 1.0), f"cache option stop must be in [0, 1], got {stop!r}")
        self.num_steps = int(num_steps)
        self.window, self.flex, self.warmup, self.stop = int(window), float(flex), int(warmup), float(stop)
        # stable-diffusion.cpp multiplies in float32: 0.9f * 20 rounds to exactly 18.
        self.stop_step = int(np.float32(stop) * np.float32(num_steps))
        self.reset()

    def reset(self) -> None:
        self.count = 0  # model evaluations so far, computed or forecast (sd.cpp's `cnt`)
        self._num_cached = 0  # forecasts since the last computed step
        self._window_size = float(self.window)
        self._computed: list[int] = []
        self._skipped: list[int] = []

    def should_skip(self) -> bool:
        if self.count < self.warmup:
            return False
        if self.stop_step > 0 and self.count >= self.stop_step:
            return False
        if len(self._computed) < 2:
            return False
        window = max(1, int(np.floor(self._window_size)))
        return (self._num_cached + 1) % window != 0

    def mark_computed(self) -> None:
        if self.count >= self.warmup:
            self._window_size += self.flex
        self._computed.append(self.count + 1)
        self._num_cached = 0
        self.count += 1

    def mark_skipped(self) -> None:
        self._skipped.append(self.count + 1)
        self._num_cached += 1
        self.count += 1

    def withdraw_skip(self) -> None:
        """Undo the last mark_skipped(): that step is about to be computed after all."""
        if not self._skipped or self._skipped[-1] != self.count:
            raise RuntimeError("withdraw_skip() without a skipped current step")
        self._skipped.pop()
        self._num_cached -= 1
        self.count -= 1

    @property
    def computed_steps(self) -> list[int]:
        return list(self._computed)

    @property
    def skipped_steps(self) -> list[int]:
        return list(self._skipped)

    def state(self) -> dict[str, Any]:
        """Everything a resumed run needs to continue exactly (JSON-able)."""
        return {"count": self.count, "num_cached": self._num_cached, "window_size": self._window_size,
                "computed": list(self._computed), "skipped": list(self._skipped)}

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from `state()` of a run with the same settings; a state that could not come from one is refused."""
        try:
            count, num_cached, window_size = state["count"], state["num_cached"], state["window_size"]
            computed, skipped = list(state["computed"]), list(state["skipped"])
        except (KeyError, TypeError):
            raise AnimaError("the cache state is incomplete") from None
        require(is_integer(count) and 0 <= count <= self.num_steps and all(is_integer(s) for s in computed + skipped)
               and sorted(computed + skipped) == list(range(1, count + 1))
               and is_integer(num_cached) and 0 <= num_cached <= count
               and is_number_in(window_size, self.window, self.window + self.flex * self.num_steps),
               "the cache state does not fit this run's schedule")
        self.count, self._num_cached, self._window_size = int(count), int(num_cached), float(window_size)
        self._computed, self._skipped = [int(s) for s in computed], [int(s) for s in skipped]


class Spectrum:
    """Chebyshev ridge fit over the last K computed x0, blended with a first-order Taylor step.

    A step cache for any sampler (sampling/sample.py wraps the model with it): on each model call
    `if s.should_skip(): x0 = s.forecast(x)`, otherwise run the model and `s.record(x, x0)`. x is not read: the
    fit is over the stored x0 alone.
    """

    def __init__(self, num_steps: int, w: float = 0.40, m: int = 3, lam: float = 1.0, window: int = 2,
                 flex: float = 0.5, warmup: int = 4, stop: float = 0.9, *, normalize: bool = False,
                 tau_axis: str = "fixed50", taylor: str = "half", name: str = "spectrum") -> None:
        require(is_number_in(w, 0.0, 1.0), f"cache option w must be in [0, 1], got {w!r}")
        require(is_integer(m) and 0 <= m <= MAX_DEGREE, f"cache option m must be an integer from 0 to {MAX_DEGREE}, got {m!r}")
        require(is_number_in(lam, 0.0, 1e6), f"cache option lam must be in [0, 1e6], got {lam!r}")
        check_bool("cache option normalize", normalize)
        require(tau_axis in TAU_AXES, f"cache option tau_axis must be one of {', '.join(TAU_AXES)}, got {tau_axis!r}")
        require(taylor in TAYLOR_MODES, f"cache option taylor must be one of {', '.join(TAYLOR_MODES)}, got {taylor!r}")
        self.schedule = SpectrumSchedule(num_steps, window, flex, warmup, stop)
        self.name, self.num_steps = name, self.schedule.num_steps
        self.w, self.m, self.lam = float(w), int(m), float(lam)
        self.normalize, self.tau_axis, self.taylor = normalize, tau_axis, taylor
        self.history_len = max(self.m + 1, 6)
        self.reset()

    def reset(self) -> None:
        self.schedule.reset()
        self._history: deque[np.ndarray] = deque(maxlen=self.history_len)  # flat float32 x0
        self._history_counts: deque[int] = deque(maxlen=self.history_len)  # schedule.count of each
        self._shape: tuple[int, ...] = ()
        self._dtype = np.dtype(np.float32)

    @property
    def computed_steps(self) -> list[int]:
        return self.schedule.computed_steps

    @property
    def skipped_steps(self) -> list[int]:
        return self.schedule.skipped_steps

    def report(self) -> CacheReport:
        return CacheReport(self.computed_steps, self.skipped_steps)  # a fixed schedule measures nothing

    def set_sigmas(self, sigmas: np.ndarray, fresh_noise: bool = False) -> None:
        pass  # sd.cpp's schedule and tau axis count model calls, not sigmas; it forecasts x0 alone

    def should_skip(self, x: np.ndarray | None = None) -> bool:
        return self.schedule.should_skip()

    def record(self, x: np.ndarray, x0: np.ndarray) -> None:
        x0 = np.asarray(x0)
        self._shape, self._dtype = x0.shape, x0.dtype
        self._history.append(x0.astype(np.float32).ravel())
        self._history_counts.append(self.schedule.count)
        self.schedule.mark_computed()

    def forecast(self, x: np.ndarray) -> np.ndarray:
        coefficients = self.forecast_coefficients().astype(np.float32)
        forecast = np.zeros_like(self._history[0])
        for coefficient, entry in zip(coefficients, self._history):
            forecast += coefficient * entry
        self.schedule.mark_skipped()
        return forecast.reshape(self._shape).astype(self._dtype, copy=False)

    def withdraw_forecast(self) -> None:
        """Take back the last forecast(): the caller computes that step with the model and record()s it."""
        self.schedule.withdraw_skip()

    def state(self) -> dict[str, Any]:
        """The schedule's state and the stored x0 (float32 arrays, oldest first) with their step counts."""
        return {**self.schedule.state(), "history": list(self._history), "history_counts": list(self._history_counts),
                "shape": list(self._shape)}

    def restore(self, state: dict[str, Any]) -> None:
        self.schedule.restore(state)
        try:
            history, counts, shape = list(state["history"]), list(state["history_counts"]), tuple(state["shape"])
        except (KeyError, TypeError):
            raise AnimaError("the cache state is incomplete") from None
        size = int(np.prod(shape)) if shape and all(is_integer(n) and n > 0 for n in shape) else -1
        require(len(history) == len(counts) <= self.history_len
               and all(isinstance(h, np.ndarray) and h.dtype == np.float32 and h.shape == (size,) for h in history)
               and all(is_integer(c) for c in counts) and counts == sorted(set(counts))
               and all(c + 1 in self.schedule.computed_steps for c in counts),
               "the cache state's stored x0 do not fit this run")
        self._history.clear()
        self._history.extend(np.array(h, copy=True) for h in history)
        self._history_counts.clear()
        self._history_counts.extend(int(c) for c in counts)
        self._shape, self._dtype = shape, np.dtype(np.float32)

    def _tau(self, count: int) -> float:
        if self.tau_axis == "fixed50":
            return count / 50.0 * 2.0 - 1.0  # sd.cpp's axis, whatever the number of steps
        # The run's evaluations 0..N-1 span [-1, 1], where the Chebyshev basis is well conditioned.
        return count / max(self.num_steps - 1, 1) * 2.0 - 1.0

    def _chebyshev_basis(self, taus: np.ndarray) -> np.ndarray:
        basis = np.empty((len(taus), self.m + 1))
        basis[:, 0] = 1.0
        if self.m >= 1:
            basis[:, 1] = taus
        for j in range(2, self.m + 1):
            basis[:, j] = 2.0 * taus * basis[:, j - 1] - basis[:, j - 2]
        return basis

    def chebyshev_weights(self) -> np.ndarray:
        """Ridge-regression weights, one per stored x0 (oldest first), for the next step's value."""
        if len(self._history) < 2:
            raise RuntimeError("Spectrum needs at least two computed steps before it can forecast")
        design = self._chebyshev_basis(np.array([self._tau(c) for c in self._history_counts]))
        target = self._chebyshev_basis(np.array([self._tau(self.schedule.count)]))[0]
        gram = design.T @ design + self.lam * np.eye(self.m + 1)
        try:
            factor = np.linalg.cholesky(gram)
        except np.linalg.LinAlgError:
            # Same jitter as sd.cpp, needed only when lam = 0 and the history cannot pin down m+1 terms.
            gram += 1e-4 * np.trace(gram) / (self.m + 1) * np.eye(self.m + 1)
            factor = np.linalg.cholesky(gram)
        solution = np.linalg.solve(factor.T, np.linalg.solve(factor, target))
        weights = design @ solution
        total = weights.sum()
        if self.normalize and abs(total) > _MIN_WEIGHT_SUM:
            weights /= total
        return weights

    def _taylor_step(self) -> float:
        if self.taylor == "half":
            return 0.5
        last, previous = self._history_counts[-1], self._history_counts[-2]
        return (self.schedule.count - last) / (last - previous)

    def forecast_coefficients(self) -> np.ndarray:
        """Combined weights on the stored x0 (oldest first) that the next forecast() applies."""
        coefficients = self.w * self.chebyshev_weights()
        step = self._taylor_step()
        coefficients[-1] += (1.0 - self.w) * (1.0 + step)
        coefficients[-2] -= (1.0 - self.w) * step
        return coefficients
