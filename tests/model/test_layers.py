"""Sinusoid and RoPE tables against values written down from the spec (anima.md, DiT steps 3 and 6)."""

import math

import torch

from anima_rknn.model.layers import rope_axis_dims, rope_tables, timestep_sinusoid


def test_sinusoid_is_cos_half_first_and_takes_sigma_not_sigma_times_1000():
    emb = timestep_sinusoid(torch.tensor([0.5]), 2048)
    assert emb.shape == (1, 2048) and emb.dtype == torch.float32
    assert math.isclose(emb[0, 0].item(), math.cos(0.5), rel_tol=1e-6)
    assert math.isclose(emb[0, 1024].item(), math.sin(0.5), rel_tol=1e-6)
    f1 = math.exp(-math.log(10000) / 1024)
    assert math.isclose(emb[0, 1].item(), math.cos(0.5 * f1), rel_tol=1e-6)
    f1023 = math.exp(-math.log(10000) * 1023 / 1024)
    assert math.isclose(emb[0, 2047].item(), math.sin(0.5 * f1023), rel_tol=1e-5)


def test_rope_split_is_44_42_42_for_head_dim_128():
    assert rope_axis_dims(128) == (44, 42, 42)


def test_rope_angles_follow_the_spec():
    grid_h, grid_w = 3, 5
    cos, sin = rope_tables(128, grid_h, grid_w)
    assert cos.shape == (15, 128)
    angles = torch.atan2(sin, cos)
    theta_hw = 10000 * 4.0 ** (42 / 40)
    token = 2 * grid_w + 3  # row 2, column 3 (row-major)
    assert torch.all(angles[token, :22] == 0)  # t = 0 for an image
    assert math.isclose(angles[token, 22].item(), 2.0, abs_tol=1e-6)  # h, first frequency = 1
    assert math.isclose(angles[token, 23].item(), 2.0 * theta_hw ** (-2 / 42), rel_tol=1e-5)
    assert math.isclose(angles[token, 43].item(), 3.0 - 2 * math.pi if 3.0 > math.pi else 3.0, abs_tol=1e-5)
    assert math.isclose(angles[token, 44].item(), 3.0 * theta_hw ** (-2 / 42), rel_tol=1e-5)
    torch.testing.assert_close(cos[:, :64], cos[:, 64:])  # split-half: pair j with j + 64
