"""The split execution engine and the factory that pairs it with a backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import AnimaError
from ..model.dit import AnimaDiT
from .backends.onnx import OnnxBackend
from .backends.torch import TorchBackend
from .split import SplitEngine

BACKENDS = ("torch", "onnx")


def _subgraph_manifest(dit: AnimaDiT, subgraphs: Path | None, backend: str, dit_path: Path | None,
                       width: int, height: int) -> dict[str, Any]:
    """The checked manifest of an exported set, which must also have this DiT's sizes."""
    from ..export.onnx import load_manifest  # here: export.onnx imports engine.backends (a cycle at import time)

    if subgraphs is None:
        raise AnimaError(f"the {backend} backend needs an exported subgraph folder (--subgraphs DIR)")
    manifest = load_manifest(Path(subgraphs), dit_path=dit_path, width=width, height=height)
    config = dit.config
    expected = {"blocks": config.blocks, "hidden": config.hidden, "heads": config.heads,
                "head_dim": config.head_dim, "context_dim": config.context_dim}
    found = {key: manifest["model"][key] for key in expected}
    if found != expected:
        raise AnimaError(f"subgraphs in {subgraphs} are for a DiT with {found}, this one has {expected}")
    return manifest


def make_engine(dit: AnimaDiT, backend: str = "torch", *, width: int, height: int,
                subgraphs: Path | None = None, dit_path: Path | None = None) -> SplitEngine:
    """A split engine for width x height images. The torch backend runs the bodies in `dit.body_dtype`;
    exported backends check their set against the resolution, the DiT's sizes and, given `dit_path`,
    the DiT file's sha256."""
    if backend == "torch":
        runner = TorchBackend(dit, dit.body_dtype)
    elif backend == "onnx":
        manifest = _subgraph_manifest(dit, subgraphs, backend, dit_path, width, height)
        runner = OnnxBackend(Path(subgraphs), manifest)
    else:
        raise AnimaError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    return SplitEngine(dit, runner, latent_size=(height // 8, width // 8))


__all__ = ["BACKENDS", "SplitEngine", "make_engine"]
