"""The subgraph-set manifest is checked whole, like user input, before any file it names is opened.

Every refusal is one AnimaError line naming the manifest and the entry, through read_manifest, make_engine
(onnx and rknn) and the rknn backend alike; a set never reads outside its own folder, and nothing is unpickled.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import pickle
import signal
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from anima_rknn.engine import RknnOptions, make_engine
from anima_rknn.engine.backends.rknn import RknnBackend
from anima_rknn.errors import AnimaError
from anima_rknn.export.manifest import MANIFEST, Field, clear_set_folder, read_manifest, read_progress, subgraph_name
from anima_rknn.model.io import load_dit

KINDS = ("self_attn", "cross_attn", "mlp")
TOKENS, HIDDEN = 16, 128  # the tiny preset at 64x64
DELETE = object()


def valid_manifest(blocks: int = 2) -> dict[str, Any]:
    """A converted set of the tiny preset (`blocks` blocks) at 64x64, as export-onnx and convert-rknn write it."""
    inputs = {"self_attn": [("x", [1, 16, 128]), ("rope_cos", [1, 1, 16, 64]), ("rope_sin", [1, 1, 16, 64])],
              "cross_attn": [("x", [1, 16, 128]), ("context", [1, 512, 64])], "mlp": [("x", [1, 16, 128])]}
    subgraphs, records = [], []
    for index in range(3 * blocks):
        kind, name = KINDS[index % 3], f"b{index // 3:02d}_{KINDS[index % 3]}"
        subgraphs.append({
            "index": index, "block": index // 3, "kind": kind, "file": f"{name}.onnx", "sha256": f"{index:064x}",
            "inputs": [{"name": n, "shape": s, "dtype": "float32"} for n, s in inputs[kind]],
            "outputs": [{"name": "y", "shape": [1, 16, 128], "dtype": "float32"}],
        })
        records.append({"index": index, "rknn_file": f"{name}.rknn", "rknn_sha256": "ab" * 32, "rknn_bytes": 1000,
                        "convert_s": 0.5, "internal_bytes": 5000, "weight_bytes": 800})
    return {
        "format": "anima-rknn-subgraphs/1",
        "model": {"file": "tiny.safetensors", "sha256": "cd" * 32, "blocks": blocks, "hidden": 128, "heads": 2,
                  "head_dim": 64, "context_dim": 64},
        "width": 64, "height": 64, "tokens": 16, "context_tokens": 512, "dtype": "float32", "opset": 17,
        "subgraphs": subgraphs,
        "rknn": {"source_sha256": "ef" * 32, "target": "rk3588", "toolkit_version": "2.5.0", "subgraphs": records},
    }


def changed(path: tuple, value: Any) -> dict[str, Any]:
    manifest = copy.deepcopy(valid_manifest())
    if not path:
        return value
    parent = manifest
    for key in path[:-1]:
        parent = parent[key]
    if value is DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return manifest


def write_set(folder: Path, manifest: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return folder


def refusal(call) -> str:
    with pytest.raises(AnimaError) as raised:
        call()
    message = str(raised.value)
    assert "\n" not in message and "Traceback" not in message
    return message


@pytest.fixture(scope="module")
def dit(tiny_set):
    return load_dit(tiny_set.dit, torch.float32)


def every_reader(folder: Path, dit) -> list[str]:
    """The message each public way of opening a set gives."""
    return [
        refusal(lambda: read_manifest(folder)),
        refusal(lambda: make_engine(dit, "onnx", width=64, height=64, subgraphs=folder)),
        refusal(lambda: make_engine(dit, "rknn", width=64, height=64, subgraphs=folder,
                                    rknn=RknnOptions(runtime="simulator"))),
        refusal(lambda: RknnBackend(folder, runtime="simulator")),
    ]


NAME_CASES = [
    ("/etc/passwd", "it is an absolute path"),
    ("../b01_self_attn.onnx", "it contains a path separator"),
    ("sub/b01_self_attn.onnx", "it contains a path separator"),
    ("sub\\b01_self_attn.onnx", "it contains a path separator"),
    ("..", "it is '..'"),
    (".b01_self_attn.onnx", "it starts with '.'"),
    ("", "it is empty"),
    ("b01\0.onnx", "it contains a NUL character"),
    ("b01\n.onnx", "it contains a control character"),
    ("b01\ud800.onnx", "it is not valid text for a file name"),
    ("x" * 300 + ".onnx", "it is too long"),
    ("b01_self_attn.pkl", "it does not end in .onnx"),
]

BAD = [
    # (where, new value, the message after "<folder>/manifest.json: ")
    ((), [], "expected an object, got []"),
    ((), "anima", "expected an object, got 'anima'"),
    (("format",), "anima-rknn-subgraphs/2", "not an anima-rknn-subgraphs/1 manifest"),
    (("format",), DELETE, "not an anima-rknn-subgraphs/1 manifest"),
    (("model",), "x", "model: expected an object, got 'x'"),
    (("model", "file"), 7, "model.file: expected a file name, got 7"),
    (("model", "file"), "../dit.safetensors", "model.file: '../dit.safetensors' is not a plain file name: "
                                              "it contains a path separator"),
    (("model", "sha256"), "AB" * 32, "model.sha256: expected a sha256 (64 lowercase hex digits), got 'ABAB"),
    (("model", "sha256"), None, "model.sha256: expected a sha256 (64 lowercase hex digits), got null"),
    (("model", "blocks"), 0, "model.blocks: expected a whole number from 1 to 1024, got 0"),
    (("model", "blocks"), True, "model.blocks: expected a whole number from 1 to 1024, got true"),
    (("model", "blocks"), 10**40, "model.blocks: expected a whole number from 1 to 1024, got 1000000000"),
    (("model", "hidden"), 128.0, "model.hidden: expected a whole number from 1 to 65536, got 128.0"),
    (("model", "hidden"), "128", "model.hidden: expected a whole number from 1 to 65536, got '128'"),
    (("model", "heads"), DELETE, "model.heads: missing"),
    (("model", "head_dim"), -64, "model.head_dim: expected a whole number from 1 to 4096, got -64"),
    (("model", "context_dim"), [64], "model.context_dim: expected a whole number from 1 to 65536, got [64]"),
    (("width",), 72, "width: expected a multiple of 16, got 72"),
    (("width",), 8208, "width: expected a whole number from 16 to 8192, got 8208"),
    (("height",), "64", "height: expected a whole number from 16 to 8192, got '64'"),
    (("height",), 0, "height: expected a whole number from 16 to 8192, got 0"),
    (("tokens",), 17, "tokens: expected 16, got 17"),
    (("tokens",), 16.0, "tokens: expected 16, got 16.0"),
    (("context_tokens",), 10**9, "context_tokens: expected a whole number from 1 to 65536, got 1000000000"),
    (("dtype",), "bfloat16", "dtype: expected one of float32, float16, got 'bfloat16'"),
    (("subgraphs",), {}, "subgraphs: expected a list, got an object"),
    (("subgraphs",), [], "subgraphs: expected 6 entries, got 0"),
    (("subgraphs", 3), None, "subgraphs[3]: expected an object, got null"),
    (("subgraphs", 3, "index"), 4, "subgraphs[3].index: expected 3, got 4"),
    (("subgraphs", 3, "index"), "3", "subgraphs[3].index: expected 3, got '3'"),
    (("subgraphs", 3, "block"), 0, "subgraphs[3].block: expected 1, got 0"),
    (("subgraphs", 3, "kind"), "mlp", "subgraphs[3].kind: expected 'self_attn', got 'mlp'"),
    (("subgraphs", 3, "file"), DELETE, "subgraphs[3].file: missing"),
    (("subgraphs", 3, "file"), ["a.onnx"], "subgraphs[3].file: expected a file name, got ['a.onnx']"),
    (("subgraphs", 4, "file"), "b01_self_attn.onnx", "subgraphs: two entries name the same file"),
    (("subgraphs", 3, "sha256"), "0" * 63, "subgraphs[3].sha256: expected a sha256"),
    (("subgraphs", 3, "inputs"), [], "subgraphs[3].inputs: expected 3 entries, got 0"),
    (("subgraphs", 3, "inputs", 1, "name"), "evil", "subgraphs[3].inputs[1].name: expected 'rope_cos', got 'evil'"),
    (("subgraphs", 3, "inputs", 0, "shape"), [1, 10**12, 128],
     r"subgraphs[3].inputs[0].shape: expected [1, 16, 128], got [1, 1000000000000, 128]"),
    (("subgraphs", 3, "inputs", 0, "shape"), [1, 16, True], "subgraphs[3].inputs[0].shape: expected [1, 16, 128], "
                                                            "got [1, 16, true]"),
    (("subgraphs", 3, "inputs", 0, "shape"), [[1]] * 3, "subgraphs[3].inputs[0].shape: expected [1, 16, 128], "
                                                        "got a list"),
    (("subgraphs", 3, "inputs", 0, "dtype"), "float64", "subgraphs[3].inputs[0].dtype: expected 'float32'"),
    (("subgraphs", 5, "outputs", 0, "shape"), [1, 16, 128.5], "subgraphs[5].outputs[0].shape: expected"),
    (("subgraphs", 5, "outputs"), "y", "subgraphs[5].outputs: expected a list, got 'y'"),
    (("rknn",), [], "rknn: expected an object, got []"),
    (("rknn", "target"), "rk 3588", "rknn.target: expected a short name of letters, digits and ._+-, got 'rk 3588'"),
    (("rknn", "toolkit_version"), "2" * 41, "rknn.toolkit_version: expected a short name"),
    (("rknn", "source_sha256"), DELETE, "rknn.source_sha256: missing"),
    (("rknn", "subgraphs"), [{}] * 7, "rknn.subgraphs: expected 6 entries, got 7"),
    (("rknn", "subgraphs", 2, "index"), 3, "rknn.subgraphs[2].index: expected 2, got 3"),
    (("rknn", "subgraphs", 2, "rknn_file"), "../b00_mlp.rknn",
     "rknn.subgraphs[2].rknn_file: '../b00_mlp.rknn' is not a plain file name: it contains a path separator"),
    (("rknn", "subgraphs", 2, "rknn_file"), "b00_mlp.onnx",
     "rknn.subgraphs[2].rknn_file: 'b00_mlp.onnx' is not a plain file name: it does not end in .rknn"),
    (("rknn", "subgraphs", 2, "rknn_file"), "b01_mlp.rknn",
     "rknn.subgraphs[2].rknn_file: expected 'b00_mlp.rknn', got 'b01_mlp.rknn'"),
    (("rknn", "subgraphs", 2, "rknn_bytes"), "1000", "rknn.subgraphs[2].rknn_bytes: expected a whole number"),
    (("rknn", "subgraphs", 2, "internal_bytes"), -1,
     "rknn.subgraphs[2].internal_bytes: expected a whole number from 0 to 1125899906842624, got -1"),
    (("rknn", "subgraphs", 2, "weight_bytes"), 10**400, "rknn.subgraphs[2].weight_bytes: expected a whole number"),
    (("rknn", "subgraphs", 2, "convert_s"), float("nan"), "rknn.subgraphs[2].convert_s: expected a number from 0 "
                                                          "to 10000000.0, got nan"),
    (("rknn", "subgraphs", 2, "convert_s"), 10**400, "rknn.subgraphs[2].convert_s: expected a number"),
    *[(("subgraphs", 3, "file"), name, f"subgraphs[3].file: {name!r} is not a plain file name: {why}"
       if len(name) < 60 else "subgraphs[3].file: 'xxx") for name, why in NAME_CASES],
]


def test_the_valid_manifest_is_accepted(tmp_path):
    assert read_manifest(write_set(tmp_path / "set", valid_manifest())) == valid_manifest()


@pytest.mark.parametrize(("where", "value", "message"), BAD)
def test_a_bad_field_is_one_line_naming_the_entry_for_every_reader(tmp_path, dit, where, value, message):
    folder = write_set(tmp_path / "set", changed(where, value))
    for got in every_reader(folder, dit):
        assert got.startswith(f"{folder / MANIFEST}: {message}"), got


@pytest.mark.parametrize("data", [b"", b"{", b"[" * 100_000, b'{"format": 1e999999}', b'"\\ud800"',
                                  b"1" * 5000, b"\xff\xfe{}"])
def test_a_manifest_that_is_not_json_is_one_line(tmp_path, data):
    folder = tmp_path / "set"
    folder.mkdir()
    (folder / MANIFEST).write_bytes(data)
    assert refusal(lambda: read_manifest(folder)).startswith(f"{folder / MANIFEST}: ")


def test_a_huge_manifest_is_refused_without_reading_it_all(tmp_path):
    folder = tmp_path / "set"
    folder.mkdir()
    with open(folder / MANIFEST, "wb") as f:
        f.truncate(1 << 34)  # sparse: 16 GiB that would never fit in memory
    assert refusal(lambda: read_manifest(folder)).endswith("larger than 8 MiB")


def test_sets_of_up_to_1024_blocks_read_and_a_reconversion_clears_their_stale_files(tmp_path):
    """Block numbers past 99 take three or four digits (b100_mlp); sets written before keep their two (b07)."""
    assert (subgraph_name(21), subgraph_name(300), subgraph_name(3071)) == ("b07_self_attn", "b100_self_attn",
                                                                            "b1023_mlp")
    manifest = read_manifest(write_set(tmp_path / "big", valid_manifest(blocks=1024)))
    assert manifest["rknn"]["subgraphs"][-1]["rknn_file"] == "b1023_mlp.rknn"
    folder = tmp_path / "stale"
    folder.mkdir()
    for name in ("b07_mlp.rknn", "b100_mlp.rknn", "b1023_cross_attn.quantization.cfg", "b00_mlp.rknn", "notes.txt"):
        (folder / name).write_text("x")
    clear_set_folder(folder, keep=["b00_mlp.rknn"])
    assert sorted(p.name for p in folder.iterdir()) == ["b00_mlp.rknn", "notes.txt"]


class Unpickled:
    """Unpickling this creates `marker`: proof that something was unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def test_a_pickle_planted_as_manifest_or_subgraph_file_is_never_unpickled(tmp_path, dit):
    marker = tmp_path / "unpickled"
    planted = pickle.dumps(Unpickled(marker))
    folder = tmp_path / "set"
    folder.mkdir()
    (folder / MANIFEST).write_bytes(planted)
    assert all("not valid JSON" in message for message in every_reader(folder, dit))

    manifest = valid_manifest()  # every file a pickle whose sha256 the manifest agrees with
    for entry in manifest["subgraphs"]:
        (folder / entry["file"]).write_bytes(planted)
        entry["sha256"] = hashlib.sha256(planted).hexdigest()
    write_set(folder, manifest)
    message = refusal(lambda: make_engine(dit, "onnx", width=64, height=64, subgraphs=folder))
    assert message.startswith(f"cannot load subgraph file {folder / 'b00_self_attn.onnx'}: ")
    assert not marker.exists()


