"""`anima-rknn make-tiny` writes a set that loads through the same code as the real model."""

import pytest

from anima_rknn.core.tensorfile import read_shapes
from anima_rknn.demo.tiny_set import write_model_set
from anima_rknn.errors import AnimaError
from anima_rknn.model.model_set import from_model_dir


def test_make_tiny_writes_the_layout(run_cli, tmp_path):
    out = tmp_path / "set"
    result = run_cli("make-tiny", "--out", out)
    assert result.code == 0, result.err
    files = from_model_dir(out)
    assert all(k.startswith("net.") for k in read_shapes(files.dit, "DiT"))
    assert all(k.startswith("model.") for k in read_shapes(files.text_encoder, "text encoder"))
    assert "decoder.conv1.weight" in read_shapes(files.vae, "VAE")
    again = run_cli("make-tiny", "--out", out)
    assert again.code == 1 and "--overwrite" in again.err


def test_make_tiny_with_the_real_tokenizers(run_cli, tmp_path, real_tokenizers):
    out = tmp_path / "real-tok"
    assert run_cli("make-tiny", "--out", out, "--tokenizers", real_tokenizers).code == 0
    shapes = read_shapes(from_model_dir(out).text_encoder, "text encoder")
    assert shapes["model.embed_tokens.weight"][0] == 151669  # the real Qwen vocabulary
    result = run_cli("generate", "--model", out, "-p", "1girl, (smile:1.2)", "-W", "64", "-H", "64",
                     "--steps", "2", "-o", tmp_path / "x.png")
    assert result.code == 0, result.err


def test_make_tiny_into_a_file_is_refused_and_the_file_kept(run_cli, tmp_path):
    target = tmp_path / "taken"
    target.write_text("not a folder")
    result = run_cli("make-tiny", "--out", target)
    assert result.code == 2 and "is a file" in result.err and "Traceback" not in result.err
    with pytest.raises(AnimaError, match="is a file, not a folder"):
        write_model_set(target)
    assert target.read_text() == "not a folder"
