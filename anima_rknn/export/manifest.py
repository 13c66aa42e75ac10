"""The `manifest.json` of a subgraph set, shared by the ONNX export and the RKNN conversion.

A set is made for one resolution and one DiT file; these checks refuse to use it for anything else.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

from ..errors import AnimaError
from ..files import sha256_file

SUBGRAPHS_FORMAT = "anima-rknn-subgraphs/1"
MANIFEST = "manifest.json"


@functools.lru_cache(maxsize=256)
def _sha256_of_version(path: Path, size: int, mtime_ns: int) -> str:
    return sha256_file(path)


def cached_sha256(path: str | os.PathLike) -> str:
    """sha256, hashed once per file version per process (a 4 GB DiT takes seconds; the bench loads sets often)."""
    path = Path(path)
    stat = path.stat()
    return _sha256_of_version(path.resolve(), stat.st_size, stat.st_mtime_ns)


def read_manifest(subgraph_dir: str | os.PathLike) -> dict[str, Any]:
    path = Path(subgraph_dir) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise AnimaError(f"{subgraph_dir} holds no {MANIFEST}: export a subgraph set with "
                         "`anima-rknn export-onnx` first") from None
    except (OSError, ValueError) as e:
        raise AnimaError(f"cannot read {path}: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != SUBGRAPHS_FORMAT:
        raise AnimaError(f"{path} is not an {SUBGRAPHS_FORMAT} manifest")
    return manifest


def check_set(manifest: dict[str, Any], subgraph_dir: str | os.PathLike, *, dit_path: str | os.PathLike | None,
              width: int, height: int) -> None:
    """Resolution, and (given `dit_path`) the DiT file the set was exported from."""
    if (manifest["width"], manifest["height"]) != (width, height):
        raise AnimaError(f"subgraphs in {subgraph_dir} were exported for {manifest['width']}x{manifest['height']}, "
                         f"asked for {width}x{height}")
    if dit_path is None:
        return
    if not Path(dit_path).is_file():
        raise AnimaError(f"DiT file not found: {dit_path}")
    digest = cached_sha256(dit_path)
    if digest != manifest["model"]["sha256"]:
        raise AnimaError(f"subgraphs in {subgraph_dir} were exported from a different DiT file "
                         f"({manifest['model']['file']}, sha256 {manifest['model']['sha256'][:12]}...; "
                         f"{Path(dit_path).name} has sha256 {digest[:12]}...)")


def check_file(path: Path, expected_sha256: str) -> None:
    if not path.is_file():
        raise AnimaError(f"subgraph file {path} is missing")
    if cached_sha256(path) != expected_sha256:
        raise AnimaError(f"subgraph file {path} is corrupt (sha256 differs from the manifest): export or convert it again")
