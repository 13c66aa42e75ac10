"""Our samplers against independent implementations, on the exact Gaussian-mixture denoiser, same sigmas, same noise.

References and what they check (the agreement is max |ours - theirs| / max |theirs| over a 16 x 8 latent; ours
runs in float32, the references in float64 or in their own float32):

- k-diffusion 0.1.1 (its real sampling module, tests/sampling/kdiffusion.py), float64:
  - sample_euler, sample_heun on our flow sigmas as they are (the probability-flow ODE dx/dsigma = (x - x0) / sigma
    is the same in the flow and in k-diffusion's VE form): 7 schedules x steps 1..50 x shift 1 and 3; worst seen
    7.7e-6 (heun, 2 steps to sigma_min 0.001, where float32 rounding of x - x0 is divided by that sigma), typically
    1e-7..2e-6.
  - sample_dpmpp_2m, sample_dpmpp_2m_sde (eta 0, 0.5, 1), sample_dpmpp_sde (eta 0, 0.5, 1, 1.5) through the exact change
    of variables flow -> VE: x_ve = x / (1 - sigma), sigma_ve = sigma / (1 - sigma), under which the data-prediction
    exponential integrators are the same algebra (lambda = -log sigma_ve). sigma = 1 is sigma_ve = inf there, so
    k-diffusion starts from our latent after our first step (both take that step's h_last as infinite: the second
    step is first order on both sides). Noise: k-diffusion's noise_sampler hands it ours, draw for draw (dpmpp_sde's
    two stages: two increments of one Brownian path, see OurNoise). Worst seen 3.4e-6.
- diffusers 0.42.1 schedulers, their sigmas replaced by ours:
  - DPMSolverMultistepScheduler (solver_order 2, flow_prediction, use_flow_sigmas, final_sigmas_type "zero",
    lower_order_final), algorithm_type "dpmsolver++" = our dpmpp_2m and "sde-dpmsolver++" = our dpmpp_2m_sde at
    eta 1 (its variance_noise = our draw), every step's latent from step 1 on: diffusers takes sigma = 1 as
    lambda = -inf (r0 infinite, so its second step's D1 is 0) exactly as ours, and its last step (lower_order_final,
    to sigma 0) is x0 as ours. Worst seen 1.9e-6.
  - FlowMatchEulerDiscreteScheduler: euler; with stochastic_sampling it is lcm (x0, then fresh noise at
    sigma_next; its randn_tensor replaced by our draws). Worst seen 3.1e-7 (euler), 6e-7 (lcm).
  - FlowMatchHeunDiscreteScheduler (its interleaved sigmas built from ours): heun. Worst seen 7e-8.
  - LTXEulerAncestralRFScheduler (ComfyUI's sample_euler_ancestral_RF): euler_ancestral at eta 1 and 0.5,
    s_noise 1 and 0.7, our draws. Worst seen 3.4e-6.
  - SASolverScheduler (predictor order 3, corrector order 4, data prediction, flow sigmas): one step of our
    sa_solver and sa_solver_pece from our own state at an interior step (their warm-up, their order-2
    modification, their lower_order_final and their non-zero final flow sigma differ from ComfyUI's, which ours
    follows, so whole runs are not comparable): the corrector of the last step, the (PECE: re-evaluated) model,
    the predictor, at the full orders (towards a final 0 ours drop their orders as ComfyUI does, through order 2,
    where diffusers alters its coefficients), with tau 0 and tau 1 in the [0.2, 0.8] band, the same noise. Worst
    seen 2.4e-7.
UniPC (diffusers' UniPCMultistepScheduler) and DDIM (DDIMScheduler): tests/sampling/test_new_samplers.py. No flow DEIS
counterpart: we have no such sampler.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from diffusers import (
    DPMSolverMultistepScheduler,
    FlowMatchEulerDiscreteScheduler,
    FlowMatchHeunDiscreteScheduler,
    LTXEulerAncestralRFScheduler,
    SASolverScheduler,
)
from diffusers.schedulers import scheduling_flow_match_euler_discrete as flow_match_euler_module
from diffusers.schedulers import scheduling_ltx_euler_ancestral_rf as ltx_module
from kdiffusion import load_sampling
from mixture import GaussianMixture

from anima_rknn.sampling.caches import make_cache
from anima_rknn.sampling.sample import sample, step_noise
from anima_rknn.sampling.samplers import SAMPLERS, StepContext, _sa_tau, call_sigmas
from anima_rknn.sampling.schedule import SCHEDULES, flow_sigmas

K = load_sampling()
# diffusers' set_timesteps hands numpy a torch tensor (its __array__ lacks numpy 2's copy keyword): not ours.
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")
TOLERANCE = 1.5e-5  # float32 rounding: the worst case seen is 7.7e-6 (see the docstring)
SEED = 7

_rng = np.random.default_rng(0)
MIXTURE = GaussianMixture(_rng.standard_normal((4, 8)), 0.4, np.array([0.1, 0.2, 0.3, 0.4]))
X = _rng.standard_normal((16, 8)).astype(np.float32)
NOISE = step_noise(SEED, X.shape)


def denoise(x: np.ndarray, sigma: float) -> np.ndarray:
    return MIXTURE.denoise(x, sigma).astype(np.float32)


def run_ours(name: str, sigmas: np.ndarray, eta: float = 1.0, s_noise: float = 1.0) -> list[np.ndarray]:
    """Our latent after every step."""
    sampler, latents = SAMPLERS[name], []
    sample(sampler, denoise, X, sigmas, make_cache("none", len(call_sigmas(sampler, sigmas))),
           lambda event: latents.append(event.x), seed=SEED, eta=eta, s_noise=s_noise)
    return latents


def disagreement(ours: np.ndarray, theirs: np.ndarray) -> float:
    theirs = np.asarray(theirs, dtype=np.float64)
    return float(np.max(np.abs(ours - theirs)) / np.max(np.abs(theirs)))


def worst(ours: list[np.ndarray], theirs: list[np.ndarray]) -> float:
    assert len(ours) == len(theirs)
    return max(disagreement(a, b) for a, b in zip(ours, theirs))


def velocity(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """The flow model's output v = (x - x0) / sigma that diffusers' flow schedulers take."""
    x0 = torch.from_numpy(denoise(x.numpy().astype(np.float32), sigma)).to(x.dtype)
    return (x - x0) / sigma


def our_draws(step_of_call: list[int], state: dict):
    """A stand-in for diffusers' randn_tensor that returns our draw 0 of the step the scheduler is on."""

    def randn_tensor(shape, generator=None, device=None, dtype=None, **kwargs):
        return torch.from_numpy(step_noise(SEED, tuple(shape))(step_of_call[state["call"]], 0)).to(dtype)

    return randn_tensor


