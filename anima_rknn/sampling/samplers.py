"""The samplers, one small function per step each, over a denoiser that returns x0 for a rectified-flow model.

A flow model's latent at noise level sigma is  x = (1 - sigma) x0 + sigma eps  (alpha = 1 - sigma), not the
x0 + sigma eps of k-diffusion's VE form. Where a method only integrates  dx/dsigma = (x - x0) / sigma  (euler,
heun) the two forms are the same ODE and the code is k-diffusion's. Where a method adds noise or works in
log-SNR (the ancestral, SDE, exponential-integrator and Adams methods), it is written here in the flow form,
with  lambda = log(alpha / sigma)  and  e^-h = (sigma_t alpha_s) / (sigma_s alpha_t)  for a step s -> t: a
renoised latent must again be (1 - sigma) x0 + sigma eps, or every stochastic step would shrink the image.

Each step function takes the model (`model(x, sigma) -> x0`, which a step cache may answer instead of the
network), the latent, a StepContext (the run's sigmas, the step index, the step's noise, eta, s_noise) and the
sampler's history (the x0 of earlier steps, which multistep methods read), and returns the next latent, the x0
the step reported, and the new history. A guided sampler (CFG++) takes a GuidedModel instead, which returns the
unconditional x0 of the same CFG call beside the guided one. The history is all a sampler carries from step to
step, so a run stopped after any step resumes bit for bit from (latent, history). No step function knows which
cache runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..checks import shown
from ..errors import AnimaError
from .schedule import A1111_SCHEDULES, SCHEDULE_LABELS, SCHEDULES, schedule_name

Model = Callable[[np.ndarray, float], np.ndarray]  # model(x, sigma) -> x0 (float32, shaped like x)
# A guided sampler's (Sampler.guided): model(x, sigma) -> (guided x0, unconditional x0) of one CFG call.
GuidedModel = Callable[[np.ndarray, float], tuple[np.ndarray, np.ndarray]]
History = dict[str, list[np.ndarray]]  # float32 arrays only: a resume state stores them as tensors


@dataclass(frozen=True)
class StepContext:
    sigmas: np.ndarray  # the run's sigmas, float64, steps + 1 of them
    index: int  # this step goes from sigmas[index] to sigmas[index + 1]
    noise: Callable[[int, int], np.ndarray]  # noise(step index, draw) -> standard normal float32, shaped like x
    eta: float
    s_noise: float

    @property
    def sigma(self) -> float:
        return float(self.sigmas[self.index])

    @property
    def sigma_next(self) -> float:
        return float(self.sigmas[self.index + 1])

    def draw(self, draw: int = 0) -> np.ndarray:
        return self.noise(self.index, draw)


StepResult = tuple[np.ndarray, np.ndarray, History]  # (the next latent, the x0 the step reports, the new history)
StepFunction = Callable[[Model | GuidedModel, np.ndarray, StepContext, History], StepResult]


# ---- the flow form's log-SNR --------------------------------------------------------------------------------

# Where a method needs lambda at sigma = 1 itself (a stage placed in lambda, an interpolation node), sigma = 1
# counts as 1 - 1e-4, as ComfyUI's offset_first_sigma_for_snr does; every other method takes the exact limit.
FIRST_SIGMA_FOR_SNR = 1.0 - 1e-4


def half_log_snr(sigma: float) -> float:
    """lambda = log((1 - sigma) / sigma): -inf at pure noise, +inf at the clean image."""
    if sigma >= 1.0:
        return -math.inf
    if sigma <= 0.0:
        return math.inf
    return math.log((1.0 - sigma) / sigma)


def sigma_of_half_log_snr(lam: float) -> float:
    return 1.0 / (1.0 + math.exp(lam))


def _exp_minus_h(sigma: float, sigma_next: float) -> float:
    """e^-h of the step sigma -> sigma_next, 0 from pure noise (h infinite), 1 for a step that stays put."""
    if sigma_next == sigma:
        return 1.0
    return sigma_next * (1.0 - sigma) / (sigma * (1.0 - sigma_next))


def _step_ratio(sigmas: np.ndarray, index: int) -> float:
    """h / h_last of step `index` (0 when the last step began at pure noise, where h_last is infinite)."""
    h = half_log_snr(float(sigmas[index + 1])) - half_log_snr(float(sigmas[index]))
    h_last = half_log_snr(float(sigmas[index])) - half_log_snr(float(sigmas[index - 1]))
    return h / h_last


def _f32(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32, copy=False)


def _first_order(x: np.ndarray, x0: np.ndarray, sigma: float, sigma_next: float, eta: float) -> np.ndarray:
    """The flow SDE-DPM-Solver++ step of order 1, without its noise: x's share decays by e^-(eta h) on top of
    the ODE's; at eta = 0 this is DDIM, which for a flow model is the Euler step."""
    decay = _exp_minus_h(sigma, sigma_next) ** eta  # 0 ** 0 is 1: from pure noise an ODE step keeps x's share
    return (sigma_next / sigma * decay) * x + (1.0 - sigma_next) * (1.0 - _exp_minus_h(sigma, sigma_next) * decay) * x0


