"""Accuracy of a converted VAE set against the fp32 torch VAE: its decoder on the latents of real pictures, its
encoder (where the set has one) on the pictures themselves.

Both sides decode (encode) through the same host tiling and blending (vae.tiling.decode_tiled, encode_tiled):
torch runs its own module on each tile, the set runs its .rknn tile (the simulator's NPU fp16 numerics on x86),
so what differs is the tile's arithmetic alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import AnimaError
from ..export.vae import check_image_fits, load_vae_set
from ..vae import decode_tiled, load_vae
from ..vae.preview import varied_images
from ..vae.rescale import picture_latents
from ..vae.tiling import encode_tiled
from .backends.rknn import RknnBackend
from .vae_tiles import BackendTileDecoder, BackendTileEncoder

DEFAULT_MIN_PSNR = 40.0  # dB, decoded 8-bit image vs fp32 torch


@dataclass(frozen=True)
class ImageAccuracy:
    index: int
    cosine: float  # of the float pixels
    psnr: float  # dB, of the 8-bit images
    max_abs_error: float  # of the float pixels in [0, 1]


@dataclass(frozen=True)
class LatentAccuracy:
    index: int
    cosine: float  # of the latents
    psnr: float  # dB: the fp32 latent's largest |value| over the RMS error (latent_psnr)
    max_abs_error: float  # of the normalised latent (about unit scale)


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


def latent_psnr(reference: torch.Tensor, other: torch.Tensor) -> float:
    """PSNR in dB of a latent against the reference: its largest |value| stands for an image's 255, so 40 dB is an
    RMS error of 1% of the latent's peak (inf when identical, NaN when `other` is not finite)."""
    reference, other = reference.double(), other.double()
    rms = float((other - reference).pow(2).mean().sqrt())
    return math.inf if rms == 0 else 20 * math.log10(float(reference.abs().max()) / rms)


def _cosine(got: torch.Tensor, want: torch.Tensor) -> float:
    g, w = got.double().ravel(), want.double().ravel()
    return float(g @ w / max(float(g.norm() * w.norm()), np.finfo(np.float64).tiny))


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
            results.append(ImageAccuracy(index, _cosine(got, want), psnr_uint8(to_uint8(want), to_uint8(got)),
                                         float((got.double() - want.double()).abs().max())))
    finally:
        decoder.close()
    return results


def verify_vae_encoder(set_dir: Path, vae_path: Path, *, side: int | None = None, count: int = 2, seed: int = 0,
                       runtime: str = "auto") -> list[LatentAccuracy]:
    """Encode `count` varied pictures of `side` px (default: one tile; the same pictures verify_vae_set decodes the
    encodings of) with the set's encoder and with fp32 torch's, tiled alike, and compare the latents."""
    manifest = load_vae_set(set_dir, vae_path=vae_path, converted=True, encoder=True)
    tile, overlap = manifest["tile"], manifest["overlap"]
    side = tile if side is None else side
    if side % 16:
        raise AnimaError(f"the verification image size must be a multiple of 16, got {side}")
    check_image_fits(manifest, side, side)
    vae = load_vae(vae_path, decode_only=False)
    encoder = BackendTileEncoder(RknnBackend(set_dir, runtime=runtime), manifest)
    results = []
    try:
        for index, image in enumerate(varied_images(count, side, seed)):
            with torch.no_grad():
                want = encode_tiled(vae, image[None], tile, overlap)
                got = encode_tiled(encoder, image[None], tile, overlap)
            results.append(LatentAccuracy(index, _cosine(got, want), latent_psnr(want, got),
                                          float((got.double() - want.double()).abs().max())))
    finally:
        encoder.close()
    return results
