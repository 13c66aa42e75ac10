"""ONNX -> .rknn conversion: manifest, resumability, source checks. Runs in .venv-rknn (rknn-toolkit2)."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from anima_rknn.core.files import sha256_file
from anima_rknn.errors import AnimaError
from anima_rknn.export.rknn import TOOLKIT_MISSING, convert_subgraphs

HAS_TOOLKIT = importlib.util.find_spec("rknn") is not None
needs_toolkit = pytest.mark.skipif(not HAS_TOOLKIT, reason="rknn-toolkit2 lives in .venv-rknn")


@pytest.mark.skipif(HAS_TOOLKIT, reason="checks the message shown where the toolkit is missing")
def test_missing_toolkit_is_one_clear_line(tmp_path):
    with pytest.raises(AnimaError) as raised:
        convert_subgraphs(tmp_path, tmp_path / "out")
    assert str(raised.value) == TOOLKIT_MISSING and "\n" not in TOOLKIT_MISSING


@needs_toolkit
def test_manifest_extends_the_source_and_describes_every_file(tiny_onnx_set, tiny_rknn_set):
    source = json.loads((tiny_onnx_set / "manifest.json").read_text())
    manifest = json.loads((tiny_rknn_set / "manifest.json").read_text())
    assert {key: manifest[key] for key in source} == source  # existing keys untouched
    rknn = manifest["rknn"]
    assert set(rknn) == {"source_sha256", "target", "toolkit_version", "subgraphs"}  # no path to elsewhere
    assert rknn["toolkit_version"] == "2.5.0" and rknn["target"] == "rk3588"
    assert rknn["source_sha256"] == sha256_file(tiny_onnx_set / "manifest.json")
    for entry in manifest["subgraphs"]:  # each ONNX source beside its .rknn: a hard link on one file system
        copy = tiny_rknn_set / entry["file"]
        assert sha256_file(copy) == entry["sha256"] and copy.samefile(tiny_onnx_set / entry["file"])
    assert [r["rknn_file"] for r in rknn["subgraphs"]] == [
        Path(e["file"]).with_suffix(".rknn").name for e in source["subgraphs"]]
    for record in rknn["subgraphs"]:
        path = tiny_rknn_set / record["rknn_file"]
        assert record["rknn_sha256"] == sha256_file(path) and record["rknn_bytes"] == path.stat().st_size
        assert record["convert_s"] > 0 and record["internal_bytes"] > 0 and record["weight_bytes"] > 0
    assert not list(tiny_rknn_set.glob(".*.part"))


@needs_toolkit
def test_interrupted_conversion_redoes_only_the_missing_file(tiny_onnx_set, tiny_rknn_set, tmp_path, monkeypatch):
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    monkeypatch.chdir(workdir)  # verbose builds dump debug ONNX files into the working folder unless kept away
    out = tmp_path / "rknn"
    shutil.copytree(tiny_rknn_set, out)
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("*.rknn")}
    (out / "b01_cross_attn.rknn").unlink()
    (out / ".b01_cross_attn.rknn.x1y2z3.part").write_bytes(b"half a model")  # what a killed run leaves
    convert_subgraphs(tiny_onnx_set, out, progress=False)
    after = {p.name: p.stat().st_mtime_ns for p in out.glob("*.rknn")}
    assert after.keys() == before.keys()
    assert [name for name in after if after[name] != before[name]] == ["b01_cross_attn.rknn"]
    assert not list(out.glob(".*.part")) and not list(workdir.iterdir())
    manifest = json.loads((out / "manifest.json").read_text())
    redone = next(r for r in manifest["rknn"]["subgraphs"] if r["rknn_file"] == "b01_cross_attn.rknn")
    assert redone["rknn_sha256"] == sha256_file(out / "b01_cross_attn.rknn")


@needs_toolkit
def test_a_changed_onnx_file_is_refused_by_name(tiny_onnx_set, tmp_path):
    source = tmp_path / "onnx"
    shutil.copytree(tiny_onnx_set, source)
    with open(source / "b00_mlp.onnx", "ab") as f:
        f.write(b"\0")
    with pytest.raises(AnimaError, match="b00_mlp.onnx is corrupt"):
        convert_subgraphs(source, tmp_path / "rknn", progress=False)
    assert not (tmp_path / "rknn").exists()


@needs_toolkit
def test_converting_into_the_source_folder_is_refused(tiny_onnx_set):
    with pytest.raises(AnimaError, match="other than"):
        convert_subgraphs(tiny_onnx_set, tiny_onnx_set, progress=False)


@needs_toolkit
def test_a_toolkit_failure_is_one_line_naming_the_file_and_leaves_no_partial_output(tiny_onnx_set, tmp_path):
    source = tmp_path / "onnx"
    shutil.copytree(tiny_onnx_set, source)
    (source / "b00_cross_attn.onnx").write_bytes(b"not an onnx model")
    manifest = json.loads((source / "manifest.json").read_text())
    manifest["subgraphs"][1]["sha256"] = sha256_file(source / "b00_cross_attn.onnx")  # consistent, but unbuildable
    (source / "manifest.json").write_text(json.dumps(manifest))
    out = tmp_path / "rknn"
    with pytest.raises(AnimaError, match="load_onnx failed for b00_cross_attn.onnx") as raised:
        convert_subgraphs(source, out, progress=False)
    assert "\n" not in str(raised.value)
    assert sorted(p.name for p in out.iterdir()) == ["b00_cross_attn.onnx", "b00_self_attn.onnx",
                                                     "b00_self_attn.rknn", "convert-progress.json"]


@pytest.fixture(scope="module")
def vae_encoder_onnx_set(tiny_set, tmp_path_factory):
    """export-vae --encoder of the tiny model set's VAE, 64-px tiles."""
    from anima_rknn.export.vae import export_vae_decoder

    folder = tmp_path_factory.mktemp("vae-encoder-onnx")
    export_vae_decoder(tiny_set.vae, folder, 64, 16, encoder=True)
    return folder


