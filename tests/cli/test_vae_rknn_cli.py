"""The VAE decoder set on the RK3588 path: convert-rknn, verify-rknn and generate --vae-backend rknn, run in
.venv-rknn on rknn-toolkit2's x86 simulator (the NPU's fp16 numerics) with the tiny model set's VAE."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("rknn.api")
pytestmark = pytest.mark.usefixtures("one_thread")
GENERATE = ("generate", "-p", "a red circle", "--steps", "2", "-W", "112", "-H", "112", "--vae-tile-size", "64",
            "--vae-tile-overlap", "16")  # 2x2 tiles of the set's 64 px


@pytest.fixture(scope="module")
def vae_rknn_set(tiny_vae_rknn_set):
    return tiny_vae_rknn_set


def test_convert_records_the_compilers_memory_figures(vae_rknn_set):
    manifest = json.loads((vae_rknn_set / "manifest.json").read_text())
    record = manifest["rknn"]["subgraphs"][0]
    assert record["rknn_file"] == "vae_decoder.rknn" and record["weight_bytes"] > 0 and record["internal_bytes"] > 0
    assert manifest["format"] == "anima-rknn-vae/1" and manifest["tile"] == 64


def test_verify_decodes_real_pictures_within_40_db_of_fp32_torch(run_cli, model_dir, vae_rknn_set):
    result = run_cli("verify-rknn", "--model", model_dir, "--subgraphs", vae_rknn_set, "--image-size", "112",
                     "--runtime", "simulator", "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert len(report["pictures"]) == 2 and report["flagged"] == []
    assert all(p["psnr"] >= 40 and p["cosine"] > 0.9999 for p in report["pictures"])


def test_verify_flags_a_set_below_the_threshold_and_exits_1(run_cli, model_dir, vae_rknn_set):
    result = run_cli("verify-rknn", "--model", model_dir, "--subgraphs", vae_rknn_set, "--min-psnr", "200",
                     "--runtime", "simulator")
    assert result.code == 1 and "BELOW" in result.out
    assert result.err == "error: 2 of 2 decoded pictures below cosine 0.999 or PSNR 200.0 dB\n"


def test_generate_decodes_on_the_simulator_close_to_torch(run_cli, model_dir, vae_rknn_set, tmp_path):
    on_torch = run_cli(*GENERATE, "--model", model_dir, "--vae-backend", "torch", "--vae-tiling", "--out",
                       tmp_path / "torch.png")
    on_rknn = run_cli(*GENERATE, "--model", model_dir, "--vae-backend", "rknn", "--vae-subgraphs", vae_rknn_set,
                      "--rknn-runtime", "simulator", "--out", tmp_path / "rknn.png")
    assert on_torch.code == 0 and on_rknn.code == 0, on_rknn.err
    a, b = (np.asarray(Image.open(tmp_path / f"{name}.png"), np.float64) for name in ("torch", "rknn"))
    assert 10 * np.log10(255**2 / np.mean((a - b) ** 2)) >= 40


def test_a_corrupt_rknn_file_is_refused_in_one_line_and_nothing_written(run_cli, model_dir, vae_rknn_set, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(vae_rknn_set, broken)
    data = bytearray((broken / "vae_decoder.rknn").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (broken / "vae_decoder.rknn").write_bytes(bytes(data))
    out = tmp_path / "out.png"
    result = run_cli(*GENERATE, "--model", model_dir, "--vae-backend", "rknn", "--vae-subgraphs", broken,
                     "--rknn-runtime", "simulator", "--out", out)
    assert result.code == 1 and "is corrupt (sha256 differs from the manifest)" in result.err
    assert result.err.count("\n") == 1 and not out.exists()


def test_an_onnx_set_is_not_taken_for_a_converted_one(run_cli, model_dir, tiny_vae_onnx_set, tmp_path):
    result = run_cli(*GENERATE, "--model", model_dir, "--vae-backend", "rknn", "--vae-subgraphs", tiny_vae_onnx_set,
                     "--out", tmp_path / "x.png")
    assert result.code == 1 and "holds an ONNX VAE decoder, not an .rknn one" in result.err
    assert list(tmp_path.iterdir()) == []


def test_convert_refuses_a_set_exported_without_fp16_calibration(run_cli, tiny_set, tmp_path):
    """--vae-backend auto's cached sets skip the calibration the NPU needs (export_vae_decoder(calibrate=False))."""
    from anima_rknn.export.vae import export_vae_decoder

    export_vae_decoder(tiny_set.vae, tmp_path / "fast", 64, 16, calibrate=False)
    result = run_cli("convert-rknn", "--subgraphs", tmp_path / "fast", "--out", tmp_path / "rknn")
    assert result.code == 1 and result.err.count("\n") == 1
    assert "was exported for ONNX Runtime only, without the fp16 calibration the NPU needs" in result.err
    assert not (tmp_path / "rknn").exists()


