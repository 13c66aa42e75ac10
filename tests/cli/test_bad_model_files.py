"""A damaged or crafted model file, given to `generate`, ends in one line naming the file (and tensor), exit 1."""

from __future__ import annotations

import json
import re
import shutil
import struct

import pytest
import torch
from crafted_files import edited, growing_normalizer, planted_pickle, split_by, tokenizer_with

from anima_rknn.core.tensorfile import load_tensors, read_metadata, save_tensors

FAST = ("-p", "a red circle", "-W", "64", "-H", "64", "--steps", "1")


def _retyped(name, dtype):
    def make(source, target):
        tensors = load_tensors(source, "model")
        tensors[name] = tensors[name].to(dtype)
        save_tensors(tensors, target, read_metadata(source, "model"))
        return target
    return make


def _metadata(key, value):
    def make(source, target):
        save_tensors(load_tensors(source, "model"), target, {**read_metadata(source, "model"), key: value})
        return target
    return make


def _header(change):
    return lambda source, target: edited(source, target, change)


def _cut(missing):
    def make(source, target):
        target.write_bytes(source.read_bytes()[:-missing])
        return target
    return make


def _pickle(source, target):
    target.write_bytes(planted_pickle(target.parent / "unpickled", protocol=2))
    return target


def _reversed(name):
    def change(header):
        header[name]["data_offsets"].reverse()
    return change


def _overlap(header):
    """The second tensor in the data section moved back over the first, its size kept."""
    _, second = sorted((n for n in header if n != "__metadata__"), key=lambda n: header[n]["data_offsets"])[:2]
    begin, end = header[second]["data_offsets"]
    header[second]["data_offsets"] = [begin - 2, end - 2]


def _json_list(source, target):
    target.write_bytes(struct.pack("<Q", 2) + b"[]")
    return target


def _huge_header_length(source, target):
    target.write_bytes(struct.pack("<Q", 2**40) + source.read_bytes()[8:])
    return target


CASES = {
    "dit integer weight": ("dit", _retyped("net.blocks.0.mlp.layer1.weight", torch.int64),
                           "tensor net.blocks.0.mlp.layer1.weight has dtype I64; a floating-point weight is expected"),
    "dit reversed offsets": ("dit", _header(_reversed("net.blocks.1.mlp.layer2.weight")),
                             r"tensor net.blocks.1.mlp.layer2.weight: data_offsets \[\d+, \d+\] are reversed"),
    "dit context tokens": ("dit", _metadata("anima_rknn.context_tokens", "1e9"),
                           "metadata anima_rknn.context_tokens is '1e9'; expected a whole number from 1 to 4096"),
    "dit image size": ("dit", _metadata("anima_rknn.demo.image_size", "nan"),
                       "metadata anima_rknn.demo.image_size is 'nan'"),
    "dit truncated": ("dit", _cut(100), "is truncated: 100 bytes missing"),
    "dit pickle": ("dit", _pickle, r"not a safetensors file \(it looks like a PyTorch pickle, which is never loaded\)"),
    "text encoder truncated": ("text_encoder", _cut(5), "is truncated: 5 bytes missing"),
    "text encoder bool weight": ("text_encoder", _retyped("model.norm.weight", torch.bool),
                                 "tensor model.norm.weight has dtype BOOL; a floating-point weight is expected"),
    "text encoder header list": ("text_encoder", _json_list, r"its header is a JSON list, not an object"),
    "vae overlap": ("vae", _header(_overlap), r"tensor \S+: data_offsets \[\d+, \d+\] overlap tensor \S+"),
    "vae zero std": ("vae", _metadata("latents_std", "[" + ", ".join(["0"] * 16) + "]"),
                     "metadata latents_std is not a JSON list of positive numbers"),
    "vae huge header length": ("vae", _huge_header_length, "header length 1099511627776 is over the 100000000 byte"),
    "vae pickle": ("vae", _pickle, "is truncated or not a safetensors file"),
}


def _files(folder):
    return sorted(p.relative_to(folder) for p in folder.rglob("*"))


def _assert_refused(result, path, pattern, out):
    assert result.code == 1, (result.code, result.err)
    assert "Traceback" not in result.err
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(path) in lines[0], result.err
    assert re.search(pattern, lines[0]), lines[0]
    assert not out.exists()