# ---- k-diffusion -----------------------------------------------------------------------------------------------

def flow_model(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """k-diffusion's model(x, sigma) on our flow latents, float64."""
    return torch.from_numpy(MIXTURE.denoise(x.numpy(), float(sigma[0])))


def ve_model(x_ve: torch.Tensor, sigma_ve: torch.Tensor) -> torch.Tensor:
    """The same denoiser seen in k-diffusion's VE form: x_ve = x / (1 - sigma), sigma_ve = sigma / (1 - sigma)."""
    sigma = float(sigma_ve[0]) / (1.0 + float(sigma_ve[0]))
    return torch.from_numpy(MIXTURE.denoise(x_ve.numpy() * (1.0 - sigma), sigma))


class OurNoise:
    """k-diffusion's noise_sampler(sigma, sigma_next), answering with our draws in the order our step draws them.

    A step that asks twice (dpmpp_sde: sigma -> sigma_mid, then sigma -> sigma_next) gets two increments of one
    Brownian motion in the flow sigma, as k-diffusion's Brownian tree gives them and as our step combines its two
    draws: the second is rho * draw 0 + sqrt(1 - rho^2) * draw 1, rho = sqrt((sigma - sigma_mid) / (sigma -
    sigma_next)), the sigmas here being k-diffusion's VE ones turned back into flow sigmas."""

    def __init__(self, first_step: int, draws_per_step: int) -> None:
        self.step, self.draw, self.draws = first_step, 0, draws_per_step
        self.first_reach = 0.0

    def __call__(self, sigma, sigma_next) -> torch.Tensor:
        sigma, sigma_next = (float(s) / (1.0 + float(s)) for s in (sigma, sigma_next))
        noise = NOISE(self.step, self.draw).astype(np.float64)
        if self.draw == 0:
            self.first_reach = sigma - sigma_next
        else:
            rho = math.sqrt(self.first_reach / (sigma - sigma_next))
            noise = rho * NOISE(self.step, 0).astype(np.float64) + math.sqrt(1.0 - rho**2) * noise
        self.draw += 1
        if self.draw == self.draws:
            self.step, self.draw = self.step + 1, 0
        return torch.from_numpy(noise)


@pytest.mark.parametrize("shift", [1.0, 3.0])
@pytest.mark.parametrize("steps", [1, 2, 7, 30])
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("name", ["euler", "heun"])
def test_euler_and_heun_match_k_diffusion(name, schedule, steps, shift):
    sigmas = flow_sigmas(steps, shift, schedule)
    reference = {"euler": K.sample_euler, "heun": K.sample_heun}[name]
    theirs = reference(flow_model, torch.from_numpy(X.astype(np.float64)), torch.from_numpy(sigmas), disable=True)
    assert disagreement(run_ours(name, sigmas)[-1], theirs.numpy()) < TOLERANCE


def _dpmpp_against_k_diffusion(name: str, sigmas: np.ndarray, eta: float) -> float:
    reference, draws = {"dpmpp_2m": (K.sample_dpmpp_2m, 0), "dpmpp_2m_sde": (K.sample_dpmpp_2m_sde, 1),
                        "dpmpp_sde": (K.sample_dpmpp_sde, 2)}[name]
    ours = run_ours(name, sigmas, eta=eta)
    # From our latent after step 1 (sigma = 1 is sigma_ve = inf), in k-diffusion's VE variables.
    x_ve = torch.from_numpy(ours[0].astype(np.float64) / (1.0 - sigmas[1]))
    sigmas_ve = torch.from_numpy(np.append(sigmas[1:-1] / (1.0 - sigmas[1:-1]), 0.0))
    options = {"noise_sampler": OurNoise(1, draws), "eta": eta} if draws else {}
    theirs = reference(ve_model, x_ve, sigmas_ve, disable=True, **options)
    return disagreement(ours[-1], theirs.numpy())


DPMPP_CASES = [("dpmpp_2m", 1.0), ("dpmpp_2m_sde", 0.0), ("dpmpp_2m_sde", 0.5), ("dpmpp_2m_sde", 1.0),
               ("dpmpp_sde", 0.0), ("dpmpp_sde", 1.0)]


@pytest.mark.parametrize("shift", [1.0, 3.0])
@pytest.mark.parametrize("steps", [3, 4, 10, 40])  # k-diffusion 0.1.1's 2m_sde fails on a lone step to 0 (h unset)
@pytest.mark.parametrize("schedule", ["simple", "karras", "beta", "linear_quadratic"])
@pytest.mark.parametrize(("name", "eta"), DPMPP_CASES)
def test_dpmpp_match_k_diffusion_in_ve_variables(name, eta, schedule, steps, shift):
    assert _dpmpp_against_k_diffusion(name, flow_sigmas(steps, shift, schedule), eta) < TOLERANCE


@pytest.mark.parametrize("eta", [0.5, 1.5])
def test_dpmpp_sde_matches_k_diffusion_at_any_eta(eta):
    """dpmpp_sde's stages are k-diffusion's ancestral steps (sigma_down, sigma_up = min(sigma_t, eta sigma_t
    sqrt(1 - e^-2h)) in sigma_ve = e^-lambda) at every eta, not only where they coincide with the SDE-DPM-Solver++
    form (eta 0 and 1; the two were 0.6..0.9 of the latent's scale apart at eta 0.5 and 1.5)."""
    for steps in (5, 20):
        assert _dpmpp_against_k_diffusion("dpmpp_sde", flow_sigmas(steps, 3.0), eta) < TOLERANCE


# ---- diffusers ---------------------------------------------------------------------------------------------------

def _dpm_solver(sigmas: np.ndarray, algorithm: str) -> list[np.ndarray]:
    steps = len(sigmas) - 1
    scheduler = DPMSolverMultistepScheduler(solver_order=2, algorithm_type=algorithm, prediction_type="flow_prediction",
                                            use_flow_sigmas=True, flow_shift=1.0, final_sigmas_type="zero",
                                            lower_order_final=True)
    scheduler.set_timesteps(steps)
    scheduler.sigmas = torch.from_numpy(sigmas.copy())
    scheduler.timesteps = torch.from_numpy(sigmas[:-1] * 1000)
    scheduler.set_begin_index(0)
    x, latents = torch.from_numpy(X.copy()), []
    for index in range(steps):
        noise = torch.from_numpy(NOISE(index, 0))
        x = scheduler.step(velocity(x, float(sigmas[index])), scheduler.timesteps[index], x,
                           variance_noise=noise).prev_sample
        latents.append(x.numpy())
    return latents


@pytest.mark.parametrize("shift", [1.0, 3.0])
@pytest.mark.parametrize("steps", [1, 2, 3, 10, 40])
@pytest.mark.parametrize("schedule", ["simple", "normal", "karras", "beta"])
@pytest.mark.parametrize(("name", "algorithm"), [("dpmpp_2m", "dpmsolver++"), ("dpmpp_2m_sde", "sde-dpmsolver++")])
def test_dpmpp_2m_matches_diffusers_dpm_solver_step_by_step(name, algorithm, schedule, steps, shift):
    sigmas = flow_sigmas(steps, shift, schedule)
    assert worst(run_ours(name, sigmas, eta=1.0), _dpm_solver(sigmas, algorithm)) < TOLERANCE


def _drive(scheduler, sigmas_of_call: list[float], monkeypatch=None, module=None, step_of_call=None):
    """diffusers' sampling loop: the model at the scheduler's sigma of each call, its latent after each call."""
    x, latents, state = torch.from_numpy(X.copy()), [], {"call": 0}
    if module is not None:
        monkeypatch.setattr(module, "randn_tensor", our_draws(step_of_call, state))
    scheduler.set_begin_index(0)
    for call, sigma in enumerate(sigmas_of_call):
        state["call"] = call
        x = scheduler.step(velocity(x, sigma), scheduler.timesteps[call], x).prev_sample
        latents.append(x.numpy())
    return latents


CASES = [(schedule, steps, shift) for schedule in ("simple", "karras", "beta") for steps in (1, 2, 5, 20)
         for shift in (1.0, 3.0)]


@pytest.mark.parametrize(("schedule", "steps", "shift"), CASES)
def test_euler_matches_diffusers_flow_match_euler(schedule, steps, shift):
    sigmas = flow_sigmas(steps, shift, schedule)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=1.0)  # our sigmas are shifted already
    scheduler.set_timesteps(sigmas=sigmas[:-1])
    assert worst(run_ours("euler", sigmas), _drive(scheduler, list(sigmas[:-1]))) < TOLERANCE


