import numpy as np
import pytest
import scipy.stats
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from anima_rknn.errors import AnimaError
from anima_rknn.sampling.schedule import (
    A1111_SCHEDULES,
    BETA_MAX_STEPS,
    SCHEDULE_LABELS,
    SCHEDULES,
    flow_sigmas,
    schedule_name,
    strength_start,
)


def test_twenty_steps_hand_values():
    # sigma = 3t / (1 + 2t) with t = (1000 - int(k * 1000 / 20)) / 1000 = 1 - k / 20.
    sigmas = flow_sigmas(20)
    assert sigmas.dtype == np.float64 and sigmas.shape == (21,)
    assert sigmas[0] == 1.0 and sigmas[-1] == 0.0
    np.testing.assert_allclose(sigmas[1], 2.85 / 2.9, rtol=1e-15)  # t = 0.95
    np.testing.assert_allclose(sigmas[5], 0.9, rtol=1e-15)  # t = 0.75: 2.25 / 2.5
    np.testing.assert_allclose(sigmas[10], 0.75, rtol=1e-15)  # t = 0.5: 1.5 / 2
    np.testing.assert_allclose(sigmas[19], 0.15 / 1.1, rtol=1e-15)  # t = 0.05, last non-zero
    assert np.all(np.diff(sigmas) < 0)


def test_thirty_steps_hand_values():
    sigmas = flow_sigmas(30)
    # k = 1: int(1000 / 30) = 33, t = 0.967; k = 29: int(29000 / 30) = 966, t = 0.034.
    np.testing.assert_allclose(sigmas[1], 3 * 0.967 / (1 + 2 * 0.967), rtol=1e-15)
    np.testing.assert_allclose(sigmas[29], 3 * 0.034 / (1 + 2 * 0.034), rtol=1e-15)


def test_shift_one_is_the_plain_table():
    np.testing.assert_allclose(flow_sigmas(4, shift=1.0), [1.0, 0.75, 0.5, 0.25, 0.0], rtol=1e-15)


@pytest.mark.parametrize("steps", [20, 30, 50])
def test_matches_diffusers_flow_match_scheduler(steps):
    # diffusers' own set_timesteps(steps) spaces t linearly from 1 down to its shifted sigma_min
    # (0.003 at shift 3), not ComfyUI's "simple" picks from the 1000-entry table, so it cannot produce
    # this table by itself; given the unshifted t of the simple schedule it applies the same shift and
    # appends the terminal 0. Its arithmetic is float32.
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)
    t = [(1000 - int(k * 1000 / steps)) / 1000 for k in range(steps)]
    scheduler.set_timesteps(sigmas=t)
    reference = scheduler.sigmas.to(torch.float64).numpy()
    np.testing.assert_allclose(flow_sigmas(steps, shift=3.0), reference, rtol=0, atol=2e-7)


@pytest.mark.parametrize("steps, shift", [(0, 3.0), (-5, 3.0), (2.5, 3.0), (20, 0.0), (20, float("nan"))])
def test_bad_arguments(steps, shift):
    with pytest.raises(AnimaError):
        flow_sigmas(steps, shift)


# --- the other schedules: each against its published formula, written out here, and against diffusers where it
# has the same. At shift 3 ComfyUI's ModelSamplingDiscreteFlow has sigma_min = table[0] = shift(1 / 1000) and
# sigma_max = table[-1] = shift(1) = 1; its timestep(sigma) is 1000 sigma and its sigma(timestep) is
# shift(timestep / 1000).

STEP_COUNTS = [1, 2, 10, 20, 30, 50]


def shifted(t, shift=3.0):
    return shift * t / (1 + (shift - 1) * t)


def ramp(steps):
    """k / (steps - 1) for k < steps, as linspace(0, 1, steps) (just 0 for one step)."""
    return np.array([k / (steps - 1) for k in range(steps)]) if steps > 1 else np.zeros(1)


def expected_normal(steps, shift):
    start, end = 1000 * shifted(1.0, shift), 1000 * shifted(0.001, shift)
    return np.append(shifted((start + ramp(steps) * (end - start)) / 1000, shift), 0.0)


def expected_sgm_uniform(steps, shift):
    start, end = 1000 * shifted(1.0, shift), 1000 * shifted(0.001, shift)
    return np.append([shifted((start + k / steps * (end - start)) / 1000, shift) for k in range(steps)], 0.0)


