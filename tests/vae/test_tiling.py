"""Tiled decoding and encoding against whole-image decoding and encoding of the same VAE, and the memory estimates
that decide when to tile."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from anima_rknn.errors import AnimaError
from anima_rknn.vae import WanVAE, WanVAEConfig, decode_tiled, load_vae, random_vae
from anima_rknn.vae.preview import varied_images
from anima_rknn.vae.tiling import (
    _feather,
    decode_bytes,
    encode_bytes,
    encode_tiled,
    plan_encode_tiling,
    plan_tiling,
    tiled_decode_bytes,
    tiled_encode_bytes,
)


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


# ---- tiled encoding ----------------------------------------------------------------------------------------------


def _encoder_without_attention(vae: WanVAE) -> WanVAE:
    proj = vae.encoder.middle[1].proj
    proj.weight.zero_()
    proj.bias.zero_()
    return vae


def _blockwise(vae: WanVAE) -> WanVAE:
    """Keep only the centre tap of every stride-1 3x3 conv of the encoder and the two taps of each stride-2 one that
    read inside its own 2x2 block: each latent pixel then encodes its own s x s block of the image alone."""
    for module in vae.encoder.modules():
        if isinstance(module, nn.Conv2d) and module.kernel_size == (3, 3):
            kept = (slice(1, 2), slice(1, 2)) if module.stride == (1, 1) else (slice(0, 2), slice(0, 2))
            taps = module.weight[:, :, kept[0], kept[1]].clone()
            module.weight.zero_()
            module.weight[:, :, kept[0], kept[1]] = taps
    return _encoder_without_attention(vae)


@pytest.mark.parametrize("image_hw", [(128, 128), (80, 104)])  # one tile, and an image smaller than the tile
def test_one_tile_encode_is_exactly_the_plain_encode(image_hw):
    vae = random_vae(WanVAEConfig(dim=8, num_res_blocks=1), seed=3)
    image = torch.rand(1, 3, *image_hw, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.equal(encode_tiled(vae, image, tile_px=128, overlap_px=32), vae.encode(image))


@pytest.mark.parametrize(
    ("config", "overlap_latent"),
    [(WanVAEConfig(dim=8, num_res_blocks=1), 2),
     (WanVAEConfig(dim=8, dim_mult=(1, 2, 2), num_res_blocks=1), 2),
     (WanVAEConfig(dim=8, dim_mult=(1, 2, 2), num_res_blocks=1), 0)],  # fmt: skip
)
def test_many_tiles_blend_exactly_for_a_blockwise_encoder(config: WanVAEConfig, overlap_latent: int) -> None:
    # As for the decoder: every tile gives the whole-image latent, so a misplaced tile, an uncovered strip or
    # weights not summing to one shows.
    vae = _blockwise(random_vae(config, seed=0))
    s = config.scale_factor
    image = torch.rand(2, 3, 20 * s, 27 * s, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        tiled = encode_tiled(vae, image, tile_px=8 * s, overlap_px=overlap_latent * s)  # 3 x 4 or 5 tiles
        whole = vae.encode(image)
    assert tiled.shape == whole.shape == (2, 16, 20, 27)
    assert (tiled - whole).abs().max().item() < 1e-5


def test_encoder_tiles_are_the_whole_image_away_from_the_overlap_but_for_the_global_attention(tiny_set):
    # A 48x512 strip in tiles of 40 latent pixels overlapping by 8: latent columns [0, 24) and [40, 64) lie in
    # one tile each, at least 16 latent pixels from its inner edge, past the convolutions' reach. There the
    # attention-free encoder gives the one-piece latent; the real one does not, anywhere: its middle attention
    # mixes every latent pixel of the tile it sees.
    image = F.interpolate(varied_images(1, 512), size=(48, 512), mode="bilinear")
    away = lambda d: torch.cat([d[..., :24], d[..., 40:]], dim=-1).abs()  # noqa: E731
    for attention in (False, True):
        vae = load_vae(tiny_set.vae, decode_only=False)
        vae = vae if attention else _encoder_without_attention(vae)
        with torch.no_grad():
            difference = encode_tiled(vae, image, tile_px=320, overlap_px=64) - vae.encode(image)
        if attention:
            assert away(difference).amax(dim=(0, 1, 2)).min() > 1e-3  # every latent column differs
        else:
            assert away(difference).max() < 1e-5
            assert difference[..., 24:40].abs().max() > 1e-3  # the tiles really were encoded apart


def test_2x2_tiles_of_a_real_picture_come_close_to_the_one_piece_encode(tiny_set):
    # 112 px in 64-px tiles overlapping by 16: 14x14 latent pixels in 8x8 tiles. Tiles see zero padding where the
    # whole image goes on, and the middle attention sees one tile, not the image: measured cosine 0.9955 and an RMS
    # difference 0.095 of the latent's RMS on this VAE (the demo VAE: 0.991-0.993; 0.9996 for 960 px in 512-px tiles).
    vae = load_vae(tiny_set.vae, decode_only=False)
    image = varied_images(1, 112)
    with torch.no_grad():
        tiled, whole = encode_tiled(vae, image, tile_px=64, overlap_px=16), vae.encode(image)
    cosine = float(tiled.flatten() @ whole.flatten() / (tiled.norm() * whole.norm()))
    assert cosine > 0.99
    assert float((tiled - whole).pow(2).mean().sqrt() / whole.pow(2).mean().sqrt()) < 0.15


@pytest.mark.parametrize(
    ("shape", "tile_px", "overlap_px", "message"),
    [((1, 3, 64, 64), 500, 64, "multiples of 8"), ((1, 3, 64, 64), 64, 64, "smaller than the tile"),
     ((1, 3, 60, 64), 32, 8, "image size 60x64 is not a multiple of the VAE's scale 8")],  # fmt: skip
)
def test_bad_encode_options_are_user_errors(shape, tile_px, overlap_px, message):
    vae = random_vae(WanVAEConfig(dim=8, num_res_blocks=1), seed=5)
    with pytest.raises(AnimaError, match=message):
        encode_tiled(vae, torch.zeros(shape), tile_px=tile_px, overlap_px=overlap_px)


# ---- the encoder's memory estimate -------------------------------------------------------------------------------

def torch_peak_bytes(run) -> int:
    """The most bytes of tensors alive at once while `run()` runs, from torch's profiler (its allocation events)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    live = peak = 0
    for _, change in events:
        live += change
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize(("dim", "px", "tile"), [(16, 768, 0), (96, 256, 0), (16, 448, 256)])
def test_the_encode_estimate_is_above_the_measured_peak(dim, px, tile):
    """The estimate against the peak of torch's own allocations, which is exact and the same on every run; the
    process's peak RSS above it (allocator, thread pools) is what benchmarks/vae_memory.py measures and the fit's
    margin covers (README). At 768 px the middle attention's 729 MiB dominate: there the estimate is close."""
    vae = WanVAE(WanVAEConfig(dim=dim)).eval()
    image = torch.rand(1, 3, px, px, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        peak = torch_peak_bytes(lambda: vae.encode(image) if tile == 0 else encode_tiled(vae, image, tile, 64))
    estimate = encode_bytes(vae.config, px, px) if tile == 0 else tiled_encode_bytes(vae.config, px, px, tile)
    assert peak < estimate
    if tile == 0 and dim == 16:
        assert estimate < 1.5 * peak  # 749 MiB measured, 1.29x


def test_encode_memory_grows_with_the_square_of_the_pixels():
    assert encode_bytes(REAL_VAE, 2048, 2048) > 32 * GIB  # the middle attention's 65536^2 matrices
    assert encode_bytes(REAL_VAE, 1024, 1024) < 4 * GIB
    assert tiled_encode_bytes(REAL_VAE, 2048, 2048, 512) < 1 * GIB


@pytest.mark.parametrize("mode, size, available, expected", [
    ("auto", 1024, 8 * GIB, None),
    ("auto", 2048, 8 * GIB, 512),
    ("auto", 2048, None, None),
    ("on", 1024, 8 * GIB, 512),
    ("on", 256, 8 * GIB, None),
    ("off", 1024, 8 * GIB, None),
])
def test_plan_encode(mode, size, available, expected):
    assert plan_encode_tiling(REAL_VAE, size, size, mode, 512, available) == expected


@pytest.mark.parametrize("mode, tile, pattern", [
    ("off", 512, "^encoding 4096x4096 in one piece needs about .* GiB, but only 2.0 GiB .* use --vae-tiling$"),
    ("auto", 4096, "^encoding 4096x4096 in one piece needs"),
    ("on", 2048, "^encoding 4096x4096 in 2048-px tiles needs .* use a smaller --vae-tile-size$"),
    ("sometimes", 512, "unknown VAE tiling mode 'sometimes'"),
])
def test_an_encode_that_cannot_fit_is_refused_up_front(mode, tile, pattern):
    with pytest.raises(AnimaError, match=pattern):
        plan_encode_tiling(REAL_VAE, 4096, 4096, mode, tile, 2 * GIB)