class Blocked(Exception):
    """Not an OSError, which the code under test would turn into its own message."""


@contextlib.contextmanager
def no_hang(seconds: int = 20):
    """Fail instead of hanging if the block blocks (opening a FIFO for reading waits for a writer)."""
    def give_up(signum, frame):
        raise Blocked("something opened the FIFO")

    previous = signal.signal(signal.SIGALRM, give_up)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize(("field", "name"), [("subgraphs[4].file", "b01_cross_attn.onnx"),
                                             ("rknn.subgraphs[4].rknn_file", "b01_cross_attn.rknn")])
def test_a_link_leading_out_is_refused_alike_whether_its_target_exists_or_not(tmp_path, dit, field, name):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"secret")
    os.mkfifo(outside / "fifo")
    folder = write_set(tmp_path / "set", valid_manifest())
    link = folder / name
    messages = set()
    for target in (outside / "secret", outside / "missing", outside / "fifo", "../outside/secret",
                   "../outside/missing"):
        link.unlink(missing_ok=True)
        link.symlink_to(target)
        with no_hang():
            messages.update(every_reader(folder, dit))
    assert messages == {f"{folder / MANIFEST}: {field}: {name!r} is a link leading out of {folder}"}


def test_a_manifest_link_leading_out_or_a_fifo_manifest_is_refused_unopened(tmp_path, dit):
    outside = write_set(tmp_path / "outside", valid_manifest())  # a valid set, but not this folder's
    folder = tmp_path / "set"
    folder.mkdir()
    (folder / MANIFEST).symlink_to(outside / MANIFEST)
    leading_out = f"{folder / MANIFEST}: 'manifest.json' is a link leading out of {folder}"
    assert set(every_reader(folder, dit)) == {leading_out}
    (folder / MANIFEST).unlink()
    (folder / MANIFEST).symlink_to(tmp_path / "missing.json")
    assert set(every_reader(folder, dit)) == {leading_out}
    (folder / MANIFEST).unlink()
    os.mkfifo(folder / MANIFEST)
    with no_hang():
        assert set(every_reader(folder, dit)) == {f"{folder / MANIFEST}: not a regular file"}


