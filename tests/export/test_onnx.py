"""ONNX subgraph export: valid graphs in RKNN's op set, the manifest schema, and refusals of a mismatched set."""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxscript")

from anima_rknn.cli import cli  # noqa: E402
from anima_rknn.cli import export_onnx as _command  # noqa: E402, F401  (registers export-onnx)
from anima_rknn.core.files import is_temporary  # noqa: E402
from anima_rknn.demo import demo_model_dir  # noqa: E402
from anima_rknn.errors import AnimaError  # noqa: E402
from anima_rknn.export.onnx import export_subgraphs, load_manifest  # noqa: E402
from anima_rknn.model.config import PRESETS  # noqa: E402
from anima_rknn.model.io import random_dit, save_dit  # noqa: E402
from anima_rknn.model.model_set import LAYOUT  # noqa: E402

CONFIG = PRESETS["tiny"]
# rknn.md: ops the RKNN converter lacks.
RKNN_MISSING_OPS = {"Einsum", "Range", "CumSum", "Trilu", "GatherND", "GroupNormalization"}
ONNX_TYPES = {"float32": onnx.TensorProto.FLOAT, "float16": onnx.TensorProto.FLOAT16}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    dit_path = root / "anima-tiny.safetensors"
    save_dit(random_dit(CONFIG, seed=7), dit_path)
    manifest_path = export_subgraphs(dit_path, 128, 64, root / "set", progress=False)
    return dit_path, manifest_path.parent


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def graph_io(values) -> list[dict]:
    return [{"name": v.name, "shape": [d.dim_value for d in v.type.tensor_type.shape.dim],
             "elem_type": v.type.tensor_type.elem_type} for v in values]


def manifest_io(entries) -> list[dict]:
    return [{"name": e["name"], "shape": e["shape"], "elem_type": ONNX_TYPES[e["dtype"]]} for e in entries]


def test_manifest_schema(exported):
    dit_path, set_dir = exported
    manifest = json.loads((set_dir / "manifest.json").read_text())
    assert set(manifest) == {"format", "model", "width", "height", "tokens", "context_tokens", "dtype", "opset",
                             "subgraphs", "loras"}
    assert manifest["loras"] == []  # none baked in
    assert manifest["format"] == "anima-rknn-subgraphs/1"
    assert manifest["model"] == {"file": dit_path.name, "sha256": sha256(dit_path), "blocks": 2, "hidden": 128,
                                 "heads": 2, "head_dim": 64, "context_dim": 64}
    # 128x64 px -> 16x8 latent -> 8x4 patches.
    assert (manifest["width"], manifest["height"], manifest["tokens"]) == (128, 64, 32)
    assert (manifest["context_tokens"], manifest["dtype"], manifest["opset"]) == (512, "float32", 17)
    kinds = ["self_attn", "cross_attn", "mlp"]
    assert [(s["index"], s["block"], s["kind"], s["file"]) for s in manifest["subgraphs"]] == [
        (3 * b + k, b, kind, f"b{b:02d}_{kind}.onnx") for b in range(2) for k, kind in enumerate(kinds)]
    for entry in manifest["subgraphs"]:
        assert set(entry) == {"index", "block", "kind", "file", "sha256", "inputs", "outputs"}
        assert entry["sha256"] == sha256(set_dir / entry["file"])
        assert entry["outputs"] == [{"name": "y", "shape": [1, 32, 128], "dtype": "float32"}]
    assert sorted(p.name for p in set_dir.iterdir()) == sorted([s["file"] for s in manifest["subgraphs"]]
                                                              + ["manifest.json"])


def test_graphs_are_valid_static_opset17_without_rknn_missing_ops(exported):
    _, set_dir = exported
    manifest = json.loads((set_dir / "manifest.json").read_text())
    expected_inputs = {"self_attn": [("x", [1, 32, 128]), ("rope_cos", [1, 1, 32, 64]), ("rope_sin", [1, 1, 32, 64])],
                       "cross_attn": [("x", [1, 32, 128]), ("context", [1, 512, 64])],
                       "mlp": [("x", [1, 32, 128])]}
    for entry in manifest["subgraphs"]:
        model = onnx.load(set_dir / entry["file"])
        onnx.checker.check_model(model, full_check=True)
        assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [17]
        ops = {node.op_type for node in model.graph.node}
        assert not ops & RKNN_MISSING_OPS, entry["file"]
        assert not ops & {"Shape", "Gather", "Mod"}, f"unfolded shape arithmetic in {entry['file']}: {ops}"
        assert [(i["name"], i["shape"]) for i in entry["inputs"]] == expected_inputs[entry["kind"]]
        assert graph_io(model.graph.input) == manifest_io(entry["inputs"])
        assert graph_io(model.graph.output) == manifest_io(entry["outputs"])


def test_load_manifest_accepts_the_matching_set(exported):
    dit_path, set_dir = exported
    assert load_manifest(set_dir, dit_path=dit_path, width=128, height=64)["tokens"] == 32


def test_load_manifest_refuses_another_resolution(exported):
    dit_path, set_dir = exported
    with pytest.raises(AnimaError, match=r"subgraphs in .* were exported for 128x64, asked for 64x128$"):
        load_manifest(set_dir, dit_path=dit_path, width=64, height=128)


