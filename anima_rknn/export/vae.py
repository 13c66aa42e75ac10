"""Export the VAE decoder for one fixed latent tile as an ONNX set, with a manifest that pins it down.

The NPU needs static shapes, so the decoder is exported for one tile: normalised latent [1, z, t/s, t/s] in,
RGB [1, 3, t, t] in [0, 1] out, the latent de-normalisation (z * std + mean) and the final clamp inside the
graph. Any image whose sides are multiples of the VAE's scale and at least one tile decodes with it: the host
cuts the latent into tiles of that shape and blends them (vae.tiling.decode_tiled). The set is refused for
another VAE file or another tile size; see manifest.py for the checks of the manifest itself.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import torch

from ..core.files import cached_sha256, write_json
from ..errors import AnimaError
from ..vae import load_vae, read_vae_config
from ..vae.rescale import picture_latents, rescale_stream, stream_peak, stream_scale
from ..vae.wan import WanVAEConfig
from .manifest import (
    MANIFEST,
    MAX_SIDE,
    VAE_DECODER_KIND,
    VAE_FORMAT,
    check_file,
    check_source,
    clear_set_folder,
    open_set_folder,
    read_manifest,
    vae_tile_shapes,
)
from .onnx import OPSET, export_graph, write_graph

DECODER_FILE = "vae_decoder.onnx"
DEFAULT_TILE, DEFAULT_OVERLAP = 512, 64  # the defaults of --vae-tile-size / --vae-tile-overlap
CALIBRATION_PICTURES = 2


def check_tile(config: WanVAEConfig, tile: int, overlap: int) -> None:
    """A tile the decoder can be exported for: a multiple of the VAE's scale, overlap at most half of it."""
    s = config.scale_factor
    if not 0 < tile <= MAX_SIDE or tile % s:
        raise AnimaError(f"the VAE tile must be a positive multiple of the VAE's scale ({s} px) up to {MAX_SIDE}, "
                         f"got {tile}")
    if not 0 <= overlap <= tile // 2 or overlap % s:
        raise AnimaError(f"the VAE tile overlap must be a multiple of {s} px from 0 to half the tile "
                         f"({tile // 2}), got {overlap}")


def check_image_fits(manifest: dict[str, Any], width: int, height: int) -> None:
    """Every tile must lie inside the image: a fixed-shape tile cannot be cut short."""
    tile = manifest["tile"]
    if tile > width or tile > height:
        raise AnimaError(f"the VAE set decodes {tile}x{tile} tiles, larger than the {width}x{height} image: "
                         "export one with a smaller --tile")


def export_vae_decoder(vae_path: Path, out_dir: Path, tile: int = DEFAULT_TILE, overlap: int = DEFAULT_OVERLAP,
                       overwrite: bool = False, rescale: bool = True, calibrate: bool = True) -> Path:
    """Write out_dir/vae_decoder.onnx for `tile`-px tiles and manifest.json; return the manifest's path.

    The residual stream is rescaled for fp16 (vae.rescale) from its peak on the latents of two pictures of one
    tile; `rescale=False` exports the decoder as it is (to measure what the rescaling is for). `calibrate=False`
    skips that measurement (three quarters of the export's time) for a set only ONNX Runtime runs, in fp32, where
    the stream cannot overflow: its manifest says stream_peak null, and convert-rknn refuses it."""
    vae_path, out_dir = Path(vae_path), Path(out_dir)
    if not vae_path.is_file():
        raise AnimaError(f"VAE file not found: {vae_path}")
    check_tile(read_vae_config(vae_path), tile, overlap)
    # before touching out_dir: a bad VAE file leaves it as it was
    peak: float | None = None
    scale = 1.0
    if calibrate:
        vae, latents = picture_latents(vae_path, CALIBRATION_PICTURES, tile)
        peak = stream_peak(vae, latents)
        if not math.isfinite(peak):
            raise AnimaError(f"{vae_path.name} decodes pictures to non-finite values (NaN/Inf): not exported")
        scale = stream_scale(peak) if rescale else 1.0
        if scale != 1.0:
            rescale_stream(vae, scale)
    else:
        vae = load_vae(vae_path, decode_only=True)
    config = vae.config
    open_set_folder(out_dir, overwrite=overwrite, names=[DECODER_FILE])
    clear_set_folder(out_dir, keep=[DECODER_FILE])
    z_shape, image_shape = vae_tile_shapes(config.z_dim, config.scale_factor, tile)
    with warnings.catch_warnings():
        # The latent statistics become graph constants, which is what they are: nothing to warn about.
        warnings.filterwarnings("ignore", message="torch.tensor results are registered as constants")
        graph = export_graph(vae, {"z": z_shape}, torch.float32)
    path = out_dir / DECODER_FILE
    digest = write_graph(graph, path)
    manifest = {
        "format": VAE_FORMAT,
        "model": {"file": vae_path.name, "sha256": cached_sha256(vae_path), "z_dim": config.z_dim,
                  "scale_factor": config.scale_factor},
        "tile": tile, "overlap": overlap, "dtype": "float32", "opset": OPSET,
        "stream_peak": peak, "stream_scale": scale,
        "subgraphs": [{
            "index": 0, "kind": VAE_DECODER_KIND, "file": DECODER_FILE, "sha256": digest,
            "inputs": [{"name": "z", "shape": z_shape, "dtype": "float32"}],
            "outputs": [{"name": "y", "shape": image_shape, "dtype": "float32"}],
        }],
    }
    manifest_path = out_dir / MANIFEST
    write_json(manifest_path, manifest, overwrite=True)
    return manifest_path


def load_vae_set(set_dir: Path, *, vae_path: Path, converted: bool) -> dict[str, Any]:
    """The VAE set's manifest, after checking it was made from `vae_path` (sha256) and its decoder file (the .onnx,
    or the .rknn of a converted set; the simulator's .onnx beside it is hashed when the backend loads it)."""
    set_dir = Path(set_dir)
    manifest = read_manifest(set_dir, kind="vae")
    if converted and "rknn" not in manifest:
        raise AnimaError(f"{set_dir} holds an ONNX VAE decoder, not an .rknn one: convert it with "
                         "`anima-rknn convert-rknn` first")
    check_source(manifest, vae_path, "VAE", f"the VAE set in {set_dir} was")
    # Hashed now, before minutes of denoising: one file (cached per version), not 84 like a DiT set.
    entry = manifest["rknn"]["subgraphs"][0] if converted else manifest["subgraphs"][0]
    file, digest = (entry["rknn_file"], entry["rknn_sha256"]) if converted else (entry["file"], entry["sha256"])
    check_file(set_dir / file, digest)
    return manifest
