"""Shared fixtures: one small model set in the real formats, written once per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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
