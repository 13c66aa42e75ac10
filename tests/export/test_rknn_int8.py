"""Quantized (w8a8) conversion: calibration captured from real torch runs, the held-out check and its fallback,
the manifest's precision against the file, resumption, and bad calibration sets. Runs in .venv-rknn."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from anima_rknn.core.files import sha256_file
from anima_rknn.errors import AnimaError
from anima_rknn.export.calibration import CALIBRATION_JSON, agreement, read_calibration
from anima_rknn.export.manifest import PRECISIONS, QUANT_SUFFIXES, read_manifest

pytest.importorskip("rknn.api")

from anima_rknn.engine.backends.rknn import RknnBackend  # noqa: E402
from anima_rknn.engine.calibrate import CalibrationRun, capture_calibration, captured_steps  # noqa: E402
from anima_rknn.export.rknn import (  # noqa: E402
    Quantization,
    check_quantize_options,
    convert_subgraphs,
    read_converted_manifest,
    rknn_io_dtype,
)
from anima_rknn.model.io import load_dit  # noqa: E402


@pytest.fixture(scope="module")
def calibration(tiny_set, tiny_onnx_set, tmp_path_factory) -> Path:
    """Two runs of the tiny model at 64x64 (random contexts stand in for two prompts), 4 steps, 2 captured."""
    source = read_manifest(tiny_onnx_set)
    dit = load_dit(tiny_set.dit, torch.float32)
    shape = (1, dit.config.context_tokens, dit.config.context_dim)
    generator = torch.Generator().manual_seed(3)
    runs = [CalibrationRun(f"prompt {i}", i, torch.randn((1, 16, 8, 8), generator=generator).numpy(),
                           torch.randn(shape, generator=generator), torch.randn(shape, generator=generator))
            for i in range(2)]
    folder = tmp_path_factory.mktemp("calibration")
    capture_calibration(dit, source, folder, runs, steps=4, captured=2, progress=False, overwrite=True)
    return folder


@pytest.fixture(scope="module")
def w8a8_set(tiny_onnx_set, calibration, tmp_path_factory) -> Path:
    source = read_manifest(tiny_onnx_set)
    quantization = Quantization("w8a8", "normal", 0.99, read_calibration(calibration, source))
    return convert_subgraphs(tiny_onnx_set, tmp_path_factory.mktemp("w8a8"), progress=False,
                             quantization=quantization).parent


def test_captured_steps_spread_over_the_schedule():
    assert captured_steps(20, 5) == [0, 5, 10, 14, 19]
    assert captured_steps(4, 1) == [0]
    with pytest.raises(AnimaError, match="captured steps must be 1 to 4"):
        captured_steps(4, 5)


def test_calibration_holds_both_branches_and_a_held_out_run_in_the_toolkits_format(calibration, tiny_onnx_set):
    data = json.loads((calibration / CALIBRATION_JSON).read_text())
    samples = data["samples"]
    assert [(s["run"], s["step"], s["branch"], s["held_out"]) for s in samples] == [
        (run, step, branch, run == 1) for run in (0, 1) for step in (0, 3) for branch in ("cond", "uncond")]
    assert samples[0]["sigma"] == 1.0 and 0 < samples[2]["sigma"] < 1
    # the toolkit's dataset: one line per calibrating sample, the inputs' .npy in the model's input order
    lines = (calibration / "b00_self_attn" / "dataset.txt").read_text().splitlines()
    assert lines == [f"{i:03d}_x.npy {i:03d}_rope_cos.npy {i:03d}_rope_sin.npy" for i in range(4)]
    assert (calibration / "b00_cross_attn" / "dataset.txt").read_text().splitlines()[1] == "001_x.npy 001_context.npy"
    # a held-out pass keeps its fp32 output, the reference of the check; a calibrating one its inputs only
    assert (calibration / "b00_mlp" / "004_y.npy").exists() and not (calibration / "b00_mlp" / "003_y.npy").exists()
    # the cond and uncond passes of one step see different contexts, the same rope tables
    cond, uncond = (np.load(calibration / "b00_cross_attn" / f"00{i}_context.npy") for i in (0, 1))
    assert not np.array_equal(cond, uncond)
    # the output kept is the fp32 torch body's on those inputs
    entry = read_manifest(tiny_onnx_set)["subgraphs"][2]
    _, inputs, want = next(read_calibration(calibration, read_manifest(tiny_onnx_set)).held_out(entry))
    assert inputs[0].shape == (1, 16, 128) and want.shape == (1, 16, 128)


def test_every_subgraph_is_quantized_or_falls_back_by_its_held_out_cosine(w8a8_set):
    manifest = read_converted_manifest(w8a8_set, dit_path=None, width=64, height=64)  # checks files' precision
    assert manifest["rknn"]["quantization"]["dtype"] == "w8a8"
    for record in manifest["rknn"]["subgraphs"]:
        precision, cosines = record["precision"], record["held_out_cosine"]
        assert precision in PRECISIONS and "w8a8" in cosines
        if precision == "float16":
            assert max(c for p, c in cosines.items() if p != "float16") < 0.99 and "quant_files" not in record
            assert rknn_io_dtype(w8a8_set / record["rknn_file"]) == "float16"
        else:
            assert cosines[precision] >= 0.99
            assert rknn_io_dtype(w8a8_set / record["rknn_file"]) == "int8"
            stem = record["rknn_file"].removesuffix(".rknn")
            assert [f["file"] for f in record["quant_files"]] == [stem + s for s in QUANT_SUFFIXES]
            assert all(f["sha256"] == sha256_file(w8a8_set / f["file"]) for f in record["quant_files"])
    assert any(r["precision"] != "float16" for r in manifest["rknn"]["subgraphs"])


def test_the_simulator_rebuilds_a_quantized_context_that_agrees_as_measured(w8a8_set, calibration, tiny_onnx_set):
    manifest = read_manifest(w8a8_set)
    index = next(r["index"] for r in manifest["rknn"]["subgraphs"] if r["precision"] != "float16")
    record, entry = manifest["rknn"]["subgraphs"][index], manifest["subgraphs"][index]
    held = list(read_calibration(calibration, read_manifest(tiny_onnx_set)).held_out(entry))
    backend = RknnBackend(w8a8_set, runtime="simulator")
    try:
        cosines = [agreement(backend.run(index, dict(zip([s["name"] for s in entry["inputs"]], inputs))), want)[0]
                   for _, inputs, want in held]
    finally:
        backend.close()
    assert min(cosines) == pytest.approx(record["held_out_cosine"][record["precision"]], abs=1e-6)


def _claim(folder: Path, index: int, **changes) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    record = manifest["rknn"]["subgraphs"][index]
    record.update(changes)
    for key in [k for k, v in changes.items() if v is None]:
        del record[key]
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_a_manifest_claiming_the_wrong_precision_is_refused_in_one_line(w8a8_set, tiny_rknn_set, tmp_path):
    quantized = shutil.copytree(w8a8_set, tmp_path / "q")
    index = next(r["index"] for r in read_manifest(quantized)["rknn"]["subgraphs"] if r["precision"] != "float16")
    _claim(quantized, index, precision="float16", quant_files=None, held_out_cosine=None)
    with pytest.raises(AnimaError, match=r"the manifest says float16 but the file is an int8 \(quantized\) model"):
        read_converted_manifest(quantized, dit_path=None, width=64, height=64)
    plain = shutil.copytree(tiny_rknn_set, tmp_path / "fp16")
    stem = "b00_mlp"
    _claim(plain, 2, precision="w8a8", held_out_cosine={"w8a8": 0.9999},
           quant_files=[{"file": stem + s, "sha256": "0" * 64} for s in QUANT_SUFFIXES])
    with pytest.raises(AnimaError, match="the manifest says w8a8 but the file is an fp16 model") as raised:
        RknnBackend(plain, runtime="simulator").run(2, {"x": np.zeros((1, 16, 128), np.float32)})
    assert "\n" not in str(raised.value)


def test_an_interrupted_quantized_conversion_redoes_only_what_is_missing(w8a8_set, tiny_onnx_set, calibration,
                                                                         tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = shutil.copytree(w8a8_set, tmp_path / "q")
    records = read_manifest(out)["rknn"]["subgraphs"]
    quantized = next(r for r in records if r["precision"] != "float16")
    (out / quantized["quant_files"][0]["file"]).unlink()  # a step-1 file lost: that subgraph is redone
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("*.rknn")}
    source = read_manifest(tiny_onnx_set)
    calibration_set = read_calibration(calibration, source)
    convert_subgraphs(tiny_onnx_set, out, progress=False, quantization=Quantization("w8a8", "normal", 0.99,
                                                                                    calibration_set))
    after = {p.name: p.stat().st_mtime_ns for p in out.glob("*.rknn")}
    assert [n for n in after if after[n] != before[n]] == [quantized["rknn_file"]]
    read_converted_manifest(out, dit_path=None, width=64, height=64)
    with pytest.raises(AnimaError, match="another set, target, toolkit version or quantization"):
        convert_subgraphs(tiny_onnx_set, out, progress=False,
                          quantization=Quantization("w8a8", "mmse", 0.99, calibration_set))


@pytest.mark.parametrize(("change", "message"), [
    (lambda d, f: d["model"].update(sha256="1" * 64), "captured from another DiT file"),
    (lambda d, f: d.update(width=128), "captured at 128x64, this set is 64x64"),
    (lambda d, f: d.update(subgraphs=9), "captured for a set of 9 subgraphs, this set has 6"),
    (lambda d, f: np.save(f / "b01_mlp" / "002_x.npy", np.zeros((1, 16, 64), np.float32)),
     r"002_x.npy: expected a float32 array of shape \[1, 16, 128\], got float32 \[1, 16, 64\]"),
    (lambda d, f: (f / "b00_cross_attn" / "005_y.npy").write_bytes(b"\x93NUMPY junk"), "cannot read calibration file"),
    (lambda d, f: d["samples"][0].update(branch="both"), "expected one of cond, uncond"),
    (lambda d, f: [s.update(held_out=False) for s in d["samples"]], "expected both calibrating and held-out"),
])
def test_a_calibration_set_that_does_not_fit_is_refused_in_one_line(calibration, tiny_onnx_set, tmp_path, change,
                                                                     message):
    folder = shutil.copytree(calibration, tmp_path / "calibration")
    data = json.loads((folder / CALIBRATION_JSON).read_text())
    change(data, folder)
    (folder / CALIBRATION_JSON).write_text(json.dumps(data))
    with pytest.raises(AnimaError, match=message) as raised:
        read_calibration(folder, read_manifest(tiny_onnx_set))
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(("args", "message"), [
    (("int4", "normal", 0.999), "unknown quantization 'int4': choose one of fp16, w8a8"),
    (("w8a8", "gdq", 0.999), "unknown quantization algorithm 'gdq': choose one of normal, mmse, kl_divergence"),
    (("w8a8", "normal", 1.5), r"minimum cosine must be in \(0, 1\]"),
])
def test_unknown_quantization_options_are_refused(args, message):
    with pytest.raises(AnimaError, match=message):
        check_quantize_options(*args)


def _first_quantized(manifest: dict) -> dict:
    return next(r for r in manifest["rknn"]["subgraphs"] if r["precision"] != "float16")


@pytest.mark.parametrize(("change", "message"), [
    (lambda m: _first_quantized(m).update(precision="int4"), "expected one of float16, w8a8, hybrid"),
    (lambda m: _first_quantized(m)["quant_files"][0].update(file="../b00_mlp.model"), "quant_files[0].file: expected"),
    (lambda m: _first_quantized(m)["quant_files"].pop(), "quant_files: expected 3 entries, got 2"),
    (lambda m: _first_quantized(m)["held_out_cosine"].update(w8a8=float("nan")), "expected a number from -1.0 to 1.0"),
    (lambda m: _first_quantized(m).update(held_out_cosine={"float16": 1.0}), "has no figure for the precision chosen"),
    (lambda m: _first_quantized(m).update(precision="float16", held_out_cosine={"float16": 1.0}),
     "an fp16 subgraph has no quantization files"),
    (lambda m: m["rknn"]["quantization"].update(algorithm="best"), "expected one of normal, mmse, kl_divergence"),
    (lambda m: m["rknn"]["quantization"].update(calibration_sha256="x"), "expected a sha256"),
])
def test_a_damaged_quantized_manifest_is_refused_in_one_line(w8a8_set, tmp_path, change, message):
    folder = shutil.copytree(w8a8_set, tmp_path / "q")
    manifest = json.loads((folder / "manifest.json").read_text())
    change(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(AnimaError, match=re.escape(message)) as raised:
        read_manifest(folder)
    assert "\n" not in str(raised.value)


def test_an_interrupted_capture_starts_again_in_its_own_folder(tiny_set, tiny_onnx_set, tmp_path):
    from anima_rknn.export.calibration import CalibrationWriter

    source = read_manifest(tiny_onnx_set)
    folder = tmp_path / "calibration"
    CalibrationWriter(folder, source)  # killed before its first sample
    assert (folder / ".capturing").exists() and not (folder / CALIBRATION_JSON).exists()
    dit = load_dit(tiny_set.dit, torch.float32)
    context = torch.zeros((1, dit.config.context_tokens, dit.config.context_dim))
    runs = [CalibrationRun("x", i, np.zeros((1, 16, 8, 8), np.float32), context, context + 1) for i in range(2)]
    calibration = capture_calibration(dit, source, folder, runs, steps=2, captured=1, progress=False)
    assert len(calibration.samples) == 4 and not (folder / ".capturing").exists()
    with pytest.raises(AnimaError, match="is not empty"):  # a finished one is never written over unasked
        CalibrationWriter(folder, source)


def test_a_conversion_killed_before_its_first_subgraph_resumes(tiny_onnx_set, tmp_path, monkeypatch):
    from anima_rknn.export import rknn as conversion

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "rknn"

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(conversion, "convert_one", killed)
        with pytest.raises(KeyboardInterrupt):
            convert_subgraphs(tiny_onnx_set, out, progress=False)
    assert (out / "convert-progress.json").exists() and (out / "b00_self_attn.onnx").exists()
    convert_subgraphs(tiny_onnx_set, out, progress=False)  # resumed without --overwrite
    assert len(read_manifest(out)["rknn"]["subgraphs"]) == 6