def _renoise_scale(sigma: float, sigma_next: float, eta: float) -> float:
    """The noise an eta step adds back, so the latent's noise is sigma_next again: sigma_next sqrt(1 - e^-2 eta h)."""
    return sigma_next * math.sqrt(max(0.0, 1.0 - _exp_minus_h(sigma, sigma_next) ** (2.0 * eta)))


# ---- the samplers ---------------------------------------------------------------------------------------------

def euler(model: Model, x: np.ndarray, ctx: StepContext, history: History) -> StepResult:
    """Euler on the probability-flow ODE (k-diffusion's sample_euler, churn 0)."""
    sigma, sigma_next = ctx.sigma, ctx.sigma_next
    x0 = model(x, sigma)
    velocity = (x - x0) / sigma
    return _f32(x + (sigma_next - sigma) * velocity), x0, {}


def euler_ancestral(model: Model, x: np.ndarray, ctx: StepContext, history: History) -> StepResult:
    """Euler down to sigma_down, then fresh noise up to sigma_next. Flow form: the deterministic part lands on
    (1 - sigma_down) x0 + sigma_down eps; scaling by (1 - sigma_next) / (1 - sigma_down) restores x0's share,
    and noise of variance sigma_next^2 - (that scale * sigma_down)^2 restores the noise's. eta 1 takes
    sigma_down = sigma_next^2 / sigma, as ComfyUI's euler_ancestral for flow models (sample_euler_ancestral_RF)."""
    sigma, sigma_next, eta = ctx.sigma, ctx.sigma_next, ctx.eta
    x0 = model(x, sigma)
    if sigma_next == 0.0:
        return x0, x0, {}
    sigma_down = sigma_next * (1.0 + (sigma_next / sigma - 1.0) * eta)
    x_down = (sigma_down / sigma) * x + (1.0 - sigma_down / sigma) * x0
    if eta == 0.0:
        return _f32(x_down), x0, {}
    scale = (1.0 - sigma_next) / (1.0 - sigma_down)
    renoise = math.sqrt(max(0.0, sigma_next**2 - (scale * sigma_down) ** 2))
    return _f32(scale * x_down + (ctx.s_noise * renoise) * ctx.draw()), x0, {}


def heun(model: Model, x: np.ndarray, ctx: StepContext, history: History) -> StepResult:
    """Heun's second-order method (k-diffusion's sample_heun, churn 0): two model calls per step, one on the
    last (to sigma 0 it is Euler)."""
    sigma, sigma_next = ctx.sigma, ctx.sigma_next
    x0 = model(x, sigma)
    slope = (x - x0) / sigma
    predicted = _f32(x + (sigma_next - sigma) * slope)
    if sigma_next == 0.0:
        return predicted, x0, {}
    slope_next = (predicted - model(predicted, sigma_next)) / sigma_next
    return _f32(x + (sigma_next - sigma) * ((slope + slope_next) / 2)), x0, {}


def dpmpp_2m(model: Model, x: np.ndarray, ctx: StepContext, history: History) -> StepResult:
    """DPM-Solver++(2M) (Lu et al. 2022), data prediction in the flow form's lambda: the first-order step on a
    linear extrapolation of x0 from this step and the last (diffusers' DPMSolverMultistepScheduler, order 2)."""
    sigma, sigma_next = ctx.sigma, ctx.sigma_next
    x0 = model(x, sigma)
    if sigma_next == 0.0:
        return x0, x0, {"x0": [x0]}
    guess = x0
    if history.get("x0"):
        guess = x0 + (0.5 * _step_ratio(ctx.sigmas, ctx.index)) * (x0 - history["x0"][-1])
    return _f32(_first_order(x, guess, sigma, sigma_next, 0.0)), x0, {"x0": [x0]}


def dpmpp_2m_sde(model: Model, x: np.ndarray, ctx: StepContext, history: History) -> StepResult:
    """SDE-DPM-Solver++(2M), midpoint form (k-diffusion's sample_dpmpp_2m_sde; diffusers' sde-dpmsolver++ at eta
    1) in the flow form: the first-order SDE step, the second-order term on x0's change, fresh noise."""
    sigma, sigma_next, eta = ctx.sigma, ctx.sigma_next, ctx.eta
    x0 = model(x, sigma)
    if sigma_next == 0.0:
        return x0, x0, {"x0": [x0]}
    x_next = _first_order(x, x0, sigma, sigma_next, eta)
    if history.get("x0"):
        weight = (1.0 - sigma_next) * (1.0 - _exp_minus_h(sigma, sigma_next) ** (1.0 + eta))
        x_next = x_next + (0.5 * weight * _step_ratio(ctx.sigmas, ctx.index)) * (x0 - history["x0"][-1])
    if eta > 0.0:
        x_next = x_next + (ctx.s_noise * _renoise_scale(sigma, sigma_next, eta)) * ctx.draw()
    return _f32(x_next), x0, {"x0": [x0]}


