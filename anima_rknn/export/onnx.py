"""Export the DiT's 3 bodies per block as static-shape ONNX subgraphs, with a manifest that pins them down.

A set is made for one resolution (static shapes: the NPU converter needs them) and one DiT file, and
`load_manifest` refuses to use it for anything else. Graphs come from the classic TorchScript exporter at
opset 17 and are then constant-folded by onnxscript's optimizer, which turns the exporter's shape
arithmetic (Shape/Gather/Slice/Mod chains) into constants: what is left is MatMul, Softmax, Reshape,
Transpose, Slice/Concat (RoPE's half rotation), ReduceMean and element-wise ops, all in RKNN's supported set.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tqdm import tqdm

from ..core.files import (
    atomic_path,
    cached_sha256,
    check_name,
    check_space,
    held_folder,
    parameter_bytes,
    sha256_file,
    write_json,
)
from ..errors import AnimaError
from ..model.config import DiTConfig
from ..model.io import load_dit, read_dit_config
from ..model.lora import LoraRef, open_loras
from .manifest import (
    MANIFEST,
    MAX_SIDE,
    SUBGRAPH_KINDS,
    SUBGRAPHS_FORMAT,
    check_file,
    check_set,
    clear_set_folder,
    input_shapes,
    open_set_folder,
    read_manifest,
    subgraph_name,
)

if TYPE_CHECKING:
    import onnx

OPSET = 17
DTYPES = {"float32": torch.float32, "float16": torch.float16}
# Ops the RKNN converter lacks (rknn.md); the exporter must never emit them.
RKNN_UNSUPPORTED_OPS = frozenset({"Einsum", "Range", "CumSum", "Trilu", "GatherND", "GroupNormalization"})
ONNX_MISSING = "ONNX export needs onnx and onnxscript: pip install 'anima-rknn[onnx]'"


def token_count(width: int, height: int) -> int:
    """Image size -> DiT tokens: 8x VAE compression, then 2x2 patches."""
    if not (0 < width <= MAX_SIDE and 0 < height <= MAX_SIDE) or width % 16 or height % 16:
        raise AnimaError(f"width and height must be positive multiples of 16 up to {MAX_SIDE}, got {width}x{height}")
    return (width // 16) * (height // 16)


def config_shapes(kind: str, config: DiTConfig, tokens: int) -> dict[str, list[int]]:
    return input_shapes(kind, tokens=tokens, hidden=config.hidden, head_dim=config.head_dim,
                        context_tokens=config.context_tokens, context_dim=config.context_dim)


def export_graph(module: torch.nn.Module, shapes: dict[str, list[int]], dtype: torch.dtype) -> onnx.ModelProto:
    try:
        import onnx
        from onnxscript import optimizer
    except ImportError:
        raise AnimaError(ONNX_MISSING) from None
    example = tuple(torch.zeros(shape, dtype=dtype) for shape in shapes.values())
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        # The classic exporter is deprecated in favour of dynamo, which cannot write opset 17 for these graphs.
        warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export.*")
        warnings.filterwarnings("ignore", message=".*feature will be removed.*")
        torch.onnx.export(module, example, buffer, input_names=list(shapes), output_names=["y"],
                          opset_version=OPSET, dynamo=False)
    graph = optimizer.optimize(onnx.load_from_string(buffer.getvalue()))
    unsupported = RKNN_UNSUPPORTED_OPS.intersection(node.op_type for node in graph.graph.node)
    if unsupported:
        raise AnimaError(f"this torch version exported ops RKNN lacks: {', '.join(sorted(unsupported))}")
    return graph


def write_graph(graph: onnx.ModelProto, path: Path, overwrite: bool) -> str:
    """The graph published whole at `path` (replacing an older one only if `overwrite`); its sha256, for the
    manifest."""
    with atomic_path(path, overwrite=overwrite) as tmp:
        tmp.write_bytes(graph.SerializeToString())
        return sha256_file(tmp)


def export_subgraphs(dit_path: Path, width: int, height: int, out_dir: Path, dtype: str = "float32",
                     progress: bool = True, overwrite: bool = False, loras: Sequence[LoraRef] = (),
                     lora_ignore_unmatched: bool = False) -> Path:
    """Write out_dir/bNN_{self_attn,cross_attn,mlp}.onnx for one resolution, then manifest.json; return its path.

    `loras` are baked in: merged into the bodies' weights (the NPU cannot add low-rank terms at run time), and
    recorded in the manifest (file, sha256, scale) so the set is only used with the same LoRAs."""
    dit_path, out_dir = Path(dit_path), Path(out_dir)
    check_name(out_dir / MANIFEST)  # before minutes of work (the folder is checked whole before it is written)
    if dtype not in DTYPES:
        raise AnimaError(f"unknown export dtype {dtype!r}; choose float32 or float16")
    tokens = token_count(width, height)
    if not dit_path.is_file():
        raise AnimaError(f"DiT file not found: {dit_path}")
    # Everything is read and checked before out_dir is touched: a bad DiT or LoRA file leaves it as it was.
    opened = open_loras(list(loras), read_dit_config(dit_path), ignore_unmatched=lora_ignore_unmatched)
    dit = load_dit(dit_path, DTYPES[dtype], loras=opened, dequantize=True)  # the NPU gets plain weights
    config = dit.config
    names = [f"{subgraph_name(index)}.onnx" for index in range(3 * config.blocks)]
    check_space(out_dir, parameter_bytes(dit.blocks, DTYPES[dtype].itemsize), "the subgraph set")
    # Held for the whole export (a second export into the folder is refused); without --overwrite the folder is
    # empty, so nothing is replaced, not even a file that appears there meanwhile.
    with held_folder(lambda: open_set_folder(out_dir, overwrite=overwrite, names=names)):
        clear_set_folder(out_dir, keep=names)
        entries = []
        for index in tqdm(range(3 * config.blocks), desc="export-onnx", unit="subgraph", disable=not progress):
            kind = SUBGRAPH_KINDS[index % 3]
            shapes = config_shapes(kind, config, tokens)
            graph = export_graph(getattr(dit.blocks[index // 3], kind), shapes, DTYPES[dtype])
            path = out_dir / names[index]
            digest = write_graph(graph, path, overwrite)
            entries.append({
                "index": index, "block": index // 3, "kind": kind, "file": path.name, "sha256": digest,
                "inputs": [{"name": name, "shape": shape, "dtype": dtype} for name, shape in shapes.items()],
                "outputs": [{"name": "y", "shape": [1, tokens, config.hidden], "dtype": dtype}],
            })
        manifest = {
            "format": SUBGRAPHS_FORMAT,
            "model": {"file": dit_path.name, "sha256": cached_sha256(dit_path), "blocks": config.blocks,
                      "hidden": config.hidden, "heads": config.heads, "head_dim": config.head_dim,
                      "context_dim": config.context_dim},
            "width": width, "height": height, "tokens": tokens, "context_tokens": config.context_tokens,
            "dtype": dtype, "opset": OPSET, "subgraphs": entries, "loras": [lora.identity() for lora in opened],
        }
        manifest_path = out_dir / MANIFEST
        write_json(manifest_path, manifest, overwrite=overwrite)
        return manifest_path


def load_manifest(subgraph_dir: Path, *, dit_path: Path | None, width: int, height: int,
                  loras: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The set's manifest (checked whole by read_manifest), after checking it fits: resolution, DiT file
    (sha256, skipped when dit_path is None) and every subgraph file's sha256."""
    subgraph_dir = Path(subgraph_dir)
    manifest = read_manifest(subgraph_dir)
    check_set(manifest, subgraph_dir, dit_path=dit_path, width=width, height=height, loras=loras)
    for entry in manifest["subgraphs"]:
        check_file(subgraph_dir / entry["file"], entry["sha256"])
    return manifest
