"""Export the VAE decoder (and, asked, its encoder) for one fixed tile as an ONNX set, with a manifest that pins it.

The NPU needs static shapes, so the decoder is exported for one tile: normalised latent [1, z, t/s, t/s] in,
RGB [1, 3, t, t] in [0, 1] out, the latent de-normalisation (z * std + mean) and the final clamp inside the
graph. Any image whose sides are multiples of the VAE's scale and at least one tile decodes with it: the host
cuts the latent into tiles of that shape and blends them (vae.tiling.decode_tiled). The encoder (image-to-image)
is the same tile the other way: RGB [1, 3, t, t] in [0, 1] in, the normalised posterior mean [1, z, t/s, t/s]
out, the x * 2 - 1 and the (mu - mean) / std inside the graph, blended by vae.tiling.encode_tiled. Both sit in one
set; a set without the encoder is what export-vae always wrote. The set is refused for another VAE file or
another tile size; see manifest.py for the checks of the manifest itself.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..core.files import cached_sha256, check_space, held_folder, write_json
from ..core.tensorfile import read_shapes
from ..errors import AnimaError
from ..vae import load_vae, read_vae_config
from ..vae.preview import varied_images
from ..vae.rescale import encoder_stream_peak, picture_latents, rescale_stream, stream_peak, stream_scale
from ..vae.wan import WanVAE, WanVAEConfig
from .manifest import (
    MANIFEST,
    MAX_SIDE,
    VAE_DECODER_KIND,
    VAE_ENCODER_KIND,
    VAE_FORMAT,
    check_file,
    check_source,
    clear_set_folder,
    open_set_folder,
    read_manifest,
    vae_entry,
    vae_record,
    vae_tile_shapes,
)
from .onnx import OPSET, export_graph, write_graph

if TYPE_CHECKING:
    import onnx

DECODER_FILE = "vae_decoder.onnx"
ENCODER_FILE = "vae_encoder.onnx"
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


def has_encoder(vae_path: Path) -> bool:
    """Whether a VAE file holds the encoder's weights (a decode-only file does not), from its header alone."""
    return "encoder.conv1.weight" in read_shapes(vae_path, "VAE")


class _Encoder(torch.nn.Module):
    """WanVAE.encode as a module's forward, so it exports as the graph."""

    def __init__(self, vae: WanVAE) -> None:
        super().__init__()
        self.vae = vae

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.vae.encode(image)


def _calibrated_encoder(vae_path: Path, tile: int, rescale: bool) -> tuple[WanVAE, float, float]:
    """The fp32 VAE with its encoder, its encoder's stream peak on the calibration pictures and the scale it is
    carried at (vae.rescale: c is 1 unless the stream would come near fp16's range)."""
    vae = load_vae(vae_path, decode_only=False)
    peak = encoder_stream_peak(vae, varied_images(CALIBRATION_PICTURES, tile))
    if not math.isfinite(peak):
        raise AnimaError(f"{vae_path.name} encodes pictures to non-finite values (NaN/Inf): not exported")
    scale = stream_scale(peak) if rescale else 1.0
    if scale != 1.0:
        rescale_stream(vae, scale, encoder=True)
    return vae, peak, scale


def export_vae_decoder(vae_path: Path, out_dir: Path, tile: int = DEFAULT_TILE, overlap: int = DEFAULT_OVERLAP,
                       overwrite: bool = False, rescale: bool = True, calibrate: bool = True,
                       encoder: bool = False) -> Path:
    """Write out_dir/vae_decoder.onnx for `tile`-px tiles (and, with `encoder`, vae_encoder.onnx beside it) and
    manifest.json; return the manifest's path.

    The residual stream is rescaled for fp16 (vae.rescale) from its peak on the latents of two pictures of one
    tile; `rescale=False` exports the decoder as it is (to measure what the rescaling is for). `calibrate=False`
    skips that measurement (three quarters of the export's time) for a set only ONNX Runtime runs, in fp32, where
    the stream cannot overflow: its manifest says stream_peak null, and convert-rknn refuses it. The encoder's
    stream is measured and rescaled alike, on the two pictures themselves (encoder_stream_peak / _scale)."""
    vae_path, out_dir = Path(vae_path), Path(out_dir)
    if not vae_path.is_file():
        raise AnimaError(f"VAE file not found: {vae_path}")
    check_tile(read_vae_config(vae_path), tile, overlap)
    if encoder and not has_encoder(vae_path):
        raise AnimaError(f"{vae_path.name} holds the VAE decoder alone, no encoder: export without --encoder")
    # Float32 graphs of (at most) every weight of the file: twice its bfloat16 bytes; checked before the calibration.
    check_space(out_dir, 2 * vae_path.stat().st_size + (1 << 20), "the VAE set")
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
    encoding: tuple[WanVAE, float | None, float] | None = None
    if encoder:
        encoding = (_calibrated_encoder(vae_path, tile, rescale) if calibrate
                    else (load_vae(vae_path, decode_only=False), None, 1.0))
    config = vae.config
    files = [DECODER_FILE, ENCODER_FILE] if encoder else [DECODER_FILE]
    # Held for the whole export (a second one into the folder is refused); without --overwrite the folder is
    # empty, so nothing is replaced, not even a file that appears there meanwhile.
    with held_folder(lambda: open_set_folder(out_dir, overwrite=overwrite, names=files)):
        clear_set_folder(out_dir, keep=files)  # a set without the encoder leaves no vae_encoder.onnx of an earlier one
        z_shape, image_shape = vae_tile_shapes(config.z_dim, config.scale_factor, tile)
        entries = [{
            "index": 0, "kind": VAE_DECODER_KIND, "file": DECODER_FILE,
            "sha256": _write(vae, {"z": z_shape}, out_dir / DECODER_FILE, overwrite),
            "inputs": [{"name": "z", "shape": z_shape, "dtype": "float32"}],
            "outputs": [{"name": "y", "shape": image_shape, "dtype": "float32"}],
        }]
        del vae
        calibration: dict[str, Any] = {}
        if encoding is not None:
            encoding_vae, encoder_peak, encoder_scale = encoding
            entries.append({
                "index": 1, "kind": VAE_ENCODER_KIND, "file": ENCODER_FILE,
                "sha256": _write(_Encoder(encoding_vae), {"image": image_shape}, out_dir / ENCODER_FILE, overwrite),
                "inputs": [{"name": "image", "shape": image_shape, "dtype": "float32"}],
                "outputs": [{"name": "y", "shape": z_shape, "dtype": "float32"}],
            })
            calibration = {"encoder_stream_peak": encoder_peak, "encoder_stream_scale": encoder_scale}
        manifest = {
            "format": VAE_FORMAT,
            "model": {"file": vae_path.name, "sha256": cached_sha256(vae_path), "z_dim": config.z_dim,
                      "scale_factor": config.scale_factor},
            "tile": tile, "overlap": overlap, "dtype": "float32", "opset": OPSET,
            "stream_peak": peak, "stream_scale": scale, **calibration,
            "subgraphs": entries,
        }
        manifest_path = out_dir / MANIFEST
        write_json(manifest_path, manifest, overwrite=overwrite)
        return manifest_path


