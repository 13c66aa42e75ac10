"""Tiled VAE decoding: bounded memory (and fixed tile shapes for accelerators) for large images.

Tiles are all `tile_px` square (the last one in a row or column is shifted back to end at the image
edge instead of being cut short) and are blended with linear ramps over `overlap_px` pixels on the
sides that face another tile; dividing by the summed weights makes any overlap blend correctly.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import AnimaError
from .wan import WanVAE, WanVAEConfig

TILING_MODES = ("auto", "on", "off")
# Fitted on this project's decoder (benchmarks/vae_memory.py, figures in the README): the middle attention
# materialises two n x n float32 matrices over the n latent pixels, and the full-resolution stage holds about
# seven `dim`-channel float32 images. Errs on the high side: 1.1-1.9x the measured peak from 512x512 up.
_ATTENTION_COPIES, _FULL_RES_COPIES, _OVERHEAD_BYTES = 2, 7, 128 << 20
# A tiled decode also holds the float32 RGB image, the weight sum and the blend's temporaries.
_TILED_BYTES_PER_PIXEL = 32
# Decode in one piece only while the estimate leaves this share of the available memory free.
_AUTO_SHARE = 0.75


def decode_bytes(config: WanVAEConfig, width: int, height: int) -> int:
    """Estimated peak memory of decoding one width x height image in one piece."""
    latent_pixels = (width // config.scale_factor) * (height // config.scale_factor)
    attention = _ATTENTION_COPIES * 4 * latent_pixels**2
    return attention + _FULL_RES_COPIES * 4 * config.dim * width * height + _OVERHEAD_BYTES


def tiled_decode_bytes(config: WanVAEConfig, width: int, height: int, tile_px: int) -> int:
    """Estimated peak memory of decoding in tiles of `tile_px`: one tile's decode plus the blended image."""
    return (decode_bytes(config, min(tile_px, width), min(tile_px, height))
            + _TILED_BYTES_PER_PIXEL * width * height)


def plan_tiling(config: WanVAEConfig, width: int, height: int, mode: str, tile_px: int,
                available: int | None) -> int | None:
    """The tile size to decode with (None: one piece). "auto" tiles when one piece would not fit comfortably
    in `available` bytes; any plan that cannot fit is refused now, before minutes of denoising."""
    if mode not in TILING_MODES:
        raise AnimaError(f"unknown VAE tiling mode {mode!r}; choose one of {', '.join(TILING_MODES)}")
    whole = decode_bytes(config, width, height)
    if mode == "auto":
        mode = "on" if available is not None and whole > _AUTO_SHARE * available else "off"
    tile = None if mode == "off" or tile_px >= max(width, height) else tile_px
    need = whole if tile is None else tiled_decode_bytes(config, width, height, tile)
    if available is not None and need > available:
        how = "in one piece" if tile is None else f"in {tile}-px tiles"
        raise AnimaError(f"decoding {width}x{height} {how} needs about {need / 2**30:.1f} GiB, but only "
                         f"{available / 2**30:.1f} GiB of memory is available: "
                         + ("use --vae-tiling" if tile is None else "use a smaller --vae-tile-size"))
    return tile


def _tile_starts(length: int, tile: int, overlap: int) -> list[int]:
    if length <= tile:
        return [0]
    return [*range(0, length - tile, tile - overlap), length - tile]


def tiled_pixels(width: int, height: int, tile_px: int, overlap_px: int) -> int:
    """Pixels the decoder computes for a width x height image in `tile_px` tiles: every tile whole, overlaps
    computed once per tile that covers them (the decoder's work grows with this)."""
    rows, cols = _tile_starts(height, tile_px, overlap_px), _tile_starts(width, tile_px, overlap_px)
    return len(rows) * min(tile_px, height) * len(cols) * min(tile_px, width)


def _feather(start: int, size: int, total: int, ramp: int) -> Tensor:
    """1-D blend weights of one tile: rising over `ramp` pixels at each side that is not the image edge."""
    weights = torch.ones(size)
    if ramp:
        rise = torch.arange(1, ramp + 1, dtype=torch.float32) / (ramp + 1)
        if start > 0:
            weights[:ramp] *= rise
        if start + size < total:
            weights[-ramp:] *= rise.flip(0)
    return weights


def decode_tiled(vae: WanVAE, z: Tensor, tile_px: int = 512, overlap_px: int = 64) -> Tensor:
    """Decode a normalised latent [B, z, h, w] tile by tile; same result as `vae.decode` for one tile."""
    s = vae.scale_factor
    if tile_px <= 0 or overlap_px < 0 or tile_px % s or overlap_px % s:
        raise AnimaError(f"VAE tile size and overlap must be multiples of {s} pixels, got {tile_px} and {overlap_px}")
    if overlap_px >= tile_px:
        raise AnimaError(f"VAE tile overlap ({overlap_px} px) must be smaller than the tile ({tile_px} px)")
    tile, overlap = tile_px // s, overlap_px // s
    height, width = z.shape[-2:]
    rows, cols = _tile_starts(height, tile, overlap), _tile_starts(width, tile, overlap)
    if len(rows) == 1 and len(cols) == 1:
        return vae.decode(z)

    tile_h, tile_w = min(tile, height), min(tile, width)
    image = torch.zeros(z.shape[0], 3, height * s, width * s, device=z.device)
    weight_sum = torch.zeros(height * s, width * s, device=z.device)
    for y in rows:
        weight_y = _feather(y * s, tile_h * s, height * s, overlap_px).to(z.device)
        for x in cols:
            weight_x = _feather(x * s, tile_w * s, width * s, overlap_px).to(z.device)
            weights = weight_y[:, None] * weight_x[None, :]
            decoded = vae.decode(z[..., y : y + tile_h, x : x + tile_w])
            region = (slice(y * s, (y + tile_h) * s), slice(x * s, (x + tile_w) * s))
            image[(..., *region)] += decoded * weights
            weight_sum[region] += weights
    return image / weight_sum
