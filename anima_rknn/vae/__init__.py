"""Wan 2.1 / Qwen-Image VAE (single-image 2-D form), its checkpoint format, and tiled decoding."""

from .io import file_shapes, load_vae, random_vae, read_vae_config, save_vae
from .tiling import decode_tiled
from .wan import WAN21_LATENTS_MEAN, WAN21_LATENTS_STD, WanVAE, WanVAEConfig

__all__ = [
    "WAN21_LATENTS_MEAN",
    "WAN21_LATENTS_STD",
    "WanVAE",
    "WanVAEConfig",
    "decode_tiled",
    "file_shapes",
    "load_vae",
    "random_vae",
    "read_vae_config",
    "save_vae",
]