def _ancestral_stage(x: np.ndarray, x0: np.ndarray, sigma: float, sigma_to: float, eta: float, s_noise: float,
                     noise: Callable[[], np.ndarray]) -> np.ndarray:
    """k-diffusion's ancestral split of a step (sigma_up = eta of the fresh noise, sigma_down the rest) and the
    first-order DPM-Solver++ step down to sigma_down, taken where k-diffusion takes them: in the VE variables of
    the flow latent, x / alpha at sigma_ve = sigma / alpha = e^-lambda."""
    ve, ve_to = sigma / (1.0 - sigma), sigma_to / (1.0 - sigma_to)
    up = min(ve_to, eta * math.sqrt(ve_to**2 * (ve**2 - ve_to**2) / ve**2))
    down = math.sqrt(ve_to**2 - up**2)
    x_to = ((1.0 - sigma_to) * down / sigma) * x + ((1.0 - sigma_to) * (1.0 - down / ve)) * x0
    return x_to + ((1.0 - sigma_to) * up * s_noise) * noise() if up > 0.0 else x_to


def dpmpp_sde(model: Model, x: np.ndarray, ctx: StepContext, history: History) -> StepResult:
    """DPM-Solver++ SDE single-step, two stages (k-diffusion's and ComfyUI's sample_dpmpp_sde, r = 1/2): an
    ancestral stage to the lambda midpoint, the model there, and the full ancestral step on that x0. Two model
    calls per step, one on the last. The stages' noises are two increments of one Brownian motion in sigma, as
    k-diffusion's Brownian tree gives them: the second is correlated with the first by
    sqrt((sigma - sigma_mid) / (sigma - sigma_next)) (independent draws leave the variance 9-11% short at 50
    steps on the test bed)."""
    sigma, sigma_next, eta, s_noise = ctx.sigma, ctx.sigma_next, ctx.eta, ctx.s_noise
    x0 = model(x, sigma)
    if sigma_next == 0.0:
        return x0, x0, {}
    start = min(sigma, FIRST_SIGMA_FOR_SNR)
    lam = half_log_snr(start)
    sigma_mid = sigma_of_half_log_snr(lam + 0.5 * (half_log_snr(sigma_next) - lam))
    x_mid = _ancestral_stage(x, x0, start, sigma_mid, eta, s_noise, lambda: ctx.draw(0))
    x0_mid = model(_f32(x_mid), sigma_mid)

    def coupled() -> np.ndarray:
        rho = math.sqrt((sigma - sigma_mid) / (sigma - sigma_next))
        return rho * ctx.draw(0) + math.sqrt(1.0 - rho**2) * ctx.draw(1)

    return _f32(_ancestral_stage(x, x0_mid, start, sigma_next, eta, s_noise, coupled)), x0, {}


# ER-SDE-Solver-3 (Cui et al. 2023, arXiv:2309.06169; ComfyUI's sample_er_sde, the default of Anima's model card).
ER_SDE_STAGES = 3
ER_SDE_POINTS = 200  # the paper's code integrates its stage weights with this many left Riemann points


def _er_sde_scale(lam: float) -> float:
    """The paper's noise scale function  phi(lambda) = lambda (e^(lambda^0.3) + 10), without its lambda factor."""
    return math.exp(lam**0.3) + 10.0


def er_sde(model: Model, x: np.ndarray, ctx: StepContext, history: History) -> StepResult:
    """ER-SDE-Solver-3, VP form, where lambda_er = sigma / alpha (flow: sigma / (1 - sigma)). One model call,
    up to third order from the x0 of the last two steps; s_noise scales the noise it adds back."""
    sigma, sigma_next = ctx.sigma, ctx.sigma_next
    x0 = model(x, sigma)
    earlier = [x0, *history.get("x0", [])][:ER_SDE_STAGES]
    if sigma_next == 0.0:
        return x0, x0, {"x0": earlier[:ER_SDE_STAGES - 1]}
    lams = [s / (1.0 - s) if s < 1.0 else math.inf for s in ctx.sigmas[ctx.index - len(earlier) + 1: ctx.index + 2]]
    lam_s, lam_t = lams[-2], lams[-1]
    alpha_t = 1.0 - sigma_next
    # r = phi(lam_t) / phi(lam_s); its lambda factor is kept apart so that sigma = 1 (lam_s infinite) is the limit.
    g = _er_sde_scale(lam_t) / _er_sde_scale(lam_s)
    x_next = (sigma_next / sigma * g) * x + alpha_t * (1.0 - (lam_t / lam_s) * g) * x0
    if len(earlier) >= 2 and math.isfinite(lams[-3]):
        dt = lam_t - lam_s
        points = lam_t - dt / ER_SDE_POINTS * np.arange(ER_SDE_POINTS)
        scaled = points * np.exp(points**0.3) + 10.0 * points
        width = -dt / ER_SDE_POINTS
        phi_t = lam_t * _er_sde_scale(lam_t)
        slope = (x0 - earlier[1]) / (lam_s - lams[-3])
        x_next = x_next + alpha_t * (dt + float(np.sum(1.0 / scaled)) * width * phi_t) * slope
        if len(earlier) >= 3 and math.isfinite(lams[-4]):
            slope_before = (earlier[1] - earlier[2]) / (lams[-3] - lams[-4])
            curve = (slope - slope_before) / ((lam_s - lams[-4]) / 2.0)
            weight = dt**2 / 2.0 + float(np.sum((points - lam_s) / scaled)) * width * phi_t
            x_next = x_next + alpha_t * weight * curve
    if ctx.s_noise > 0.0:
        spread = math.sqrt(max(0.0, lam_t**2 - (lam_t * g) ** 2))  # lam_s r = lam_t g
        x_next = x_next + (alpha_t * ctx.s_noise * spread) * ctx.draw()
    return _f32(x_next), x0, {"x0": earlier[:ER_SDE_STAGES - 1]}