@needs_toolkit
def test_a_vae_set_with_the_encoder_converts_both_and_resumes_the_missing_one(vae_encoder_onnx_set, tmp_path,
                                                                              monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "rknn"
    convert_subgraphs(vae_encoder_onnx_set, out, progress=False)
    source = json.loads((vae_encoder_onnx_set / "manifest.json").read_text())
    manifest = json.loads((out / "manifest.json").read_text())
    assert {key: manifest[key] for key in source} == source  # the encoder's entry and calibration untouched
    records = manifest["rknn"]["subgraphs"]
    assert [(r["index"], r["rknn_file"]) for r in records] == [(0, "vae_decoder.rknn"), (1, "vae_encoder.rknn")]
    for entry, record in zip(manifest["subgraphs"], records):
        assert (out / entry["file"]).samefile(vae_encoder_onnx_set / entry["file"])  # the simulator's source
        assert record["rknn_sha256"] == sha256_file(out / record["rknn_file"]) and record["internal_bytes"] > 0
    decoder_time = (out / "vae_decoder.rknn").stat().st_mtime_ns
    (out / "vae_encoder.rknn").unlink()
    convert_subgraphs(vae_encoder_onnx_set, out, progress=False)
    assert (out / "vae_decoder.rknn").stat().st_mtime_ns == decoder_time  # only the missing encoder redone
    assert json.loads((out / "manifest.json").read_text())["rknn"]["subgraphs"][1]["rknn_sha256"] == sha256_file(
        out / "vae_encoder.rknn")


@needs_toolkit
def test_a_vae_set_whose_encoder_was_not_calibrated_for_fp16_is_refused(vae_encoder_onnx_set, tmp_path):
    source = tmp_path / "onnx"
    shutil.copytree(vae_encoder_onnx_set, source)
    manifest = json.loads((source / "manifest.json").read_text())
    manifest.update(encoder_stream_peak=None, encoder_stream_scale=1.0)
    (source / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(AnimaError, match="was exported for ONNX Runtime only, without the fp16 calibration"):
        convert_subgraphs(source, tmp_path / "rknn", progress=False)
    assert not (tmp_path / "rknn").exists()
