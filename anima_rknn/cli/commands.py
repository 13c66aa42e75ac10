"""Importing a command module registers its command on the `anima-rknn` group."""

from . import bench, export_onnx, generate, make_tiny, rknn  # noqa: F401