def test_plan_adds_the_decode_stage_after_the_dit(run_cli, vae_rknn_set, tiny_rknn_set):
    result = run_cli("plan", "--preset", "full", "-W", "512", "-H", "512", "--budget", "8GB",
                     "--vae-subgraphs", vae_rknn_set)
    assert result.code == 0, result.err
    assert "VAE decoder context (activations compiler)" in result.out
    assert "whole run (DiT contexts closed before the decode): peak" in result.out
    wrong = run_cli("plan", "--preset", "full", "--vae-subgraphs", tiny_rknn_set)
    assert wrong.code == 1 and wrong.err.endswith("holds DiT subgraphs, not a VAE decoder set\n")


def test_a_stream_past_fp16s_range_is_nan_on_the_npu_unless_rescaled(tiny_set, tmp_path):
    """The measurement behind vae.rescale: the same loud decoder exported as it is and rescaled."""
    import torch

    from anima_rknn.engine.vae_accuracy import verify_vae_set
    from anima_rknn.export.rknn import convert_subgraphs
    from anima_rknn.export.vae import export_vae_decoder
    from anima_rknn.vae import load_vae, save_vae

    loud = load_vae(tiny_set.vae, decode_only=False)
    with torch.no_grad():
        loud.decoder.conv1.weight.mul_(1e6)
        loud.decoder.conv1.bias.mul_(1e6)
    path = tmp_path / "loud.safetensors"
    save_vae(loud, path, dtype=torch.float32)
    results = {}
    for rescale in (False, True):
        onnx = tmp_path / f"onnx-{rescale}"
        export_vae_decoder(path, onnx, 64, 16, rescale=rescale)
        rknn = convert_subgraphs(onnx, tmp_path / f"rknn-{rescale}", progress=False).parent
        results[rescale] = verify_vae_set(rknn, path, count=1, runtime="simulator")[0]
    assert np.isnan(results[False].cosine)
    assert results[True].psnr >= 40 and results[True].cosine > 0.9999


# ---- a set with the encoder (export-vae --encoder) -----------------------------------------------------------------


@pytest.fixture(scope="module")
def encoder_onnx_set(tiny_set, tmp_path_factory):
    from anima_rknn.export.vae import export_vae_decoder

    folder = tmp_path_factory.mktemp("vae-encoder-onnx")
    export_vae_decoder(tiny_set.vae, folder, 64, 16, encoder=True)
    return folder


@pytest.fixture(scope="module")
def encoder_rknn_set(encoder_onnx_set, tmp_path_factory):
    from anima_rknn.export.rknn import convert_subgraphs

    return convert_subgraphs(encoder_onnx_set, tmp_path_factory.mktemp("vae-encoder-rknn"), progress=False).parent


