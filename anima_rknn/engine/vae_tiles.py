"""The VAE decoder's fixed-shape tiles on an accelerator backend (ONNX Runtime, RKNN).

The backend runs the exported decoder on one latent tile; everything else stays on the host: cutting the
latent into tiles and the feathered blending (vae.tiling.decode_tiled), so every image size that is a
multiple of 16 and at least one tile decodes with the one tile shape the set was exported for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..core.cpu_speed import AUTO
from ..errors import AnimaError
from ..export.vae import check_image_fits, load_vae_set
from .backends.base import Backend
from .backends.onnx import OnnxBackend
from .backends.rknn import RknnBackend, RknnOptions

VAE_BACKENDS = (AUTO, "torch", "onnx", "rknn")  # auto: torch or onnx, whichever decodes faster here (vae_auto)


class BackendTileDecoder:
    """A backend's decoder tile, shaped like WanVAE where decode_tiled uses it (`decode`, `scale_factor`)."""

    def __init__(self, backend: Backend, manifest: dict[str, Any]) -> None:
        self.backend = backend
        self.scale_factor = manifest["model"]["scale_factor"]
        self.tile = manifest["tile"]
        self.latent_shape = tuple(manifest["subgraphs"][0]["inputs"][0]["shape"])

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """One normalised latent tile [1, z, t/s, t/s] -> its RGB tile in [0, 1], float32."""
        if tuple(z.shape) != self.latent_shape:
            raise AnimaError(f"the VAE set decodes latent tiles of shape {list(self.latent_shape)} "
                             f"({self.tile}x{self.tile} px), got {list(z.shape)}")
        return torch.from_numpy(np.asarray(self.backend.run(0, {"z": z.float().numpy()}), dtype=np.float32))

    def close(self) -> None:
        self.backend.close()


def vae_set_manifest(vae_backend: str, vae_subgraphs: Path | None, vae_path: Path, width: int,
                     height: int) -> dict[str, Any] | None:
    """The checked manifest of the VAE set a run decodes with (None for torch, which needs none): made from
    this VAE file, its tile inside the width x height image. Cheap to repeat (hashes are cached). `vae_backend`
    is never AUTO here: the pipeline resolves it first."""
    if vae_backend not in VAE_BACKENDS or vae_backend == AUTO:
        raise AnimaError(f"unknown VAE backend {vae_backend!r}; choose one of {', '.join(VAE_BACKENDS[1:])}")
    if vae_backend == "torch":
        return None
    if vae_subgraphs is None:
        raise AnimaError(f"the {vae_backend} VAE backend needs an exported VAE set (--vae-subgraphs DIR)")
    manifest = load_vae_set(Path(vae_subgraphs), vae_path=vae_path, converted=vae_backend == "rknn")
    check_image_fits(manifest, width, height)
    return manifest


def open_tile_decoder(vae_backend: str, vae_subgraphs: Path, manifest: dict[str, Any],
                      rknn: RknnOptions = RknnOptions()) -> BackendTileDecoder:
    """The tile decoder of a set checked by vae_set_manifest. The rknn backend opens its one context on the
    first tile; the VAE runs after the DiT's contexts are closed, so it can take their place."""
    if vae_backend == "onnx":
        backend: Backend = OnnxBackend(Path(vae_subgraphs), manifest)
    elif vae_backend == "rknn":
        backend = RknnBackend(vae_subgraphs, runtime=rknn.runtime, core_mask=rknn.core_mask)
    else:
        raise AnimaError(f"the {vae_backend!r} VAE backend runs no exported set")
    return BackendTileDecoder(backend, manifest)