# SA-Solver (Xue et al. 2023, arXiv:2309.05019), ComfyUI's defaults for its sa_solver / sa_solver_pece samplers:
# predictor order 3, corrector order 4, stochastic (tau = eta) for sigma in [0.2, 0.8], deterministic outside.
SA_PREDICTOR_ORDER, SA_CORRECTOR_ORDER = 3, 4
SA_NOISE_BAND = (0.2, 0.8)
_GAUSS_NODES, _GAUSS_WEIGHTS = np.polynomial.legendre.leggauss(32)


def _sa_tau(sigma: float, eta: float) -> float:
    return eta if SA_NOISE_BAND[0] <= sigma <= SA_NOISE_BAND[1] else 0.0


def _sa_coefficients(lam_from: float, lam_to: float, nodes: list[float], tau: float, alpha_to: float) -> list[float]:
    """The stochastic Adams weights of a step lam_from -> lam_to: alpha_to (1 + tau^2) times the integral of
    e^-(1 + tau^2)(lam_to - lam) against each Lagrange basis polynomial over `nodes` (32-point Gauss-Legendre,
    exact to rounding for these smooth integrands)."""
    half = (lam_to - lam_from) / 2.0
    lams = lam_from + half * (_GAUSS_NODES + 1.0)
    decay = (1.0 + tau**2) * np.exp(-(1.0 + tau**2) * (lam_to - lams)) * _GAUSS_WEIGHTS * half
    weights = []
    for j, node in enumerate(nodes):
        basis = np.ones_like(lams)
        for k, other in enumerate(nodes):
            if k != j:
                basis *= (lams - other) / (node - other)
        weights.append(alpha_to * float(np.sum(decay * basis)))
    return weights


def _sa_step(x: np.ndarray, x0s: list[np.ndarray], sigmas: np.ndarray, index: int, order: int, eta: float,
             noise: Callable[[], np.ndarray], s_noise: float, corrector: bool) -> np.ndarray:
    """x at sigmas[index + 1] from x at sigmas[index] and the x0 of the last `order` model steps (the newest
    last; a corrector's newest is at sigmas[index + 1] itself)."""
    sigma, sigma_next = float(sigmas[index]), float(sigmas[index + 1])
    lam_of = [half_log_snr(min(float(s), FIRST_SIGMA_FOR_SNR)) for s in sigmas]
    newest = index + 1 if corrector else index
    nodes = lam_of[newest - order + 1: newest + 1]
    tau = _sa_tau(sigma_next, eta)
    h = lam_of[index + 1] - lam_of[index]
    weights = _sa_coefficients(lam_of[index], lam_of[index + 1], nodes, tau, 1.0 - sigma_next)
    x_next = (min(sigma_next, FIRST_SIGMA_FOR_SNR) / min(sigma, FIRST_SIGMA_FOR_SNR) * math.exp(-(tau**2) * h)) * x
    for weight, x0 in zip(weights, x0s[-order:]):
        x_next = x_next + weight * x0
    if tau > 0.0 and s_noise > 0.0:
        x_next = x_next + (s_noise * sigma_next * math.sqrt(-math.expm1(-2.0 * tau**2 * h))) * noise()
    return _f32(x_next)


def _sa_solver(model: Model, x: np.ndarray, ctx: StepContext, history: History, pece: bool) -> StepResult:
    """One SA-Solver step: the model at x (the last step's prediction); the corrector redoes the last step with
    that x0 and the same noise; with `pece` the model runs again at the corrected x; then the predictor. Towards
    a final sigma of 0 the orders drop to 1 (as ComfyUI's lower_order_to_end): the last lambda steps are long,
    and a polynomial extrapolated over them is unstable."""
    sigmas, index, eta = ctx.sigmas, ctx.index, ctx.eta
    last = sigmas[index + 1] == 0.0
    left = len(sigmas) - 1 - index if sigmas[-1] == 0.0 else len(sigmas)  # steps from this one to the end
    x0 = model(x, ctx.sigma)
    x0s = [*history.get("x0", []), x0][-SA_CORRECTOR_ORDER:]
    if index > 0 and (pece or not last):
        x = _sa_step(history["x"][0], x0s, sigmas, index - 1, min(SA_CORRECTOR_ORDER, len(x0s), left), eta,
                     lambda: ctx.noise(index - 1, 0), ctx.s_noise, corrector=True)
        if pece:
            x0 = x0s[-1] = model(x, ctx.sigma)
    if last:
        return x0, x0, {"x0": x0s, "x": [x]}
    predicted = _sa_step(x, x0s, sigmas, index, min(SA_PREDICTOR_ORDER, len(x0s), left - 1), eta,
                         lambda: ctx.draw(0), ctx.s_noise, corrector=False)
    return predicted, x0, {"x0": x0s, "x": [x]}


