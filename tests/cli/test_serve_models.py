"""`anima-rknn serve` given several models (--model more than once): folders, hub ids or DiT files, each named
by its DiT, the first the default (test_serve_cli.py's real server serves two, lists and switches them)."""

from __future__ import annotations

import shutil

import pytest
from test_serve_cli import _free_port, _refused

from anima_rknn.cli.serve import _served_models
from anima_rknn.errors import AnimaError
from anima_rknn.model.model_set import DEMO_MODEL


@pytest.fixture(scope="module")
def other_dit(tiny_set, tmp_path_factory):
    """The tiny DiT under another name: a model given as a DiT file alone."""
    path = tmp_path_factory.mktemp("dits") / "anima-tiny-copy.safetensors"
    shutil.copy(tiny_set.dit, path)
    return path


def test_several_folders_and_dit_files(model_dir, other_dit):
    served = _served_models((str(model_dir), str(DEMO_MODEL), str(other_dit)), None, text_encoder=None, vae=None,
                            qwen_tokenizer=None, t5_tokenizer=None)
    assert list(served) == ["anima-tiny-random", "anima-demo", "anima-tiny-copy"]
    assert served["anima-tiny-copy"].dit == other_dit
    # A DiT file alone takes its other parts from the first folder given (the demo's text encoder would not fit).
    assert served["anima-tiny-copy"].vae == served["anima-tiny-random"].vae
    one = _served_models((str(model_dir),), None, text_encoder=None, vae=None, qwen_tokenizer=None,
                         t5_tokenizer=None)
    assert list(one) == ["anima-tiny-random"]


def test_several_models_refused_in_one_line(run_cli, model_dir, other_dit, tmp_path):
    with pytest.raises(AnimaError, match="two --model DiTs are both named anima-tiny-random"):
        _served_models((str(model_dir), str(model_dir)), None, text_encoder=None, vae=None, qwen_tokenizer=None,
                       t5_tokenizer=None)
    with pytest.raises(AnimaError, match="give each DiT as its own --model, not --dit"):
        _served_models((str(model_dir), str(other_dit)), str(other_dit), text_encoder=None, vae=None,
                       qwen_tokenizer=None, t5_tokenizer=None)
    result = run_cli("serve", "--port", _free_port(), "--data-dir", tmp_path / "data", "--model", model_dir,
                     "--model", tmp_path / "missing")
    _refused(result, "model directory not found")

