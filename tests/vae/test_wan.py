"""The Wan VAE network against diffusers' AutoencoderKLQwenImage, and its configuration."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from diffusers_reference import diffusers_vae

from anima_rknn.errors import AnimaError
from anima_rknn.vae import WanVAEConfig, load_vae, random_vae, save_vae

# Wan 2.1 statistics as printed in the spec (anima.md, VAE section).
SPEC_MEAN = [-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
             0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921]  # fmt: skip
SPEC_STD = [2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
            3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160]  # fmt: skip

SMALL = WanVAEConfig(dim=16)


PARITY_CASES = [
    (SMALL, (5, 7)),
    (WanVAEConfig(dim=16, num_res_blocks=1), (4, 6)),
    # 3 levels (4x), z_dim 8 and non-default statistics that must travel in the metadata.
    (
        WanVAEConfig(dim=8, z_dim=8, dim_mult=(1, 2, 3), num_res_blocks=1,
                     latents_mean=tuple(0.1 * i for i in range(8)), latents_std=tuple(1 + 0.2 * i for i in range(8))),
        (6, 5),
    ),  # fmt: skip
]


@pytest.mark.parametrize(("config", "latent_hw"), PARITY_CASES)
def test_decode_and_encode_match_diffusers(tmp_path: Path, config: WanVAEConfig, latent_hw: tuple[int, int]) -> None:
    path = tmp_path / "vae.safetensors"
    save_vae(random_vae(config, seed=1), path, dtype=torch.float32)
    ours = load_vae(path, decode_only=False)
    assert ours.config == config
    theirs = diffusers_vae(path, config)
    mean = torch.tensor(config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(config.latents_std).view(1, -1, 1, 1, 1)

    torch.manual_seed(0)
    z = torch.randn(2, config.z_dim, *latent_hw)
    image = torch.rand(1, 3, 8 * config.scale_factor, 6 * config.scale_factor)
    with torch.no_grad():
        decoded = ours.decode(z)
        reference = theirs.decode(z.unsqueeze(2) * std + mean).sample[:, :, 0]
        encoded = ours.encode(image)
        posterior_mean = theirs.encode((image * 2 - 1).unsqueeze(2)).latent_dist.mean
    reference = (reference + 1) / 2
    assert decoded.shape == (2, 3, latent_hw[0] * config.scale_factor, latent_hw[1] * config.scale_factor)
    assert (decoded - reference).abs().max().item() <= 1e-4  # measured ~1e-6
    assert 0.05 < reference.std().item()  # the comparison is not between two flat images
    reference_latent = ((posterior_mean - mean) / std)[:, :, 0]
    assert (encoded - reference_latent).abs().max().item() <= 1e-4  # measured ~1e-6


def test_defaults_are_the_spec_values() -> None:
    assert list(WanVAEConfig().latents_mean) == SPEC_MEAN
    assert list(WanVAEConfig().latents_std) == SPEC_STD
    with pytest.raises(AnimaError, match="16 entries"):
        WanVAEConfig(latents_mean=(0.0,) * 15)


def test_bf16_load_decodes_close_to_fp32(tmp_path: Path) -> None:
    path = tmp_path / "vae.safetensors"
    save_vae(random_vae(SMALL, seed=6), path)
    z = torch.randn(1, 16, 4, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = load_vae(path).decode(z)
        half = load_vae(path, dtype=torch.bfloat16).decode(z)
    assert half.dtype == torch.float32
    assert (full - half).abs().mean().item() < 0.02
