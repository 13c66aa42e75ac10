"""Importing a command module registers its command on the `anima-rknn` group."""

from . import batch, bench, calibrate_cache, eval_demo, export_onnx, export_vae, generate, make_tiny, rknn, serve, train_demo  # noqa: F401
