"""Accuracy of a converted VAE decoder set against the fp32 torch decoder, on the latents of real pictures.

Both sides decode through the same host tiling and blending (vae.tiling.decode_tiled): torch runs its own
module on each tile, the set runs its .rknn tile (the simulator's NPU fp16 numerics on x86), so what differs
is the tile's arithmetic alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import AnimaError
from ..export.vae import check_image_fits, load_vae_set
from ..vae import decode_tiled
from ..vae.rescale import picture_latents
from .backends.rknn import RknnBackend
from .vae_tiles import BackendTileDecoder

DEFAULT_MIN_PSNR = 40.0  # dB, decoded 8-bit image vs fp32 torch


@dataclass(frozen=True)
class ImageAccuracy:
    index: int
    cosine: float  # of the float pixels
    psnr: float  # dB, of the 8-bit images
    max_abs_error: float  # of the float pixels in [0, 1]


def to_uint8(pixels: torch.Tensor) -> np.ndarray:
    """[1, 3, H, W] in [0, 1] -> uint8 [H, W, 3], rounded as the pipeline writes its PNGs; NaN counts as black,
    so an overflowed decode scores a low PSNR (its cosine stays NaN and is flagged)."""
    pixels = torch.nan_to_num(pixels[0], nan=0.0)
    return (pixels.permute(1, 2, 0).clamp(0, 1).numpy() * 255).round().astype(np.uint8)


def psnr_uint8(reference: np.ndarray, other: np.ndarray) -> float:
    """PSNR in dB of two 8-bit images (inf when identical). bench.metrics has the same on scikit-image, which
    the RKNN environment lacks."""
    mse = float(np.mean((reference.astype(np.float64) - other.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255**2 / mse)


def verify_vae_set(set_dir: Path, vae_path: Path, *, side: int | None = None, count: int = 2, seed: int = 0,
                   runtime: str = "auto") -> list[ImageAccuracy]:
    """Decode `count` pictures of `side` px (default: one tile) with the set and with fp32 torch, tiled alike."""
    manifest = load_vae_set(set_dir, vae_path=vae_path, converted=True)
    tile, overlap = manifest["tile"], manifest["overlap"]
    side = tile if side is None else side
    if side % 16:
        raise AnimaError(f"the verification image size must be a multiple of 16, got {side}")
    check_image_fits(manifest, side, side)
    vae, latents = picture_latents(vae_path, count, side, seed)
    decoder = BackendTileDecoder(RknnBackend(set_dir, runtime=runtime), manifest)
    results = []
    try:
        for index, z in enumerate(latents):
            with torch.no_grad():
                want = decode_tiled(vae, z[None], tile, overlap)
                got = decode_tiled(decoder, z[None], tile, overlap)
            g, w = got.double().ravel(), want.double().ravel()
            cosine = float(g @ w / max(float(g.norm() * w.norm()), np.finfo(np.float64).tiny))
            results.append(ImageAccuracy(index, cosine, psnr_uint8(to_uint8(want), to_uint8(got)),
                                         float((g - w).abs().max())))
    finally:
        decoder.close()
    return results
