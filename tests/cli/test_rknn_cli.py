"""`convert-rknn`, `plan`, `verify-rknn` and `generate --backend rknn` as a user runs them.

The toolkit-dependent tests run in .venv-rknn on the real exporter's subgraphs of the tiny model set; the
missing-toolkit message and the planner run anywhere.
"""

from __future__ import annotations

import importlib.util
import json
import pickle
import shutil

import numpy as np
import pytest
from PIL import Image
from test_outputs_cli import _one_line, _when

from anima_rknn.core.files import held_folder, output_folder, sha256_file
from anima_rknn.export.manifest import read_manifest, rknn_name
from anima_rknn.export.rknn import TOOLKIT_MISSING

HAS_TOOLKIT = importlib.util.find_spec("rknn") is not None
needs_toolkit = pytest.mark.skipif(not HAS_TOOLKIT, reason="rknn-toolkit2 lives in .venv-rknn")
SIZE = ("--width", "64", "--height", "64")


@pytest.mark.skipif(HAS_TOOLKIT, reason="checks the message shown where the toolkit is missing")
def test_convert_without_the_toolkit_says_how_to_install_it(run_cli, tmp_path):
    (tmp_path / "onnx").mkdir()
    result = run_cli("convert-rknn", "--subgraphs", tmp_path / "onnx", "--out", tmp_path / "rknn")
    assert result.code == 1
    assert result.err == f"error: {TOOLKIT_MISSING}\n" and "scripts/setup-rknn-env.sh" in result.err


def test_plan_for_the_full_model_on_the_board(run_cli):
    result = run_cli("plan", "--preset", "full", "-W", "512", "-H", "512", "--budget", "8GB")
    assert result.code == 0, result.err
    assert "84 contexts, 1024 tokens" in result.out and "budget 7.45 GiB" in result.out
    resident = int(result.out.split("resident contexts ")[1].split()[0])
    assert 1 < resident < 84
    assert f"per transformer pass: {84 - resident + 1} loads, {84 - resident + 1} releases" in result.out


@pytest.mark.parametrize(("args", "message"), [
    (("--preset", "full", "--budget", "1GB"), "cannot hold the host side plus one RKNN context"),
    (("--preset", "full", "--budget", "lots"), "cannot read 'lots' as a memory size"),
    ((), "pass exactly one of --subgraphs DIR or --preset NAME"),
])
def test_plan_refuses_in_one_line(run_cli, args, message):
    result = run_cli("plan", *args)
    assert result.code == 1 and message in result.err and result.err.count("\n") == 1


@needs_toolkit
def test_convert_shows_progress_and_resumes(run_cli, tiny_onnx_set, tmp_path):
    out = tmp_path / "rknn"
    result = run_cli("convert-rknn", "--subgraphs", tiny_onnx_set, "--out", out)
    assert result.code == 0, result.err
    assert "converted 6 subgraphs for rk3588" in result.out
    assert "rknn convert" in result.err and "6/6" in result.err  # the progress bar, on stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(r["rknn_file"] for r in manifest["rknn"]["subgraphs"]) == sorted(p.name for p in out.glob("*.rknn"))
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("*.rknn")}
    (out / "b01_mlp.rknn").unlink()
    assert run_cli("convert-rknn", "--subgraphs", tiny_onnx_set, "--out", out).code == 0
    after = {p.name: p.stat().st_mtime_ns for p in out.glob("*.rknn")}
    assert [name for name in after if after[name] != before.get(name)] == ["b01_mlp.rknn"]


@needs_toolkit
def test_verify_reports_every_subgraph_close_to_fp32_torch(run_cli, model_dir, tiny_rknn_set):
    result = run_cli("verify-rknn", "--model", model_dir, "--subgraphs", tiny_rknn_set, "--runtime", "simulator",
                     "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert [r["file"] for r in report["subgraphs"]] == [
        "b00_self_attn.rknn", "b00_cross_attn.rknn", "b00_mlp.rknn",
        "b01_self_attn.rknn", "b01_cross_attn.rknn", "b01_mlp.rknn"]
    assert report["flagged"] == [] and report["min_cosine"] == 0.999
    for r in report["subgraphs"]:
        # fp16 bodies: a few unit roundoffs (2**-11) of the output scale; see test_rknn_backend.py
        assert r["cosine"] > 0.9999 and 0 < r["max_rel_error"] < 4e-3
    assert result.err.endswith("all 6 subgraphs at cosine >= 0.999\n")


