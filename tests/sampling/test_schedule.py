import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from anima_rknn.errors import AnimaError
from anima_rknn.sampling.schedule import flow_sigmas


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
