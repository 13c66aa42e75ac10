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
under those the forecast holds the last computed x0 (er_sde on the demo tuning set, budget=8: 18.3 dB mean with the
blend, 27.5 with x0's damped line, 32.1 held; budget=10: 31.7, 33.1, 36.7). A policy's steps are
the run's model calls (two a step for heun and the like, whose second call may sit at the sigma of the next
step's first: two computed calls at one sigma give no slope, and the forecast then holds x0 and eps).
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import numpy as np

from ..checks import is_integer, is_number, require
from ..errors import AnimaError

AUTO_OPTIONS = {"tol": float, "budget": int, "guard": float, "warmup": int, "verify": bool, "check": bool}
# Chosen on the demo model's tuning prompts and seeds (benchmarks/auto_cache.py --prompts 24 --prompt-seed 3
# --seed 5000), never on the README's 48 held-out ones. tol and guard steer a run without a budget; a budget
# plans its own calls and spends them all.
AUTO_DEFAULTS = {"tol": 0.05, "guard": 0.2, "warmup": 3}
# Forecast error grows like (steps since the last computed one) ** ORDER: on the demo model's uncached
# trajectories the error of a forecast 1, 2, 3 steps ahead is about 0.05, 0.09, 0.12 in the late steps.
ORDER = 1.0
# Share of the straight-line extrapolation the forecast takes: the full line overshoots a trajectory that bends
# (0.5 was best of 0, 0.25, 0.5, 0.75, 1 on those trajectories).
DAMPING = 0.5
# What a forecast is charged before any measurement (only a budget of warm-up steps forecasts that early): as far
# off as x0 itself, so the estimate never claims a precision nobody measured.
UNMEASURED_LEVEL = 1.0
# A budget's plan. On the demo model's uncached tuning trajectories a forecast's error grows with its distance d
# from the last computed step like d ** (0.5 + 1.2 sigma): fast at high noise (d=3 costs 5.7 one-step errors at
# sigma 0.9), hardly at all at the end (d=3: 1.9). One forecast step's share of the final latent's error,
# measured by forecasting that step alone, is weight * error * gain, the gain about 0.55 from sigma 0.8 down and
# up to 2.5 times that at sigma 0.94 (an early error changes what the later steps draw): the plan ramps it up
# linearly above PLAN_SIGMA, to 1 + PLAN_GAIN at sigma 1. On the demo tuning set gains 0-3 from 0.8 placed
# budget 10 alike (44.2 dB mean, 31.5 worst) and 1-2 placed budget 8 alike (36.3 / 25.9; 0: 33.1 / 18.9); 3 from
# 0.7 did better at budget 8 (38.1 / 26.2) but lost 4 more cells to spectrum-plus on a test bed of other
# mixtures (spectrum_testbed.py --testbed-seed 1), where 1 from 0.8 won 13 of 15.
PLAN_GROWTH = (0.5, 1.2)
PLAN_GAIN, PLAN_SIGMA = 1.0, 0.8
# The "may differ visibly" flag (issue 24). A fragile image's deviation from its uncached run grows from the
# steps after a forecast on, and its model x0 moves off the forecaster's line: its late measured misses exceed
# the typical miss at their sigma and distance d from the previous computed step. The typical miss, fitted on
# the demo model's tune-large runs at budgets 6-16 (12,288 measured misses; residual sd 0.57 in ln):
#   ln miss = a + b ln d + c sigma + e sigma ln d.
# The score is the geometric mean of miss / typical over the computed steps at sigma <= FLAG_SIGMA; an image
# scoring FLAG_SCORE or more is flagged. Chosen on tune-large alone at budget=10: the threshold that flags 8
# of its 9 images under 30 dB (32 of 192 flagged); FLAG_SIGMA 0.8 had the best precision of 0.2-1
# (benchmarks/auto_cache.py, README: what held out). Another model's misses need their own fit.
TYPICAL_MISS = (-3.59, 1.85, 1.77, -0.66)
FLAG_SIGMA, FLAG_SCORE = 0.8, 1.3
# A budget's `check` (issue 24), DBCache-style: before a planned forecast is trusted, the first block runs on the
# latent at hand (a partial pass of the positive prompt: 1 / blocks of a pass), and its output's miss from the
# damped line through the last two computed steps' (relative L2), over the typical miss at that sigma and distance
# d, scales the step's charge in the plan; the plan made again over the same calls left may then compute the step.
# The typical miss, fitted on the demo model's `tune` uncached runs (distances 1-4, steps 3-20):
#   ln miss = a + b sigma + (c + e sigma) ln d.
# Across the images of a set the partial pass's miss ranks the x0 forecast's real error with median Spearman 0.50-
# 0.62 (tune and four held-out sets; benchmarks/partial_pass_check.py). Another model needs its own fit.
TYPICAL_PROBE_MISS = (-2.58, -0.76, 0.85, 0.21)


def damped_line(sigma: float, last: tuple[float, np.ndarray], before: tuple[float, np.ndarray]) -> np.ndarray:
    """The value at `sigma` on the line in sigma through the last two computed steps' (sigma, value), taken DAMPING
    of the way past the last one (two calls at one sigma give no slope: the last value, held)."""
    (sigma_a, a), (sigma_b, b) = last, before
    reach = DAMPING * (sigma - sigma_a) / (sigma_a - sigma_b) if sigma_a != sigma_b else 0.0
    return a + reach * (a - b)


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


def typical_probe_miss(sigma: float, distance: int) -> float:
    """The partial pass's miss a typical run shows at `sigma`, `distance` steps after a computed one."""
    k0, k1, k2, k3 = TYPICAL_PROBE_MISS
    return math.exp(k0 + k1 * sigma + (k2 + k3 * sigma) * math.log(distance))


class Probe(Protocol):
    """A cheap look at the model for `check`: its features at latent x and sigma from a partial pass, and the same
    features of the last full model call (which kept them for free)."""

    def __call__(self, x: np.ndarray, sigma: float) -> np.ndarray: ...

    def last(self) -> np.ndarray: ...


class AutoCache:
    """Warm-up, then forecast a step only while its expected share of the final error is under `tol`; `guard`: a
    measured relative x0 error above it makes the next step a computed one.

    The guard and the run spacing (_longest_run) decide before `tol`, so a `tol` above the largest charge of the
    forecasts they let through changes nothing: at 20 steps on the demo tuning prompts that is 0.03-0.18 per image
    (median 0.085), and with both unbounded the spacing alone computes 1,2,3,5,8,12,17 (README, `--cache auto`).

    `budget` (computed steps, optional) replaces both: a hard cap, spent whole on the plan with the least
    expected error. The sampler's own refusal of a non-finite forecast is the one thing that can add a call
    beyond it. With `check`, a partial pass looks at every forecast the plan would make before it is trusted
    (TYPICAL_PROBE_MISS): the image's own measurements move its plan, within the same cap. It needs a Probe
    (attach_probe), which the pipeline makes from its engine.
    """

    name = "auto"

    def __init__(self, num_steps: int, tol: float | None = None, budget: int | None = None,
                 guard: float | None = None, warmup: int = AUTO_DEFAULTS["warmup"], verify: bool = False,
                 check: bool = False) -> None:
        require(is_integer(num_steps) and num_steps >= 1,
                f"number of steps must be a positive integer, got {num_steps!r}")
        for key, value in (("tol", tol), ("guard", guard)):
            require(budget is None or value is None,
                    f"cache option {key} does not apply with a budget (a budget plans where its calls go)")
        tol = AUTO_DEFAULTS["tol"] if tol is None else tol
        guard = AUTO_DEFAULTS["guard"] if guard is None else guard
        require(is_number(tol) and tol >= 0, f"cache option tol must be a number >= 0, got {tol!r}")
        require(is_number(guard) and guard > 0, f"cache option guard must be a number > 0, got {guard!r}")
        require(isinstance(verify, bool), f"cache option verify must be true or false, got {verify!r}")
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
        self.verify = verify  # a flagged run is re-run uncached from the last call before its first forecast
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
        self._rerun_from: int | None = None  # verify re-ran the calls after this one uncached
        self._first_score: float | None = None  # the flag score of the run that verify threw away

    # ---- the sampler's side ------------------------------------------------------------------------------

    def set_sigmas(self, sigmas: np.ndarray, fresh_noise: bool = False) -> None:
        sigmas = [float(s) for s in np.asarray(sigmas, dtype=np.float64)]
        if len(sigmas) != self.num_steps + 1:
            raise RuntimeError(f"auto cache is set up for {self.num_steps} steps, got {len(sigmas)} sigmas")
        # Measured (README, `check=1`): under fresh noise the first block's tokens jitter off any line, and the
        # check then moves calls where they do harm (er_sde, budget=10: 33.0-33.6 dB mean against 36.3-37.3).
        require(not (self.check and fresh_noise), "cache option check does not apply to a sampler that adds fresh "
                "noise on its steps (it lowers their images); use a deterministic one, or eta / s_noise 0 where taken")
        self._sigmas, self._fresh_noise = sigmas, bool(fresh_noise)

    @property
    def needs_probe(self) -> bool:
        return self.check

    def attach_probe(self, probe: Probe) -> None:
        self._probe = probe

    def should_skip(self, x: np.ndarray | None = None) -> bool:
        if self._sigmas is None:
            raise RuntimeError("the sampler hands the auto cache its sigmas before the first step")
        if self.check and self._probe is None:
            raise RuntimeError("the auto cache's check needs a probe of the model (attach_probe)")
        if self._rerun_from is not None:
            return False  # verify's re-run: every call computed
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
        if self._rerun_from is not None:  # verify's re-run measures nothing: no forecast follows
            self._computed.append(step)
            self._errors.append(None)
            return
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
        """Estimated relative L2 distance of the final latent from the uncached run's (0 after verify's re-run:
        the image is then the uncached one)."""
        return self._settled + self._open_estimate()

    @property
    def flag_score(self) -> float | None:
        """The late misses over the typical ones (TYPICAL_MISS); None when no call at sigma <= FLAG_SIGMA was
        measured. After verify's re-run: the score of the run it replaced."""
        if self._rerun_from is not None:
            return self._first_score
        a, b, c, e = TYPICAL_MISS
        logs = [math.log(error) - (a + b * math.log(step - before) + c * sigma + e * sigma * math.log(step - before))
                for before, step, error in zip(self._computed, self._computed[1:], self._errors[1:])
                if error is not None and error > 0 and (sigma := self._sigmas[step - 1]) <= FLAG_SIGMA]
        return math.exp(sum(logs) / len(logs)) if logs else None

    @property
    def may_differ(self) -> bool | None:
        """The flag: this cached image may differ visibly from the uncached one (None: nothing late measured)."""
        score = self.flag_score
        return None if score is None else score >= FLAG_SCORE

    @property
    def wants_rerun(self) -> bool:
        """verify is on, the run forecast at least once, and its flag is up: the sampler rewinds (rewind())."""
        return self.verify and self._rerun_from is None and bool(self._skipped) and bool(self.may_differ)

    @property
    def rerun_from(self) -> int | None:
        """The call verify re-ran the rest of the run from, uncached (None: not re-run)."""
        return self._rerun_from

    def rewind(self, calls: int) -> None:
        """Back to the state after `calls` calls, all of them computed (the sampler's snapshot before the first
        forecast), every later call to be computed."""
        if not self.wants_rerun or calls not in self._computed or any(s <= calls for s in self._skipped):
            raise RuntimeError(f"the auto cache cannot rewind to call {calls}")
        self._first_score = self.flag_score
        kept = self._computed.index(calls) + 1
        self._computed, self._errors, self._skipped = self._computed[:kept], self._errors[:kept], []
        self._settled, self._rerun_from, self._anchors, self._probe_anchors = 0.0, calls, [], []
        self._checked = [s for s in self._checked if s <= calls]

    @property
    def checked_steps(self) -> list[int]:
        """The calls the plan would have forecast and `check`'s partial pass had computed."""
        return list(self._checked)

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
                "rerun_from": self._rerun_from, "first_score": self._first_score,
                "checked": list(self._checked), "probe_steps": [a[0] for a in self._probe_anchors],
                "probe_features": [a[1] for a in self._probe_anchors]}

    def restore(self, state: dict[str, Any]) -> None:
        try:
            computed, skipped = list(state["computed"]), list(state["skipped"])
            measured_steps, measured_errors = list(state["measured_steps"]), list(state["measured_errors"])
            level, settled, shape = state["level"], state["settled"], tuple(state["shape"])
            steps, x0s, epss = list(state["anchor_steps"]), list(state["anchor_x0"]), list(state["anchor_eps"])
            # a state written before verify existed has neither
            rerun_from, first_score = state.get("rerun_from"), state.get("first_score")
            # nor a state written before check existed
            checked, probe_steps = list(state.get("checked", [])), list(state.get("probe_steps", []))
            probe_features = list(state.get("probe_features", []))
        except (KeyError, TypeError):
            raise AnimaError("the cache state is incomplete") from None
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
               and (steps == computed[-2:] if rerun_from is None else not steps)
               and len(x0s) == len(epss) == len(steps)
               and all(isinstance(a, np.ndarray) and a.dtype == np.float32 and a.shape == (size,) for a in arrays)
               and (rerun_from is None or (self.verify and is_integer(rerun_from) and rerun_from in computed
                                           and not skipped and is_number(first_score) and first_score >= 0))
               and all(is_integer(s) for s in checked) and set(checked) <= set(computed)
               and (probe_steps == (computed[-2:] if self.check and rerun_from is None else []))
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
        self._rerun_from = None if rerun_from is None else int(rerun_from)
        self._first_score = None if first_score is None else float(first_score)
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
        (a, x0_a, eps_a), (b, x0_b, eps_b) = ((s, x0.astype(np.float64), e.astype(np.float64))
                                              for s, x0, e in self._anchors[-2:][::-1])
        sigma, sigma_a, sigma_b = self._sigmas[step - 1], self._sigmas[a - 1], self._sigmas[b - 1]
        from_x0 = damped_line(sigma, (sigma_a, x0_a), (sigma_b, x0_b))
        if sigma >= 1.0:
            return from_x0
        from_eps = (x.astype(np.float64) - sigma * damped_line(sigma, (sigma_a, eps_a), (sigma_b, eps_b))) \
            / (1.0 - sigma)
        return sigma**2 * from_x0 + (1.0 - sigma**2) * from_eps

    @staticmethod
    def _features(features: np.ndarray) -> np.ndarray:
        return np.asarray(features, dtype=np.float32).ravel().copy()

    def _probe_ratio(self, step: int, x: np.ndarray | None) -> float:
        """The partial pass's miss at the latent x of `step` (probe_miss), over the typical miss at its sigma and
        distance (TYPICAL_PROBE_MISS)."""
        if x is None:
            raise RuntimeError("the auto cache's check needs the latent the model is asked about")
        sigma, distance = self._sigmas[step - 1], len(self._open) + 1
        features = self._probe(np.asarray(x, dtype=np.float32), sigma)
        (a, at), (b, bt) = self._probe_anchors[-2:][::-1]
        if not at.size == bt.size == np.size(features):  # only a restored state can bring other sizes
            raise AnimaError("the cache state's first-block tokens do not fit this model")
        return probe_miss(features, sigma, (self._sigmas[a - 1], at), (self._sigmas[b - 1], bt)) \
            / typical_probe_miss(sigma, distance)

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
        gain = 1.0 + PLAN_GAIN * np.maximum(0.0, sigma - PLAN_SIGMA) / (1.0 - PLAN_SIGMA)
        distances = np.arange(1, self.num_steps + 1)
        growth = distances[None, :] ** (PLAN_GROWTH[0] + PLAN_GROWTH[1] * sigma[:, None])
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
