"""How a run's latent becomes its picture, and an image its latent: the VAE backend and the tiles, decided once
from the run's VAE settings, the VAE set's manifest and the free memory (pipeline.prepare() makes the plan, and
decode and encode follow it). --vae-backend auto is resolved here (engine/vae_auto.py probes), and so is the tile
a run leaves unset: its VAE set's, whichever front end started the run."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Protocol

from ..core.cpu_speed import AUTO
from ..core.memory import available_bytes
from ..errors import AnimaError
from ..export.manifest import read_manifest
from ..vae.tiling import plan_encode_tiling, plan_tiling
from ..vae.wan import WanVAEConfig
from .backends.rknn import RknnOptions, check_runtime
from .vae_auto import choose_vae_backend
from .vae_tiles import DEFAULT_VAE_OVERLAP, DEFAULT_VAE_TILE, vae_set_manifest


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
    vae_tile: int | None  # None: the VAE set's, else DEFAULT_VAE_TILE (vae_tiles() decides)
    vae_overlap: int | None
    rknn: RknnOptions


def vae_tiles(settings: VaeSettings) -> tuple[int, int]:
    """The run's VAE tile and overlap: those given, else the VAE set's (export-vae made its tiles for them), else
    the defaults. One given that is not the set's is refused: the set decodes no other tile."""
    if settings.vae_subgraphs is None:
        return (DEFAULT_VAE_TILE if settings.vae_tile is None else settings.vae_tile,
                DEFAULT_VAE_OVERLAP if settings.vae_overlap is None else settings.vae_overlap)
    manifest = read_manifest(settings.vae_subgraphs, kind="vae")
    for label, given, made, where in (("tile size", settings.vae_tile, manifest["tile"], "--vae-tile-size; a "
                                       "request's vae_tile"),
                                      ("tile overlap", settings.vae_overlap, manifest["overlap"], "--vae-tile-overlap; "
                                       "a request's vae_overlap")):
        if given is not None and given != made:
            raise AnimaError(f"the VAE set in {settings.vae_subgraphs} was made for VAE {label} {made}, asked for "
                             f"{given}: leave it out ({where}) or export another set")
    return manifest["tile"], manifest["overlap"]


def plan_decode(vae: Path, config: WanVAEConfig, settings: VaeSettings, width: int, height: int) -> DecodePlan:
    """How a width x height picture decodes with the VAE file `vae`; what cannot fit or run is refused now. The
    settings' tile and overlap are vae_tiles()'s (resolved by prepare())."""
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
    tile = plan_tiling(config, width, height, "on" if vae_set is not None else settings.vae_tiling,
                       settings.vae_tile, available_bytes())
    return DecodePlan(tile, settings.vae_overlap, settings.vae_backend, settings.vae_subgraphs)


def plan_encode(vae: Path, config: WanVAEConfig, settings: VaeSettings, plan: DecodePlan, width: int,
                height: int) -> int | None:
    """The tile a width x height image encodes in on the plan's backend (None: one piece, on torch)."""
    if plan.backend == "torch":
        return plan_encode_tiling(config, width, height, settings.vae_tiling, settings.vae_tile, available_bytes())
    return vae_set_manifest(plan.backend, plan.subgraphs, vae, width, height, encoder=True)["tile"]