def sa_solver(model: Model, x: np.ndarray, ctx: StepContext, history: History) -> StepResult:
    """SA-Solver, predictor-corrector with one model call per step (the corrector reuses the next call)."""
    return _sa_solver(model, x, ctx, history, pece=False)


def sa_solver_pece(model: Model, x: np.ndarray, ctx: StepContext, history: History) -> StepResult:
    """SA-Solver, PECE: the model runs again on every corrected latent (two calls per step after the first)."""
    return _sa_solver(model, x, ctx, history, pece=True)


def res_multistep(model: Model, x: np.ndarray, ctx: StepContext, history: History) -> StepResult:
    """RES 2M (Zhang & Chen's exponential integrator; ComfyUI's res_multistep, made for Cosmos models like Anima):
    as DPM-Solver++(2M), but the linear interpolation of x0 in lambda is integrated exactly (phi functions). In the
    flow form's lambda, where ComfyUI applies its VE form (t = -log sigma) to flow sigmas: both are second order,
    8e-3 apart at 50 steps, 0.16 at 10 (on a latent of scale 3), as for dpmpp_2m."""
    sigma, sigma_next = ctx.sigma, ctx.sigma_next
    x0 = model(x, sigma)
    if sigma_next == 0.0:
        return x0, x0, {"x0": [x0]}
    if not history.get("x0") or ctx.sigmas[ctx.index - 1] >= 1.0:
        return _f32(_first_order(x, x0, sigma, sigma_next, 0.0)), x0, {"x0": [x0]}
    lam = half_log_snr(sigma)
    h = half_log_snr(sigma_next) - lam
    c2 = (half_log_snr(float(ctx.sigmas[ctx.index - 1])) - lam) / h
    phi1 = -math.expm1(-h) / h
    phi2 = (1.0 - phi1) / h
    b1, b2 = phi1 - phi2 / c2, phi2 / c2
    x_next = (sigma_next / sigma) * x + ((1.0 - sigma_next) * h) * (b1 * x0 + b2 * history["x0"][-1])
    return _f32(x_next), x0, {"x0": [x0]}


def lcm(model: Model, x: np.ndarray, ctx: StepContext, history: History) -> StepResult:
    """Latent Consistency sampling (for distilled models): x0, then fresh noise at sigma_next."""
    sigma_next = ctx.sigma_next
    x0 = model(x, ctx.sigma)
    if sigma_next == 0.0:
        return x0, x0, {}
    return _f32((1.0 - sigma_next) * x0 + sigma_next * ctx.draw()), x0, {}


# UniPC (Zhao et al. 2023, arXiv:2302.04867), data prediction, multistep, ComfyUI's uni_pc (B(h) = h, "bh1") and
# uni_pc_bh2 (B(h) = e^h - 1): order 3 as ComfyUI's, lower towards the end (lower_order_final) and in the first
# steps (warm-up), in the flow form's lambda (diffusers' UniPCMultistepScheduler with flow sigmas).
UNIPC_ORDER = 3


def _unipc_order(sigmas: np.ndarray, index: int) -> int:
    """The order of step `index`'s predictor: warm-up over the first steps, lower order over the last ones."""
    return min(UNIPC_ORDER, len(sigmas) - 1 - index, index + 1)


def _unipc_update(x: np.ndarray, x0s: list[np.ndarray], lams: list[float], sigma: float, sigma_to: float,
                  order: int, bh2: bool, x0_to: np.ndarray | None = None) -> np.ndarray:
    """UniP (`x0_to` None) or UniC (`x0_to`: the model's x0 at sigma_to) from x at `sigma`, with the x0 of the last
    steps (`x0s`, the newest at `sigma` last) at the log-SNRs `lams` (the same order): diffusers'
    multistep_uni_p_bh_update / multistep_uni_c_bh_update with predict_x0, in the flow form's alpha = 1 - sigma."""
    m0, lam_s0 = x0s[-1], lams[-1]
    if sigma_to == 0.0:  # h infinite: the update is x0 itself (the order is 1 there)
        return m0
    h = half_log_snr(sigma_to) - lam_s0
    hh = -h
    h_phi_1 = math.expm1(hh)
    b_h = math.expm1(hh) if bh2 else hh
    rks = [(lams[-1 - i] - lam_s0) / h for i in range(1, order)] + [1.0]
    d1s = [(x0s[-1 - i] - m0) / rks[i - 1] for i in range(1, order)]
    rows, b, h_phi_k, factorial = [], [], h_phi_1 / hh - 1.0, 1.0
    for i in range(1, order + 1):
        rows.append([rk ** (i - 1) for rk in rks])
        b.append(h_phi_k * factorial / b_h)
        factorial *= i + 1
        h_phi_k = h_phi_k / hh - 1.0 / factorial
    alpha_to = 1.0 - sigma_to
    x_next = (sigma_to / sigma) * x - (alpha_to * h_phi_1) * m0
    if x0_to is None:
        if order == 1:
            return x_next
        rhos = [0.5] if order == 2 else np.linalg.solve(np.array(rows)[:-1, :-1], np.array(b)[:-1]).tolist()
        correction = sum(rho * d1 for rho, d1 in zip(rhos, d1s))
    else:
        rhos = [0.5] if order == 1 else np.linalg.solve(np.array(rows), np.array(b)).tolist()
        correction = sum(rho * d1 for rho, d1 in zip(rhos[:-1], d1s)) + rhos[-1] * (x0_to - m0)
    return x_next - (alpha_to * b_h) * correction


