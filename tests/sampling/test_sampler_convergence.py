"""The samplers against the exact answers of the Gaussian-mixture test bed (tests/sampling/mixture.py).

Deterministic samplers (eta 0) integrate the probability-flow ODE dx/dsigma = (x - x0(x, sigma)) / sigma. The
reference is scipy's DOP853 at rtol 1e-11 on that ODE; both sides go from the same start down to the same
SIGMA_END = 0.02 (a schedule without the final 0, so no last jump to x0 caps any order), uniform in the flow time t
with sigma = shift_sigma(t). The order is the log-log slope of the RMS error over 32 rows against the step count.
Measured (fit over 32..256 steps):

    from sigma 1       shift 1   shift 3        from sigma 0.9   shift 1   shift 3
    euler               1.05      1.00                            1.02      1.00
    heun                1.92      1.90                            1.94      1.92
    dpmpp_2m            1.91      2.04                            2.03      2.08
    res_multistep       1.98      2.13                            2.08      2.15
    sa_solver           1.42*     2.79*                           3.61      3.22
    sa_solver_pece      1.29*     2.75*                           3.58      3.26
    * at the floor of sigma 1's offset from 128 (shift 1) or 256 (shift 3) steps on: see below

(benchmarks/sampler_orders.py draws them: docs/sampler_orders.png.)
Near sigma 1 the lambda steps do not shrink with the step count (log((k + 1) / k) at the k-th step of a uniform
schedule), which costs the exponential multistep methods a log factor at shift 1 (their local slopes fall from 2.0
to 1.9). sa_solver / sa_solver_pece (predictor 3, corrector 4, warm-up from order 1; their order is taken from sigma
0.9) from pure noise do not converge: sigma = 1 counts as 1 - 1e-4 in their lambdas (FIRST_SIGMA_FOR_SNR, after
ComfyUI's offset_first_sigma_for_snr), an error of about 1e-4 |x - x0| in the first step that no step count
removes: RMS 2.4e-4 at sigma 0.02 from 128 steps on (shift 1), a floor the order-3 decay meets at about 64 steps.

Stochastic samplers sample the data distribution: 16000 rows of one latent (one seed: independent rows) end near
the mixture's components; assigned to the nearest mean, the component weights, means and variances must match
within 5 standard errors (from the counts: sqrt(w (1 - w) / N), sqrt(var / n_k), var sqrt(2 / (n_k dim))). Each run
ends with x0 at the last sigma, so a component's target variance is that of the posterior mean there,
std^4 (1 - s)^2 / ((1 - s)^2 std^2 + s^2) (0.2% below std^2 at 100 steps). Steps per sampler are chosen so that the
sampler's own discretisation error is well inside the tolerance (Euler ancestral is weak order 1 with a large
constant: 12% of the variance at 100 steps shift 3, 1.8% at 400 steps shift 1, as the exact variance recursion of
one Gaussian through its steps also gives). A noise scale halved (s_noise 0.5) is caught, tens of standard errors
off. Measured worst |z| (of 12 means, 3 weights, 3 variances): euler_ancestral (400 steps) 3.2 (a variance, -3.3%),
dpmpp_2m_sde (100) 2.6 (a weight), er_sde (100) 2.1, sa_solver and sa_solver_pece (100) 1.8, dpmpp_sde (50) within
3.5 (its two stage noises are increments of one Brownian path; drawn independently they left the variances 9..11%,
8..14 standard errors, low); with s_noise 0.5 the variances are tens of standard errors low. lcm is exact with a
consistency model (3 steps: 3.0) and not with a plain denoiser (variances 34..72 standard errors low).
"""

from __future__ import annotations

import numpy as np
import pytest
from mixture import GaussianMixture
from scipy.integrate import solve_ivp

from anima_rknn.sampling.caches import make_cache
from anima_rknn.sampling.sample import sample
from anima_rknn.sampling.samplers import (
    FIRST_SIGMA_FOR_SNR,
    SAMPLERS,
    call_sigmas,
)
from anima_rknn.sampling.schedule import flow_sigmas, shift_sigma

# ---- deterministic samplers: the order of convergence to the probability-flow ODE -------------------------------

SIGMA_END = 0.02
_rng = np.random.default_rng(3)
SMOOTH = GaussianMixture(_rng.standard_normal((3, 4)), 0.5, np.array([0.2, 0.3, 0.5]))
START = _rng.standard_normal((32, 4))
ORDERS = {"euler": 1.0, "heun": 2.0, "dpmpp_2m": 2.0, "res_multistep": 2.0, "sa_solver": 3.0, "sa_solver_pece": 3.0}
ORDER_SLACK = 0.3


def _velocity(sigma: float, y: np.ndarray) -> np.ndarray:
    x = y.reshape(START.shape)
    return ((x - SMOOTH.denoise(x, sigma)) / sigma).ravel()