def test_links_that_stay_inside_the_folder_are_followed(tmp_path):
    folder = write_set(tmp_path / "set", valid_manifest())
    (folder / "real.onnx").write_bytes(b"graph")
    (folder / "b00_mlp.onnx").symlink_to("real.onnx")
    (folder / "b01_mlp.onnx").symlink_to(folder / "real.onnx")
    assert read_manifest(folder)["width"] == 64


def test_a_missing_manifest_says_how_to_make_one(tmp_path):
    assert refusal(lambda: read_manifest(tmp_path)) == (f"{tmp_path} holds no manifest.json: export a subgraph set "
                                                        "with `anima-rknn export-onnx` first")


IDENTITY = {"source_sha256": "ef" * 32, "target": "rk3588", "toolkit_version": "2.5.0"}
RKNN_NAMES = [f"b{i // 3:02d}_{KINDS[i % 3]}.rknn" for i in range(6)]
RECORD = {"rknn_file": "b00_mlp.rknn", "rknn_sha256": "ab" * 32, "rknn_bytes": 1000, "convert_s": 0.5}


@pytest.mark.parametrize(("progress", "message"), [
    ({**IDENTITY, "done": {"b00_mlp.rknn": {**RECORD, "rknn_file": "../b00_mlp.rknn"}}},
     "done['b00_mlp.rknn'].rknn_file: '../b00_mlp.rknn' is not a plain file name: it contains a path separator"),
    ({**IDENTITY, "done": {"../x.rknn": {**RECORD, "rknn_file": "../x.rknn"}}},
     "done['../x.rknn']: not a file of this set"),
    ({**IDENTITY, "done": {"b00_mlp.rknn": {**RECORD, "rknn_sha256": 5}}},
     "done['b00_mlp.rknn'].rknn_sha256: expected a sha256 (64 lowercase hex digits), got 5"),
    ({**IDENTITY, "done": []}, "done: expected an object, got []"),
    ({**IDENTITY}, "done: missing"),
    ([IDENTITY, 1, 2, 3, 4, 5, 6, 7, 8], "expected an object, got a list"),
])
def test_a_bad_progress_file_is_one_line_naming_the_entry(tmp_path, progress, message):
    path = tmp_path / "convert-progress.json"
    path.write_text(json.dumps(progress))
    assert refusal(lambda: read_progress(path, IDENTITY, RKNN_NAMES)) == f"{path}: {message}"