@needs_toolkit
def test_verify_flags_swapped_subgraphs_and_exits_1(run_cli, model_dir, tiny_onnx_set, tiny_rknn_set, tmp_path):
    # The simulator builds each context from the ONNX source beside its .rknn: swap the two MLPs there (hashes
    # made to match), as a converter that mixed up files would. Each then runs the other block's weights.
    rknn = tmp_path / "rknn"
    shutil.copytree(tiny_rknn_set, rknn)
    (rknn / "b00_mlp.onnx").write_bytes((tiny_onnx_set / "b01_mlp.onnx").read_bytes())
    (rknn / "b01_mlp.onnx").write_bytes((tiny_onnx_set / "b00_mlp.onnx").read_bytes())
    manifest = json.loads((rknn / "manifest.json").read_text())
    for entry in manifest["subgraphs"]:
        entry["sha256"] = sha256_file(rknn / entry["file"])
    (rknn / "manifest.json").write_text(json.dumps(manifest))
    result = run_cli("verify-rknn", "--model", model_dir, "--subgraphs", rknn, "--runtime", "simulator")
    assert result.code == 1
    rows = result.out.splitlines()[1:]
    assert len(rows) == 6 and [row.split()[1] for row in rows if row.endswith("BELOW 0.999")] == [
        "b00_mlp.rknn", "b01_mlp.rknn"]
    assert result.err == "error: 2 of 6 subgraphs below cosine 0.999: b00_mlp.rknn, b01_mlp.rknn\n"


@needs_toolkit
def test_generate_on_the_simulator_computes_the_same_steps_as_torch(run_cli, model_dir, tiny_rknn_set, tmp_path):
    reports, images = {}, {}
    for backend in ("torch", "rknn"):
        out = tmp_path / f"{backend}.png"
        result = run_cli("generate", "--model", model_dir, "-p", "a red circle", *SIZE, "--cache", "spectrum",
                         "--backend", backend, "--subgraphs", tiny_rknn_set, "--rknn-runtime", "simulator",
                         "--rknn-budget", "2GiB", "-o", out, "--json")
        assert result.code == 0, result.err
        reports[backend] = json.loads(result.out)
        images[backend] = np.asarray(Image.open(out), dtype=np.float64)
    torch_run, rknn_run = reports["torch"], reports["rknn"]
    assert rknn_run["finite"] is True and rknn_run["backend"] == "rknn"
    assert rknn_run["dtype"] == "fp16"  # what ran: the NPU's fp16, whatever --dtype (auto) chose for torch
    parameters = Image.open(tmp_path / "rknn.png").info["parameters"]
    assert "Dtype: fp16" in parameters and "Backend: rknn" in parameters
    assert f"VAE backend: {rknn_run['vae_backend']}" in parameters and f"Threads: {rknn_run['threads']}" in parameters
    assert rknn_run["computed_steps"] == torch_run["computed_steps"] == [1, 2, 3, 4, 6, 8, 11, 14, 18, 19, 20]
    assert rknn_run["skipped_steps"] == torch_run["skipped_steps"] and rknn_run["recomputed_steps"] == []
    assert rknn_run["transformer_passes"] == torch_run["transformer_passes"] == 22
    # fp16 bodies move the 8-bit image by at most a few levels on the tiny model
    print("max pixel difference", np.abs(images["rknn"] - images["torch"]).max())
    assert np.abs(images["rknn"] - images["torch"]).max() <= 8


