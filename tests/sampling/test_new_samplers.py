"""DDIM (a name of euler here), UniPC (uni_pc, uni_pc_bh2) and CFG++ UD10 AB against independent references.

- DDIM, deterministic (eta 0), is Euler's step for a flow model: the flow latent x = (1 - sigma) x0 + sigma eps is
  the VP latent sqrt(abar) x0 + sqrt(1 - abar) eps scaled by s = sqrt((1 - sigma)^2 + sigma^2), with
  sqrt(abar) = (1 - sigma) / s. diffusers' DDIMScheduler (epsilon prediction, its alphas_cumprod set to those abar)
  steps the VP latent; scaled back it is our euler step, to float32 rounding. Both give
  x_t = (sigma_t / sigma_s) x + (1 - sigma_t / sigma_s) x0.
- UniPC: diffusers' UniPCMultistepScheduler (solver_order 3 as ComfyUI's uni_pc, predict_x0, flow_prediction,
  use_flow_sigmas, final_sigmas_type "zero", lower_order_final) with our sigmas, bh1 = uni_pc, bh2 = uni_pc_bh2,
  every step's latent. From sigma = 1 diffusers offsets the first sigma by 1e-6 and ours (as ComfyUI's
  offset_first_sigma_for_snr) by 1e-4: the reference is handed ours. bh1's last step to sigma 0 (first order, by
  lower_order_final) is NaN in diffusers (B(h) = -inf times a zero correction); ours is x0, the limit, as every
  sampler's last step to 0 here.
- CFG++ UD10 AB (ComfyUI's cfgpp_ud10_ab): against a direct transcription of ComfyUI's _sample_cfgpp_history in
  float64 (scipy quadrature for its Adams-Bashforth weights, as k-diffusion's linear_multistep_coeff), on the
  Gaussian-mixture bed at CFG 1, 2 and 4; at CFG 1 it integrates the flow ODE; at CFG 2 it draws the prompt's modes.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from diffusers import DDIMScheduler, UniPCMultistepScheduler
from mixture import GaussianMixture, make_testbed
from scipy import integrate
from test_sampler_convergence import SIGMA_END, SMOOTH, START, exact_flow, fitted_order, ode_errors, uniform_sigmas

from anima_rknn.errors import AnimaError
from anima_rknn.sampling import samplers
from anima_rknn.sampling.caches import make_cache
from anima_rknn.sampling.sample import sample
from anima_rknn.sampling.samplers import FIRST_SIGMA_FOR_SNR, SAMPLERS, StepContext, sampler_name
from anima_rknn.sampling.schedule import flow_sigmas

pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")
_rng = np.random.default_rng(0)
MIXTURE = GaussianMixture(_rng.standard_normal((4, 8)), 0.4, np.array([0.1, 0.2, 0.3, 0.4]))
X = _rng.standard_normal((16, 8)).astype(np.float32)
TOLERANCE = 2e-6  # float32 rounding; the worst seen is 4.2e-7 (UniPC, 30 steps)


def denoise(x: np.ndarray, sigma: float) -> np.ndarray:
    return MIXTURE.denoise(x, sigma).astype(np.float32)


def ours(name: str, sigmas: np.ndarray) -> list[np.ndarray]:
    x, history, latents = X.copy(), {}, []
    for index in range(len(sigmas) - 1):
        x, _, history = SAMPLERS[name].step(denoise, x, StepContext(sigmas, index, None, 1.0, 1.0), history)
        latents.append(x)
    return latents


def worst(mine: list[np.ndarray], theirs: list[np.ndarray]) -> float:
    return max(float(np.abs(a - b).max() / np.abs(b).max()) for a, b in zip(mine, theirs, strict=True))


# ---- DDIM ---------------------------------------------------------------------------------------------------------

def _vp(sigma: float) -> tuple[float, float]:
    """The flow latent's scale s and the VP schedule's abar at sigma."""
    scale = math.hypot(1.0 - sigma, sigma)
    return scale, ((1.0 - sigma) / scale) ** 2


def diffusers_ddim_step(x: np.ndarray, x0: np.ndarray, sigma: float, sigma_next: float) -> np.ndarray:
    """One step of diffusers' DDIMScheduler (eta 0) on the VP form of the flow latent, back in flow form."""
    scheduler = DDIMScheduler(num_train_timesteps=1000, set_alpha_to_one=True, clip_sample=False,
                              prediction_type="epsilon")
    scheduler.set_timesteps(10)  # steps 100 timesteps apart: timestep 900 -> 800, or 50 -> the final abar 1
    (scale, abar), timestep = _vp(sigma), 900 if sigma_next > 0 else 50
    alphas = scheduler.alphas_cumprod.to(torch.float64).clone()
    alphas[timestep] = abar
    if sigma_next > 0:
        alphas[timestep - 100] = _vp(sigma_next)[1]
    scheduler.alphas_cumprod = alphas
    x_vp = torch.tensor(x, dtype=torch.float64) / scale
    eps = (x_vp - math.sqrt(abar) * torch.tensor(x0, dtype=torch.float64)) / math.sqrt(1.0 - abar)
    out = scheduler.step(eps, timestep, x_vp, eta=0.0).prev_sample
    return out.numpy() * (_vp(sigma_next)[0] if sigma_next > 0 else 1.0)