def test_progress_of_another_conversion_is_told_apart_and_a_link_out_is_refused(tmp_path):
    path = tmp_path / "out" / "convert-progress.json"
    path.parent.mkdir()
    assert read_progress(path, IDENTITY, RKNN_NAMES) == {}
    path.write_text(json.dumps({**IDENTITY, "target": "rk3576", "done": {"b00_mlp.rknn": "junk"}}))
    assert read_progress(path, IDENTITY, RKNN_NAMES) is None
    path.write_text(json.dumps({**IDENTITY, "done": {"b00_mlp.rknn": RECORD}}))
    assert read_progress(path, IDENTITY, RKNN_NAMES) == {"b00_mlp.rknn": RECORD}
    path.unlink()
    path.symlink_to(tmp_path / "elsewhere.json")
    assert refusal(lambda: read_progress(path, IDENTITY, RKNN_NAMES)) == (
        f"{path}: 'convert-progress.json' is a link leading out of {path.parent}")


def test_field_names_keep_messages_on_one_line():
    at = Field("set/manifest.json")
    with pytest.raises(AnimaError, match=r"^set/manifest.json: done\['a\\nb'\]\[2\]: x$"):
        at["done"]["a\nb"][2].fail("x")


# ---- VAE sets: the decoder alone, or the decoder and the encoder, and nothing else ------------------------------