@needs_toolkit
def test_a_lora_baked_for_the_npu_runs_only_with_the_same_lora(run_cli, model_dir, tiny_set, tmp_path):
    from lora_files import comfy, random_pairs, write_lora

    from anima_rknn.model.io import read_dit_config

    lora = write_lora(tmp_path / "style.safetensors",
                      comfy(random_pairs(read_dit_config(tiny_set.dit), seed=1, strength=1.0)))
    style = f"{lora}:0.8"
    assert run_cli("export-onnx", "--model", model_dir, *SIZE, "--out", tmp_path / "onnx", "--lora", style).code == 0
    assert run_cli("convert-rknn", "--subgraphs", tmp_path / "onnx", "--out", tmp_path / "rknn").code == 0
    baked = read_manifest(tmp_path / "rknn")["loras"]
    assert [(entry["file"], entry["scale"]) for entry in baked] == [("style.safetensors", 0.8)]
    images = {}
    for backend in ("torch", "rknn"):
        out = tmp_path / f"{backend}.png"
        result = run_cli("generate", "--model", model_dir, "-p", "a red circle", *SIZE, "--steps", "4",
                         "--backend", backend, "--subgraphs", tmp_path / "rknn", "--rknn-runtime", "simulator",
                         "--lora", style, "-o", out)
        assert result.code == 0, result.err
        images[backend] = np.asarray(Image.open(out), dtype=np.float64)
    assert np.abs(images["rknn"] - images["torch"]).max() <= 8  # fp16 bodies, as without a LoRA
    refused = run_cli("generate", "--model", model_dir, "-p", "a red circle", *SIZE, "--backend", "rknn",
                      "--subgraphs", tmp_path / "rknn", "--rknn-runtime", "simulator", "-o", tmp_path / "no.png")
    assert refused.code == 1 and "were baked with LoRAs style.safetensors:0.8, this run asks for none" in refused.err
    assert not (tmp_path / "no.png").exists()


@needs_toolkit
def test_generate_refuses_a_set_for_another_resolution(run_cli, model_dir, tiny_rknn_set, tmp_path):
    result = run_cli("generate", "--model", model_dir, "-p", "cat", "--width", "128", "--height", "128",
                     "--steps", "2", "--backend", "rknn", "--subgraphs", tiny_rknn_set, "--rknn-runtime", "simulator",
                     "-o", tmp_path / "x.png")
    assert result.code == 1 and "exported for 64x64, asked for 128x128" in result.err


# A subgraph set is checked whole before any file it names is opened; each refusal is one line.


@pytest.fixture(scope="module")
def onnx_set(tiny_set, tmp_path_factory):
    pytest.importorskip("onnxscript")
    from anima_rknn.export.onnx import export_subgraphs

    return export_subgraphs(tiny_set.dit, 64, 64, tmp_path_factory.mktemp("onnx") / "set", progress=False).parent


