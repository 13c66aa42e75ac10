"""Step-cache policies behind one seam, the model call: sampling/sample.py asks whether to skip the network, and
if so for a forecast of x0; otherwise it records the network's x0. A policy's "steps" are model calls."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from ..checks import is_int_in, require
from ..errors import AnimaError
from .auto_cache import AUTO_OPTIONS, AutoCache, Probe
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


class CachePolicy(Protocol):
    """Before the first call the sampler loop hands over the sigma of every model call the run makes and the
    run's final sigma, and whether the sampler adds fresh noise on its steps (set_sigmas); then per call it calls
    should_skip(x), then forecast(x) or record(x, x0), x being the latent the model is asked about.

    A non-finite forecast is taken back with withdraw_forecast(); the loop then record()s the model's x0 for
    that same call. state() / restore() carry a run across a stop and resume:
    NumPy arrays (or lists of them) plus JSON-able values.
    """

    name: str
    num_steps: int
    verify: bool  # a flagged run asks to be re-run uncached (wants_rerun): the loop keeps a snapshot for it
    needs_probe: bool  # the policy looks at the model through a partial pass (auto's check): attach_probe() it

    def set_sigmas(self, sigmas: np.ndarray, fresh_noise: bool = False) -> None: ...

    def should_skip(self, x: np.ndarray | None = None) -> bool: ...

    def forecast(self, x: np.ndarray) -> np.ndarray: ...

    def record(self, x: np.ndarray, x0: np.ndarray) -> None: ...

    def withdraw_forecast(self) -> None: ...

    def state(self) -> dict[str, Any]: ...

    def restore(self, state: dict[str, Any]) -> None: ...

    @property
    def computed_steps(self) -> list[int]: ...

    @property
    def skipped_steps(self) -> list[int]: ...

    @property
    def error_estimate(self) -> float | None:
        """The run's own estimate of its final latent's relative distance from the uncached run's; None for a
        policy that does not measure its forecasts."""

    @property
    def may_differ(self) -> bool | None:
        """The run's own flag: its image may differ visibly from the uncached one; None for a policy that does
        not check itself."""

    @property
    def wants_rerun(self) -> bool:
        """The finished run asks to be re-run uncached from the last call before its first forecast (auto's
        verify): the sampler loop then restores its snapshot of that call and calls rewind()."""

    @property
    def rerun_from(self) -> int | None:
        """The model call after which verify re-ran the run uncached (None: not re-run)."""

    def rewind(self, calls: int) -> None:
        """Back to the state after `calls` model calls, every later call computed (only when wants_rerun)."""

    def attach_probe(self, probe: Probe) -> None:
        """The model's partial pass for a policy that needs_probe, before the first call."""


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
        raise RuntimeError("cache 'none' never forecasts")

    def record(self, x: np.ndarray, x0: np.ndarray) -> None:
        self._recorded += 1

    def withdraw_forecast(self) -> None:
        raise RuntimeError("cache 'none' never forecasts")

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

    error_estimate = may_differ = rerun_from = None
    verify = wants_rerun = needs_probe = False


class ReuseCache:
    """Skips on Spectrum's schedule but returns the last computed x0 unchanged: the baseline a
    forecaster has to beat."""

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

    error_estimate = may_differ = rerun_from = None
    verify = wants_rerun = needs_probe = False


def make_cache(name: str, num_steps: int,
               options: dict[str, float | str | bool] | None = None) -> CachePolicy:
    """The cache policy `name` (one of CACHE_NAMES) for a run of `num_steps` model calls (sampling.samplers.
    call_sigmas: one per step for most samplers)."""
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
        return AutoCache(num_steps, **options)
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