def vae_entry(index: int, kind: str, file: str, inputs: dict, outputs: dict) -> dict[str, Any]:
    return {"index": index, "kind": kind, "file": file, "sha256": f"{index + 1:064x}",
            "inputs": [{"name": n, "shape": s, "dtype": "float32"} for n, s in inputs.items()],
            "outputs": [{"name": n, "shape": s, "dtype": "float32"} for n, s in outputs.items()]}


DECODER = vae_entry(0, "vae_decoder", "vae_decoder.onnx", {"z": [1, 16, 8, 8]}, {"y": [1, 3, 64, 64]})
ENCODER = vae_entry(1, "vae_encoder", "vae_encoder.onnx", {"image": [1, 3, 64, 64]}, {"y": [1, 16, 8, 8]})


def valid_vae_manifest(encoder: bool = True, converted: bool = False) -> dict[str, Any]:
    """A 64-px VAE set of the tiny VAE, as export-vae [--encoder] (and convert-rknn) write it."""
    manifest = {
        "format": "anima-rknn-vae/1",
        "model": {"file": "vae.safetensors", "sha256": "cd" * 32, "z_dim": 16, "scale_factor": 8},
        "tile": 64, "overlap": 16, "dtype": "float32", "opset": 17, "stream_peak": 25.0, "stream_scale": 1.0,
        "subgraphs": [copy.deepcopy(DECODER)],
    }
    if encoder:
        manifest.update(encoder_stream_peak=22.0, encoder_stream_scale=1.0)
        manifest["subgraphs"].append(copy.deepcopy(ENCODER))
    if converted:
        manifest["rknn"] = {**IDENTITY, "subgraphs": [
            {"index": e["index"], "rknn_file": e["file"].replace(".onnx", ".rknn"), "rknn_sha256": "ab" * 32,
             "rknn_bytes": 1000, "convert_s": 0.5} for e in manifest["subgraphs"]]}
    return manifest