def _uni_pc(model: Model, x: np.ndarray, ctx: StepContext, history: History, bh2: bool) -> StepResult:
    """One UniPC step: the model at x (the last step's prediction); UniC corrects x with that x0 (no extra call);
    UniP predicts the next latent from the corrected one. sigma = 1 counts as FIRST_SIGMA_FOR_SNR, where the
    log-SNR is infinite."""
    sigmas, index = ctx.sigmas, ctx.index
    at = [min(float(s), FIRST_SIGMA_FOR_SNR) for s in sigmas]
    lams = [half_log_snr(s) for s in at]
    x0 = model(x, ctx.sigma)
    earlier = history.get("x0", [])
    if earlier:  # corrects the last step's prediction, at the order that step predicted with
        order = _unipc_order(sigmas, index - 1)
        x = _f32(_unipc_update(history["x"][0], earlier[-order:], lams[index - order: index], at[index - 1],
                               at[index], order, bh2, x0_to=x0))
    x0s = [*earlier, x0][-UNIPC_ORDER:]
    order = _unipc_order(sigmas, index)
    x_next = _unipc_update(x, x0s[-order:], lams[index - order + 1: index + 1], at[index], float(sigmas[index + 1]),
                           order, bh2)
    return _f32(x_next), x0, {"x0": x0s, "x": [x]}


def uni_pc(model: Model, x: np.ndarray, ctx: StepContext, history: History) -> StepResult:
    """UniPC with B(h) = h (ComfyUI's uni_pc, A1111's UniPC default variant bh1): one model call a step."""
    return _uni_pc(model, x, ctx, history, bh2=False)


def uni_pc_bh2(model: Model, x: np.ndarray, ctx: StepContext, history: History) -> StepResult:
    """UniPC with B(h) = e^h - 1 (ComfyUI's uni_pc_bh2, diffusers' default)."""
    return _uni_pc(model, x, ctx, history, bh2=True)


# CFG++ UD10 AB (ComfyUI's cfgpp_ud10_ab, made for base Anima, recommended at CFG 2): CFG++ Euler (Chung et al.
# 2024, arXiv:2406.08070: the step lands on the guided x0 but renoises with the unconditional prediction's noise),
# its unconditional noise extrapolated a tenth of a step from the last one, the step blended a quarter towards a
# two-step Adams-Bashforth step, and the last step to sigma 0 replaced by the guided x0 extrapolated linearly in
# sigma. One model call (a guided one: conditional and unconditional) a step.
CFGPP_HISTORY_WEIGHT, CFGPP_UNCOND_HISTORY_WEIGHT = 0.25, 0.1


def _adams_bashforth_2(sigmas: np.ndarray, index: int) -> tuple[float, float]:
    """The weights of the slopes at sigmas[index] and sigmas[index - 1] in the two-step Adams-Bashforth step to
    sigmas[index + 1]: the integral of their Lagrange basis polynomials over the step (k-diffusion's
    linear_multistep_coeff of order 2, in closed form)."""
    s_prev, s, s_next = (float(sigmas[index + k]) for k in (-1, 0, 1))
    return (((s_next - s_prev) ** 2 - (s - s_prev) ** 2) / (2.0 * (s - s_prev)),
            (s_next - s) ** 2 / (2.0 * (s_prev - s)))


def cfgpp_ud10_ab(model: GuidedModel, x: np.ndarray, ctx: StepContext, history: History) -> StepResult:
    """One step of CFG++ UD10 AB over a model that returns the guided and the unconditional x0 of one call. In the
    flow form alpha = 1 - sigma, so the unconditional noise is (x - alpha u) / sigma and the CFG++ Euler step lands
    on alpha_next x0 + sigma_next noise."""
    sigmas, index, sigma, sigma_next = ctx.sigmas, ctx.index, ctx.sigma, ctx.sigma_next
    x0, uncond = model(x, sigma)
    uncond_noise = (x - (1.0 - sigma) * uncond) / sigma
    noise, first = uncond_noise, not history.get("x0")
    if not first:
        ratio = (sigma_next - sigma) / (sigma - float(sigmas[index - 1]))
        noise = noise + (CFGPP_UNCOND_HISTORY_WEIGHT * ratio) * (uncond_noise - history["noise"][0])
    euler_step = (1.0 - sigma_next) * x0 + sigma_next * noise - x
    slope = euler_step / (sigma_next - sigma)
    step = euler_step
    if not first:
        now, before = _adams_bashforth_2(sigmas, index)
        step = euler_step + CFGPP_HISTORY_WEIGHT * (now * slope + before * history["slope"][0] - euler_step)
    x_next = x + step
    if sigma_next == 0.0 and not first:  # x0 extrapolated to sigma 0 along the last two steps' line
        x_next = x0 - sigma * (x0 - history["x0"][0]) / (sigma - float(sigmas[index - 1]))
    new_history = {"x0": [_f32(x0)], "noise": [_f32(uncond_noise)], "slope": [_f32(slope)]}
    return _f32(x_next), x0, new_history