def _write(module: torch.nn.Module, shapes: dict[str, list[int]], path: Path, overwrite: bool) -> str:
    """Export `module` for these input shapes to `path`; return the file's sha256."""
    with warnings.catch_warnings():
        # The latent statistics become graph constants, which is what they are: nothing to warn about; nor is
        # encode()'s check that the (static) image size is a multiple of the scale, or the exporter's reversed
        # Slice of a zero pad's pads, which _fold_constant_of_shape folds.
        warnings.filterwarnings("ignore", message="torch.tensor results are registered as constants")
        warnings.filterwarnings("ignore", message="Converting a tensor to a Python boolean")
        warnings.filterwarnings("ignore", message="Constant folding - Only steps=1 can be constant folded")
        graph = _fold_constant_of_shape(export_graph(module, shapes, torch.float32))
    return write_graph(graph, path, overwrite)


def _fold_constant_of_shape(graph: onnx.ModelProto) -> onnx.ModelProto:
    """The graph with each ConstantOfShape of a constant shape replaced by its value, optimized again.

    The exporter computes a zero pad's pads (the encoder's downsamplers) with a ConstantOfShape, which onnxscript's
    optimizer never folds (it could be large; here it is four int64 zeros), so every shape after the first pad stays
    unknown and nothing there folds: 15 Shape and 5 Gather ops left in the encoder. Folded, the pads become the
    Conv's own and the graph is as static as the decoder's (Conv, ReduceL2, MatMul, Softmax and element-wise ops)."""
    import numpy as np
    from onnx import numpy_helper
    from onnxscript import optimizer

    constants = {tensor.name: tensor for tensor in graph.graph.initializer}
    kept, folded = [], False
    for node in graph.graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in constants:
            value = (numpy_helper.to_array(node.attribute[0].t) if node.attribute
                     else np.zeros(1, dtype=np.float32))  # ONNX's default: one float32 zero
            filled = np.full(numpy_helper.to_array(constants[node.input[0]]), value.item(), dtype=value.dtype)
            graph.graph.initializer.append(numpy_helper.from_array(filled, node.output[0]))
            folded = True
        else:
            kept.append(node)
    if not folded:
        return graph
    del graph.graph.node[:]
    graph.graph.node.extend(kept)
    return optimizer.optimize(graph)


def no_encoder_message(set_dir: Path, converted: bool) -> str:
    how = "export it again with `anima-rknn export-vae --encoder`"
    if converted:
        how += " and convert it again with `anima-rknn convert-rknn`"
    return f"the VAE set in {set_dir} has no encoder: {how}"


def load_vae_set(set_dir: Path, *, vae_path: Path, converted: bool, encoder: bool = False) -> dict[str, Any]:
    """The VAE set's manifest, after checking it was made from `vae_path` (sha256) and its decoder file (the .onnx,
    or the .rknn of a converted set; the simulator's .onnx beside it is hashed when the backend loads it). With
    `encoder`, the set must have an encoder too, and its file is checked alike."""
    set_dir = Path(set_dir)
    manifest = read_manifest(set_dir, kind="vae")
    if converted and "rknn" not in manifest:
        raise AnimaError(f"{set_dir} holds an ONNX VAE decoder, not an .rknn one: convert it with "
                         "`anima-rknn convert-rknn` first")
    check_source(manifest, vae_path, "VAE", f"the VAE set in {set_dir} was")
    kinds = [VAE_DECODER_KIND]
    if encoder:
        if vae_entry(manifest, VAE_ENCODER_KIND) is None:
            raise AnimaError(no_encoder_message(set_dir, converted))
        kinds.append(VAE_ENCODER_KIND)
    # Hashed now, before minutes of denoising: a file or two (cached per version), not 84 like a DiT set.
    for kind in kinds:
        entry = vae_record(manifest, kind) if converted else vae_entry(manifest, kind)
        file, digest = (entry["rknn_file"], entry["rknn_sha256"]) if converted else (entry["file"], entry["sha256"])
        check_file(set_dir / file, digest)
    return manifest