@pytest.mark.parametrize("encoder", [False, True])
@pytest.mark.parametrize("converted", [False, True])
def test_a_vae_set_with_the_decoder_alone_or_with_the_encoder_is_accepted(tmp_path, encoder, converted):
    manifest = valid_vae_manifest(encoder, converted)
    assert read_manifest(write_set(tmp_path / "set", manifest), kind="vae") == manifest


def vae_changed(change) -> dict[str, Any]:
    manifest = valid_vae_manifest(converted=True)
    change(manifest)
    return manifest


VAE_BAD = [
    (lambda m: m.update(subgraphs=[]), "subgraphs: expected 1 or 2 entries (the decoder, then the encoder), got 0"),
    (lambda m: m["subgraphs"].append(copy.deepcopy(ENCODER)),
     "subgraphs: expected 1 or 2 entries (the decoder, then the encoder), got 3"),
    (lambda m: m.update(subgraphs=[copy.deepcopy(ENCODER)]), "subgraphs[0].index: expected 0, got 1"),
    (lambda m: m["subgraphs"][1].update(index=0), "subgraphs[1].index: expected 1, got 0"),
    (lambda m: m.update(subgraphs=[copy.deepcopy(DECODER), {**copy.deepcopy(DECODER), "index": 1}]),
     "subgraphs[1].kind: expected 'vae_encoder', got 'vae_decoder'"),
    (lambda m: m["subgraphs"][1].update(file="vae_decoder.onnx"), "subgraphs: two entries name the same file"),
    (lambda m: m["subgraphs"][1].update(file="../vae_encoder.onnx"),
     "subgraphs[1].file: '../vae_encoder.onnx' is not a plain file name: it contains a path separator"),
    (lambda m: m["subgraphs"][1]["inputs"][0].update(name="z"),
     "subgraphs[1].inputs[0].name: expected 'image', got 'z'"),
    (lambda m: m["subgraphs"][1]["inputs"][0].update(shape=[1, 3, 32, 32]),
     "subgraphs[1].inputs[0].shape: expected [1, 3, 64, 64], got [1, 3, 32, 32]"),
    (lambda m: m["subgraphs"][1]["outputs"][0].update(shape=[1, 16, 4, 4]),
     "subgraphs[1].outputs[0].shape: expected [1, 16, 8, 8], got [1, 16, 4, 4]"),
    (lambda m: m.pop("encoder_stream_peak"), "encoder_stream_peak: missing"),
    (lambda m: m.update(encoder_stream_scale=3.0), "encoder_stream_scale: expected a power of two, got 3.0"),
    (lambda m: m.update(encoder_stream_peak=None, encoder_stream_scale=2.0),
     "encoder_stream_scale: expected a number from 1 to 1, got 2.0"),
    (lambda m: m["rknn"]["subgraphs"].pop(), "rknn.subgraphs: expected 2 entries, got 1"),
    (lambda m: m["rknn"]["subgraphs"][1].update(rknn_file="vae_decoder.rknn"),
     "rknn.subgraphs[1].rknn_file: expected 'vae_encoder.rknn', got 'vae_decoder.rknn'"),
]


