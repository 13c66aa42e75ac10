"""Tiled VAE decoding and encoding: bounded memory (and fixed tile shapes for accelerators) for large images.

Tiles are all `tile_px` square (the last one in a row or column is shifted back to end at the image
edge instead of being cut short) and are blended with linear ramps over `overlap_px` pixels on the
sides that face another tile; dividing by the summed weights makes any overlap blend correctly. A decode and an
encode cut the image at the same places; the decode blends RGB tiles over `overlap_px` pixels, the encode blends
latent tiles over `overlap_px / s` latent pixels (one latent pixel is s image pixels).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
from torch import Tensor

from ..errors import AnimaError
from .wan import WanVAE, WanVAEConfig

TILING_MODES = ("auto", "on", "off")
# Fitted on this project's decoder (benchmarks/vae_memory.py, figures in the README): the middle attention
# materialises two n x n float32 matrices over the n latent pixels, and the full-resolution stage holds about
# seven `dim`-channel float32 images. Errs on the high side: 1.1-2.2x the measured peak from 512x512 up (the
# benchmark resetting the peak before each decode; below that the full width measures 0.94x at 256x256).
_ATTENTION_COPIES, _FULL_RES_COPIES, _OVERHEAD_BYTES = 2, 7, 128 << 20
# A tiled decode also holds the float32 RGB image, the weight sum and the blend's temporaries.
_TILED_BYTES_PER_PIXEL = 32
# Fitted on this project's encoder the same way (benchmarks/vae_memory.py --parts encode, README): its middle
# attention holds 9 bytes per entry of the n x n matrix (torch's math attention: two float32 matrices and the
# bool mask of its safe softmax; 2.26-2.28 copies of float32 measured on the attention alone), the full-resolution
# stage about three `dim`-channel float32 images. Errs on the high side: 1.03-1.5x the measured peak from
# 512x512 up (dims 16, 32 and 96, up to 1536x1536), closest where the attention dominates.
_ENCODE_ATTENTION_BYTES, _ENCODE_FULL_RES_COPIES, _ENCODE_OVERHEAD_BYTES = 9, 3, 128 << 20
# A tiled encode also holds the float32 image it cuts, the blended latent, its weight sum and their temporaries.
_TILED_ENCODE_BYTES_PER_PIXEL = 16
# Decode (encode) in one piece only while the estimate leaves this share of the available memory free.
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


def encode_bytes(config: WanVAEConfig, width: int, height: int) -> int:
    """Estimated peak memory of encoding one width x height image in one piece."""
    latent_pixels = (width // config.scale_factor) * (height // config.scale_factor)
    attention = _ENCODE_ATTENTION_BYTES * latent_pixels**2
    return attention + _ENCODE_FULL_RES_COPIES * 4 * config.dim * width * height + _ENCODE_OVERHEAD_BYTES


def tiled_encode_bytes(config: WanVAEConfig, width: int, height: int, tile_px: int) -> int:
    """Estimated peak memory of encoding in tiles of `tile_px`: one tile's encode plus the image and blended latent."""
    return (encode_bytes(config, min(tile_px, width), min(tile_px, height))
            + _TILED_ENCODE_BYTES_PER_PIXEL * width * height)


def plan_tiling(config: WanVAEConfig, width: int, height: int, mode: str, tile_px: int,
                available: int | None) -> int | None:
    """The tile size to decode with (None: one piece). "auto" tiles when one piece would not fit comfortably
    in `available` bytes; any plan that cannot fit is refused now, before minutes of denoising."""
    return _plan(decode_bytes, tiled_decode_bytes, "decoding", config, width, height, mode, tile_px, available)


def plan_encode_tiling(config: WanVAEConfig, width: int, height: int, mode: str, tile_px: int,
                       available: int | None) -> int | None:
    """The tile size to encode a width x height image with (None: one piece), decided as plan_tiling decides
    the decode's, from the encoder's own estimate."""
    return _plan(encode_bytes, tiled_encode_bytes, "encoding", config, width, height, mode, tile_px, available)


