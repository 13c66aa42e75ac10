"""The VAE's fixed-shape tiles on an accelerator backend (ONNX Runtime, RKNN): the decoder's, and the encoder's.

The backend runs the exported decoder on one latent tile (the encoder on one image tile); everything else stays on
the host: cutting the latent (the image) into tiles and the feathered blending (vae.tiling.decode_tiled,
encode_tiled), so every image size that is a multiple of 16 and at least one tile decodes (encodes) with the one
tile shape the set was exported for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..core.cpu_speed import AUTO
from ..errors import AnimaError
from ..export.manifest import VAE_DECODER_KIND, VAE_ENCODER_KIND, VAE_KINDS, vae_entry
from ..export.vae import check_image_fits, load_vae_set, no_encoder_message
from .backends.base import Backend
from .backends.onnx import OnnxBackend
from .backends.rknn import RknnBackend, RknnOptions

VAE_BACKENDS = (AUTO, "torch", "onnx", "rknn")  # auto: torch or onnx, whichever decodes faster here (vae_auto)
# A run's VAE tile and overlap in pixels when it names none and has no VAE set (a set's are its own: vae_plan).
DEFAULT_VAE_TILE, DEFAULT_VAE_OVERLAP = 512, 64
ENCODER_INDEX = VAE_KINDS.index(VAE_ENCODER_KIND)  # the encoder's subgraph index in a set that has one


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


class BackendTileEncoder:
    """A backend's encoder tile, shaped like WanVAE where encode_tiled uses it (`encode`, `scale_factor`).

    `index` is the encoder's subgraph index in the backend: the set's own (1) for RKNN, which opens only the
    contexts it runs, 0 for an OnnxBackend given the encoder's entry alone (open_tile_encoder)."""

    def __init__(self, backend: Backend, manifest: dict[str, Any], index: int = ENCODER_INDEX) -> None:
        entry = vae_entry(manifest, VAE_ENCODER_KIND)
        if entry is None:
            raise AnimaError("the VAE set has no encoder: export it again with `anima-rknn export-vae --encoder`")
        self.backend, self.index = backend, index
        self.scale_factor = manifest["model"]["scale_factor"]
        self.tile = manifest["tile"]
        self.image_shape = tuple(entry["inputs"][0]["shape"])

    def encode(self, image: torch.Tensor) -> torch.Tensor:
        """One image tile [1, 3, t, t] in [0, 1] -> its normalised latent tile [1, z, t/s, t/s], float32."""
        if tuple(image.shape) != self.image_shape:
            raise AnimaError(f"the VAE set encodes image tiles of shape {list(self.image_shape)} "
                             f"({self.tile}x{self.tile} px), got {list(image.shape)}")
        latent = self.backend.run(self.index, {"image": image.float().numpy()})
        return torch.from_numpy(np.asarray(latent, dtype=np.float32))

    def close(self) -> None:
        self.backend.close()


def vae_set_manifest(vae_backend: str, vae_subgraphs: Path | None, vae_path: Path, width: int,
                     height: int, encoder: bool = False) -> dict[str, Any] | None:
    """The checked manifest of the VAE set a run decodes with (None for torch, which needs none): made from
    this VAE file, its tile inside the width x height image; with `encoder` (image-to-image), the set must hold the
    encoder too. Cheap to repeat (hashes are cached). `vae_backend` is never AUTO here: the pipeline resolves it
    first."""
    if vae_backend not in VAE_BACKENDS or vae_backend == AUTO:
        raise AnimaError(f"unknown VAE backend {vae_backend!r}; choose one of {', '.join(VAE_BACKENDS[1:])}")
    if vae_backend == "torch":
        return None
    if vae_subgraphs is None:
        raise AnimaError(f"the {vae_backend} VAE backend needs an exported VAE set (--vae-subgraphs DIR)")
    manifest = load_vae_set(Path(vae_subgraphs), vae_path=vae_path, converted=vae_backend == "rknn", encoder=encoder)
    check_image_fits(manifest, width, height)
    return manifest


def _alone(manifest: dict[str, Any], kind: str) -> dict[str, Any]:
    """The manifest with the `kind` subgraph alone: OnnxBackend opens a session for every entry it is given."""
    return {**manifest, "subgraphs": [vae_entry(manifest, kind)]}


def open_tile_decoder(vae_backend: str, vae_subgraphs: Path, manifest: dict[str, Any],
                      rknn: RknnOptions = RknnOptions()) -> BackendTileDecoder:
    """The tile decoder of a set checked by vae_set_manifest. The rknn backend opens its one context on the
    first tile; the VAE runs after the DiT's contexts are closed, so it can take their place."""
    if vae_backend == "onnx":
        backend: Backend = OnnxBackend(Path(vae_subgraphs), _alone(manifest, VAE_DECODER_KIND))
    elif vae_backend == "rknn":
        backend = RknnBackend(vae_subgraphs, runtime=rknn.runtime, core_mask=rknn.core_mask)
    else:
        raise AnimaError(f"the {vae_backend!r} VAE backend runs no exported set")
    return BackendTileDecoder(backend, manifest)


def open_tile_encoder(vae_backend: str, vae_subgraphs: Path, manifest: dict[str, Any],
                      rknn: RknnOptions = RknnOptions()) -> BackendTileEncoder:
    """The tile encoder of a set checked by vae_set_manifest(..., encoder=True). On rknn it is the same converted
    set's second model: RknnBackend opens a context for the subgraphs it runs only, so this one holds the encoder's
    context alone (opened on the first tile), never the decoder's."""
    if vae_entry(manifest, VAE_ENCODER_KIND) is None:
        raise AnimaError(no_encoder_message(Path(vae_subgraphs), converted=vae_backend == "rknn"))
    if vae_backend == "onnx":
        return BackendTileEncoder(OnnxBackend(Path(vae_subgraphs), _alone(manifest, VAE_ENCODER_KIND)), manifest,
                                  index=0)
    if vae_backend == "rknn":
        backend = RknnBackend(vae_subgraphs, runtime=rknn.runtime, core_mask=rknn.core_mask)
        return BackendTileEncoder(backend, manifest)
    raise AnimaError(f"the {vae_backend!r} VAE backend runs no exported set")
