"""Flow-matching sigma schedules, computed as ComfyUI computes them for Anima.

ComfyUI samples Anima through ModelSamplingDiscreteFlow (comfy/model_sampling.py) with multiplier 1000:
    table[i - 1] = shift_sigma(i / 1000), i = 1..1000;  sigma_min = table[0], sigma_max = table[-1] (1.0)
    sigma(timestep) = shift_sigma(timestep / 1000);  timestep(sigma) = 1000 sigma
timestep() is not the inverse of sigma() when shift != 1: the schedules that walk timesteps (normal, sgm_uniform)
apply the shift to sigma_min twice, and so end near shift_sigma(sigma_min) (0.0089 at shift 3), as ComfyUI and
diffusers' FlowMatchEulerDiscreteScheduler both do. Every schedule returns steps + 1 float64 sigmas, from about
1.0 down to a final 0.0. Names are those of comfy/samplers.py SCHEDULER_HANDLERS:

- simple: every (1000 / steps)-th table entry from the top (comfy/samplers.py simple_scheduler).
- normal: timesteps evenly spaced from timestep(sigma_max) to timestep(sigma_min), mapped by sigma()
  (comfy/samplers.py normal_scheduler).
- sgm_uniform: as normal over steps + 1 timesteps, the last dropped (normal_scheduler(sgm=True)).
- karras: Karras et al. 2022 eq. 5, rho = 7, from sigma_max to sigma_min (k-diffusion get_sigmas_karras).
- exponential: log-linear from sigma_max to sigma_min (k-diffusion get_sigmas_exponential).
- beta: quantiles 1 - k / steps of Beta(0.6, 0.6) rounded to the nearest of the table's 1000 entries
  (comfy/samplers.py beta_scheduler, after Lee et al. 2024, arXiv:2407.12173).
- linear_quadratic: 1 - s with s linear up to 0.025 over the first steps // 2 steps, then quadratic up to 1
  (comfy/samplers.py linear_quadratic_schedule, from Genmo's Mochi; threshold_noise 0.025, linear_steps steps // 2).

Shift reaches karras and exponential only through sigma_min, and linear_quadratic not at all (its sigma_max is
1.0 at every shift), as in ComfyUI. A1111's names and labels (modules/sd_schedulers.py) map onto these.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..checks import is_integer, is_number, require, shown

TRAIN_TIMESTEPS = 1000
KARRAS_RHO = 7.0  # Karras et al. 2022's and k-diffusion's default
BETA_ALPHA = 0.6  # ComfyUI's beta_scheduler defaults; alpha = beta makes the distribution symmetric about 1/2
LINEAR_QUADRATIC_THRESHOLD = 0.025  # ComfyUI's threshold_noise (Mochi's)
# ComfyUI's beta rounds its quantiles to table entries; from 139 steps on two quantiles round to one entry and
# ComfyUI drops the repeat, running fewer steps than asked: we refuse instead, a step count is a promise.
BETA_MAX_STEPS = 138
ZERO_SIGMA = 1e-5  # normal_scheduler treats a last sigma this close to 0 as the final 0 (math.isclose abs_tol)

SCHEDULES = ("simple", "normal", "karras", "exponential", "sgm_uniform", "beta", "linear_quadratic")
# A1111's "Schedule type" labels (modules/sd_schedulers.py); A1111 has no linear_quadratic, which Forge Neo (an A1111
# fork, same file) labels "Linear Quadratic".
SCHEDULE_LABELS = {"simple": "Simple", "normal": "Normal", "karras": "Karras", "exponential": "Exponential",
                   "sgm_uniform": "SGM Uniform", "beta": "Beta", "linear_quadratic": "Linear Quadratic"}
# A1111's scheduler names, labels and aliases that one of ours honours, and which one. "automatic" is the
# sampler's own default, which for Anima is simple (the spec's and ComfyUI workflows'); "uniform" spaces
# timesteps evenly from sigma_max to sigma_min, which is ComfyUI's normal. A1111's own beta interpolates sigma
# linearly between sigma_min and sigma_max; the name runs ComfyUI's, as every schedule here follows ComfyUI.
A1111_SCHEDULES = {
    "automatic": "simple", "Automatic": "simple", "uniform": "normal", "Uniform": "normal",
    "karras": "karras", "Karras": "karras", "exponential": "exponential", "Exponential": "exponential",
    "sgm_uniform": "sgm_uniform", "SGM Uniform": "sgm_uniform", "SGMUniform": "sgm_uniform",
    "simple": "simple", "Simple": "simple", "normal": "normal", "Normal": "normal", "beta": "beta", "Beta": "beta",
}
# stable-diffusion.cpp's --scheduler names beside ours: its discrete spaces timesteps evenly from the largest to the
# smallest, as A1111's Uniform (normal here). Its other schedules have none here: the refusal says so.
SDCPP_SCHEDULES = {"discrete": "normal"}
SDCPP_SCHEDULES_REFUSED = ("ays", "gits", "smoothstep", "kl_optimal", "lcm", "bong_tangent", "ltx2", "logit_normal",
                           "flux2", "flux")
_BY_CASEFOLDED = {text.casefold(): name for text, name in
                  [*zip(SCHEDULES, SCHEDULES), *((label, name) for name, label in SCHEDULE_LABELS.items()),
                   *A1111_SCHEDULES.items(), *SDCPP_SCHEDULES.items()]}


def shift_sigma(t: np.ndarray | float, shift: float) -> np.ndarray | float:
    """Time shift of rectified flow: spends more steps at high noise when shift > 1."""
    return shift * t / (1.0 + (shift - 1.0) * t)


def schedule_name(text: object) -> str:
    """Our name for a schedule given as ours or as A1111 names or labels it, in any case; else one AnimaError line."""
    name = _BY_CASEFOLDED.get(text.casefold()) if isinstance(text, str) else None
    require(not (name is None and isinstance(text, str) and text.casefold() in SDCPP_SCHEDULES_REFUSED),
            f"stable-diffusion.cpp's schedule {shown(text)} is not implemented here: choose one of "
            f"{', '.join(SCHEDULES)} (its discrete is normal here)")
    require(name is not None, f"unknown schedule {shown(text)}: choose one of {', '.join(SCHEDULES)} "
                              f"(or A1111's {', '.join(SCHEDULE_LABELS.values())}, Automatic, Uniform)")
    return name


@dataclass(frozen=True)
class _DiscreteFlow:
    """The part of ComfyUI's ModelSamplingDiscreteFlow the schedules read."""

    shift: float
    table: np.ndarray  # shift_sigma(i / 1000), i = 1..1000, increasing

    @property
    def sigma_min(self) -> float:
        return float(self.table[0])

    @property
    def sigma_max(self) -> float:
        return float(self.table[-1])

    def sigma(self, timestep: np.ndarray | float) -> np.ndarray | float:
        return shift_sigma(timestep / TRAIN_TIMESTEPS, self.shift)

    def timestep(self, sigma: float) -> float:
        return sigma * TRAIN_TIMESTEPS