def crafted_copy(onnx_set, folder, where: tuple, value) -> None:
    shutil.copytree(onnx_set, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    parent = manifest
    for key in where[:-1]:
        parent = parent[key]
    parent[where[-1]] = value
    (folder / "manifest.json").write_text(json.dumps(manifest))


def refusals(run_cli, model_dir, folder, tmp_path) -> set[str]:
    """What `plan` and `generate --backend onnx` say about the set in `folder`; each must be one line."""
    out = tmp_path / "x.png"
    results = [run_cli("plan", "--subgraphs", folder),
               run_cli("generate", "--model", model_dir, "-p", "cat", *SIZE, "--steps", "1", "--backend", "onnx",
                       "--subgraphs", folder, "-o", out)]
    for result in results:
        assert result.code == 1 and result.err.count("\n") == 1 and "Traceback" not in result.err, result.err
    assert not out.exists()
    return {result.err for result in results}


@pytest.mark.parametrize(("where", "value", "message"), [
    (("subgraphs", 3, "file"), "../../outside.onnx",
     "subgraphs[3].file: '../../outside.onnx' is not a plain file name: it contains a path separator"),
    (("subgraphs", 3, "file"), "/etc/passwd", "subgraphs[3].file: '/etc/passwd' is not a plain file name: "
                                              "it is an absolute path"),
    (("subgraphs", 3, "file"), "b01\0.onnx", r"subgraphs[3].file: 'b01\x00.onnx' is not a plain file name: "
                                             "it contains a NUL character"),
    (("model", "blocks"), 10**40, "model.blocks: expected a whole number from 1 to 1024, got 1000000000"),
    (("width",), "64", "width: expected a whole number from 16 to 8192, got '64'"),
    (("subgraphs", 0, "inputs", 0, "shape"), [1, 10**12, 128],
     "subgraphs[0].inputs[0].shape: expected [1, 16, 128], got [1, 1000000000000, 128]"),
])
def test_a_crafted_manifest_is_one_line_from_plan_and_generate(run_cli, model_dir, onnx_set, tmp_path, where,
                                                               value, message):
    folder = tmp_path / "crafted"
    crafted_copy(onnx_set, folder, where, value)
    [err] = refusals(run_cli, model_dir, folder, tmp_path)
    assert err.startswith(f"error: {folder / 'manifest.json'}: {message}"), err


def test_a_link_out_of_the_set_is_refused_alike_whether_its_target_exists_or_not(run_cli, model_dir, onnx_set,
                                                                                 tmp_path):
    folder = tmp_path / "linked"
    shutil.copytree(onnx_set, folder)
    (tmp_path / "secret.onnx").write_bytes((onnx_set / "b01_mlp.onnx").read_bytes())  # even a valid graph
    messages = set()
    for target in (tmp_path / "secret.onnx", tmp_path / "missing.onnx"):
        (folder / "b01_mlp.onnx").unlink()
        (folder / "b01_mlp.onnx").symlink_to(target)
        messages |= refusals(run_cli, model_dir, folder, tmp_path)
    assert messages == {f"error: {folder / 'manifest.json'}: subgraphs[5].file: 'b01_mlp.onnx' is a link leading "
                        f"out of {folder}\n"}


def test_a_pickle_as_manifest_is_not_json_and_never_unpickled(run_cli, model_dir, tmp_path):
    class Unpickled:
        def __reduce__(self):
            return open, (str(tmp_path / "unpickled"), "w")

    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "manifest.json").write_bytes(pickle.dumps(Unpickled()))
    [err] = refusals(run_cli, model_dir, folder, tmp_path)
    assert err.startswith(f"error: {folder / 'manifest.json'}: not valid JSON")
    assert not (tmp_path / "unpickled").exists()


# convert-rknn --out: a new or empty folder, or its own interrupted conversion; anything else needs --overwrite.


