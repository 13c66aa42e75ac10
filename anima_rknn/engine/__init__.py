"""The split execution engine and the factory that pairs it with a backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import AnimaError
from ..export.onnx import load_manifest
from ..export.rknn import read_converted_manifest
from ..model.config import DiTConfig
from ..model.dit import AnimaDiT
from .backends.onnx import OnnxBackend
from .backends.rknn import RknnBackend, RknnOptions
from .backends.torch import TorchBackend
from .memory_plan import plan_memory
from .split import FirstBlockProbe, SplitEngine

BACKENDS = ("torch", "onnx", "rknn")


def _check_sizes(config: DiTConfig, manifest: dict[str, Any], subgraphs: Path) -> None:
    expected = {"blocks": config.blocks, "hidden": config.hidden, "heads": config.heads,
                "head_dim": config.head_dim, "context_dim": config.context_dim}
    found = {key: manifest["model"][key] for key in expected}
    if found != expected:
        raise AnimaError(f"subgraphs in {subgraphs} are for a DiT with {found}, this one has {expected}")


def subgraph_manifest(config: DiTConfig, subgraphs: Path | None, backend: str, dit_path: Path | None,
                      width: int, height: int, loras: list[dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """The checked manifest of an exported (onnx) or converted (rknn) set, which must have this DiT's sizes
    and, given `loras` (LoRA identities), be baked with those LoRAs (None for the torch backend, which needs no
    set). Cheap to repeat: file hashes are cached per file version."""
    if backend == "torch":
        return None
    if subgraphs is None:
        raise AnimaError(f"the {backend} backend needs an exported subgraph folder (--subgraphs DIR)")
    read = read_converted_manifest if backend == "rknn" else load_manifest
    manifest = read(Path(subgraphs), dit_path=dit_path, width=width, height=height, loras=loras)
    _check_sizes(config, manifest, subgraphs)
    return manifest


def make_engine(dit: AnimaDiT, backend: str = "torch", *, width: int, height: int,
                subgraphs: Path | None = None, dit_path: Path | None = None,
                rknn: RknnOptions = RknnOptions()) -> SplitEngine:
    """A split engine for width x height images. The torch backend runs the bodies in `dit.body_dtype`;
    exported backends check their set against the resolution, the DiT's sizes and, given `dit_path`,
    the DiT file's sha256. The rknn backend keeps as many contexts open as `rknn.budget_bytes` allows."""
    if backend == "torch":
        runner = TorchBackend(dit, dit.body_dtype)
    elif backend in ("onnx", "rknn"):
        manifest = subgraph_manifest(dit.config, subgraphs, backend, dit_path, width, height)
        if backend == "onnx":
            runner = OnnxBackend(Path(subgraphs), manifest)
        else:
            max_resident = None if rknn.budget_bytes is None else plan_memory(manifest, rknn.budget_bytes).max_resident
            runner = RknnBackend(Path(subgraphs), runtime=rknn.runtime, max_resident=max_resident,
                                 core_mask=rknn.core_mask)
    else:
        raise AnimaError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    return SplitEngine(dit, runner, latent_size=(height // 8, width // 8))


__all__ = ["BACKENDS", "FirstBlockProbe", "RknnOptions", "SplitEngine", "make_engine", "subgraph_manifest"]
