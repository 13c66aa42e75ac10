"""`auto`: a step cache that schedules the model calls from its forecaster's own measured error.

On every computed step the forecaster first predicts that step (no model call) and compares the prediction
with the model's x0: a measured forecast error for this image at this point of the trajectory, for free. A
forecast x0 enters the Euler update (every sampler's first-order part) scaled by (sigma - sigma_next) / sigma, so
forecasting a step `d` steps after the last computed one adds about  weight * level * d**ORDER  to the final
latent's relative error, `level` being the error per unit of d**ORDER that the last measurement showed. A step is
forecast while that stays under the tolerance (and while the guard and the run spacing allow: see AutoCache). A
budget of computed steps is planned as a whole instead, and re-planned before every step: the cheapest placement of
the calls left over the steps to come (dynamic programming), each forecast charged for how its error grows with the
distance and for how much an early error grows on its way to the image. The
sum of those terms, each forecast run charged at the error measured where it ended, is the run's own estimate
of how far its latent is from the uncached one.

The forecaster extrapolates, with damping, both x0 and the noise the sampler removes (eps), linearly in sigma
from the last two computed steps, and blends them by sigma**2: x0 moves fast at high noise, eps at low noise,
where x0 = (x - sigma eps) / (1 - sigma) also shrinks an eps error by sigma. Eps is read from the latent the model
is asked about, eps = (x - (1 - sigma) x0) / sigma, so the forecast holds under any deterministic sampler. A
sampler that adds fresh noise on its steps (ancestral, SDE, LCM) re-draws part of that eps every step, which no
line through earlier steps foresees, and x0, computed from a latent with new noise in it, jitters about its path:
under those the forecast holds the last computed x0 (measured: docs/research/auto-cache-constants.md). A policy's
steps are the run's model calls (two a step for heun and the like, whose second call may sit at the sigma of the
next step's first: two computed calls at one sigma give no slope, and the forecast then holds x0 and eps).

The numbers fitted to one model (the flag's and check's typical misses, the plan's growth and gain) come from that
model's cache fit (sampling/cache_fit.py); without one, auto runs by tolerance alone and raises no flag.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..checks import is_integer, is_number, require
from ..errors import AnimaError
from .cache_fit import HOW_TO_FIT, CacheFit
from .cache_seam import CacheReport, Probe

AUTO_OPTIONS = {"tol": float, "budget": int, "guard": float, "warmup": int, "verify": bool, "check": bool}
# What needs the model's fit (CacheFit): a budget's plan and check's typical miss; verify re-runs on the flag.
FITTED_OPTIONS = ("budget", "check", "verify")
# Chosen on the demo model's tuning prompts (docs/research/auto-cache-constants.md); steer a run without a budget.
AUTO_DEFAULTS = {"tol": 0.05, "guard": 0.2, "warmup": 3}
# Forecast error grows like (steps since the last computed one) ** ORDER (demo uncached trajectories; docs/research).
ORDER = 1.0
# Share of the straight-line extrapolation the forecast takes (best of 0-1 on the demo trajectories; docs/research).
DAMPING = 0.5
# A forecast's charge before any measurement: as far off as x0 itself, a precision nobody measured is never claimed.
UNMEASURED_LEVEL = 1.0


# Where check holds: measured under euler alone; under er_sde, even with s_noise 0, budget=10,check=1 gave
# 5.6-12.6 dB (issue 46), and no other sampler was measured.
CHECK_SAMPLERS = ("euler",)


def check_refusal(sampler: str) -> str | None:
    """Why cache option check cannot run under `sampler` (None: it can)."""
    if sampler in CHECK_SAMPLERS:
        return None
    return (f"cache option check holds only under the {', '.join(CHECK_SAMPLERS)} sampler, where it was measured "
            f"(under er_sde it lowered images to 5.6-12.6 dB); use --sampler euler, or drop check and keep the budget")


def fit_refusal(options: dict[str, Any], fit: CacheFit | None) -> str | None:
    """Why auto with these options cannot run on a model without a cache fit (None: it can)."""
    needing = [key for key in FITTED_OPTIONS if options.get(key) not in (None, False)]
    if fit is not None or not needing:
        return None
    return (f"cache option {', '.join(needing)} of auto needs this model's cache fit, and it has none (it runs "
            f"auto in tolerance mode only, with no flag); {HOW_TO_FIT}")


def damped_line(sigma: float, last: tuple[float, np.ndarray], before: tuple[float, np.ndarray]) -> np.ndarray:
    """The value at `sigma` on the line in sigma through the last two computed steps' (sigma, value), taken DAMPING
    of the way past the last one (two calls at one sigma give no slope: the last value, held)."""
    (sigma_a, a), (sigma_b, b) = last, before
    reach = DAMPING * (sigma - sigma_a) / (sigma_a - sigma_b) if sigma_a != sigma_b else 0.0
    return a + reach * (a - b)


def forecast_x0(sigma: float, x: np.ndarray, last: tuple[float, np.ndarray, np.ndarray],
                before: tuple[float, np.ndarray, np.ndarray]) -> np.ndarray:
    """The forecast of x0 at `sigma` for the latent x (flat) from the last two computed calls' (sigma, x0, eps)
    (flat): the damped lines of x0 and of eps, blended by sigma**2 (module docstring); flat float64."""
    (sigma_a, x0_a, eps_a), (sigma_b, x0_b, eps_b) = ((s, x0.astype(np.float64), e.astype(np.float64))
                                                      for s, x0, e in (last, before))
    from_x0 = damped_line(sigma, (sigma_a, x0_a), (sigma_b, x0_b))
    if sigma >= 1.0:
        return from_x0
    from_eps = (x.astype(np.float64) - sigma * damped_line(sigma, (sigma_a, eps_a), (sigma_b, eps_b))) / (1.0 - sigma)
    return sigma**2 * from_x0 + (1.0 - sigma**2) * from_eps


def probe_miss(features: np.ndarray, sigma: float, last: tuple[float, np.ndarray],
               before: tuple[float, np.ndarray]) -> float:
    """Relative L2 miss of a probe's features at `sigma` from the damped line through the (sigma, features) of the
    last two computed steps; inf where not finite."""
    (sigma_a, at), (sigma_b, bt) = ((s, np.asarray(f, dtype=np.float64).ravel()) for s, f in (last, before))
    features = np.asarray(features, dtype=np.float64).ravel()
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        miss = float(np.linalg.norm(damped_line(sigma, (sigma_a, at), (sigma_b, bt)) - features)
                     / np.linalg.norm(features))
    return miss if math.isfinite(miss) else math.inf


def typical_probe_miss(sigma: float, distance: int, fit: CacheFit) -> float:
    """The partial pass's miss a typical run shows at `sigma`, `distance` steps after a computed one."""
    k0, k1, k2, k3 = fit.typical_probe_miss
    return math.exp(k0 + k1 * sigma + (k2 + k3 * sigma) * math.log(distance))