@pytest.mark.parametrize(("schedule", "steps", "shift"), CASES)
def test_lcm_matches_diffusers_flow_match_euler_stochastic(schedule, steps, shift, monkeypatch):
    sigmas = flow_sigmas(steps, shift, schedule)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=1.0, stochastic_sampling=True)
    scheduler.set_timesteps(sigmas=sigmas[:-1])
    theirs = _drive(scheduler, list(sigmas[:-1]), monkeypatch, flow_match_euler_module, list(range(steps)))
    assert worst(run_ours("lcm", sigmas), theirs) < TOLERANCE


@pytest.mark.parametrize(("schedule", "steps", "shift"), CASES)
def test_heun_matches_diffusers_flow_match_heun(schedule, steps, shift):
    sigmas = flow_sigmas(steps, shift, schedule)
    scheduler = FlowMatchHeunDiscreteScheduler(shift=1.0)
    scheduler.set_timesteps(steps)
    ours_sigmas = torch.from_numpy(sigmas)  # its layout: s0, s1, s1, s2, s2, ..., s_last, s_last, 0
    scheduler.sigmas = torch.cat([ours_sigmas[:1], ours_sigmas[1:-1].repeat_interleave(2), ours_sigmas[-1:]])
    scheduler.timesteps = scheduler.sigmas[:-1] * 1000
    theirs = _drive(scheduler, [float(s) for s in scheduler.sigmas[:-1]])
    # Calls 2k (Euler predictor) and 2k + 1 (corrector) make step k; the last step (to 0) is one Euler call.
    assert worst(run_ours("heun", sigmas), theirs[1::2] + [theirs[-1]]) < TOLERANCE