def listing(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@needs_toolkit
def test_convert_refuses_a_folder_it_does_not_own(run_cli, tiny_onnx_set, tmp_path):
    for holds, name in (("a subgraph set", "manifest.json"), ("other files", "notes.txt")):
        out = tmp_path / name
        out.mkdir()
        (out / name).write_text('{"format": "someone else\'s"}')
        result = run_cli("convert-rknn", "--subgraphs", tiny_onnx_set, "--out", out)
        assert result.code == 1 and "Traceback" not in result.err
        assert result.err == f"error: {out} is not empty (it holds {holds}); pass --overwrite to replace it\n"
        assert listing(out) == {name: b'{"format": "someone else\'s"}'}


def _progress_folder(tmp_path, source, target: str, done: dict):
    """An output folder holding a convert-progress.json for `source`, as an interrupted conversion leaves it."""
    out = tmp_path / "rknn"
    out.mkdir()
    (out / "convert-progress.json").write_text(json.dumps({
        "source_sha256": sha256_file(source / "manifest.json"), "target": target, "toolkit_version": "2.5.0",
        "done": done}))
    return out


@needs_toolkit
def test_convert_refuses_a_crafted_progress_file_and_changes_nothing(run_cli, tiny_onnx_set, tmp_path):
    record = {"rknn_file": "../../b00_mlp.rknn", "rknn_sha256": "ab" * 32, "rknn_bytes": 1, "convert_s": 1.0}
    out = _progress_folder(tmp_path, tiny_onnx_set, "rk3588", {"b00_mlp.rknn": record})
    (out / "manifest.json").write_text("an earlier manifest")
    before = listing(out)
    result = run_cli("convert-rknn", "--subgraphs", tiny_onnx_set, "--out", out)
    assert result.code == 1 and result.err == (
        f"error: {out / 'convert-progress.json'}: done['b00_mlp.rknn'].rknn_file: '../../b00_mlp.rknn' is not a "
        "plain file name: it contains a path separator\n")
    assert listing(out) == before


@needs_toolkit
def test_convert_refuses_the_conversion_of_another_target_without_overwrite(run_cli, tiny_onnx_set, tmp_path):
    out = _progress_folder(tmp_path, tiny_onnx_set, "rk3576", {})
    before = listing(out)
    result = run_cli("convert-rknn", "--subgraphs", tiny_onnx_set, "--out", out)
    assert result.code == 1 and result.err == (f"error: {out} holds the conversion of another set, target, toolkit "
                                               "version or quantization; pass --overwrite to replace it\n")
    assert listing(out) == before


@needs_toolkit
def test_convert_with_overwrite_replaces_a_stale_set_then_resumes_without_it(run_cli, tiny_onnx_set, tmp_path):
    out = tmp_path / "rknn"
    out.mkdir()
    (out / "manifest.json").write_text("a set for another model")
    (out / "b05_mlp.rknn").write_bytes(b"from a larger set")
    (out / "b00_mlp.rknn").write_bytes(b"stale")
    (out / "b00_mlp.onnx").symlink_to(tiny_onnx_set / "b01_mlp.onnx")  # a link is never taken as our copy
    result = run_cli("convert-rknn", "--subgraphs", tiny_onnx_set, "--out", out, "--overwrite")
    assert result.code == 0, result.err
    manifest = read_manifest(out)
    assert not (out / "b05_mlp.rknn").exists() and not (out / "b00_mlp.onnx").is_symlink()
    for entry, record in zip(manifest["subgraphs"], manifest["rknn"]["subgraphs"]):
        assert sha256_file(out / entry["file"]) == entry["sha256"]
        assert sha256_file(out / record["rknn_file"]) == record["rknn_sha256"]
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("*.rknn")}
    result = run_cli("convert-rknn", "--subgraphs", tiny_onnx_set, "--out", out)  # its own work: resumes
    assert result.code == 0, result.err
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*.rknn")} == before  # nothing left to convert


@needs_toolkit
def test_convert_leaves_a_file_that_appears_in_its_folder_and_holds_the_folder(run_cli, tiny_onnx_set, tmp_path):
    """The outputs rule for convert-rknn: a .rknn file that someone else puts in the folder during the run stays
    (one line, exit 1), and a second run into a folder that a run holds is refused before it writes anything."""
    out = tmp_path / "rknn"
    names = [rknn_name(entry["file"]) for entry in read_manifest(tiny_onnx_set)["subgraphs"]]
    other = _when(out / names[0], out / names[-1])  # while the first converts, at the last one's name
    result = run_cli("convert-rknn", "--subgraphs", tiny_onnx_set, "--out", out)
    other.join()
    assert result.code == 1 and _one_line(result) and str(out / names[-1]) in result.err, result.err
    assert "exists; pass --overwrite" in result.err or "appeared while this run was working" in result.err
    assert (out / names[-1]).read_bytes() == b"mine" and not (out / "manifest.json").exists()
    held = tmp_path / "held"
    with held_folder(lambda: output_folder(held, overwrite=False, holds="a subgraph set")):  # another run's
        result = run_cli("convert-rknn", "--subgraphs", tiny_onnx_set, "--out", held)
        assert result.code == 1 and _one_line(result), result.err
        assert result.err.endswith(f"error: another anima-rknn run is writing into {held}; wait for it to end, or "
                                   "choose another folder\n")
        assert list(held.iterdir()) == []
