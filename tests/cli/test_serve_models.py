"""`anima-rknn serve` given several models (--model more than once): folders, hub ids or DiT files, each named
by its DiT, the first the default; one real server lists and switches them."""

from __future__ import annotations

import json
import shutil
import time
import urllib.request

import pytest
from test_serve_cli import _free_port, _get, _refused, _serve

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


def test_a_real_server_of_two_models(model_dir, tmp_path):
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    with open(tmp_path / "log.txt", "w") as log:
        server = _serve("--port", port, "--data-dir", tmp_path / "data", "--model", DEMO_MODEL, "--model", model_dir,
                        log=log)
    try:
        deadline = time.monotonic() + 120
        while _get(f"{base}/sdapi/v1/sd-models", {}) != 200:
            assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "log.txt").read_text()
            time.sleep(0.2)
        models = json.loads(urllib.request.urlopen(f"{base}/sdapi/v1/sd-models", timeout=30).read())
        assert [m["model_name"] for m in models] == ["anima-demo", "anima-tiny-random"]
        request = urllib.request.Request(f"{base}/sdapi/v1/options", method="POST", data=json.dumps(
            {"sd_model_checkpoint": "anima-tiny-random"}).encode(), headers={"Content-Type": "application/json"})
        assert urllib.request.urlopen(request, timeout=30).status == 200
        options = json.loads(urllib.request.urlopen(f"{base}/sdapi/v1/options", timeout=30).read())
        assert options["sd_model_checkpoint"] == models[1]["title"]
        assert "serving anima-demo.safetensors, anima-tiny-random.safetensors" in (tmp_path / "log.txt").read_text()
    finally:
        server.terminate()
        server.wait(60)