def test_convert_and_verify_a_set_with_the_encoder_through_the_cli(run_cli, model_dir, encoder_onnx_set, tmp_path):
    out = tmp_path / "rknn"
    converted = run_cli("convert-rknn", "--subgraphs", encoder_onnx_set, "--out", out)
    assert converted.code == 0, converted.err
    assert converted.out.startswith(f"converted 2 subgraphs for rk3588 into {out}")
    assert sorted(p.name for p in out.iterdir()) == ["convert-progress.json", "manifest.json", "vae_decoder.onnx",
                                                     "vae_decoder.rknn", "vae_encoder.onnx", "vae_encoder.rknn"]
    records = json.loads((out / "manifest.json").read_text())["rknn"]["subgraphs"]
    assert [r["rknn_file"] for r in records] == ["vae_decoder.rknn", "vae_encoder.rknn"]
    assert all(r["weight_bytes"] > 0 and r["internal_bytes"] > 0 for r in records)

    result = run_cli("verify-rknn", "--model", model_dir, "--subgraphs", out, "--image-size", "112", "--runtime",
                     "simulator", "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert report["flagged"] == [] and report["flagged_encoded"] == []
    assert all(p["psnr"] >= 40 and p["cosine"] > 0.9999 for p in report["pictures"])
    # the encoder's latents, fp16 simulator vs fp32 torch, 2x2 tiles of 64 px: cosine 0.9999999, 73.5-74.0 dB measured
    assert len(report["encoded"]) == 2
    assert all(p["psnr"] >= 60 and p["cosine"] > 0.99999 for p in report["encoded"]), report["encoded"]
    assert "all 2 decoded and 2 encoded pictures at cosine >= 0.999 and PSNR >= 40.0 dB" in result.err

    text = run_cli("verify-rknn", "--model", model_dir, "--subgraphs", out, "--min-psnr", "200", "--runtime",
                   "simulator")
    assert text.code == 1 and "decoded pictures\n" in text.out and "encoded pictures (latents)\n" in text.out
    assert text.err == ("error: 2 of 2 decoded pictures and 2 of 2 encoded pictures below cosine 0.999 or PSNR "
                        "200.0 dB\n")


def test_the_encoder_tiles_on_the_simulator_come_close_to_torch_and_open_its_context_alone(encoder_rknn_set,
                                                                                           tiny_set):
    import torch

    from anima_rknn.engine.backends.rknn import RknnOptions
    from anima_rknn.engine.vae_tiles import open_tile_encoder, vae_set_manifest
    from anima_rknn.engine.vae_accuracy import latent_psnr
    from anima_rknn.vae import load_vae
    from anima_rknn.vae.preview import varied_images
    from anima_rknn.vae.tiling import encode_tiled

    manifest = vae_set_manifest("rknn", encoder_rknn_set, tiny_set.vae, 112, 112, encoder=True)
    encoder = open_tile_encoder("rknn", encoder_rknn_set, manifest, RknnOptions(runtime="simulator"))
    vae = load_vae(tiny_set.vae, decode_only=False)
    image = varied_images(1, 112, seed=5)
    try:
        with torch.no_grad():
            got, want = encode_tiled(encoder, image, 64, 16), encode_tiled(vae, image, 64, 16)
        assert list(encoder.backend.contexts) == [1]  # the encoder's context, not the decoder's
    finally:
        encoder.close()
    assert got.shape == want.shape == (1, 16, 14, 14) and got.dtype == torch.float32
    assert latent_psnr(want, got) >= 60


def test_a_converted_set_without_the_encoder_says_how_to_get_one(vae_rknn_set, tiny_set):
    from anima_rknn.engine.vae_tiles import vae_set_manifest
    from anima_rknn.errors import AnimaError

    with pytest.raises(AnimaError) as raised:
        vae_set_manifest("rknn", vae_rknn_set, tiny_set.vae, 112, 112, encoder=True)
    assert str(raised.value) == (f"the VAE set in {vae_rknn_set} has no encoder: export it again with `anima-rknn "
                                 "export-vae --encoder` and convert it again with `anima-rknn convert-rknn`")


def test_plan_adds_the_encode_stage_of_a_set_with_the_encoder(run_cli, encoder_rknn_set):
    result = run_cli("plan", "--preset", "full", "-W", "512", "-H", "512", "--budget", "8GB",
                     "--vae-subgraphs", encoder_rknn_set)
    assert result.code == 0, result.err
    assert "VAE decoder context (activations compiler)" in result.out
    assert "VAE encoder context: weights" in result.out and "encode stage peak" in result.out
    assert "whole run (DiT contexts closed before the decode, opened after the encode): peak" in result.out


def test_img2img_encodes_and_decodes_on_the_simulator_close_to_torch(run_cli, model_dir, encoder_rknn_set, tmp_path):
    """generate --init-img on --vae-backend rknn: the init image goes through the set's encoder tiles on the NPU's
    fp16 numerics, the picture through its decoder; against torch fp32 on both sides."""
    rng = np.random.default_rng(4)
    Image.fromarray(rng.integers(0, 255, (14, 14, 3), dtype=np.uint8)).resize((112, 112)).save(tmp_path / "in.png")
    img2img = (*GENERATE, "--model", model_dir, "--init-img", tmp_path / "in.png", "--strength", "0.5", "--json")
    on_torch = run_cli(*img2img, "--vae-backend", "torch", "--vae-tiling", "--out", tmp_path / "torch.png")
    on_rknn = run_cli(*img2img, "--vae-backend", "rknn", "--vae-subgraphs", encoder_rknn_set, "--rknn-runtime",
                      "simulator", "--out", tmp_path / "rknn.png")
    assert on_torch.code == 0 and on_rknn.code == 0, on_rknn.err
    assert json.loads(on_rknn.out)["timings"]["vae_encode_s"] > 0
    a, b = (np.asarray(Image.open(tmp_path / f"{name}.png"), np.float64) for name in ("torch", "rknn"))
    assert 10 * np.log10(255**2 / np.mean((a - b) ** 2)) >= 35