def _plan(whole_bytes: Callable[[WanVAEConfig, int, int], int],
          tiled_bytes: Callable[[WanVAEConfig, int, int, int], int], verb: str, config: WanVAEConfig, width: int,
          height: int, mode: str, tile_px: int, available: int | None) -> int | None:
    if mode not in TILING_MODES:
        raise AnimaError(f"unknown VAE tiling mode {mode!r}; choose one of {', '.join(TILING_MODES)}")
    whole = whole_bytes(config, width, height)
    if mode == "auto":
        mode = "on" if available is not None and whole > _AUTO_SHARE * available else "off"
    tile = None if mode == "off" or tile_px >= max(width, height) else tile_px
    need = whole if tile is None else tiled_bytes(config, width, height, tile)
    if available is not None and need > available:
        how = "in one piece" if tile is None else f"in {tile}-px tiles"
        raise AnimaError(f"{verb} {width}x{height} {how} needs about {need / 2**30:.1f} GiB, but only "
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


class TileEncoder(Protocol):
    """What encode_tiled needs of an encoder: WanVAE, or a backend's fixed-shape tile (engine.vae_tiles)."""

    scale_factor: int

    def encode(self, image: Tensor) -> Tensor: ...


def decode_tiled(vae: WanVAE, z: Tensor, tile_px: int = 512, overlap_px: int = 64) -> Tensor:
    """Decode a normalised latent [B, z, h, w] tile by tile; same result as `vae.decode` for one tile."""
    s = vae.scale_factor
    _check_tiles(s, tile_px, overlap_px)
    return _tiled(vae.decode, z, z.shape[-2], z.shape[-1], tile_px // s, overlap_px // s, 1, s, overlap_px)


def encode_tiled(encoder: TileEncoder, image: Tensor, tile_px: int = 512, overlap_px: int = 64) -> Tensor:
    """Encode an image [B, 3, H, W] in [0, 1] tile by tile into its normalised latent [B, z, H/s, W/s]; same
    result as `encoder.encode` for one tile. The tiles are cut where decode_tiled cuts them and blended in latent
    space over overlap_px / s latent pixels.

    Not the one-piece encode for several tiles, and not only at the seams: the encoder's middle attention is
    global, so every latent pixel of a tile depends on the whole tile (tests/vae/test_tiling.py measures how close
    2x2 tiles come)."""
    s = encoder.scale_factor
    _check_tiles(s, tile_px, overlap_px)
    height, width = image.shape[-2:]
    if height % s or width % s:
        raise AnimaError(f"image size {height}x{width} is not a multiple of the VAE's scale {s}")
    return _tiled(encoder.encode, image, height // s, width // s, tile_px // s, overlap_px // s, s, 1,
                  overlap_px // s)


def _check_tiles(s: int, tile_px: int, overlap_px: int) -> None:
    if tile_px <= 0 or overlap_px < 0 or tile_px % s or overlap_px % s:
        raise AnimaError(f"VAE tile size and overlap must be multiples of {s} pixels, got {tile_px} and {overlap_px}")
    if overlap_px >= tile_px:
        raise AnimaError(f"VAE tile overlap ({overlap_px} px) must be smaller than the tile ({tile_px} px)")


def _tiled(run: Callable[[Tensor], Tensor], x: Tensor, height: int, width: int, tile: int, overlap: int,
           step_in: int, step_out: int, ramp: int) -> Tensor:
    """`run` on the tiles of `x` and their results blended. Tiles are cut on the latent grid (height x width
    latent pixels, tiles of `tile` overlapping by `overlap`): one latent pixel is `step_in` pixels of x and
    `step_out` pixels of the result, whose tiles are feathered over `ramp` of its pixels."""
    rows, cols = _tile_starts(height, tile, overlap), _tile_starts(width, tile, overlap)
    if len(rows) == 1 and len(cols) == 1:
        return run(x)

    tile_h, tile_w = min(tile, height), min(tile, width)
    out: Tensor | None = None
    weight_sum = torch.zeros(height * step_out, width * step_out, device=x.device)
    for y in rows:
        weight_y = _feather(y * step_out, tile_h * step_out, height * step_out, ramp).to(x.device)
        for x0 in cols:
            weight_x = _feather(x0 * step_out, tile_w * step_out, width * step_out, ramp).to(x.device)
            weights = weight_y[:, None] * weight_x[None, :]
            done = run(x[..., y * step_in : (y + tile_h) * step_in, x0 * step_in : (x0 + tile_w) * step_in])
            if out is None:
                out = torch.zeros(x.shape[0], done.shape[1], height * step_out, width * step_out, device=x.device)
            region = (slice(y * step_out, (y + tile_h) * step_out), slice(x0 * step_out, (x0 + tile_w) * step_out))
            out[(..., *region)] += done * weights
            weight_sum[region] += weights
    assert out is not None  # two tiles at least
    return out / weight_sum
