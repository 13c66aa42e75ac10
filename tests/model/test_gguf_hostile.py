"""Damaged and crafted GGUF files: one line (an AnimaError; `error: ...` and exit 1 from the CLI), no allocation
sized by a count the file cannot back, nothing read past the end."""

from __future__ import annotations

import os
import struct
import sys
import tracemalloc
from pathlib import Path

import pytest
import torch

from anima_rknn.cli import main
from anima_rknn.core.gguf import map_gguf, read_gguf_header, write_gguf
from anima_rknn.core.quant import encode
from anima_rknn.core.tensorfile import load_tensors, save_tensors
from anima_rknn.errors import AnimaError
from anima_rknn.model.io import load_dit, read_dit_config
from anima_rknn.model.quantize import quantize_checkpoint

HUGE = 2**62


def _string(text: str) -> bytes:
    return struct.pack("<Q", len(text)) + text.encode()


def _file(path: Path, *, tensors: int = 0, kvs: int = 0, body: bytes = b"", version: int = 3) -> Path:
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", version, tensors, kvs) + body)
    return path


def _tensor(name: str, ne: list[int], code: int, offset: int = 0) -> bytes:
    return _string(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne) + struct.pack("<IQ", code,
                                                                                                        offset)


@pytest.fixture(scope="module")
def quantized(tiny_set, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hostile") / "dit.gguf"
    quantize_checkpoint(tiny_set.dit, path, "q8_0")
    return path


def _refused(path: Path, *phrases: str) -> str:
    tracemalloc.start()
    try:
        with pytest.raises(AnimaError) as caught:
            map_gguf(read_gguf_header(path, "DiT"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(caught.value)
    assert "\n" not in message and all(p in message for p in phrases), message
    assert peak < 1 << 20, f"{peak} bytes allocated for a {path.stat().st_size}-byte file"
    return message


@pytest.mark.parametrize("cut", [3, 10, 30, 200, 2000, -100, -1])
def test_truncated_anywhere(quantized, tmp_path, cut):
    raw = quantized.read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(raw[:cut])
    _refused(path, str(path))


def test_counts_beyond_the_file(tmp_path):
    _refused(_file(tmp_path / "t.gguf", tensors=HUGE), "tensor count", "more than")
    _refused(_file(tmp_path / "k.gguf", kvs=HUGE), "metadata count", "more than")
    body = _string("a.key") + struct.pack("<I", 8) + struct.pack("<Q", HUGE)
    _refused(_file(tmp_path / "s.gguf", kvs=1, body=body), "metadata a.key", "more than")
    body = _string("tokens") + struct.pack("<II", 9, 8) + struct.pack("<Q", HUGE)
    _refused(_file(tmp_path / "a.gguf", kvs=1, body=body), "tokens", "more than")
    body = _string("scores") + struct.pack("<II", 9, 6) + struct.pack("<Q", HUGE)
    _refused(_file(tmp_path / "f.gguf", kvs=1, body=body), "scores", "more than")
    _refused(_file(tmp_path / "n.gguf", kvs=1, body=struct.pack("<Q", HUGE) + bytes(16)), "metadata key 0", "more than")


def test_a_huge_string_that_is_there_is_skipped_not_kept(tmp_path):
    """A long but real value (a chat template, a token list) costs a seek, not memory."""
    body = _string("long") + struct.pack("<I", 8) + _string("x" * 3_000_000)
    body += _string("tokens") + struct.pack("<II", 9, 8) + struct.pack("<Q", 20_000) + _string("ab") * 20_000
    path = _file(tmp_path / "long.gguf", kvs=2, body=body)
    tracemalloc.start()
    header = read_gguf_header(path, "DiT")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert "long" not in header.metadata and "tokens" not in header.metadata and peak < 1 << 20


def test_tensor_data_beyond_the_file_and_overlaps(tmp_path):
    table = _tensor("w", [32, 2], 8, offset=0)
    _refused(_file(tmp_path / "d.gguf", tensors=1, body=table), "truncated", "data section is missing")
    _refused(_file(tmp_path / "e.gguf", tensors=1, body=table + bytes(60)), "truncated", "tensor w")
    table = _tensor("w", [32, 2**40], 8)
    _refused(_file(tmp_path / "big.gguf", tensors=1, body=table + bytes(64)), "tensor w")
    two = _tensor("a", [32, 1], 0, 0) + _tensor("b", [32, 1], 0, 128)  # F32, 128 bytes each
    header = b"GGUF" + struct.pack("<IQQ", 3, 2, 0) + two
    (tmp_path / "o.gguf").write_bytes(header + bytes(-len(header) % 32) + bytes(256))
    assert read_gguf_header(tmp_path / "o.gguf", "DiT")  # apart: fine
    two = _tensor("a", [32, 1], 0, 0) + _tensor("b", [32, 1], 0, 96)
    header = b"GGUF" + struct.pack("<IQQ", 3, 2, 0) + two
    (tmp_path / "o.gguf").write_bytes(header + bytes(-len(header) % 32) + bytes(256))
    _refused(tmp_path / "o.gguf", "overlaps")
    _refused(_file(tmp_path / "r.gguf", tensors=1, body=_tensor("w", [1] * 5, 0)), "5 dimensions")
    _refused(_file(tmp_path / "v.gguf", version=1), "version 1")
    _refused(_file(tmp_path / "b.gguf", version=3 << 24), "big-endian")


@pytest.mark.parametrize(("code", "named"), [(16, "IQ2_XXS"), (9, "Q8_1"), (99, "unknown type 99"), (20, "IQ4_NL")])
def test_unsupported_tensor_type_is_named(tmp_path, code, named):
    path = _file(tmp_path / "x.gguf", tensors=1, body=_tensor("net.w", [256, 1], code) + bytes(1024))
    _refused(path, f"tensor net.w has GGML type {named}, which is not supported")


def _cli(monkeypatch, capsys, *args: object) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["anima-rknn", *map(str, args)])
    with pytest.raises(SystemExit) as exit_:
        main()
    return exit_.value.code, capsys.readouterr().err


def test_cli_refuses_damaged_and_foreign_files_in_one_line(tiny_set, quantized, tmp_path, monkeypatch, capsys):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(quantized.read_bytes()[:-500])
    foreign = tmp_path / "qwen.gguf"
    quantize_checkpoint(tiny_set.text_encoder, foreign, "q8_0")
    tensors = load_tensors(quantized, "DiT")
    wrong, bad = tmp_path / "wrong.gguf", "net.blocks.0.mlp.layer1.weight"  # a shape the architecture lacks
    table = [(name, "F32", (3, 5) if name == bad else tuple(t.shape)) for name, t in tensors.items()]
    write_gguf(wrong, table, lambda name: encode(tensors[name][:3, :5] if name == bad else tensors[name], "F32"), {})
    for path, phrase in [(cut, "truncated"), (foreign, "not an Anima DiT checkpoint: missing tensor"),
                         (wrong, "blocks.0.mlp.layer1.weight has shape [3, 5]")]:
        code, err = _cli(monkeypatch, capsys, "generate", "--dit", path, "--text-encoder", tiny_set.text_encoder,
                         "--vae", tiny_set.vae, "--qwen-tokenizer", tiny_set.qwen_tokenizer, "--t5-tokenizer",
                         tiny_set.t5_tokenizer, "--prompt", "x", "--steps", "1", "--out", tmp_path / "x.png")
        assert code == 1 and err.startswith("error: ") and err.count("\n") == 1 and phrase in err, err
        assert not (tmp_path / "x.png").exists()
    code, err = _cli(monkeypatch, capsys, "quantize", cut, "-o", tmp_path / "y.gguf")
    assert code == 1 and "truncated" in err and err.count("\n") == 1 and not (tmp_path / "y.gguf").exists()
    narrow = tmp_path / "narrow.safetensors"
    save_tensors({"w.weight": torch.ones(4, 64)}, narrow)
    code, err = _cli(monkeypatch, capsys, "quantize", narrow, "-o", tmp_path / "y.gguf", "--type", "q4_k")
    assert code == 1 and "rows are not multiples of 256" in err and not (tmp_path / "y.gguf").exists()


def test_the_loaders_name_the_problem(tiny_set, quantized, tmp_path):
    foreign = tmp_path / "qwen.gguf"
    quantize_checkpoint(tiny_set.text_encoder, foreign, "q8_0")
    with pytest.raises(AnimaError, match="not an Anima DiT checkpoint"):
        read_dit_config(foreign)
    with pytest.raises(AnimaError, match="is a GGUF file; a resume state file is a safetensors file"):
        load_tensors(quantized, "resume state", dtypes=("F32",))
    assert load_dit(quantized).config == read_dit_config(tiny_set.dit)


def test_a_gguf_that_is_not_a_file_is_one_line_and_never_waited_on(tiny_set, tmp_path, monkeypatch, capsys):
    """A FIFO given as the GGUF DiT or to quantize: refused in one line, never opened for a read that would wait on
    a writer; nothing written. (A folder is click's usage error for both.)"""
    fifo = tmp_path / "fifo.gguf"
    os.mkfifo(fifo)
    code, err = _cli(monkeypatch, capsys, "generate", "--dit", fifo, "--text-encoder", tiny_set.text_encoder,
                     "--vae", tiny_set.vae, "--qwen-tokenizer", tiny_set.qwen_tokenizer, "--t5-tokenizer",
                     tiny_set.t5_tokenizer, "--prompt", "x", "--steps", "1", "--out", tmp_path / "x.png")
    assert code == 1 and err.startswith("error: ") and err.count("\n") == 1 and fifo.name in err, err
    code, err = _cli(monkeypatch, capsys, "quantize", fifo, "-o", tmp_path / "y.gguf")
    assert code == 1 and err == f"error: checkpoint file not found: {fifo}\n", err
    assert [p.name for p in tmp_path.iterdir()] == ["fifo.gguf"]


@pytest.mark.parametrize(("command", "value", "says"), [
    ("generate", "q8_0", "--type q8_0` writes one) and stay quantized whatever --dtype is"),
    ("bench", "Q4_K", "--type q4_k` writes one) and stay quantized"),
    ("generate", "q3_k_m", "--type q8_0` writes one"),  # a type quantize does not write: its default
    ("export-onnx", "q8_0", "and are dequantized to this --dtype for the set"),
])
def test_a_ggml_type_as_dtype_is_explained_in_one_line(tmp_path, monkeypatch, capsys, command, value, says):
    """A stable-diffusion.cpp user's weight type (its --type q8_0) given as --dtype, which is a compute precision."""
    code, err = _cli(monkeypatch, capsys, command, "--dtype", value, "--out", tmp_path / "out")
    assert code == 1 and err.startswith(f"error: --dtype {value} is a GGUF weight type") and says in err, err
    assert err.count("\n") == 1 and not (tmp_path / "out").exists()


def test_a_ggml_type_as_dtype_in_a_jobs_file_is_explained_in_one_line(tmp_path, monkeypatch, capsys):
    """The same mistake in a batch's JSONL job: one line naming the line, the same explanation, nothing written."""
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"prompt": "a cat", "steps": 1}\n{"prompt": "a cat", "dtype": "Q4_K"}\n')
    code, err = _cli(monkeypatch, capsys, "batch", jobs, "--out", tmp_path / "out")
    assert code == 1 and err.count("\n") == 1, err
    assert err.startswith(f"error: {jobs} line 2: dtype Q4_K is a GGUF weight type, not a compute precision"), err
    assert "--type q4_k` writes one) and stay quantized whatever the dtype is" in err, err
    assert not (tmp_path / "out").exists()
