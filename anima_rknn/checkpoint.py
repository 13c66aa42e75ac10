"""Reading and writing safetensors checkpoints with one-line errors for every way a file can be wrong."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .errors import AnimaError
from .files import atomic_path


def _check_readable(path: str | os.PathLike, what: str) -> Path:
    path = Path(path)
    if not path.is_file():
        raise AnimaError(f"{what} file not found: {path}")
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise AnimaError(f"{path} is truncated or not a safetensors file")
        (header_len,) = struct.unpack("<Q", head)
        if header_len > size - 8:
            raise AnimaError(f"{path} is truncated or not a safetensors file")
        try:
            header = json.loads(f.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise AnimaError(f"{path} is truncated or not a safetensors file") from None
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + header_len + end > size:
        raise AnimaError(f"{path} is truncated: {8 + header_len + end - size} bytes missing")
    return path


def read_shapes(path: str | os.PathLike, what: str) -> dict[str, tuple[int, ...]]:
    """Tensor names -> shapes from the header alone (no tensor data is read)."""
    path = _check_readable(path, what)
    with safe_open(path, framework="pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


def read_metadata(path: str | os.PathLike, what: str) -> dict[str, str]:
    path = _check_readable(path, what)
    with safe_open(path, framework="pt") as f:
        return dict(f.metadata() or {})


def load_tensors(path: str | os.PathLike, what: str, strip: Sequence[str] = (),
                 skip: Sequence[str] = ()) -> dict[str, torch.Tensor]:
    """Memory-mapped tensors, with the first matching prefix in `strip` removed and names in `skip` left out."""
    path = _check_readable(path, what)
    tensors = {}
    with safe_open(path, framework="pt") as f:
        for key in f.keys():
            name = next((key[len(p):] for p in strip if key.startswith(p)), key)
            if skip and name.startswith(tuple(skip)):
                continue
            tensors[name] = f.get_tensor(key)
    return tensors


def check_shapes(found: Mapping[str, Sequence[int]], expected: Mapping[str, Sequence[int]], what: str) -> None:
    """Every expected tensor present with its shape; the first problem is named."""
    for name, shape in expected.items():
        if name not in found:
            raise AnimaError(f"not an {what} checkpoint: missing tensor {name}")
        if tuple(found[name]) != tuple(shape):
            raise AnimaError(f"{what} tensor {name} has shape {list(found[name])}, expected {list(shape)}")


def save_tensors(tensors: Mapping[str, torch.Tensor], path: str | os.PathLike,
                 metadata: Mapping[str, str] | None = None) -> None:
    with atomic_path(path, overwrite=True) as tmp:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=dict(metadata or {}))
