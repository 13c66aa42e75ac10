"""Importing a command module registers its command on the `anima-rknn` group."""

from . import (  # noqa: F401
    batch, bench, eval_demo, export_onnx, export_vae, generate, make_tiny, quantize, rknn, serve, train_demo,
)
