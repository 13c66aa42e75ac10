"""The demo model: a small Anima-architecture model set trained here on procedural captioned pictures,
shipped inside the package so that `generate` draws a real picture with nothing to download."""

from __future__ import annotations

from pathlib import Path

from ..errors import AnimaError
from .dataset import IMAGE_SIZE as DEMO_IMAGE_SIZE  # the size it was trained at; others give poor pictures

DEMO_MODEL = Path(__file__).resolve().parent.parent / "demo_model"

__all__ = ["DEMO_IMAGE_SIZE", "DEMO_MODEL", "demo_model_dir"]


def demo_model_dir() -> Path:
    """The shipped demo model set (model-directory layout)."""
    if not (DEMO_MODEL / "split_files").is_dir():
        raise AnimaError(f"the demo model is missing from this install ({DEMO_MODEL}); pass --model DIR")
    return DEMO_MODEL
