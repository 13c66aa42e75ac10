"""`anima-rknn make-tiny` writes a set that loads through the same code as the real model."""

from anima_rknn.checkpoint import read_shapes
from anima_rknn.model_set import from_model_dir


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


def test_make_tiny_with_the_real_tokenizers(run_cli, tmp_path, shared_tokenizers):
    out = tmp_path / "real-tok"
    assert run_cli("make-tiny", "--out", out, "--tokenizers", shared_tokenizers).code == 0
    shapes = read_shapes(from_model_dir(out).text_encoder, "text encoder")
    assert shapes["model.embed_tokens.weight"][0] == 151669  # the real Qwen vocabulary
    result = run_cli("generate", "--model", out, "-p", "1girl, (smile:1.2)", "-W", "64", "-H", "64",
                     "--steps", "2", "-o", tmp_path / "x.png")
    assert result.code == 0, result.err