def test_load_manifest_refuses_another_dit_file(exported, tmp_path):
    _, set_dir = exported
    other = tmp_path / "other.safetensors"
    save_dit(random_dit(CONFIG, seed=8), other)
    with pytest.raises(AnimaError, match=r"exported from a different DiT file \(anima-tiny.safetensors"):
        load_manifest(set_dir, dit_path=other, width=128, height=64)


def test_load_manifest_names_a_corrupt_or_missing_file(exported, tmp_path):
    dit_path, set_dir = exported
    copy = tmp_path / "copy"
    shutil.copytree(set_dir, copy)
    data = bytearray((copy / "b01_mlp.onnx").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / "b01_mlp.onnx").write_bytes(bytes(data))
    with pytest.raises(AnimaError, match=r"subgraph file .*b01_mlp\.onnx is corrupt"):
        load_manifest(copy, dit_path=dit_path, width=128, height=64)
    (copy / "b00_cross_attn.onnx").unlink()
    with pytest.raises(AnimaError, match=r"subgraph file .*b00_cross_attn\.onnx is missing"):
        load_manifest(copy, dit_path=dit_path, width=128, height=64)
    with pytest.raises(AnimaError, match="holds no manifest.json"):
        load_manifest(tmp_path, dit_path=dit_path, width=128, height=64)


def test_export_refuses_bad_sizes_and_a_non_empty_folder(exported):
    dit_path, set_dir = exported
    with pytest.raises(AnimaError, match="multiples of 16 up to 8192, got 120x64"):
        export_subgraphs(dit_path, 120, 64, set_dir.parent / "new", progress=False)
    before = {p.name: p.stat().st_mtime_ns for p in set_dir.iterdir()}
    with pytest.raises(AnimaError, match="is not empty \\(it holds a subgraph set\\); pass --overwrite"):
        export_subgraphs(dit_path, 64, 64, set_dir, progress=False)
    assert {p.name: p.stat().st_mtime_ns for p in set_dir.iterdir()} == before


def test_cli_export_fp16_with_overwrite_and_model_dir(exported, tmp_path):
    dit_path, _ = exported
    out = tmp_path / "fp16"
    out.mkdir()
    (out / "b05_mlp.onnx").write_bytes(b"stale")  # from an earlier, larger set: removed by --overwrite
    args = ["export-onnx", "--dit", str(dit_path), "--width", "64", "--height", "64", "--out", str(out),
            "--dtype", "fp16", "--overwrite"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["dtype"], manifest["tokens"]) == ("float16", 16)
    assert not (out / "b05_mlp.onnx").exists()
    model = onnx.load(out / "b00_self_attn.onnx")
    assert graph_io(model.graph.input)[0]["elem_type"] == onnx.TensorProto.FLOAT16
    assert any(init.data_type == onnx.TensorProto.FLOAT16 for init in model.graph.initializer)

    folder = tmp_path / "model" / "split_files" / "diffusion_models"
    folder.mkdir(parents=True)
    for name in ("a.safetensors", "b.safetensors"):
        shutil.copy(dit_path, folder / name)
    result = CliRunner().invoke(cli, ["export-onnx", "--model", str(tmp_path / "model"), "--out", str(tmp_path / "x")])
    assert isinstance(result.exception, AnimaError)
    assert "a.safetensors, b.safetensors" in str(result.exception)
    result = CliRunner().invoke(cli, ["export-onnx", "--model", str(tmp_path / "model"), "--dit", str(dit_path),
                                      "--out", str(tmp_path / "x")])
    assert "pass one of --model DIR or --dit FILE, not both" in str(result.exception)
    assert not (tmp_path / "x").exists()


def test_cli_export_defaults_to_the_demo_model_at_its_trained_size(tmp_path):
    result = CliRunner().invoke(cli, ["export-onnx", "--out", str(tmp_path / "demo")])
    assert result.exit_code == 0, result.output
    manifest = load_manifest(tmp_path / "demo", dit_path=demo_model_dir() / LAYOUT["dit"] / "anima-demo.safetensors",
                             width=64, height=64)
    assert manifest["model"]["file"] == "anima-demo.safetensors" and manifest["tokens"] == 16


def test_a_terminated_export_leaves_no_temporary_and_no_manifest(tmp_path):
    out = tmp_path / "killed"
    process = subprocess.Popen([sys.executable, "-m", "anima_rknn", "export-onnx", "--out", str(out)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 120
    while not list(out.glob("*.onnx")) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    process.send_signal(signal.SIGTERM)  # the demo model has 18 subgraphs: most are still to come
    _, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, err.decode()
    assert err.decode().rstrip().endswith("terminated by SIGTERM") and b"Traceback" not in err
    assert list(out.glob("*.onnx")) and not [p.name for p in out.iterdir() if is_temporary(p)]
    assert not (out / "manifest.json").exists()  # an unfinished set never looks complete


def test_export_is_deterministic(exported, tmp_path):
    """Same DiT, same size -> byte-identical files (so a re-export keeps matching converted .rknn sets)."""
    dit_path, set_dir = exported
    again = export_subgraphs(dit_path, 128, 64, tmp_path / "again", progress=False).parent
    first = json.loads((set_dir / "manifest.json").read_text())
    assert json.loads((again / "manifest.json").read_text()) == first