@pytest.mark.parametrize(("change", "message"), VAE_BAD)
def test_a_vae_set_holding_anything_else_is_one_line_naming_the_entry(tmp_path, change, message):
    folder = write_set(tmp_path / "set", vae_changed(change))
    assert refusal(lambda: read_manifest(folder, kind="vae")) == f"{folder / MANIFEST}: {message}"
    assert refusal(lambda: RknnBackend(folder, runtime="simulator")) == f"{folder / MANIFEST}: {message}"


def test_an_encoder_file_linking_out_of_the_set_is_refused(tmp_path):
    folder = write_set(tmp_path / "set", valid_vae_manifest())
    (folder / "vae_encoder.onnx").symlink_to(tmp_path / "elsewhere.onnx")
    assert refusal(lambda: read_manifest(folder, kind="vae")) == (
        f"{folder / MANIFEST}: subgraphs[1].file: 'vae_encoder.onnx' is a link leading out of {folder}")


# Property-based: whatever JSON a manifest holds, reading it either succeeds or is one AnimaError line.

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=25,
)


def paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every place in a JSON value, the value itself included."""
    found = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            found += paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found += paths(child, (*prefix, index))
    return found


PLACES = paths(valid_manifest())


def read_outcome(folder: Path, manifest: Any, kind: str | None = "dit") -> None:
    (folder / MANIFEST).write_text(json.dumps(manifest))
    try:
        assert isinstance(read_manifest(folder, kind=kind), dict)
    except AnimaError as e:
        assert "\n" not in str(e)


@settings(max_examples=200, deadline=None)
@given(manifest=JSON)
def test_any_json_value_reads_or_is_one_anima_error(manifest):
    with tempfile.TemporaryDirectory() as folder:
        read_outcome(Path(folder), manifest)


@settings(max_examples=200, deadline=None)
@given(place=st.sampled_from(PLACES), value=JSON)
def test_a_valid_manifest_with_any_one_field_replaced_reads_or_is_one_anima_error(place, value):
    with tempfile.TemporaryDirectory() as folder:
        read_outcome(Path(folder), changed(place, value))


VAE_PLACES = paths(valid_vae_manifest(converted=True))


@settings(max_examples=200, deadline=None)
@given(place=st.sampled_from(VAE_PLACES), value=JSON)
def test_a_valid_vae_manifest_with_any_one_field_replaced_reads_or_is_one_anima_error(place, value):
    manifest = copy.deepcopy(valid_vae_manifest(converted=True))
    parent = manifest
    for key in place[:-1]:
        parent = parent[key]
    if place:
        parent[place[-1]] = value
    else:
        manifest = value
    with tempfile.TemporaryDirectory() as folder:
        read_outcome(Path(folder), manifest, kind="vae")