def exact_flow(x: np.ndarray, sigma_from: float, sigma_to: float) -> np.ndarray:
    """The probability-flow ODE's solution at sigma_to from x at sigma_from (DOP853, rtol 1e-11)."""
    solution = solve_ivp(_velocity, (sigma_from, sigma_to), np.asarray(x, np.float64).ravel(), method="DOP853",
                         rtol=1e-11, atol=1e-12)
    assert solution.success
    return solution.y[:, -1].reshape(START.shape)


def uniform_sigmas(steps: int, shift: float, sigma_from: float) -> np.ndarray:
    """steps + 1 sigmas from sigma_from to SIGMA_END, evenly spaced in t where sigma = shift_sigma(t)."""
    def time(sigma):
        return sigma / (shift - (shift - 1.0) * sigma)
    return shift_sigma(np.linspace(time(sigma_from), time(SIGMA_END), steps + 1), shift)


def ode_errors(name: str, shift: float, sigma_from: float, step_counts: list[int]) -> list[float]:
    """RMS distance of the sampler's latent at SIGMA_END from the exact ODE solution, per step count."""
    x = START if sigma_from == 1.0 else exact_flow(START, 1.0, sigma_from)
    x = x.astype(np.float32)
    reference = exact_flow(x, sigma_from, SIGMA_END)
    sampler, errors = SAMPLERS[name], []
    for steps in step_counts:
        sigmas = uniform_sigmas(steps, shift, sigma_from)
        out = sample(sampler, lambda latent, sigma: SMOOTH.denoise(latent, sigma).astype(np.float32), x, sigmas,
                     make_cache("none", len(call_sigmas(sampler, sigmas))), seed=0, eta=0.0).latent
        errors.append(float(np.sqrt(np.mean((out - reference) ** 2))))
    return errors


def fitted_order(step_counts: list[int], errors: list[float]) -> float:
    return -float(np.polyfit(np.log(step_counts), np.log(errors), 1)[0])


@pytest.mark.parametrize("shift", [1.0, 3.0])
@pytest.mark.parametrize("name", ["euler", "heun", "dpmpp_2m", "res_multistep"])
def test_deterministic_samplers_converge_at_their_order_from_pure_noise(name, shift):
    steps = [32, 64, 128, 256]
    errors = ode_errors(name, shift, 1.0, steps)
    assert abs(fitted_order(steps, errors) - ORDERS[name]) <= ORDER_SLACK, errors


@pytest.mark.parametrize("shift", [1.0, 3.0])
@pytest.mark.parametrize("name", list(ORDERS))
def test_deterministic_samplers_converge_at_their_order_from_an_exact_state(name, shift):
    """From the exact ODE state at sigma 0.9 (no sigma = 1 in any lambda). sa_solver's order is 3 at least: its
    steps (predictor over 3 points, corrector over 4) are of order 4, its warm-up (the first two steps corrected at
    orders 2 and 3) of order 3; the fit sees 3.2..3.6, the order-4 steps still dominating (at 256 steps shift 1 the
    error, 2e-6, is float32's rounding)."""
    steps = [32, 64, 128, 256]
    order = fitted_order(steps, ode_errors(name, shift, 0.9, steps))
    low, high = (ORDERS[name] - ORDER_SLACK, ORDERS[name] + (1.0 if ORDERS[name] == 3 else 0.0) + ORDER_SLACK)
    assert low <= order <= high, order


@pytest.mark.parametrize("name", ["sa_solver", "sa_solver_pece"])
def test_sa_solver_from_pure_noise_stops_at_the_first_sigma_offset(name):
    """sigma = 1 as 1 - 1e-4 (FIRST_SIGMA_FOR_SNR) in the lambdas: from 128 steps on the error is the offset's,
    2.4e-4 RMS at shift 1 (the first step alone is off by 1e-4 |x - x0|), and more steps do not lower it."""
    assert FIRST_SIGMA_FOR_SNR == 1.0 - 1e-4
    errors = ode_errors(name, 1.0, 1.0, [128, 256])
    assert max(errors) < 5e-4, errors
    assert errors[1] > 0.7 * errors[0], errors  # no longer converging (order 3 would divide it by 8)


# ---- stochastic samplers: the marginal of the samples -------------------------------------------------------------

ROWS, DIM, STD = 16000, 4, 0.5
_means = np.zeros((3, DIM))
_means[0, 0], _means[1, 1], _means[2, :2] = 3.0, 3.0, -1.5  # 4.2 to 4.7 apart: 4+ std from every midpoint
SHARP = GaussianMixture(_means, STD, np.array([0.2, 0.3, 0.5]))
NOISE = np.random.default_rng(11).standard_normal((ROWS, DIM)).astype(np.float32)
TOLERANCE_SE = 5.0
SHIFT = 1.0
SEED = 5


def posterior_mean(x: np.ndarray, sigma: float) -> np.ndarray:
    return SHARP.denoise(x, sigma).astype(np.float32)


