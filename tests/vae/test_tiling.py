"""Tiled decoding against whole-image decoding of the same VAE."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from anima_rknn.errors import AnimaError
from anima_rknn.vae import WanVAE, WanVAEConfig, decode_tiled, random_vae
from anima_rknn.vae.tiling import _feather, decode_bytes, plan_tiling, tiled_decode_bytes


def _without_attention(vae: WanVAE) -> WanVAE:
    """Zero the middle attention's output so the decoder only sees a bounded neighbourhood."""
    proj = vae.decoder.middle[1].proj
    proj.weight.zero_()
    proj.bias.zero_()
    return vae


def _pointwise(vae: WanVAE) -> WanVAE:
    """Keep only the centre tap of every 3x3 conv: each latent pixel then decodes on its own."""
    for module in vae.decoder.modules():
        if isinstance(module, nn.Conv2d) and module.kernel_size == (3, 3):
            centre = module.weight[:, :, 1, 1].clone()
            module.weight.zero_()
            module.weight[:, :, 1, 1] = centre
    return _without_attention(vae)


@pytest.mark.parametrize(
    ("config", "overlap_latent"),
    [(WanVAEConfig(dim=8, num_res_blocks=1), 2),
     (WanVAEConfig(dim=8, dim_mult=(1, 2, 2), num_res_blocks=1), 2),
     (WanVAEConfig(dim=8, dim_mult=(1, 2, 2), num_res_blocks=1), 0)],  # fmt: skip
)
def test_many_tiles_blend_exactly_for_a_pointwise_decoder(config: WanVAEConfig, overlap_latent: int) -> None:
    # A pointwise decoder gives every tile the whole-image values, so any misplaced tile, uncovered
    # strip (e.g. the shifted last tile) or weights not summing up shows as a difference.
    vae = _pointwise(random_vae(config, seed=0))
    s = config.scale_factor
    z = torch.randn(1, 16, 20, 27, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        tiled = decode_tiled(vae, z, tile_px=8 * s, overlap_px=overlap_latent * s)  # 3 x 4 or 5 tiles
        whole = vae.decode(z)
    assert tiled.shape == whole.shape == (1, 3, 20 * s, 27 * s)
    assert (tiled - whole).abs().max().item() < 1e-5


def test_tiles_equal_whole_image_away_from_seams() -> None:
    # Without attention this decoder's receptive field is about 14 latent pixels (measured by
    # perturbing one latent column); tiles [0, 40) and [24, 64) each have a stretch covered by no other
    # tile that lies at least 16 latent pixels from their inner edge.
    vae = _without_attention(random_vae(WanVAEConfig(dim=8, num_res_blocks=1), seed=0))
    z = torch.randn(1, 16, 6, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        tiled = decode_tiled(vae, z, tile_px=320, overlap_px=64)
        whole = vae.decode(z)
    assert tiled.shape == whole.shape
    away = torch.cat([(tiled - whole)[..., : 24 * 8], (tiled - whole)[..., 40 * 8 :]], dim=-1)
    assert away.abs().max().item() < 1e-5
    seam = (tiled - whole)[..., 24 * 8 : 40 * 8]
    assert seam.abs().max().item() > 1e-4  # the tiles really were decoded separately
    assert torch.isfinite(tiled).all() and tiled.min() >= 0 and tiled.max() <= 1


@pytest.mark.parametrize("latent_hw", [(16, 16), (10, 13)])
def test_one_tile_is_exactly_the_plain_decode(latent_hw: tuple[int, int]) -> None:
    vae = random_vae(WanVAEConfig(dim=8, num_res_blocks=1), seed=3)
    z = torch.randn(1, 16, *latent_hw, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.equal(decode_tiled(vae, z, tile_px=128, overlap_px=32), vae.decode(z))


@pytest.mark.parametrize(
    ("tile_px", "overlap_px", "message"),
    [(500, 64, "multiples of 8"), (512, 60, "multiples of 8"), (64, 64, "smaller than the tile"),
     (512, -8, "multiples of 8"), (0, 0, "multiples of 8")],  # fmt: skip
)
def test_bad_options_are_user_errors(tile_px: int, overlap_px: int, message: str) -> None:
    vae = random_vae(WanVAEConfig(dim=8, num_res_blocks=1), seed=5)
    with pytest.raises(AnimaError, match=message):
        decode_tiled(vae, torch.zeros(1, 16, 4, 4), tile_px=tile_px, overlap_px=overlap_px)


def test_feather_ramps_are_linear_and_complementary() -> None:
    # 4-pixel ramps rise as 1/5 .. 4/5 on inner sides only; facing ramps of two neighbours sum to 1.
    ramp = [0.2, 0.4, 0.6, 0.8]
    middle = _feather(start=8, size=12, total=64, ramp=4)
    assert middle.tolist() == pytest.approx(ramp + [1.0] * 4 + ramp[::-1])
    assert _feather(start=0, size=12, total=64, ramp=4).tolist() == pytest.approx([1.0] * 8 + ramp[::-1])
    assert _feather(start=52, size=12, total=64, ramp=4).tolist() == pytest.approx(ramp + [1.0] * 8)
    assert _feather(start=0, size=12, total=12, ramp=4).tolist() == [1.0] * 12


# ---- deciding tiling from a memory estimate --------------------------------------------------------------


GIB = 2**30
REAL_VAE = WanVAEConfig()  # the real Qwen-Image VAE's width


def test_one_piece_memory_grows_with_the_square_of_the_pixels():
    """The middle attention's n x n matrices dominate large images: 2048x2048 wants tens of GiB in one piece."""
    assert decode_bytes(REAL_VAE, 2048, 2048) > 32 * GIB
    assert decode_bytes(REAL_VAE, 1024, 1024) < 6 * GIB
    assert tiled_decode_bytes(REAL_VAE, 2048, 2048, 512) < 1.2 * GIB


@pytest.mark.parametrize("mode, size, available, expected", [
    ("auto", 1024, 8 * GIB, None),  # fits comfortably: one piece, exactly as before
    ("auto", 2048, 8 * GIB, 512),  # would not fit: tiles, automatically
    ("auto", 2048, None, None),  # memory unknown: the user decides
    ("on", 1024, 8 * GIB, 512),
    ("on", 256, 8 * GIB, None),  # one tile covers the image
    ("off", 1024, 8 * GIB, None),
])
def test_plan(mode, size, available, expected):
    assert plan_tiling(REAL_VAE, size, size, mode, 512, available) == expected


@pytest.mark.parametrize("mode, tile, pattern", [
    ("off", 512, "in one piece needs about .* GiB, but only 2.0 GiB .* use --vae-tiling"),
    ("auto", 4096, "in one piece needs"),  # a tile as large as the image is one piece
    ("on", 2048, "in 2048-px tiles needs .* use a smaller --vae-tile-size"),
])
def test_what_cannot_fit_is_refused_up_front(mode, tile, pattern):
    with pytest.raises(AnimaError, match=pattern):
        plan_tiling(REAL_VAE, 4096, 4096, mode, tile, 2 * GIB)