def expected_karras(steps, shift):
    # Karras et al. 2022 eq. 5: (sigma_max^(1/rho) + k / (N - 1) (sigma_min^(1/rho) - sigma_max^(1/rho)))^rho
    rho, low, high = 7.0, shifted(0.001, shift), shifted(1.0, shift)
    return np.append((high ** (1 / rho) + ramp(steps) * (low ** (1 / rho) - high ** (1 / rho))) ** rho, 0.0)


def expected_exponential(steps, shift):
    low, high = shifted(0.001, shift), shifted(1.0, shift)
    return np.append(high * (low / high) ** ramp(steps), 0.0)


def beta_indices(steps):
    # ComfyUI: the Beta(0.6, 0.6) quantiles of 1 - k / steps, rounded to an index of the 1000-entry table
    return np.rint(scipy.stats.beta.ppf([1 - k / steps for k in range(steps)], 0.6, 0.6) * 999).astype(int)


def expected_beta(steps, shift):
    return np.append(shifted((beta_indices(steps) + 1) / 1000, shift), 0.0)  # table[i] = shift((i + 1) / 1000)


def expected_linear_quadratic(steps, shift):
    # ComfyUI's linear_quadratic_schedule (threshold_noise 0.025, linear_steps steps // 2): s rises linearly from 0
    # to 0.025 over the first half, then follows the parabola through (half, 0.025) with the same slope that
    # reaches 1 at i = steps; sigma = 1 - s. One step is ComfyUI's special case [1, 0]. No shift: sigma_max is 1.
    if steps == 1:
        return np.array([1.0, 0.0])
    half, threshold = steps // 2, 0.025
    excess = half - threshold * steps
    a = excess / (half * (steps - half) ** 2)
    b = threshold / half - 2 * excess / (steps - half) ** 2
    s = [i * threshold / half if i < half else a * i * i + b * i + a * half * half for i in range(steps)] + [1.0]
    return 1.0 - np.array(s)


EXPECTED = {"normal": expected_normal, "sgm_uniform": expected_sgm_uniform, "karras": expected_karras,
            "exponential": expected_exponential, "beta": expected_beta, "linear_quadratic": expected_linear_quadratic}


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("steps", STEP_COUNTS)
@pytest.mark.parametrize("shift", [1.0, 3.0])
def test_every_schedule_is_steps_plus_one_decreasing_sigmas_from_one_to_zero(schedule, steps, shift):
    sigmas = flow_sigmas(steps, shift, schedule)
    assert sigmas.dtype == np.float64 and sigmas.shape == (steps + 1,)
    assert sigmas[0] == 1.0 and sigmas[-1] == 0.0  # shift(1) is exactly 1 at these shifts, and so is shift(shift(1))
    assert np.all(np.diff(sigmas) < 0)