@pytest.mark.parametrize("case", CASES)
def test_a_bad_checkpoint_is_one_line(run_cli, model_dir, tiny_set, tmp_path, case):
    field, make, pattern = CASES[case]
    bad = make(getattr(tiny_set, field), tmp_path / "bad.safetensors")
    out = tmp_path / "out" / "x.png"
    out.parent.mkdir()
    before = _files(tmp_path)
    result = run_cli("generate", "--model", model_dir, f"--{field.replace('_', '-')}", bad, *FAST, "-o", out)
    _assert_refused(result, bad, pattern, out)
    assert _files(tmp_path) == before  # nothing written, nothing unpickled


TOKENIZER_CASES = {
    "pickle": (lambda path: path.write_bytes(planted_pickle(path.parent / "unpickled", protocol=4)),
               "it is not UTF-8 text"),
    "text pickle": (lambda path: path.write_bytes(planted_pickle(path.parent / "unpickled", protocol=0)),
                    "cannot read Qwen tokenizer .*: expected value at line 1"),
    "not json": (lambda path: path.write_text('{"model": '), "cannot read Qwen tokenizer"),
    "a JSON list": (lambda path: path.write_text("[]"), "cannot read Qwen tokenizer"),
    "huge": (lambda path: open(path, "wb").truncate(65 * 2**20), "larger than 64 MiB"),  # sparse: nothing written
    # Refused from the file's JSON when the pipeline opens, before a prompt could make them cost memory or time.
    "a normalizer that grows the text": (lambda path: tokenizer_with(path, path, normalizer=growing_normalizer()),
                                         "can make a prompt up to 3e\\+05 times longer; at most 128"),
    "a regex that backtracks": (lambda path: tokenizer_with(path, path, pre_tokenizer=split_by("(a+)+$")),
                                "repeats a repeated or alternating group"),
}


def test_a_t5_tokenizer_with_ids_past_the_adapters_table_is_one_line(run_cli, model_dir, tiny_set, tmp_path):
    """A T5 tokenizer of another model (a word mapped past the adapter's embedding rows): refused when the
    pipeline opens, naming the tokenizer file, not an IndexError once the prompt is embedded."""
    folder = tmp_path / "t5"
    shutil.copytree(tiny_set.t5_tokenizer, folder)
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    word = next(w for w, i in tokenizer["model"]["vocab"].items() if i > 2)  # an ordinary word, not a special
    tokenizer["model"]["vocab"][word] = 100_000
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    out = tmp_path / "x.png"
    result = run_cli("generate", "--model", model_dir, "--t5-tokenizer", folder, *FAST, "-o", out)
    _assert_refused(result, folder / "tokenizer.json", "makes ids up to 100000, but the LLM adapter", out)


def test_a_tokenizer_regex_that_gives_up_on_the_prompt_is_one_line(run_cli, model_dir, tiny_set, tmp_path):
    """A regex that passes the load check but that Oniguruma gives up on for this prompt (a Rust panic, not an
    Exception): one line naming the file, before the text encoder loads."""
    folder = tmp_path / "qwen"
    shutil.copytree(tiny_set.qwen_tokenizer, folder)
    tokenizer_with(folder / "tokenizer.json", folder / "tokenizer.json", pre_tokenizer=split_by("a*a*a*a*a*a*\\d"))
    out = tmp_path / "x.png"
    result = run_cli("generate", "--model", model_dir, "--qwen-tokenizer", folder, "-p", "a" * 100, "-W", "64",
                     "-H", "64", "--steps", "1", "-o", out)
    _assert_refused(result, folder / "tokenizer.json", "failed on this prompt: Onig: .*retry-limit-in-match", out)


@pytest.mark.parametrize("case", TOKENIZER_CASES)
def test_a_bad_tokenizer_is_one_line(run_cli, model_dir, tiny_set, tmp_path, case):
    make, pattern = TOKENIZER_CASES[case]
    folder = tmp_path / "qwen"
    shutil.copytree(tiny_set.qwen_tokenizer, folder)
    make(folder / "tokenizer.json")
    out = tmp_path / "x.png"
    before = _files(tmp_path)
    result = run_cli("generate", "--model", model_dir, "--qwen-tokenizer", folder, *FAST, "-o", out)
    _assert_refused(result, folder / "tokenizer.json", pattern, out)
    assert _files(tmp_path) == before
