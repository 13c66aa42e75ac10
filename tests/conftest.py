"""Shared fixtures: one small model set in the real formats, written once per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from anima_rknn.model_set import ModelFiles
from anima_rknn.tiny_set import write_model_set

SHARED = Path(os.environ.get("ANIMA_SHARED", Path(__file__).resolve().parents[1] / ".." / "shared")).resolve()


@pytest.fixture(scope="session")
def tiny_set(tmp_path_factory: pytest.TempPathFactory) -> ModelFiles:
    return write_model_set(tmp_path_factory.mktemp("models") / "tiny", "tiny", seed=0)


@pytest.fixture(scope="session")
def shared_tokenizers() -> Path:
    folder = SHARED / "tokenizers"
    if not (folder / "qwen3" / "tokenizer.json").is_file():
        pytest.skip(f"real tokenizers not found in {folder} (set ANIMA_SHARED)")
    return folder


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models gain nothing from threads, and on a busy shared CPU torch's spinning threads cost 5x."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_onnx_set(tiny_set, tmp_path_factory) -> Path:
    """The real exporter's subgraphs of the tiny model set at 64x64 (for the RKNN tests; copy before changing)."""
    pytest.importorskip("rknn.api")
    from anima_rknn.export.onnx import export_subgraphs

    folder = tmp_path_factory.mktemp("onnx")
    export_subgraphs(tiny_set.dit, 64, 64, folder, progress=False, overwrite=True)
    return folder


@pytest.fixture(scope="session")
def tiny_rknn_set(tiny_onnx_set, tmp_path_factory) -> Path:
    """tiny_onnx_set converted for rk3588 (copy before changing)."""
    from anima_rknn.export.rknn import convert_subgraphs

    return convert_subgraphs(tiny_onnx_set, tmp_path_factory.mktemp("rknn"), progress=False).parent
