"""The demo model: a small Anima-architecture model set trained here on procedural captioned pictures,
shipped inside the package so that `generate` draws a real picture with nothing to download. Where it lives is
model-set knowledge (model.model_set finds it when no model is given); training and evaluating it is here."""

from __future__ import annotations

from ..model.model_set import DEMO_MODEL, demo_model_dir
from .dataset import IMAGE_SIZE as DEMO_IMAGE_SIZE  # the size it was trained at; others give poor pictures

__all__ = ["DEMO_IMAGE_SIZE", "DEMO_MODEL", "demo_model_dir"]
