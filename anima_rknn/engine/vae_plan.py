"""How a run's latent becomes its picture, and an image its latent: the VAE backend and the tiles, decided once
from the run's VAE settings, the VAE set's manifest and the free memory (pipeline.prepare() makes the plan, and
decode and encode follow it). --vae-backend auto is resolved here (engine/vae_auto.py probes)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Protocol

from ..core.cpu_speed import AUTO
from ..core.memory import available_bytes
from ..errors import AnimaError
from ..vae.wan import WanVAEConfig
from ..vae.tiling import plan_encode_tiling, plan_tiling
from .backends.rknn import RknnOptions, check_runtime
from .vae_auto import choose_vae_backend
from .vae_tiles import vae_set_manifest


@dataclasses.dataclass(frozen=True)
class DecodePlan:
    """How a run's latent becomes its image, fixed by prepare() before any denoising: in one piece (tile None)
    or in `tile`-px tiles overlapping by `overlap`, on `backend` (torch, or onnx / rknn running the VAE set in
    `subgraphs`); never auto, which plan_decode() resolves. An image-to-image run encodes on the same backend."""

    tile: int | None = None
    overlap: int = 64
    backend: str = "torch"
    subgraphs: Path | None = None
    encode_tile: int | None = None  # an init image's encode, in these tiles (None: one piece, or no encode)


class VaeSettings(Protocol):
    """A run's VAE settings (generation.params.GenerationParams has them)."""

    vae_backend: str
    vae_subgraphs: Path | None
    vae_tiling: str
    vae_tile: int
    vae_overlap: int
    rknn: RknnOptions


def plan_decode(vae: Path, config: WanVAEConfig, settings: VaeSettings, width: int, height: int) -> DecodePlan:
    """How a width x height picture decodes with the VAE file `vae`; what cannot fit or run is refused now."""
    if settings.vae_backend == AUTO:
        torch_tile = plan_tiling(config, width, height, settings.vae_tiling, settings.vae_tile, available_bytes())
        backend, subgraphs = choose_vae_backend(vae, width, height, settings.vae_tile, settings.vae_overlap,
                                                tiling=settings.vae_tiling != "off", torch_tile=torch_tile)
        # onnx runs its set's tiles (an image of one tile is one tile): less memory than torch's plan.
        return DecodePlan(torch_tile if backend == "torch" else settings.vae_tile, settings.vae_overlap, backend,
                          subgraphs)
    vae_set = vae_set_manifest(settings.vae_backend, settings.vae_subgraphs, vae, width, height)
    if settings.vae_backend == "rknn":  # refused now, not after the denoising, where there is no NPU runtime
        check_runtime(vae_set["rknn"], settings.rknn.runtime)
    if vae_set is not None and vae_set["tile"] != settings.vae_tile:
        raise AnimaError(f"the VAE set in {settings.vae_subgraphs} decodes {vae_set['tile']}-px tiles, asked for "
                         f"{settings.vae_tile}: set the tile to {vae_set['tile']} (--vae-tile-size; a request's "
                         "vae_tile) or export another set")
    tile = plan_tiling(config, width, height, "on" if vae_set is not None else settings.vae_tiling,
                       settings.vae_tile, available_bytes())
    return DecodePlan(tile, settings.vae_overlap, settings.vae_backend, settings.vae_subgraphs)


def plan_encode(vae: Path, config: WanVAEConfig, settings: VaeSettings, plan: DecodePlan, width: int,
                height: int) -> int | None:
    """The tile a width x height image encodes in on the plan's backend (None: one piece, on torch)."""
    if plan.backend == "torch":
        return plan_encode_tiling(config, width, height, settings.vae_tiling, settings.vae_tile, available_bytes())
    return vae_set_manifest(plan.backend, plan.subgraphs, vae, width, height, encoder=True)["tile"]
