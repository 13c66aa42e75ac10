"""`convert-rknn --quantize w8a8` and `verify-rknn` on a quantized set, as a user runs them (in .venv-rknn): the
calibration captured from the tiny model's runs, and bad options refused in one line with nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("rknn.api")

QUICK_CAPTURE = ("--calibration-prompt", "a red circle", "--calibration-prompt", "a blue square",
                 "--calibration-steps", "5")


def test_convert_captures_calibration_quantizes_and_verify_reports_precisions(run_cli, model_dir, tiny_onnx_set,
                                                                            tmp_path, one_thread):
    out, calibration = tmp_path / "rknn", tmp_path / "calibration"
    result = run_cli("convert-rknn", "--subgraphs", tiny_onnx_set, "--out", out, "--quantize", "w8a8",
                     "--calibration", calibration, "--model", model_dir, "--min-cosine", "0.99", *QUICK_CAPTURE)
    assert result.code == 0, result.err
    assert "converted 6 subgraphs" in result.out and "(held-out cosine threshold 0.99)" in result.out
    samples = json.loads((calibration / "calibration.json").read_text())["samples"]
    assert {s["prompt"] for s in samples if s["held_out"]} == {"a blue square"} and len(samples) == 20
    # fed the held-out prompt's context: a prompt far from every calibrating one can leave a cross-attention's
    # static int8 context range (docs/npu-int8.md)
    report = run_cli("verify-rknn", "--model", model_dir, "--subgraphs", out, "--runtime", "simulator", "--json",
                     "--min-cosine", "0.9", "--prompt", "a blue square")
    assert report.code == 0, report.err
    rows = json.loads(report.out)["subgraphs"]
    manifest = json.loads((out / "manifest.json").read_text())["rknn"]["subgraphs"]
    assert [(r["precision"], r["held_out_cosine"]) for r in rows] == [
        (m["precision"], m["held_out_cosine"][m["precision"]]) for m in manifest]
    table = run_cli("verify-rknn", "--model", model_dir, "--subgraphs", out, "--runtime", "simulator",
                    "--min-cosine", "0.9", "--prompt", "a blue square")
    assert "precision" in table.out.splitlines()[0] and "held out" in table.out.splitlines()[0]
    plan = run_cli("plan", "--subgraphs", out, "--budget", "8GB")
    kept = sum(m["precision"] != "float16" for m in manifest)
    assert plan.code == 0 and plan.out.startswith("quantized set: ") and f"{kept} " in plan.out.splitlines()[0]
    assert "activations compiler" in plan.out and "per transformer pass: 0 loads" in plan.out
    # the same set with a quantized subgraph claimed fp16: refused before the first pass, no picture
    lying = shutil.copytree(out, tmp_path / "lying")
    _claim(lying, next(i for i, m in enumerate(manifest) if m["precision"] != "float16"), precision="float16",
           quant_files=None, held_out_cosine=None)
    refused = _generate(run_cli, model_dir, lying, tmp_path / "lying.png")
    assert refused.code == 1 and refused.err.count("\n") == 1
    assert "the manifest says float16 but the file is an int8 (quantized) model" in refused.err
    assert not (tmp_path / "lying.png").exists()


def _claim(folder: Path, index: int, **changes) -> None:
    """A manifest edited to claim `changes` for subgraph `index` (None deletes a field)."""
    manifest = json.loads((folder / "manifest.json").read_text())
    record = manifest["rknn"]["subgraphs"][index]
    record.update({k: v for k, v in changes.items() if v is not None})
    for key in [k for k, v in changes.items() if v is None]:
        record.pop(key, None)
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _generate(run_cli, model_dir: Path, subgraphs: Path, out: Path):
    return run_cli("generate", "--model", model_dir, "-p", "a red circle", "--width", "64", "--height", "64",
                   "--steps", "2", "--backend", "rknn", "--subgraphs", subgraphs, "--rknn-runtime", "simulator",
                   "-o", out)


def test_an_fp16_set_whose_manifest_claims_int8_is_refused_in_one_line(run_cli, model_dir, tiny_rknn_set,
                                                                      tmp_path):
    from anima_rknn.export.manifest import QUANT_SUFFIXES

    lying = shutil.copytree(tiny_rknn_set, tmp_path / "lying")
    _claim(lying, 2, precision="w8a8", held_out_cosine={"w8a8": 0.9999},
           quant_files=[{"file": "b00_mlp" + s, "sha256": "0" * 64} for s in QUANT_SUFFIXES])
    for result in (_generate(run_cli, model_dir, lying, tmp_path / "lying.png"),
                   run_cli("verify-rknn", "--model", model_dir, "--subgraphs", lying, "--rknn-runtime", "simulator")):
        assert result.code == 1 and result.err.count("\n") == 1, result.err
        assert "the manifest says w8a8 but the file is an fp16 model" in result.err
    assert not (tmp_path / "lying.png").exists()


@pytest.mark.parametrize(("args", "message"), [
    (("--quantize", "int4"), "unknown quantization 'int4': choose one of fp16, w8a8"),
    (("--quantize", "w8a8", "--quantized-algorithm", "best"), "unknown quantization algorithm 'best'"),
    (("--quantize", "w8a8"), "--quantize w8a8 needs --calibration DIR"),
])
def test_bad_quantization_options_are_one_line_and_write_nothing(run_cli, tiny_onnx_set, tmp_path, args, message):
    result = run_cli("convert-rknn", "--subgraphs", tiny_onnx_set, "--out", tmp_path / "out", *args)
    assert result.code == 1 and message in result.err and result.err.count("\n") == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("other", "message"), [
    ("resolution", "was captured at 32x32, this set is 64x64"),
    ("model", "captured from another DiT file"),  # another tiny DiT of the same shape (seed 1)
])
def test_a_calibration_set_of_another_resolution_or_model_is_refused_before_anything_is_written(
        run_cli, tiny_set, tiny_onnx_set, tmp_path, one_thread, other, message):
    from anima_rknn.demo.tiny_set import write_model_set
    from anima_rknn.engine.calibrate import CalibrationRun, capture_calibration
    from anima_rknn.export.manifest import read_manifest
    from anima_rknn.export.onnx import export_subgraphs
    from anima_rknn.model.io import load_dit

    side, files = (32, tiny_set) if other == "resolution" else (64, write_model_set(tmp_path / "other", seed=1))
    onnx = tmp_path / "onnx-other"
    export_subgraphs(files.dit, side, side, onnx, progress=False)
    dit = load_dit(files.dit, torch.float32)
    context = torch.zeros((1, dit.config.context_tokens, dit.config.context_dim))
    latent = np.zeros((1, 16, side // 8, side // 8), np.float32)
    runs = [CalibrationRun("x", i, latent, context, context + 1) for i in range(2)]
    capture_calibration(dit, read_manifest(onnx), tmp_path / "calibration", runs, steps=2, captured=1,
                        progress=False)
    result = run_cli("convert-rknn", "--subgraphs", tiny_onnx_set, "--out", tmp_path / "out", "--quantize", "w8a8",
                     "--calibration", tmp_path / "calibration")
    assert result.code == 1 and result.err.count("\n") == 1
    assert message in result.err
    assert not (tmp_path / "out").exists()


def test_a_capture_that_cannot_run_is_refused_before_anything_is_written(run_cli, model_dir, tiny_onnx_set,
                                                                        tmp_path):
    result = run_cli("convert-rknn", "--subgraphs", tiny_onnx_set, "--out", tmp_path / "out", "--quantize", "w8a8",
                     "--calibration", tmp_path / "calibration", "--model", model_dir, "--calibration-steps", "5",
                     "--calibration-captured", "9")
    assert result.code == 1 and result.err == "error: captured steps must be 1 to 5, got 9\n"
    assert not (tmp_path / "out").exists() and not (tmp_path / "calibration").exists()