# ---- the registry -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Sampler:
    name: str  # ComfyUI's name
    label: str  # A1111's display name (for the ones A1111 lacks: Forge's, or ComfyUI's title-cased)
    step: StepFunction
    calls: Callable[[np.ndarray, int], list[float]]  # the sigma of each model call of step `index`
    takes_eta: bool = False  # eta: how much of each step is stochastic (default 1)
    takes_s_noise: bool = False  # s_noise: a scale on the noise added back (default 1)
    aliases: tuple[str, ...] = ()  # other A1111 / k-diffusion spellings
    draws_noise: bool = False  # adds fresh noise to the latent on its steps (ancestral, SDE, LCM)
    guided: bool = False  # its model returns (guided x0, unconditional x0): a GuidedModel (CFG++)

    def adds_noise(self, eta: float, s_noise: float) -> bool:
        """Whether a run with these settings adds fresh noise (eta 0 or s_noise 0 turns it off where taken)."""
        return self.draws_noise and (s_noise > 0 or not self.takes_s_noise) and (eta > 0 or not self.takes_eta)


def _one_call(sigmas: np.ndarray, index: int) -> list[float]:
    return [float(sigmas[index])]


def _heun_calls(sigmas: np.ndarray, index: int) -> list[float]:
    return [float(s) for s in (sigmas[index], sigmas[index + 1])] if sigmas[index + 1] > 0 else _one_call(sigmas, index)


def _dpmpp_sde_calls(sigmas: np.ndarray, index: int) -> list[float]:
    if sigmas[index + 1] == 0:
        return _one_call(sigmas, index)
    lam = half_log_snr(min(float(sigmas[index]), FIRST_SIGMA_FOR_SNR))
    return [float(sigmas[index]), sigma_of_half_log_snr(lam + 0.5 * (half_log_snr(float(sigmas[index + 1])) - lam))]


def _pece_calls(sigmas: np.ndarray, index: int) -> list[float]:
    return _one_call(sigmas, index) * (1 if index == 0 else 2)


SAMPLERS: dict[str, Sampler] = {s.name: s for s in (
    # Deterministic DDIM (eta 0) is Euler's update for a flow model (tests/sampling/test_new_samplers.py shows it),
    # so its names run euler; sd.cpp's ddim_trailing is DDIM on a trailing schedule, the sampler the same.
    Sampler("euler", "Euler", euler, _one_call,
            aliases=("k_euler", "Euler (flow)", "euler_flow", "DDIM", "ddim_trailing")),
    Sampler("euler_ancestral", "Euler a", euler_ancestral, _one_call, takes_eta=True, takes_s_noise=True,
            aliases=("k_euler_a", "euler_a", "Euler Ancestral"), draws_noise=True),
    Sampler("heun", "Heun", heun, _heun_calls, aliases=("k_heun",)),
    Sampler("dpmpp_2m", "DPM++ 2M", dpmpp_2m, _one_call, aliases=("k_dpmpp_2m", "dpm++2m")),
    Sampler("dpmpp_2m_sde", "DPM++ 2M SDE", dpmpp_2m_sde, _one_call, takes_eta=True, takes_s_noise=True,
            aliases=("k_dpmpp_2m_sde", "dpm++2m_sde", "dpm++2m_sde_bt"), draws_noise=True),
    Sampler("dpmpp_sde", "DPM++ SDE", dpmpp_sde, _dpmpp_sde_calls, takes_eta=True, takes_s_noise=True,
            aliases=("k_dpmpp_sde",), draws_noise=True),
    Sampler("er_sde", "ER SDE", er_sde, _one_call, takes_s_noise=True, aliases=("ER-SDE",), draws_noise=True),
    Sampler("sa_solver", "SA-Solver", sa_solver, _one_call, takes_eta=True, takes_s_noise=True, aliases=("SA Solver",),
            draws_noise=True),
    Sampler("sa_solver_pece", "SA-Solver PECE", sa_solver_pece, _pece_calls, takes_eta=True, takes_s_noise=True,
            aliases=("SA Solver PECE",), draws_noise=True),
    Sampler("res_multistep", "Res Multistep", res_multistep, _one_call, aliases=("RES Multistep",)),
    Sampler("lcm", "LCM", lcm, _one_call, aliases=("k_lcm",), draws_noise=True),
    Sampler("uni_pc", "UniPC", uni_pc, _one_call, aliases=("uni_pc_bh1", "UniPC bh1")),
    Sampler("uni_pc_bh2", "UniPC BH2", uni_pc_bh2, _one_call),
    Sampler("cfgpp_ud10_ab", "CFG++ UD10 AB", cfgpp_ud10_ab, _one_call, guided=True),
)}
# Samplers other tools name that have none here, with the reason (A1111's, and stable-diffusion.cpp's).
REFUSED_SAMPLERS = {
    "plms": "PLMS steps a discrete DDPM model's noise prediction on its 1000-timestep grid with a 4-step warm-up; a "
            "flow model has no such grid: use uni_pc (a multistep method of order 3, one model call a step)",
    "lms": "LMS is not implemented here: use uni_pc or dpmpp_2m (multistep methods, one model call a step)",
    "dpm2": "DPM2 is not implemented here: use heun (second order, two model calls a step)",
    "dpm++2s_a": "DPM++ 2S a is not implemented here: use dpmpp_sde (two model calls a step) or euler_ancestral",
    "dpm++2mv2": "DPM++ 2M v2 is not implemented here: use dpmpp_2m",
    "ipndm": "iPNDM is not implemented here: use uni_pc (multistep, one model call a step)",
    "ipndm_v": "iPNDM_v is not implemented here: use uni_pc (multistep, one model call a step)",
    "tcd": "TCD is for TCD-distilled models: use lcm for a distilled model, euler otherwise",
    "res_2s": "RES 2S is not implemented here: use res_multistep",
    "euler_cfg_pp": "Euler CFG++ is not implemented here: use cfgpp_ud10_ab (CFG++ Euler with a history blend, at "
                    "--cfg 2) or euler at a low --cfg",
    "euler_a_cfg_pp": "Euler a CFG++ is not implemented here: use euler_ancestral at a low --cfg",
    "euler_ge": "Euler GE is not implemented here: use euler",
}
SAMPLER_NAMES = tuple(SAMPLERS)
_BY_CASEFOLDED = {text.casefold(): s.name for s in SAMPLERS.values() for text in (s.name, s.label, *s.aliases)}