@pytest.mark.parametrize("sigma, sigma_next", [(0.999, 0.9), (0.9, 0.5), (0.5, 0.49), (0.3, 0.01), (0.2, 0.0)])
def test_ddim_is_the_euler_step_of_a_flow_model(sigma, sigma_next):
    x0 = denoise(X, sigma)
    ctx = StepContext(np.array([sigma, sigma_next]), 0, None, 0.0, 1.0)
    step, _, _ = SAMPLERS["euler"].step(lambda latent, s: x0, X, ctx, {})
    reference = diffusers_ddim_step(X, x0, sigma, sigma_next)
    closed = (sigma_next / sigma) * X + (1.0 - sigma_next / sigma) * x0
    assert np.abs(step - reference).max() <= TOLERANCE * np.abs(reference).max()
    assert np.abs(step - closed).max() <= TOLERANCE * np.abs(closed).max()


@pytest.mark.parametrize("text", ["DDIM", "ddim", "ddim_trailing"])
def test_the_ddim_names_run_euler(text):
    assert sampler_name(text) == "euler"


def test_plms_is_refused_with_the_reason():
    with pytest.raises(AnimaError, match="PLMS steps a discrete DDPM model's noise prediction .* use uni_pc"):
        sampler_name("PLMS")


# ---- UniPC --------------------------------------------------------------------------------------------------------

def diffusers_unipc(variant: str, sigmas: np.ndarray) -> list[np.ndarray]:
    scheduler = UniPCMultistepScheduler(solver_order=3, prediction_type="flow_prediction", use_flow_sigmas=True,
                                        flow_shift=1.0, solver_type=variant, lower_order_final=True,
                                        final_sigmas_type="zero")
    scheduler.set_timesteps(sigmas=np.array(sigmas[:-1]))
    # ours, sigma = 1 offset as ours (the model is still called at the run's own sigma)
    scheduler.sigmas = torch.tensor([min(float(s), FIRST_SIGMA_FOR_SNR) for s in sigmas], dtype=torch.float64)
    x, latents = torch.tensor(X, dtype=torch.float64), []
    for index, timestep in enumerate(scheduler.timesteps):
        # The x0 at the run's sigma, as a velocity that diffusers turns back into that x0 at its (offset) sigma.
        x0 = torch.tensor(MIXTURE.denoise(x.numpy(), float(sigmas[index])))
        velocity = (x - x0) / scheduler.sigmas[index]
        x = scheduler.step(velocity, timestep, x).prev_sample
        latents.append(x.numpy())
    return latents


