"""Step-cache policies behind one seam, the model call: sampling/sample.py asks whether to skip the network, and
if so for a forecast of x0; otherwise it records the network's x0. A policy's "steps" are model calls."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..checks import is_int_in, require
from ..errors import AnimaError
from .auto_cache import AUTO_OPTIONS, AutoCache
from .cache_fit import CacheFit
from .cache_seam import CachePolicy, CacheReport
from .spectrum import Spectrum, SpectrumSchedule

CACHE_NAMES = ("none", "spectrum", "spectrum-plus", "reuse", "auto")

SCHEDULE_OPTIONS = {"window": int, "flex": float, "warmup": int, "stop": float}
FORECAST_OPTIONS = {"w": float, "m": int, "lam": float, "normalize": bool, "tau_axis": str, "taylor": str}
OPTION_TYPES = {**FORECAST_OPTIONS, **SCHEDULE_OPTIONS, **AUTO_OPTIONS}

# Chosen on the Gaussian-mixture test bed (benchmarks/spectrum_testbed.py, grid over w, m, lam, taylor,
# tau_axis): a mostly half-step Taylor forecast with a small share of a normalised quadratic fit on the
# real step axis beat reuse-last-x0 in all 63 held-out cases (3 test-bed seeds x 7 mixtures x 20/30/50
# steps), worst error ratio 0.88. Pure fractional Taylor (w=0) averaged worse and lost to reuse on sharp
# mixtures, where extrapolating a full step overshoots a posterior that is switching components.
SPECTRUM_PLUS_DEFAULTS: dict[str, float | str | bool] = {
    "w": 0.1, "m": 2, "lam": 1.0, "normalize": True, "tau_axis": "steps", "taylor": "half",
}

_TRUE_WORDS, _FALSE_WORDS = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


class NoCache:
    """Runs the model on every step."""

    name = "none"

    def __init__(self, num_steps: int) -> None:
        self.num_steps = num_steps
        self._recorded = 0

    def set_sigmas(self, sigmas: np.ndarray, fresh_noise: bool = False) -> None:
        pass  # every step is computed, whatever the sigmas

    def should_skip(self, x: np.ndarray | None = None) -> bool:
        return False

    def forecast(self, x: np.ndarray) -> np.ndarray:
        raise RuntimeError(f"cache {self.name!r} never forecasts")

    def record(self, x: np.ndarray, x0: np.ndarray) -> None:
        self._recorded += 1

    def withdraw_forecast(self) -> None:
        raise RuntimeError(f"cache {self.name!r} never forecasts")

    def state(self) -> dict[str, Any]:
        return {"count": self._recorded}

    def restore(self, state: dict[str, Any]) -> None:
        count = state.get("count") if isinstance(state, dict) else None
        require(is_int_in(count, 0, self.num_steps), "the cache state does not fit this run's schedule")
        self._recorded = int(count)

    @property
    def computed_steps(self) -> list[int]:
        return list(range(1, self._recorded + 1))

    @property
    def skipped_steps(self) -> list[int]:
        return []

    def report(self) -> CacheReport:
        return CacheReport(self.computed_steps, [])


class ReuseCache:
    """Skips on Spectrum's schedule but returns the last computed x0 unchanged: the baseline a
    forecaster has to beat. It implements the seam alone (CachePolicy) and nothing else."""

    name = "reuse"

    def __init__(self, schedule: SpectrumSchedule) -> None:
        self.schedule, self.num_steps = schedule, schedule.num_steps
        self._last_x0: np.ndarray | None = None

    def set_sigmas(self, sigmas: np.ndarray, fresh_noise: bool = False) -> None:
        pass  # a fixed schedule, blind to the sigmas; it reuses x0, which fresh noise does not touch

    def should_skip(self, x: np.ndarray | None = None) -> bool:
        return self.schedule.should_skip()

    def forecast(self, x: np.ndarray) -> np.ndarray:
        self.schedule.mark_skipped()
        return self._last_x0.copy()

    def record(self, x: np.ndarray, x0: np.ndarray) -> None:
        self._last_x0 = np.array(x0, copy=True)
        self.schedule.mark_computed()

    def withdraw_forecast(self) -> None:
        self.schedule.withdraw_skip()

    def state(self) -> dict[str, Any]:
        return {**self.schedule.state(), "last_x0": [] if self._last_x0 is None else [self._last_x0]}

    def restore(self, state: dict[str, Any]) -> None:
        self.schedule.restore(state)
        last = list(state.get("last_x0", ()))
        if len(last) != (1 if self.schedule.computed_steps else 0) or not all(
                isinstance(x, np.ndarray) and x.dtype == np.float32 for x in last):
            raise AnimaError("the cache state's last x0 does not fit this run")
        self._last_x0 = np.array(last[0], copy=True) if last else None

    @property
    def computed_steps(self) -> list[int]:
        return self.schedule.computed_steps

    @property
    def skipped_steps(self) -> list[int]:
        return self.schedule.skipped_steps

    def report(self) -> CacheReport:
        return CacheReport(self.computed_steps, self.skipped_steps)


class UncachedRerun(NoCache):
    """verify's re-run of a flagged run: the calls after its first `kept` (all computed: the last step before its
    first forecast) run the model again, every one. It reports those calls computed, an error of 0 (the image is
    the uncached one) and the flag of the run it replaced."""

    name = "rerun"

    def __init__(self, num_steps: int, kept: int, flagged: bool) -> None:
        super().__init__(num_steps)
        self.kept, self.flagged, self._recorded = kept, flagged, kept

    def state(self) -> dict[str, Any]:
        return {RERUN_KEY: self.kept, "count": self._recorded, "flagged": self.flagged}

    def restore(self, state: dict[str, Any]) -> None:
        kept, count, flagged = (state.get(key) for key in (RERUN_KEY, "count", "flagged"))
        require(is_int_in(kept, 2, self.num_steps) and is_int_in(count, kept, self.num_steps)
                and isinstance(flagged, bool), "the cache state of verify's re-run does not fit this run's schedule")
        self.kept, self._recorded, self.flagged = int(kept), int(count), flagged

    def report(self) -> CacheReport:
        return CacheReport(self.computed_steps, [], 0.0, self.flagged)


RERUN_KEY = "rerun_after"  # marks UncachedRerun's state (an auto state of an earlier version had "rerun_from")


def restore_cache(cache: CachePolicy, state: dict[str, Any]) -> CachePolicy:
    """`cache` restored to `state`; or, where the state is one of verify's re-run, that re-run restored."""
    if isinstance(state, dict) and RERUN_KEY in state:
        rerun = UncachedRerun(cache.num_steps, 0, False)
        rerun.restore(state)
        return rerun
    cache.restore(state)
    return cache


