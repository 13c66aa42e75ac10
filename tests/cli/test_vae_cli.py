"""export-vae and generate --vae-backend onnx as a user runs them: the decode on ONNX Runtime tiles, and every
set that does not fit refused in one line before any work, nothing written."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.usefixtures("one_thread")


# ---- the commands ----------------------------------------------------------------------------------------------


def test_export_vae_refuses_bad_tiles_in_one_line_and_writes_nothing(run_cli, tiny_set, tmp_path):
    for args, message in [(("--tile", "36"), "must be a positive multiple of the VAE's scale (8 px)"),
                          (("--tile", "32", "--overlap", "20"), "overlap must be a multiple of 8 px from 0 to half")]:
        out = tmp_path / "set"
        result = run_cli("export-vae", "--vae", tiny_set.vae, *args, "--out", out)
        assert result.code == 1 and message in result.err and result.err.count("\n") == 1
        assert not out.exists()
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(tiny_set.vae.read_bytes()[:1000])
    result = run_cli("export-vae", "--vae", corrupt, "--tile", "32", "--out", tmp_path / "set")
    assert result.code == 1 and result.err.count("\n") == 1 and not (tmp_path / "set").exists()


def test_export_vae_with_encoder_writes_both_graphs_into_one_set_and_refuses_to_overwrite_unasked(run_cli, tiny_set,
                                                                                                 tmp_path):
    out = tmp_path / "set"
    tile = ("--tile", "32", "--overlap", "8")
    result = run_cli("export-vae", "--vae", tiny_set.vae, *tile, "--encoder", "--out", out)
    assert result.code == 0, result.err
    assert result.out == f"wrote the VAE decoder and encoder for 32x32 tiles and manifest.json to {out}\n"
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "vae_decoder.onnx", "vae_encoder.onnx"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert [entry["kind"] for entry in manifest["subgraphs"]] == ["vae_decoder", "vae_encoder"]
    assert manifest["subgraphs"][1]["inputs"][0]["shape"] == [1, 3, 32, 32]
    again = run_cli("export-vae", "--vae", tiny_set.vae, *tile, "--out", out)
    assert again.code == 1 and "pass --overwrite" in again.err and again.err.count("\n") == 1
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "vae_decoder.onnx", "vae_encoder.onnx"]
    replaced = run_cli("export-vae", "--vae", tiny_set.vae, *tile, "--out", out, "--overwrite")
    assert replaced.code == 0 and replaced.out.startswith("wrote the VAE decoder for 32x32 tiles")
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "vae_decoder.onnx"]  # the encoder went with it
    help_text = run_cli("export-vae", "--help").out
    assert "also export the VAE encoder (for image-to-image on onnx / rknn)" in " ".join(help_text.split())


GENERATE = ("generate", "-p", "a red circle", "--steps", "2", "-W", "112", "-H", "112", "--vae-tile-size", "64",
            "--vae-tile-overlap", "16")  # 2x2 tiles


def test_generate_decodes_on_the_onnx_backend_like_torch(run_cli, model_dir, tiny_vae_onnx_set, tmp_path):
    on_torch = run_cli(*GENERATE, "--model", model_dir, "--vae-backend", "torch", "--vae-tiling", "--out",
                       tmp_path / "torch.png")
    on_onnx = run_cli(*GENERATE, "--model", model_dir, "--vae-backend", "onnx", "--vae-subgraphs", tiny_vae_onnx_set,
                      "--json", "--out", tmp_path / "onnx.png")
    assert on_torch.code == 0 and on_onnx.code == 0, on_onnx.err
    assert json.loads(on_onnx.out)["vae_backend"] == "onnx"
    a, b = (np.asarray(Image.open(tmp_path / f"{name}.png"), np.int16) for name in ("torch", "onnx"))
    assert np.abs(a - b).max() <= 1  # 2e-5 apart before rounding to 8 bits
    assert "VAE backend: onnx" in Image.open(tmp_path / "onnx.png").info["parameters"]


@pytest.mark.parametrize(("args", "message"), [
    (("--vae-backend", "onnx", "--vae-subgraphs", "SET", "--vae-tile-size", "96"),
     "was made for VAE tile size 64, asked for 96: leave it out (--vae-tile-size; a request's vae_tile) or export"),
    (("--vae-backend", "onnx", "--vae-subgraphs", "SET", "--vae-tile-overlap", "8"),
     "was made for VAE tile overlap 16, asked for 8: leave it out (--vae-tile-overlap; a request's vae_overlap)"),
    (("--vae-backend", "onnx"), "needs an exported VAE set (--vae-subgraphs DIR)"),
    (("--vae-backend", "torch", "--vae-subgraphs", "SET"), "runs on --vae-backend onnx or rknn, not torch"),
    (("--vae-subgraphs", "SET"), "runs on --vae-backend onnx or rknn, not auto (which exports and caches its own)"),
    (("--vae-backend", "onnx", "--vae-subgraphs", "SET", "--no-vae-tiling"), "drop --no-vae-tiling"),
    (("--vae-backend", "onnx", "--vae-subgraphs", "SET", "-W", "48"), "larger than the 48x112 image"),
])
def test_generate_refuses_a_set_that_does_not_fit_before_any_work(run_cli, model_dir, tiny_vae_onnx_set, tmp_path, args,
                                                                  message):
    args = tuple(str(tiny_vae_onnx_set) if a == "SET" else a for a in args)
    result = run_cli(*GENERATE, *args, "--model", model_dir, "--out", tmp_path / "x.png")
    assert result.code == 1 and message in result.err and result.err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_generate_takes_the_tiles_of_the_vae_set_it_is_given(run_cli, model_dir, tiny_vae_onnx_set, tmp_path):
    """No tile flags: the set's 64-px tiles and 16-px overlap (its manifest's), the same picture as naming them."""
    bare = ("generate", "-p", "a red circle", "--steps", "2", "-W", "112", "-H", "112", "--model", model_dir,
            "--vae-backend", "onnx", "--vae-subgraphs", tiny_vae_onnx_set, "--json")
    taken = run_cli(*bare, "--out", tmp_path / "taken.png")
    named = run_cli(*bare, "--vae-tile-size", "64", "--vae-tile-overlap", "16", "--out", tmp_path / "named.png")
    assert taken.code == 0 and named.code == 0, taken.err
    assert (tmp_path / "taken.png").read_bytes() == (tmp_path / "named.png").read_bytes()


def test_export_vae_tiles_default_to_the_models_trained_size(run_cli, tmp_path):
    """The demo model was trained at 64 px: its set has 64-px tiles (a 512-px tile would fit none of its images)."""
    result = run_cli("export-vae", "--out", tmp_path / "set", "--threads", "1")
    assert result.code == 0, result.err
    manifest = json.loads((tmp_path / "set" / "manifest.json").read_text())
    assert (manifest["tile"], manifest["overlap"]) == (64, 16)


def test_img2img_encodes_on_the_onnx_backend_like_torch(run_cli, model_dir, tiny_set, tmp_path):
    """An init image is encoded by the set's encoder tiles (2x2 here), not on the CPU's torch path."""
    vae_set = tmp_path / "set"
    assert run_cli("export-vae", "--vae", tiny_set.vae, "--tile", "64", "--overlap", "16", "--encoder",
                   "--out", vae_set).code == 0
    rng = np.random.default_rng(2)
    Image.fromarray(rng.integers(0, 255, (14, 14, 3), dtype=np.uint8)).resize((112, 112)).save(tmp_path / "in.png")
    img2img = (*GENERATE, "--model", model_dir, "--init-img", tmp_path / "in.png", "--strength", "0.5", "--json")
    on_torch = run_cli(*img2img, "--vae-backend", "torch", "--vae-tiling", "--out", tmp_path / "torch.png")
    on_onnx = run_cli(*img2img, "--vae-backend", "onnx", "--vae-subgraphs", vae_set, "--out", tmp_path / "onnx.png")
    assert on_torch.code == 0 and on_onnx.code == 0, on_onnx.err
    assert json.loads(on_onnx.out)["vae_backend"] == "onnx" and json.loads(on_onnx.out)["timings"]["vae_encode_s"] > 0
    a, b = (np.asarray(Image.open(tmp_path / f"{name}.png"), np.int16) for name in ("torch", "onnx"))
    assert np.abs(a - b).max() <= 2  # encode and decode both in ONNX Runtime's fp32: float rounding apart


def test_img2img_on_a_set_without_the_encoder_is_refused_before_any_work(run_cli, model_dir, tiny_vae_onnx_set,
                                                                         tmp_path):
    Image.new("RGB", (112, 112), (10, 200, 30)).save(tmp_path / "in.png")
    result = run_cli(*GENERATE, "--model", model_dir, "--init-img", tmp_path / "in.png", "--vae-backend", "onnx",
                     "--vae-subgraphs", tiny_vae_onnx_set, "--out", tmp_path / "x.png")
    assert result.code == 1 and "has no encoder" in result.err and result.err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.png"]