def sampler_name(text: object) -> str:
    """Ours for `text`: our name, A1111's display name or an alias, any case. Unknown names are refused, with
    the list, never replaced."""
    name = _BY_CASEFOLDED.get(text.casefold()) if isinstance(text, str) else None
    if name is None and isinstance(text, str) and text.casefold() in REFUSED_SAMPLERS:
        raise AnimaError(f"sampler {shown(text)}: {REFUSED_SAMPLERS[text.casefold()]}")
    if name is None:
        known = ", ".join(f"{s.name} ({s.label})" for s in SAMPLERS.values())
        raise AnimaError(f"unknown sampler {shown(text)}; choose one of {known}")
    return name


# Every spelling of a schedule that may end an old A1111 sampler name ("DPM++ 2M Karras"), longest first.
_SCHEDULE_SUFFIXES = sorted({*SCHEDULES, *SCHEDULE_LABELS.values(), *A1111_SCHEDULES}, key=len, reverse=True)


def sampler_and_scheduler(sampler: object, scheduler: object) -> tuple[str, object]:
    """A sampler and a schedule as ours (the schedule as given where it names one): A1111's display names and ours
    are taken, and A1111's older names with a schedule after the sampler ("DPM++ 2M Karras", "DPM++ 2M SDE
    Exponential") mean that sampler and schedule, unless `scheduler` names one itself (None and "automatic",
    webuiapi's default, name none). The API server and the command line both read sampler names through this."""
    try:
        return sampler_name(sampler), scheduler
    except AnimaError:
        if isinstance(sampler, str):
            for suffix in _SCHEDULE_SUFFIXES:
                if sampler.casefold().endswith(" " + suffix.casefold()):
                    try:
                        ours = sampler_name(sampler[: -len(suffix) - 1])
                    except AnimaError:
                        break
                    named = scheduler is not None and not (isinstance(scheduler, str) and
                                                           scheduler.casefold() == "automatic")
                    return ours, scheduler if named else schedule_name(suffix)
        raise


def call_sigmas(sampler: Sampler, sigmas: np.ndarray, start: int = 0) -> list[float]:
    """The sigma of every model call a run of `sampler` over `sigmas` makes from step `start` on: what a step
    cache plans over, and what the engine prepares."""
    return [sigma for index in range(start, len(sigmas) - 1) for sigma in sampler.calls(sigmas, index)]


def history_layout(sampler: Sampler, sigmas: np.ndarray, steps: int) -> dict[str, int]:
    """How many arrays under each key `sampler`'s history holds after `steps` steps of `sigmas`: what a resume
    state's must hold. Found by running the steps on a one-number latent with a zero model and zero noise."""
    sigmas = np.asarray(sigmas, dtype=np.float64)
    x, history = np.zeros(1, np.float32), {}

    def zero(latent: np.ndarray, sigma: float) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        return (np.zeros_like(latent),) * 2 if sampler.guided else np.zeros_like(latent)

    for index in range(steps):
        ctx = StepContext(sigmas, index, lambda step, draw: np.zeros(1, np.float32), 0.0, 0.0)
        x, _, history = sampler.step(zero, x, ctx, history)
    return {key: len(arrays) for key, arrays in history.items()}