def verifies(options: dict[str, float | str | bool] | None) -> bool:
    """Whether a run with these cache options is re-run uncached when its cache flags it (auto's verify)."""
    return bool((options or {}).get("verify", False))


def make_cache(name: str, num_steps: int, options: dict[str, float | str | bool] | None = None,
               fit: CacheFit | None = None) -> CachePolicy:
    """The cache policy `name` (one of CACHE_NAMES) for a run of `num_steps` model calls (sampling.samplers.
    call_sigmas: one per step for most samplers). `fit`: the model's cache numbers (sampling.cache_fit), which
    auto's budget, check and flag need; verify (auto's) is the caller's to run (verifies(), sampling.rerun)."""
    options = dict(options or {})
    if name not in CACHE_NAMES:
        raise AnimaError(f"unknown cache {name!r}; choose one of {', '.join(CACHE_NAMES)}")
    allowed = {"none": {}, "reuse": SCHEDULE_OPTIONS, "auto": AUTO_OPTIONS}.get(
        name, {**FORECAST_OPTIONS, **SCHEDULE_OPTIONS})
    for key in options:
        if key not in allowed:
            raise AnimaError(f"cache option {key!r} does not apply to cache {name!r}")
    if name == "none":
        return NoCache(num_steps)
    if name == "reuse":
        return ReuseCache(SpectrumSchedule(num_steps, **options))
    if name == "auto":
        verify = options.pop("verify", False)
        require(isinstance(verify, bool), f"cache option verify must be true or false, got {verify!r}")
        return AutoCache(num_steps, fit=fit, **options)
    if name == "spectrum-plus":
        options = {**SPECTRUM_PLUS_DEFAULTS, **options}
    return Spectrum(num_steps, name=name, **options)


def _parse_value(key: str, text: str) -> float | str | bool:
    kind = OPTION_TYPES[key]
    if kind is bool:
        if text.lower() in _TRUE_WORDS + _FALSE_WORDS:
            return text.lower() in _TRUE_WORDS
        raise AnimaError(f"cache option {key}={text!r} is not true or false")
    if kind is str:
        return text
    try:
        return kind(text)
    except ValueError:
        noun = "an integer" if kind is int else "a number"
        raise AnimaError(f"cache option {key}={text!r} is not {noun}") from None


def parse_cache_options(text: str) -> dict[str, float | str | bool]:
    """Parse stable-diffusion.cpp-style "w=0.4,m=3,lam=1.0,window=2,flex=0.5,warmup=4,stop=0.9"."""
    options: dict[str, float | str | bool] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        key, equals, value = (part.strip() for part in item.partition("="))
        if not equals or not value:
            raise AnimaError(f"cache option {item!r} is not key=value")
        if key not in OPTION_TYPES:
            raise AnimaError(f"unknown cache option {key!r}; known: {', '.join(OPTION_TYPES)}")
        if key in options:
            raise AnimaError(f"cache option {key!r} is given twice")
        options[key] = _parse_value(key, value)
    return options