def _with_zero(sigmas: np.ndarray) -> np.ndarray:
    return np.append(sigmas, 0.0)


def _simple(flow: _DiscreteFlow, steps: int) -> np.ndarray:
    # k * 1000 / steps, not k * (1000 / steps): the sigmas this code has always returned, bit for bit
    return _with_zero(np.array([flow.table[-(1 + int(k * TRAIN_TIMESTEPS / steps))] for k in range(steps)]))


def _normal(flow: _DiscreteFlow, steps: int) -> np.ndarray:
    start, end = flow.timestep(flow.sigma_max), flow.timestep(flow.sigma_min)
    if flow.sigma(end) > ZERO_SIGMA:
        return _with_zero(flow.sigma(np.linspace(start, end, steps)))
    # Only at shifts below about 0.1: ComfyUI spends one more timestep and lets sigma(end) be the end, which we
    # make the exact 0 the samplers expect (a change under ZERO_SIGMA).
    sigmas = flow.sigma(np.linspace(start, end, steps + 1))
    sigmas[-1] = 0.0
    return sigmas


def _sgm_uniform(flow: _DiscreteFlow, steps: int) -> np.ndarray:
    start, end = flow.timestep(flow.sigma_max), flow.timestep(flow.sigma_min)
    return _with_zero(flow.sigma(np.linspace(start, end, steps + 1)[:-1]))


def _karras(flow: _DiscreteFlow, steps: int) -> np.ndarray:
    top, bottom = flow.sigma_max ** (1 / KARRAS_RHO), flow.sigma_min ** (1 / KARRAS_RHO)
    return _with_zero((top + np.linspace(0.0, 1.0, steps) * (bottom - top)) ** KARRAS_RHO)


def _exponential(flow: _DiscreteFlow, steps: int) -> np.ndarray:
    return _with_zero(np.exp(np.linspace(math.log(flow.sigma_max), math.log(flow.sigma_min), steps)))


