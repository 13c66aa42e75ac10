"""Anima text-to-image (and image-to-image) on small machines. Imports are lazy so `anima_rknn.sampling.spectrum` works without torch."""

from __future__ import annotations

import importlib
import os
from typing import Any

# OpenMP's threads sleep when they wait instead of spinning: spinning threads take the CPU that the working ones
# (and the machine's other work) need, 15-60x slower on a busy 2-core machine (docs/reliability.md). Set before
# torch starts its pool; a program that imported torch first, or set the variable, keeps its own.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

_EXPORTS = {
    "load_dit": "anima_rknn.model.io",
    "AnimaPipeline": "anima_rknn.generation.pipeline",
    "GenerationParams": "anima_rknn.generation.params",
    "ImageInput": "anima_rknn.generation.images",
    "resolve_model": "anima_rknn.model.model_set",
    "Spectrum": "anima_rknn.sampling.spectrum",
    "AnimaError": "anima_rknn.errors",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'anima_rknn' has no attribute {name!r}")
    module = importlib.import_module(_EXPORTS[name])
    return getattr(module, "resolve" if name == "resolve_model" else name)