@pytest.mark.parametrize(("eta", "s_noise"), [(1.0, 1.0), (0.5, 1.0), (1.0, 0.7), (0.5, 0.7)])
@pytest.mark.parametrize(("schedule", "steps", "shift"), CASES)
def test_euler_ancestral_matches_diffusers_rf_ancestral(schedule, steps, shift, eta, s_noise, monkeypatch):
    sigmas = flow_sigmas(steps, shift, schedule)
    scheduler = LTXEulerAncestralRFScheduler(eta=eta, s_noise=s_noise)
    scheduler.set_timesteps(sigmas=torch.from_numpy(sigmas))
    theirs = _drive(scheduler, list(sigmas[:-1]), monkeypatch, ltx_module, list(range(steps)))
    assert worst(run_ours("euler_ancestral", sigmas, eta=eta, s_noise=s_noise), theirs) < TOLERANCE


def _sa_solver_step_disagreement(name: str, sigmas: np.ndarray, index: int, eta: float) -> float:
    """Our step `index` (from our own history) against diffusers' corrector and predictor from the same state, at
    the full orders (corrector 4, predictor 3)."""
    events = []
    sampler = SAMPLERS[name]
    sample(sampler, denoise, X, sigmas, make_cache("none", len(call_sigmas(sampler, sigmas))), events.append,
           seed=SEED, eta=eta)
    history, x = events[index - 1].sampler_state["history"], events[index - 1].x  # x: the predicted latent
    ctx = StepContext(sigmas, index, NOISE, eta, 1.0)
    ours, _, _ = sampler.step(denoise, x, ctx, {key: list(arrays) for key, arrays in history.items()})

    def tensor(array):
        return torch.from_numpy(np.asarray(array, dtype=np.float64))

    scheduler = SASolverScheduler(predictor_order=3, corrector_order=4, prediction_type="flow_prediction",
                                  use_flow_sigmas=True)
    scheduler.set_timesteps(len(sigmas) - 1)
    scheduler.sigmas = torch.from_numpy(sigmas.copy())
    scheduler.model_outputs = [tensor(x0) for x0 in history["x0"][-3:]]
    scheduler._step_index = index
    x0 = tensor(denoise(x, float(sigmas[index])))
    # The corrector redoes the last step (tau of its end, sigma[index]) with the same noise ...
    corrected = scheduler.stochastic_adams_moulton_update(
        this_model_output=x0, last_sample=tensor(history["x"][0]), last_noise=tensor(NOISE(index - 1, 0)),
        this_sample=tensor(x), order=4, tau=_sa_tau(float(sigmas[index]), eta))
    if name == "sa_solver_pece":  # ... PECE runs the model again at the corrected latent ...
        x0 = tensor(denoise(corrected.numpy().astype(np.float32), float(sigmas[index])))
    scheduler.model_outputs = [*scheduler.model_outputs[1:], x0]
    # ... and the predictor takes the next step (tau of its end, sigma[index + 1]) with this step's noise.
    theirs = scheduler.stochastic_adams_bashforth_update(model_output=x0, sample=corrected,
                                                         noise=tensor(NOISE(index, 0)), order=3,
                                                         tau=_sa_tau(float(sigmas[index + 1]), eta))
    return disagreement(ours, theirs.numpy())


@pytest.mark.parametrize("eta", [0.0, 1.0])
@pytest.mark.parametrize(("schedule", "steps", "shift"), [("simple", 10, 3.0), ("simple", 20, 1.0), ("karras", 16, 3.0),
                                                          ("beta", 12, 3.0)])
@pytest.mark.parametrize("name", ["sa_solver", "sa_solver_pece"])
def test_sa_solver_steps_match_diffusers_sa_solver(name, schedule, steps, shift, eta):
    sigmas = flow_sigmas(steps, shift, schedule)
    # From step 4 on (the corrector's four nodes clear sigma = 1, which diffusers takes as lambda = -inf and we, as
    # ComfyUI does, as 1 - 1e-4) to the last step at full orders: after it ours drop towards the final sigma 0
    # (ComfyUI's lower_order_to_end) through order 2, where diffusers alters its coefficients and ComfyUI does not.
    taus = set()
    for index in range(4, steps - 3):
        taus.add(_sa_tau(float(sigmas[index + 1]), eta))
        assert _sa_solver_step_disagreement(name, sigmas, index, eta) < TOLERANCE, index
    assert (1.0 in taus) == (eta == 1.0)  # eta 1 steps in the stochastic band were compared