def _symmetric_beta_cdf(x: np.ndarray, a: float) -> np.ndarray:
    """I_x(a, a), the Beta(a, a) CDF, for 0 < x <= 1/2: Numerical Recipes' continued fraction (6.4), which converges
    fast for x below (a + 1) / (2a + 2) = 1/2. Written here so that the beta schedule does not need SciPy."""
    front = np.exp(a * np.log(x * (1.0 - x)) - (2.0 * math.lgamma(a) - math.lgamma(2.0 * a))) / a
    c, d = np.ones_like(x), 1.0 / (1.0 - 2.0 * a * x / (a + 1.0))  # modified Lentz, from the fraction's first term
    fraction = d
    for m in range(1, 200):
        for numerator in (m * (a - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (2 * a + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 / (1.0 + numerator * d)
            c = 1.0 + numerator / c
            fraction = fraction * c * d
        if np.all(np.abs(c * d - 1.0) < 1e-15):
            break
    return front * fraction


def _symmetric_beta_ppf(q: np.ndarray, a: float) -> np.ndarray:
    """The Beta(a, a) quantile of each q in [0, 1], by bisection; the upper half mirrors the lower one."""
    lower = np.minimum(q, 1.0 - q)
    low, high = np.zeros_like(lower), np.full_like(lower, 0.5)
    for _ in range(60):  # 2^-60 of the bracket: below float64's resolution of x
        middle = (low + high) / 2
        below = _symmetric_beta_cdf(middle, a) < lower
        low, high = np.where(below, middle, low), np.where(below, high, middle)
    return np.where(q > 0.5, 1.0 - high, high)


def _beta(flow: _DiscreteFlow, steps: int) -> np.ndarray:
    require(steps <= BETA_MAX_STEPS, f"the beta schedule has at most {BETA_MAX_STEPS} distinct steps on the 1000-entry "
                                     f"sigma table (ComfyUI would silently run fewer), got {steps}")
    quantiles = 1.0 - np.linspace(0.0, 1.0, steps, endpoint=False)
    indices = np.rint(_symmetric_beta_ppf(quantiles, BETA_ALPHA) * (len(flow.table) - 1)).astype(np.int64)
    return _with_zero(flow.table[indices])


def _linear_quadratic(flow: _DiscreteFlow, steps: int) -> np.ndarray:
    if steps == 1:
        return np.array([flow.sigma_max, 0.0])  # ComfyUI's own case: the formula below divides by steps // 2 = 0
    linear_steps, threshold = steps // 2, LINEAR_QUADRATIC_THRESHOLD
    quadratic_steps = steps - linear_steps
    # The quadratic continues the linear ramp at i = linear_steps (value threshold, same slope) and reaches 1 at
    # i = steps.
    excess = linear_steps - threshold * steps
    quadratic = excess / (linear_steps * quadratic_steps ** 2)
    slope = threshold / linear_steps - 2 * excess / quadratic_steps ** 2
    i = np.arange(steps, dtype=np.float64)
    ramp = np.where(i < linear_steps, i * threshold / linear_steps,
                    quadratic * i ** 2 + slope * i + quadratic * linear_steps ** 2)
    return np.append(1.0 - ramp, 0.0) * flow.sigma_max


_SCHEDULERS: dict[str, Callable[[_DiscreteFlow, int], np.ndarray]] = {
    "simple": _simple, "normal": _normal, "karras": _karras, "exponential": _exponential,
    "sgm_uniform": _sgm_uniform, "beta": _beta, "linear_quadratic": _linear_quadratic,
}


def flow_sigmas(steps: int, shift: float = 3.0, schedule: str = "simple") -> np.ndarray:
    """`steps` decreasing sigmas from the schedule's sigma_max (about 1.0), then a final 0; float64, length
    steps + 1. `schedule` is any name schedule_name() accepts."""
    require(is_integer(steps) and steps >= 1, f"steps must be a positive integer, got {steps!r}")
    require(is_number(shift) and shift > 0, f"sigma shift must be a positive number, got {shift!r}")
    name = schedule_name(schedule)
    table = shift_sigma(np.arange(1, TRAIN_TIMESTEPS + 1, dtype=np.float64) / TRAIN_TIMESTEPS, shift)
    return _SCHEDULERS[name](_DiscreteFlow(float(shift), table), int(steps))


def strength_start(steps: int, strength: float) -> int:
    """The step an image-to-image run of `strength` starts at: the first of the `steps` steps whose sigma the
    init latent is noised to, as diffusers' get_timesteps computes it (its flow-matching img2img pipelines and
    Anima's modular blocks). The run makes steps - start steps, steps x strength rounded up: 20 steps at strength
    0.5 run the last 10; 10 steps at 0.75, the last 8; at 1, all of them from pure noise. (A1111 runs
    int(steps x strength) + 1 steps, from one sigma earlier.)"""
    require(is_integer(steps) and steps >= 1, f"steps must be a positive integer, got {steps!r}")
    require(is_number(strength) and 0 <= strength <= 1, f"strength must be from 0 to 1, got {shown(strength)}")
    return int(max(steps - min(steps * strength, steps), 0))