@pytest.mark.parametrize("schedule", sorted(EXPECTED))
@pytest.mark.parametrize("steps", STEP_COUNTS)
@pytest.mark.parametrize("shift", [1.0, 3.0, 0.5, 7.0])
def test_every_schedule_follows_its_formula(schedule, steps, shift):
    np.testing.assert_allclose(flow_sigmas(steps, shift, schedule), EXPECTED[schedule](steps, shift),
                               rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("steps", [2, 10, 30])
def test_last_sigmas_before_zero(steps):
    # karras and exponential end at sigma_min; normal ends at sigma(timestep(sigma_min)) = shift(shift(1 / 1000)),
    # as ComfyUI does: its timestep() is 1000 sigma, not the inverse of sigma() once shifted.
    sigma_min = 0.003 / 1.002
    np.testing.assert_allclose(flow_sigmas(steps, 3.0, "karras")[-2], sigma_min, rtol=1e-13)
    np.testing.assert_allclose(flow_sigmas(steps, 3.0, "exponential")[-2], sigma_min, rtol=1e-13)
    np.testing.assert_allclose(flow_sigmas(steps, 3.0, "normal")[-2], 3 * sigma_min / (1 + 2 * sigma_min), rtol=1e-13)
    np.testing.assert_allclose(flow_sigmas(steps, 3.0, "linear_quadratic")[steps // 2], 0.975, rtol=1e-13)


def test_normal_at_a_tiny_shift_takes_one_timestep_more_and_ends_at_zero():
    # shift 0.001 puts sigma(timestep(sigma_min)) under 1e-5: ComfyUI then spreads steps + 1 timesteps and ends on
    # that sigma instead of appending 0; we end on an exact 0 instead (a difference under 1e-5).
    shift, steps = 0.001, 10
    start, end = 1000 * shifted(1.0, shift), 1000 * shifted(0.001, shift)
    assert shifted(end / 1000, shift) < 1e-5
    timesteps = [start + k / steps * (end - start) for k in range(steps + 1)]
    expected = [shifted(t / 1000, shift) for t in timesteps[:-1]] + [0.0]
    np.testing.assert_allclose(flow_sigmas(steps, shift, "normal"), expected, rtol=1e-12, atol=0)


def test_beta_matches_scipy_at_every_step_count_it_allows():
    # our Beta(0.6, 0.6) quantile is written without SciPy; over all the step counts the schedule allows it rounds
    # to the table index SciPy's does
    for steps in range(1, BETA_MAX_STEPS + 1):
        np.testing.assert_array_equal(flow_sigmas(steps, 3.0, "beta"), expected_beta(steps, 3.0), err_msg=str(steps))


def test_beta_refuses_step_counts_where_comfyui_drops_repeated_timesteps():
    assert len(set(beta_indices(BETA_MAX_STEPS))) == BETA_MAX_STEPS
    assert len(set(beta_indices(BETA_MAX_STEPS + 1))) < BETA_MAX_STEPS + 1
    with pytest.raises(AnimaError, match="at most 138"):
        flow_sigmas(BETA_MAX_STEPS + 1, 3.0, "beta")


def diffusers_sigmas(steps=None, sigmas=None, shift=3.0, **options):
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=shift, **options)
    scheduler.set_timesteps(num_inference_steps=steps, sigmas=None if sigmas is None else list(sigmas))
    return scheduler.sigmas.to(torch.float64).numpy()


# diffusers computes in float32
DIFFUSERS_TOLERANCE = dict(rtol=1e-6, atol=2e-7)


@pytest.mark.parametrize("steps", STEP_COUNTS)
def test_normal_matches_diffusers_default_timesteps(steps):
    # diffusers' own set_timesteps(steps) spaces its timesteps from 1000 sigma_max to 1000 sigma_min and shifts
    # them: ComfyUI's normal exactly, double shift of sigma_min included.
    np.testing.assert_allclose(flow_sigmas(steps, 3.0, "normal"), diffusers_sigmas(steps), **DIFFUSERS_TOLERANCE)


@pytest.mark.parametrize("steps", STEP_COUNTS)
def test_sgm_uniform_matches_diffusers_given_its_timesteps(steps):
    # diffusers has no sgm_uniform option; given the steps + 1 timesteps (over 1000) less the last it applies the same
    # shift and appends the same 0
    timesteps = np.linspace(1.0, shifted(0.001), steps + 1)[:-1]
    np.testing.assert_allclose(flow_sigmas(steps, 3.0, "sgm_uniform"), diffusers_sigmas(sigmas=timesteps),
                               **DIFFUSERS_TOLERANCE)


@pytest.mark.parametrize("option, schedule", [("use_karras_sigmas", "karras"),
                                              ("use_exponential_sigmas", "exponential")])
@pytest.mark.parametrize("steps", STEP_COUNTS)
def test_karras_and_exponential_match_diffusers_between_the_same_ends(option, schedule, steps):
    # diffusers builds these between the ends of the sigmas it would otherwise use. By default those are its normal
    # grid's, which ends at shift(shift(1 / 1000)) = 0.0089, not ComfyUI's sigma_min = shift(1 / 1000) = 0.0030;
    # given the unshifted timesteps from 1 to 1 / 1000 its ends are ComfyUI's and the schedules agree.
    ours = flow_sigmas(steps, 3.0, schedule)
    np.testing.assert_allclose(ours, diffusers_sigmas(sigmas=np.linspace(1.0, 0.001, steps), **{option: True}),
                               **DIFFUSERS_TOLERANCE)
    if steps > 1:
        default = diffusers_sigmas(steps, **{option: True})
        np.testing.assert_allclose(default[-2], shifted(shifted(0.001)), rtol=1e-6)
        assert ours[-2] < default[-2] / 2


@pytest.mark.parametrize("steps", STEP_COUNTS)
def test_beta_quantiles_match_diffusers(steps):
    # diffusers' (and A1111's) beta is another schedule: sigma_min + ppf (sigma_max - sigma_min), at the quantiles
    # 1 - k / (steps - 1) (both ends included), linear in sigma, where ComfyUI's takes 1 - k / steps, rounds
    # ppf * 999 to a table index and reads the shifted table. With shift 1 between 1 and 0 over steps + 1 points
    # diffusers' values are ComfyUI's quantiles themselves, which must round to our indices.
    quantiles = diffusers_sigmas(sigmas=np.linspace(1.0, 0.0, steps + 1), shift=1.0, use_beta_sigmas=True)
    indices = np.rint(quantiles[:steps] * 999).astype(int)
    np.testing.assert_array_equal(flow_sigmas(steps, 3.0, "beta"), np.append(shifted((indices + 1) / 1000), 0.0))
    if steps > 2:
        assert np.max(np.abs(diffusers_sigmas(steps, use_beta_sigmas=True) - flow_sigmas(steps, 3.0, "beta"))) > 1e-2


@pytest.mark.parametrize("steps", [s for s in STEP_COUNTS if s > 1])
def test_linear_quadratic_matches_diffusers_mochi(steps):
    # diffusers' Mochi pipeline has the same schedule (Genmo's), without the final 0 and without ComfyUI's one-step
    # case (it divides by steps // 2)
    from diffusers.pipelines.mochi.pipeline_mochi import linear_quadratic_schedule

    np.testing.assert_allclose(flow_sigmas(steps, 3.0, "linear_quadratic"),
                               linear_quadratic_schedule(steps, 0.025) + [0.0], rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("steps", STEP_COUNTS + [7, 999, 1000])
@pytest.mark.parametrize("shift", [1.0, 3.0, 0.37])
def test_simple_is_the_default_and_unchanged(steps, shift):
    spec = [shifted(np.arange(1, 1001, dtype=np.float64) / 1000, shift)[-(1 + int(k * 1000 / steps))]
            for k in range(steps)] + [0.0]
    np.testing.assert_array_equal(flow_sigmas(steps, shift), spec)
    np.testing.assert_array_equal(flow_sigmas(steps, shift, "simple"), spec)


@pytest.mark.parametrize("text, name", [
    ("simple", "simple"), ("Simple", "simple"), ("NORMAL", "normal"), ("Karras", "karras"),
    ("exponential", "exponential"), ("Exponential", "exponential"), ("sgm_uniform", "sgm_uniform"),
    ("SGM Uniform", "sgm_uniform"), ("SGMUniform", "sgm_uniform"), ("beta", "beta"), ("Beta", "beta"),
    ("linear_quadratic", "linear_quadratic"), ("Linear Quadratic", "linear_quadratic"),
    ("automatic", "simple"), ("Automatic", "simple"), ("uniform", "normal"), ("Uniform", "normal"),
])
def test_schedule_name_accepts_ours_and_a1111s(text, name):
    assert schedule_name(text) == name


@pytest.mark.parametrize("text", ["ddim", "DDIM", "ddim_uniform", "kl_optimal", "KL Optimal", "Align Your Steps",
                                  "polyexponential", "turbo", "", "karras ", "Linear_Quadratic ", None, 3, b"simple"])
def test_schedule_name_refuses_the_rest_listing_ours(text):
    with pytest.raises(AnimaError) as refused:
        schedule_name(text)
    message = str(refused.value)
    assert "\n" not in message and all(name in message for name in SCHEDULES)


def test_labels_and_a1111_names_cover_our_schedules():
    assert tuple(SCHEDULE_LABELS) == SCHEDULES
    assert all(schedule_name(label) == name for name, label in SCHEDULE_LABELS.items())
    assert set(A1111_SCHEDULES.values()) == set(SCHEDULES) - {"linear_quadratic"}  # A1111 has no linear_quadratic


def test_flow_sigmas_takes_any_accepted_name_and_refuses_others():
    np.testing.assert_array_equal(flow_sigmas(20, 3.0, "SGM Uniform"), flow_sigmas(20, 3.0, "sgm_uniform"))
    with pytest.raises(AnimaError, match="unknown schedule"):
        flow_sigmas(20, 3.0, "ddim_uniform")


@pytest.mark.parametrize("steps", [1, 2, 3, 7, 10, 20, 28, 50])
def test_strength_start_is_diffusers_anima_get_timesteps(steps):
    from diffusers.modular_pipelines.anima.before_denoise import get_timesteps

    for strength in [0.0, 0.05, 0.1, 0.2, 0.25, 0.3, 1 / 3, 0.5, 0.6, 0.7, 0.75, 0.8, 0.9, 0.95, 0.999, 1.0]:
        scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)
        scheduler.set_timesteps(steps)
        timesteps, run = get_timesteps(scheduler, steps, strength)
        start = strength_start(steps, strength)
        assert steps - start == run == len(timesteps)
        if run:  # the truncated run starts at the sigma diffusers noises the init latent to
            assert scheduler.sigmas[start].item() == pytest.approx(timesteps[0].item() / 1000, abs=1e-6)


def test_strength_start_refuses_strengths_outside_0_to_1():
    for bad in (-0.01, 1.01, float("nan"), "0.5", None):
        with pytest.raises(AnimaError, match="strength"):
            strength_start(20, bad)