def late_miss_score(computed: list[int], errors: list[float | None], sigmas: list[float],
                    typical_miss: tuple[float, ...], flag_sigma: float) -> float | None:
    """The flag's score of a run: the geometric mean, over its measured computed calls at sigma <= flag_sigma, of
    the miss over the typical miss (ln miss = a + b ln d + c sigma + e sigma ln d, d the distance from the computed
    call before); None when no such call was measured. `errors[i]`: computed[i]'s measured miss (None: none)."""
    a, b, c, e = typical_miss
    logs = [math.log(error) - (a + b * math.log(step - before) + c * sigma + e * sigma * math.log(step - before))
            for before, step, error in zip(computed, computed[1:], errors[1:])
            if error is not None and error > 0 and (sigma := sigmas[step - 1]) <= flag_sigma]
    return math.exp(sum(logs) / len(logs)) if logs else None


class AutoCache:
    """Warm-up, then forecast a step only while its expected share of the final error is under `tol`; `guard`: a
    measured relative x0 error above it makes the next step a computed one.

    The guard and the run spacing (_longest_run) decide before `tol`, so a `tol` above the largest charge of the
    forecasts they let through changes nothing: at 20 steps on the demo tuning prompts that is 0.03-0.18 per image
    (median 0.085), and with both unbounded the spacing alone computes 1,2,3,5,8,12,17 (README, `--cache auto`).

    `budget` (computed steps, optional) replaces both: a hard cap, spent whole on the plan with the least
    expected error. The sampler's own refusal of a non-finite forecast is the one thing that can add a call
    beyond it. With `check`, a partial pass looks at every forecast the plan would make before it is trusted
    (the fit's typical_probe_miss): the image's own measurements move its plan, within the same cap. It needs a
    Probe (attach_probe, the optional capability caches.ChecksForecasts), which the pipeline makes from its engine.
    `fit`: the model's cache numbers (sampling.cache_fit); without one, tolerance mode only and no flag.
    """

    name = "auto"

    def __init__(self, num_steps: int, tol: float | None = None, budget: int | None = None,
                 guard: float | None = None, warmup: int = AUTO_DEFAULTS["warmup"], check: bool = False,
                 fit: CacheFit | None = None) -> None:
        require(is_integer(num_steps) and num_steps >= 1,
                f"number of steps must be a positive integer, got {num_steps!r}")
        for key, value in (("tol", tol), ("guard", guard)):
            require(budget is None or value is None,
                    f"cache option {key} does not apply with a budget (a budget plans where its calls go)")
        tol = AUTO_DEFAULTS["tol"] if tol is None else tol
        guard = AUTO_DEFAULTS["guard"] if guard is None else guard
        require(is_number(tol) and tol >= 0, f"cache option tol must be a number >= 0, got {tol!r}")
        require(is_number(guard) and guard > 0, f"cache option guard must be a number > 0, got {guard!r}")
        require(isinstance(check, bool), f"cache option check must be true or false, got {check!r}")
        require(not check or budget is not None, "cache option check needs a budget (it moves a budget's plan)")
        require(is_integer(warmup) and warmup >= 2,
                f"cache option warmup must be an integer >= 2 for auto, got {warmup!r}")
        warm = min(warmup, num_steps)
        require(budget is None or (is_integer(budget) and budget >= warm),
               f"cache option budget must be an integer of at least the warm-up's {warm} computed steps, "
               f"got {budget!r}")
        self.num_steps = int(num_steps)
        self.tol, self.guard, self.warmup = float(tol), float(guard), int(warmup)
        self.budget = None if budget is None else int(budget)
        self.fit = fit
        self.check = check  # a partial pass looks at each planned forecast first
        self._probe: Probe | None = None
        self._probe_anchors: list[tuple[int, np.ndarray]] = []  # last two computed: (step, the probe's features)
        self._checked: list[int] = []  # steps the plan would have forecast and the check computed
        self._sigmas: list[float] | None = None
        self._fresh_noise = False  # the sampler adds fresh noise: the last computed x0 is held (module docstring)
        self._computed: list[int] = []
        self._skipped: list[int] = []
        self._errors: list[float | None] = []  # measured relative x0 error per computed step (None: not measured)
        self._level: float | None = None  # error per unit of distance**ORDER, from the last finite measurement
        self._settled = 0.0  # the estimate's share from forecast runs that have ended
        self._anchors: list[tuple[int, np.ndarray, np.ndarray]] = []  # last two computed: (step, x0, eps less noise)
        self._shape: tuple[int, ...] = ()
        self._dtype = np.dtype(np.float32)

    # ---- the sampler's side ------------------------------------------------------------------------------

    def set_sigmas(self, sigmas: np.ndarray, fresh_noise: bool = False) -> None:
        sigmas = [float(s) for s in np.asarray(sigmas, dtype=np.float64)]
        if len(sigmas) != self.num_steps + 1:
            raise RuntimeError(f"auto cache is set up for {self.num_steps} steps, got {len(sigmas)} sigmas")
        # Under fresh noise the first block's tokens jitter off any line (docs/research/auto-cache-constants.md).
        require(not (self.check and fresh_noise), "cache option check does not apply to a sampler that adds fresh "
                "noise on its steps (it lowers their images); use a deterministic one, or eta / s_noise 0 where taken")
        self._sigmas, self._fresh_noise = sigmas, bool(fresh_noise)

    def attach_probe(self, probe: Probe) -> None:
        self._probe = probe

    def should_skip(self, x: np.ndarray | None = None) -> bool:
        if self._sigmas is None:
            raise RuntimeError("the sampler hands the auto cache its sigmas before the first step")
        if self.check and self._probe is None:
            raise RuntimeError("the auto cache's check needs a probe of the model (attach_probe)")
        refusal = fit_refusal({"budget": self.budget, "check": self.check}, self.fit)
        if refusal is not None:
            raise AnimaError(refusal)
        step = self._step + 1
        left = None if self.budget is None else self.budget - len(self._computed)
        if left is not None and left <= 0:
            return step > 2  # the forecast needs two computed steps
        if step <= self.warmup or len(self._anchors) < 2 or self._errors[-1] is None:
            return False  # warm-up, or the last forecast could not be measured: compute
        if left is not None:
            plan = self._plan(step, left)
            if not self._forecasts(plan):
                return False
            if self.check and not self._forecasts(plan, self._probe_ratio(step, x)):
                self._checked.append(step)
                return False
            return True
        return len(self._open) < self._longest_run() and self._errors[-1] <= self.guard \
            and self._cost(step, len(self._open) + 1) <= self.tol

    def forecast(self, x: np.ndarray) -> np.ndarray:
        step = self._step + 1
        x0 = self._predict(step, np.asarray(x, dtype=np.float32).ravel()).astype(self._dtype)
        self._skipped.append(step)
        return x0.reshape(self._shape)

    def withdraw_forecast(self) -> None:
        self._skipped.pop()

    def record(self, x: np.ndarray, x0: np.ndarray) -> None:
        step = self._step + 1
        x0 = np.asarray(x0)
        self._shape, self._dtype = x0.shape, x0.dtype
        flat, latent = x0.astype(np.float32).ravel(), np.asarray(x, dtype=np.float32).ravel()
        error = self._measure(step, latent, flat)
        self._errors.append(error)
        if error is not None:  # the forecast run that ends here is charged at the error measured here
            self._level = error / (len(self._open) + 1) ** ORDER
        self._settled += self._open_estimate()
        sigma = self._sigmas[step - 1]
        eps = ((latent.astype(np.float64) - (1.0 - sigma) * flat) / sigma).astype(np.float32)
        self._anchors = [*self._anchors[-1:], (step, flat, eps)]
        if self.check:
            self._probe_anchors = [*self._probe_anchors[-1:], (step, self._features(self._probe.last()))]
        self._computed.append(step)

    # ---- what the run reports ------------------------------------------------------------------------------

    @property
    def error_estimate(self) -> float:
        """Estimated relative L2 distance of the final latent from the uncached run's."""
        return self._settled + self._open_estimate()

    @property
    def flag_score(self) -> float | None:
        """The late misses over the typical ones (the fit's typical_miss); None when no call at sigma <= its
        flag_sigma was measured, or the model has no fit."""
        if self.fit is None:
            return None
        return late_miss_score(self._computed, self._errors, self._sigmas, self.fit.typical_miss, self.fit.flag_sigma)

    @property
    def may_differ(self) -> bool | None:
        """The flag: this cached image may differ visibly from the uncached one (None: nothing late measured)."""
        score = self.flag_score
        return None if score is None else score >= self.fit.flag_score

    def report(self) -> CacheReport:
        if self._sigmas is None:  # a restored state before set_sigmas: its calls so far, nothing to estimate yet
            return CacheReport(self.computed_steps, self.skipped_steps)
        return CacheReport(self.computed_steps, self.skipped_steps, self.error_estimate, self.may_differ)

    @property
    def checked_steps(self) -> list[int]:
        """The calls the plan would have forecast and `check`'s partial pass had computed."""
        return list(self._checked)

    @property
    def sigmas(self) -> list[float]:
        """The sigma of every call and the run's last (set_sigmas)."""
        return list(self._sigmas or [])

    @property
    def measured_errors(self) -> list[float | None]:
        return list(self._errors)

    @property
    def computed_steps(self) -> list[int]:
        return list(self._computed)

    @property
    def skipped_steps(self) -> list[int]:
        return list(self._skipped)

    # ---- resume ----------------------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """JSON values and lists of float32 arrays (resume.py stores each list's arrays as tensors). Every array is
        kept in float32 all along, so a restored run continues bit for bit."""
        measured = [(step, e) for step, e in zip(self._computed, self._errors) if e is not None]
        return {"computed": list(self._computed), "skipped": list(self._skipped),
                "measured_steps": [step for step, _ in measured], "measured_errors": [e for _, e in measured],
                "level": self._level, "settled": self._settled, "shape": list(self._shape),
                "anchor_steps": [a[0] for a in self._anchors],
                "anchor_x0": [a[1] for a in self._anchors], "anchor_eps": [a[2] for a in self._anchors],
                "checked": list(self._checked), "probe_steps": [a[0] for a in self._probe_anchors],
                "probe_features": [a[1] for a in self._probe_anchors]}

    def restore(self, state: dict[str, Any]) -> None:
        try:
            computed, skipped = list(state["computed"]), list(state["skipped"])
            measured_steps, measured_errors = list(state["measured_steps"]), list(state["measured_errors"])
            level, settled, shape = state["level"], state["settled"], tuple(state["shape"])
            steps, x0s, epss = list(state["anchor_steps"]), list(state["anchor_x0"]), list(state["anchor_eps"])
            # written in verify's re-run by a version that ran it inside the cache: refused below
            rerun_from = state.get("rerun_from")
            # nor a state written before check existed
            checked, probe_steps = list(state.get("checked", [])), list(state.get("probe_steps", []))
            probe_features = list(state.get("probe_features", []))
        except (KeyError, TypeError):
            raise AnimaError("the cache state is incomplete") from None
        require(rerun_from is None, "the resume state was written in verify's re-run by an earlier version of "
                "anima-rknn, which this one cannot continue: run it again from the start")
        size = int(np.prod(shape)) if shape and all(is_integer(n) and n > 0 for n in shape) else -1
        arrays = [*x0s, *epss]
        require(all(is_integer(s) for s in computed + skipped)
               and sorted(computed + skipped) == list(range(1, len(computed) + len(skipped) + 1))
               and len(computed) + len(skipped) <= self.num_steps and computed == sorted(computed)
               and computed[:2] == [1, 2][:len(computed)]  # the first two steps always run the model
               and len(measured_steps) == len(measured_errors) and set(measured_steps) <= set(computed)
               and measured_steps == sorted(set(measured_steps))
               and all(is_number(e) and e >= 0 for e in measured_errors)
               and (level is None or (is_number(level) and level >= 0)) and is_number(settled) and settled >= 0
               and steps == computed[-2:]
               and len(x0s) == len(epss) == len(steps)
               and all(isinstance(a, np.ndarray) and a.dtype == np.float32 and a.shape == (size,) for a in arrays)
               and all(is_integer(s) for s in checked) and set(checked) <= set(computed)
               and (probe_steps == (computed[-2:] if self.check else []))
               and len(probe_features) == len(probe_steps)
               and all(isinstance(a, np.ndarray) and a.dtype == np.float32 and a.ndim == 1 and a.size > 0
                       and a.size == probe_features[0].size and np.isfinite(a).all() for a in probe_features),
               "the cache state does not fit this run's schedule")
        self._computed, self._skipped = [int(s) for s in computed], [int(s) for s in skipped]
        errors = dict(zip(measured_steps, measured_errors))
        self._errors = [float(errors[s]) if s in errors else None for s in self._computed]
        self._level = None if level is None else float(level)
        self._settled, self._shape, self._dtype = float(settled), shape, np.dtype(np.float32)
        self._anchors = [(int(s), np.array(a, copy=True), np.array(e, copy=True)) for s, a, e in zip(steps, x0s, epss)]
        self._checked = [int(s) for s in checked]
        self._probe_anchors = [(int(s), np.array(a, copy=True)) for s, a in zip(probe_steps, probe_features)]

    # ---- inside -----------------------------------------------------------------------------------------------

    @property
    def _step(self) -> int:
        """Steps finished so far; the current step is _step + 1."""
        return len(self._computed) + len(self._skipped)

    @property
    def _open(self) -> list[int]:
        """Steps forecast since the last computed one."""
        last = self._computed[-1] if self._computed else 0
        return [s for s in self._skipped if s > last]

    def _longest_run(self) -> int:
        """A forecast run is at most one step longer than the last one: the error model is only trusted one step
        beyond what was measured (without this, the warm-up's one-step errors invite long early runs that land
        far off, the forecast error growing much faster than linearly at high noise)."""
        return self._computed[-1] - max([s for s in self._computed[:-1]], default=0)

    def _predict(self, step: int, x: np.ndarray) -> np.ndarray:
        """x0 of `step`, the model asked about latent x (flat), from the last two computed steps (flat float64, from
        the float32 state)."""
        if self._fresh_noise:  # the last computed x0, held (module docstring)
            return self._anchors[-1][1].astype(np.float64)
        (a, x0_a, eps_a), (b, x0_b, eps_b) = self._anchors[-2:][::-1]
        return forecast_x0(self._sigmas[step - 1], x, (self._sigmas[a - 1], x0_a, eps_a),
                           (self._sigmas[b - 1], x0_b, eps_b))

    @staticmethod
    def _features(features: np.ndarray) -> np.ndarray:
        return np.asarray(features, dtype=np.float32).ravel().copy()

    def _probe_ratio(self, step: int, x: np.ndarray | None) -> float:
        """The partial pass's miss at the latent x of `step` (probe_miss), over the typical miss at its sigma and
        distance (the fit's typical_probe_miss)."""
        if x is None:
            raise RuntimeError("the auto cache's check needs the latent the model is asked about")
        sigma, distance = self._sigmas[step - 1], len(self._open) + 1
        features = self._probe(np.asarray(x, dtype=np.float32), sigma)
        (a, at), (b, bt) = self._probe_anchors[-2:][::-1]
        if not at.size == bt.size == np.size(features):  # only a restored state can bring other sizes
            raise AnimaError("the cache state's first-block tokens do not fit this model")
        return probe_miss(features, sigma, (self._sigmas[a - 1], at), (self._sigmas[b - 1], bt)) \
            / typical_probe_miss(sigma, distance, self.fit)

    def _measure(self, step: int, x: np.ndarray, x0: np.ndarray) -> float | None:
        """Relative L2 error of the forecast for this computed step; None before two steps are stored or when it
        is not finite (such a step counts as unmeasured, so the next one is computed too)."""
        if len(self._anchors) < 2:
            return None
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            error = float(np.linalg.norm(self._predict(step, x) - x0) / np.linalg.norm(x0.astype(np.float64)))
        return error if math.isfinite(error) else None

    def _cost(self, step: int, distance: int) -> float:
        """Expected share of the final relative error of forecasting `step` at `distance` from the last computed."""
        sigma, sigma_next = self._sigmas[step - 1], self._sigmas[step]
        level = UNMEASURED_LEVEL if self._level is None else self._level
        return (sigma - sigma_next) / sigma * level * distance**ORDER

    def _open_estimate(self) -> float:
        return sum(self._cost(step, d) for d, step in enumerate(self._open, start=1))

    def _plan_charges(self) -> np.ndarray:
        """[step - 1, distance - 1]: a budget plan's charge for forecasting a step at a distance, in units of the
        one-step error (a factor common to every charge, so the plan needs no measured level)."""
        sigmas = np.array(self._sigmas)
        sigma, sigma_next = sigmas[:-1], sigmas[1:]
        fit = self.fit
        gain = 1.0 + fit.plan_gain * np.maximum(0.0, sigma - fit.plan_sigma) / (1.0 - fit.plan_sigma)
        distances = np.arange(1, self.num_steps + 1)
        growth = distances[None, :] ** (fit.plan_growth[0] + fit.plan_growth[1] * sigma[:, None])
        return ((sigma - sigma_next) / sigma * gain)[:, None] * growth

    def _plan(self, step: int, left: int) -> tuple[float, float, float]:
        """The cheapest placement of `left` calls over steps step..num_steps, as what decides `step`: its charge if
        forecast, the least charge of the steps after it then, and their least charge with `step` computed."""
        n, distance, charges = self.num_steps, len(self._open) + 1, self._plan_charges()
        # rest[d - 1, c]: the least charge of the steps after the one at hand when the next is at distance d from
        # a computed step with c calls left (distance n + 1 never occurs: its row stays infinite).
        rest = np.vstack([np.zeros((n, left + 1)), np.full((1, left + 1), np.inf)])
        no_call = np.full((n, 1), np.inf)
        for k in range(n, step, -1):
            forecast = charges[k - 1][:, None] + rest[1:]
            compute = np.hstack([no_call, np.broadcast_to(rest[0, :-1], (n, left))])
            rest[:n] = np.minimum(forecast, compute)
        return float(charges[step - 1, distance - 1]), float(rest[distance, left]), float(rest[0, left - 1])

    def _forecasts(self, plan: tuple[float, float, float], scale: float = 1.0) -> bool:
        """Whether the plan forecasts its step, that step's charge scaled by `scale` (check's ratio)."""
        charge, after_forecast, after_computing = plan
        return bool(scale * charge + after_forecast <= after_computing)