@pytest.mark.parametrize("name, variant", [("uni_pc", "bh1"), ("uni_pc_bh2", "bh2")])
@pytest.mark.parametrize("schedule", ["simple", "karras", "beta"])
@pytest.mark.parametrize("steps", [2, 3, 5, 12, 30])
@pytest.mark.parametrize("from_noise", [True, False])
def test_uni_pc_matches_diffusers_unipc_step_by_step(name, variant, schedule, steps, from_noise):
    sigmas = flow_sigmas(steps + (0 if from_noise else 1), 3.0, schedule)[0 if from_noise else 1:]
    mine, theirs = ours(name, sigmas), diffusers_unipc(variant, sigmas)
    if variant == "bh1":  # its last step is NaN in diffusers; ours is the x0 of the model's last call
        assert np.isnan(theirs[-1]).all()
        mine, theirs = mine[:-1], theirs[:-1]
    assert worst(mine, theirs) <= TOLERANCE


def test_uni_pc_bh1_single_step_to_zero_is_x0():
    sigmas = np.array([0.8, 0.0])
    assert np.array_equal(ours("uni_pc", sigmas)[0], denoise(X, 0.8))


@pytest.mark.parametrize("name", ["uni_pc", "uni_pc_bh2"])
def test_uni_pc_converges_at_order_3_inside_its_lower_order_ends(name, monkeypatch):
    """UniPC-3's steps are third order; the shipped sampler, as ComfyUI's and diffusers' (lower_order_final), drops to
    orders 2 and 1 over the last two steps, which caps the order this bed measures at 1-2 (docs/samplers-new.md):
    without that drop, from the exact state at sigma 0.9, the fit sees 3.2-3.6."""
    monkeypatch.setattr(samplers, "_unipc_order", lambda sigmas, index: min(samplers.UNIPC_ORDER, index + 1))
    steps = [32, 64, 128, 256]
    for shift in (1.0, 3.0):
        assert 2.7 <= fitted_order(steps, ode_errors(name, shift, 0.9, steps)) <= 4.0


# ---- CFG++ UD10 AB --------------------------------------------------------------------------------------------------

COND, UNCOND = make_testbed(dim=8, components=8, std=0.35, seed=2)
NOISE = np.random.default_rng(4).standard_normal((64, 8)).astype(np.float32)


def guided(scale: float):
    def model(x: np.ndarray, sigma: float) -> tuple[np.ndarray, np.ndarray]:
        uncond = UNCOND.denoise(x, sigma)
        return (uncond + scale * (COND.denoise(x, sigma) - uncond)).astype(np.float32), uncond.astype(np.float32)

    return model


def run_cfgpp(model, x: np.ndarray, sigmas: np.ndarray) -> np.ndarray:
    history: dict = {}
    for index in range(len(sigmas) - 1):
        x, _, history = samplers.cfgpp_ud10_ab(model, x, StepContext(sigmas, index, None, 0.0, 1.0), history)
    return x