def marginal_z(samples: np.ndarray, final_variance: float) -> dict[str, np.ndarray]:
    """Per component, (estimate - truth) / its standard error: weight, mean (per dimension), variance (pooled)."""
    samples = np.asarray(samples, np.float64)
    nearest = ((samples[:, None, :] - SHARP.means[None]) ** 2).sum(-1).argmin(1)
    weight_z, mean_z, variance_z = [], [], []
    for component, (mean, weight) in enumerate(zip(SHARP.means, SHARP.weights)):
        members = samples[nearest == component]
        count = len(members)
        weight_z.append((count / ROWS - weight) / np.sqrt(weight * (1 - weight) / ROWS))
        mean_z.append(np.abs(members.mean(0) - mean).max() / np.sqrt(final_variance / count))
        variance = members.var(0, ddof=1).mean()
        variance_z.append((variance / final_variance - 1.0) / np.sqrt(2.0 / (count * DIM)))
    return {"weight": np.array(weight_z), "mean": np.array(mean_z), "variance": np.array(variance_z)}


def worst_z(z: dict[str, np.ndarray]) -> float:
    return float(max(np.abs(values).max() for values in z.values()))


def last_x0_variance(sigmas: np.ndarray) -> float:
    """A component's variance of E[x0 | x] at the last sigma before 0: what every run here ends with."""
    s = float(sigmas[-2])
    return STD**4 * (1 - s) ** 2 / ((1 - s) ** 2 * STD**2 + s**2)


def run(name: str, steps: int, denoise=posterior_mean, **options) -> np.ndarray:
    sigmas = flow_sigmas(steps, SHIFT)
    sampler = SAMPLERS[name]
    return sample(sampler, denoise, NOISE, sigmas, make_cache("none", len(call_sigmas(sampler, sigmas))),
                  seed=SEED, **options).latent


# Steps enough for each sampler's discretisation error to be small against the tolerance (see the docstring).
STOCHASTIC = {"euler_ancestral": 400, "dpmpp_2m_sde": 100, "dpmpp_sde": 50, "er_sde": 100, "sa_solver": 100,
              "sa_solver_pece": 100}


@pytest.mark.parametrize("name", list(STOCHASTIC))
def test_stochastic_samplers_reproduce_the_mixture(name):
    steps = STOCHASTIC[name]
    z = marginal_z(run(name, steps), last_x0_variance(flow_sigmas(steps, SHIFT)))
    assert worst_z(z) < TOLERANCE_SE, z


@pytest.mark.parametrize("name", list(STOCHASTIC))
def test_a_halved_noise_scale_is_caught(name):
    """The same runs with s_noise 0.5: the variances fall far outside the tolerance, so the test above can fail."""
    steps = STOCHASTIC[name]
    z = marginal_z(run(name, steps, s_noise=0.5), last_x0_variance(flow_sigmas(steps, SHIFT)))
    assert z["variance"].min() < -4 * TOLERANCE_SE, z


def consistency_function(x: np.ndarray, sigma: float) -> np.ndarray:
    """The exact consistency model of the mixture: the probability-flow ODE from (x, sigma) to the clean end
    (to sigma 1e-4, then x0 there: a variance 1e-7 below std^2). rtol 1e-5 is far inside the statistics (the
    z-scores are those of rtol 1e-7 to 0.1)."""
    end = 1e-4
    solution = solve_ivp(lambda s, y: ((y.reshape(x.shape) - SHARP.denoise(y.reshape(x.shape), s)) / s).ravel(),
                         (sigma, end), np.asarray(x, np.float64).ravel(), method="DOP853", rtol=1e-5, atol=1e-6)
    assert solution.success
    return SHARP.denoise(solution.y[:, -1].reshape(x.shape), end).astype(np.float32)


def test_lcm_with_a_consistency_model_reproduces_the_mixture():
    """lcm is exact at any step count when the model returns the ODE's clean end (a distilled consistency model):
    x0 is then a sample, and x0 renoised to sigma_next has the exact marginal again."""
    z = marginal_z(run("lcm", 3, denoise=consistency_function), STD**2)
    assert worst_z(z) < TOLERANCE_SE, z


def test_lcm_with_a_posterior_mean_denoiser_is_not_a_sampler():
    """With a plain denoiser (E[x0 | x], what the other samplers take) lcm renoises the posterior mean, which is
    narrower than the data at every step: its samples come out 54% too narrow, and with wrong weights (tens of
    standard errors), at 100 steps as at 10. Expected of the method, not a fault of ours (diffusers'
    FlowMatchEulerDiscreteScheduler with stochastic_sampling, ComfyUI's sample_lcm do the same step)."""
    z = marginal_z(run("lcm", 100), last_x0_variance(flow_sigmas(100, SHIFT)))
    assert z["variance"].max() < -4 * TOLERANCE_SE and np.abs(z["weight"]).max() > 2 * TOLERANCE_SE, z
