"""Importing a command module registers its command on the `anima-rknn` group."""

from . import bench, eval_demo, export_onnx, generate, make_tiny, rknn, serve, train_demo  # noqa: F401