def transcription(model, x: np.ndarray, sigmas: np.ndarray) -> np.ndarray:
    """ComfyUI's _sample_cfgpp_history with cfgpp_ud10_ab's weights (history 0.25, zero 1.0 at order 1, unconditional
    history 0.1), line by line in float64, its Adams-Bashforth weights by quadrature as k-diffusion's
    linear_multistep_coeff takes them, alpha = sigma e^lambda of a flow model (ComfyUI's CONST)."""
    def alpha(sigma):
        return sigma * math.exp(math.log((1 - sigma) / sigma)) if 0 < sigma < 1 else (1.0 if sigma == 0 else 0.0)

    def coeff(i, j):
        def fn(tau):
            k = 1 - j
            return (tau - sigmas[i - k]) / (sigmas[i - j] - sigmas[i - k])
        return integrate.quad(fn, sigmas[i], sigmas[i + 1], epsrel=1e-4)[0]

    x = np.asarray(x, np.float64)
    derivatives, denoised_history, old_uncond_d = [], [], None
    for i in range(len(sigmas) - 1):
        denoised, uncond = (np.asarray(a, np.float64) for a in model(x, sigmas[i]))
        current_uncond_d = (x - alpha(sigmas[i]) * uncond) / sigmas[i]
        uncond_d = current_uncond_d
        dt = sigmas[i + 1] - sigmas[i]
        if i > 0:
            uncond_d = uncond_d + 0.1 * dt / (sigmas[i] - sigmas[i - 1]) * (current_uncond_d - old_uncond_d)
        euler_step = alpha(sigmas[i + 1]) * denoised + sigmas[i + 1] * uncond_d - x
        derivatives = [*derivatives, euler_step / dt][-2:]
        step = euler_step
        if len(derivatives) > 1:
            history_step = sum(coeff(i, j) * d for j, d in enumerate(reversed(derivatives)))
            step = euler_step + 0.25 * (history_step - euler_step)
        x = x + step
        if sigmas[i + 1] == 0 and denoised_history:
            x = denoised - sigmas[i] * (denoised - denoised_history[-1]) / (sigmas[i] - sigmas[i - 1])
        denoised_history = [*denoised_history, denoised][-2:]
        old_uncond_d = current_uncond_d
    return x


@pytest.mark.parametrize("scale", [1.0, 2.0, 4.0])
@pytest.mark.parametrize("schedule, steps", [("simple", 1), ("simple", 2), ("simple", 20), ("karras", 12),
                                             ("beta", 30)])
def test_cfgpp_ud10_ab_matches_a_direct_transcription_of_comfyui(scale, schedule, steps):
    sigmas = flow_sigmas(steps, 3.0, schedule)
    ours_x, theirs = run_cfgpp(guided(scale), NOISE, sigmas), transcription(guided(scale), NOISE, sigmas)
    assert np.abs(ours_x - theirs).max() <= 1e-5 * np.abs(theirs).max()


def test_cfgpp_ud10_ab_converges_as_its_steps_grow():
    """At CFG 1 (the guided and the unconditional x0 one) a CFG++ step is Euler's (DDIM's), but the tenth of a step
    the unconditional noise is extrapolated by adds 0.1 sigma dnoise each step: a bias of fixed size, not an error
    that shrinks. So the runs converge, at first order, to a limit 0.058 RMS from the flow ODE's solution on this
    bed (from the exact ODE state at sigma 0.9, shift 3): the difference of runs 2N and N steps halves as N doubles."""
    start = exact_flow(START, 1.0, 0.9).astype(np.float32)
    reference = exact_flow(start, 0.9, SIGMA_END)

    def model(x, sigma):
        x0 = SMOOTH.denoise(x, sigma).astype(np.float32)
        return x0, x0

    runs = [run_cfgpp(model, start, uniform_sigmas(n, 3.0, 0.9)) for n in (32, 64, 128, 256)]
    changes = [float(np.sqrt(np.mean((b - a) ** 2))) for a, b in zip(runs, runs[1:])]
    assert fitted_order([32, 64, 128], changes) >= 0.8, changes
    assert float(np.sqrt(np.mean((runs[-1] - reference) ** 2))) <= 0.08


def _share_at_prompt_modes(scale: float) -> float:
    out = run_cfgpp(guided(scale), NOISE, flow_sigmas(30, 3.0, "simple"))
    assert np.isfinite(out).all()
    nearest = np.linalg.norm(out[:, None, :] - UNCOND.means[None], axis=-1).argmin(axis=1)
    kept = {tuple(mean) for mean in COND.means}
    return float(np.mean([tuple(UNCOND.means[k]) in kept for k in nearest]))


def test_cfgpp_ud10_ab_draws_the_prompts_modes_at_cfg_2():
    """On the Gaussian-mixture bed at CFG 2 every sample lands nearest one of the conditional mixture's means (the
    prompt's modes); unguided (CFG 0: the unconditional model) 28% do, the unconditional mixture's share."""
    assert _share_at_prompt_modes(2.0) >= 0.95
    assert _share_at_prompt_modes(0.0) <= 0.5


@pytest.mark.parametrize("text", ["cfgpp_ud10_ab", "CFG++ UD10 AB", "cfg++ ud10 ab"])
def test_cfgpp_ud10_ab_is_chosen_by_its_name_and_its_a1111_label(text):
    assert sampler_name(text) == "cfgpp_ud10_ab"
    assert [s.name for s in SAMPLERS.values() if s.guided] == ["cfgpp_ud10_ab"]


def test_sdcpps_euler_cfg_pp_is_refused_with_the_cfgpp_sampler_we_have():
    with pytest.raises(AnimaError, match="euler_cfg_pp.*use cfgpp_ud10_ab"):
        sampler_name("euler_cfg_pp")


def _loop(name: str, cache: str, model, steps: int = 12) -> np.ndarray:
    sampler = SAMPLERS[name]
    return sample(sampler, model, NOISE, flow_sigmas(steps, 3.0), make_cache(cache, steps), seed=5).latent


def test_the_loop_hands_cfgpp_the_unconditional_x0_of_every_call():
    """Uncached, the loop's run is the step function's own loop over the pair, bit for bit."""
    assert np.array_equal(_loop("cfgpp_ud10_ab", "none", guided(2.0)), run_cfgpp(guided(2.0), NOISE,
                                                                                 flow_sigmas(12, 3.0)))


def test_a_cache_forecasts_the_unconditional_x0_by_its_rule_for_x0():
    """Under spectrum (a forecast whose weights do not depend on the values) the x0 pair a forecast step hands the
    sampler is the forecast a Spectrum cache makes from either x0's computed history alone."""
    seen = []

    def step(model, x, ctx, history):
        def watched(latent, sigma):
            seen.append(model(latent, sigma))
            return seen[-1]
        return samplers.cfgpp_ud10_ab(watched, x, ctx, history)

    sampler = dataclasses.replace(SAMPLERS["cfgpp_ud10_ab"], step=step)
    result = sample(sampler, guided(2.0), NOISE, flow_sigmas(12, 3.0), make_cache("spectrum", 12))
    assert result.skipped_steps
    for half in (0, 1):
        alone = make_cache("spectrum", 12)
        for call, pair in enumerate(seen, start=1):
            if call in result.skipped_steps:
                assert np.array_equal(alone.forecast(None), pair[half]), (half, call)
            else:
                alone.record(None, pair[half])


def test_a_guided_sampler_is_refused_a_denoiser_that_returns_one_x0():
    with pytest.raises(TypeError, match="returns \\(guided x0, unconditional x0\\)"):
        _loop("cfgpp_ud10_ab", "none", lambda x, sigma: guided(2.0)(x, sigma)[0])


def _recorded_and_answered(sampler: samplers.Sampler, cache: str) -> tuple[list, list]:
    """The x0 a run's cache recorded and those its denoiser answered."""
    answered, recorded, sigmas = [], [], flow_sigmas(12, 3.0)
    policy = make_cache(cache, len(samplers.call_sigmas(sampler, sigmas)))
    record = policy.record

    def watching(x, x0):
        recorded.append(x0)
        record(x, x0)

    def denoise(x, sigma):
        answered.append(guided(2.0)(x, sigma)[0])
        return answered[-1]

    policy.record = watching
    sample(sampler, denoise, NOISE, sigmas, policy, seed=5)
    return recorded, answered


@pytest.mark.parametrize("cache", ["none", "spectrum", "auto"])
def test_every_other_sampler_sees_what_it_saw_before_the_pair(cache):
    """The pair is a guided sampler's alone: under every other sampler the cache records the denoiser's own x0 (the
    same objects, nothing stacked or copied), as before CFG++ came."""
    for sampler in (s for s in SAMPLERS.values() if not s.guided):
        recorded, answered = _recorded_and_answered(sampler, cache)
        assert len(recorded) == len(answered) and all(a is b for a, b in zip(recorded, answered)), sampler.name
