"""The real Qwen3 and T5 tokenizers the package ships (xz-compressed): read in place they give the recorded ids, and a
damaged or hostile .xz is refused in one line."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

import pytest

from anima_rknn.errors import AnimaError
from anima_rknn.model.model_set import SHIPPED_TOKENIZERS, from_model_dir, tokenizers_for
from anima_rknn.text import tokenizers
from anima_rknn.text.tokenizers import PromptTokenizer, tokenizer_file

CASES = json.loads((Path(__file__).resolve().parents[1] / "data" / "tokenizers" / "test_vectors.json")
                   .read_text("utf-8"))["cases"]


@pytest.fixture(scope="module")
def shipped() -> PromptTokenizer:
    return PromptTokenizer.from_dirs(SHIPPED_TOKENIZERS["qwen_tokenizer"], SHIPPED_TOKENIZERS["t5_tokenizer"])


def test_the_shipped_files_are_the_real_tokenizers_read_in_place(shipped):
    assert all(tokenizer_file(folder).name == "tokenizer.json.xz" for folder in SHIPPED_TOKENIZERS.values())
    for case in CASES:
        assert shipped.qwen.encode(case["text"], add_special_tokens=False).ids == case["qwen_hf"]
        assert shipped.t5.encode(case["text"], add_special_tokens=False).ids + [shipped.t5_eos_id] == case["t5_hf"]


def test_a_package_install_stays_small():
    size = sum(tokenizer_file(folder).stat().st_size for folder in SHIPPED_TOKENIZERS.values())
    assert size < 2_000_000  # 1.79 MB: 1.38 (Qwen3) + 0.41 (T5)


def test_a_plain_tokenizer_json_wins_over_an_xz_beside_it(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "tokenizer.json.xz").write_bytes(lzma.compress(b"{}"))
    assert tokenizer_file(tmp_path) == tmp_path / "tokenizer.json"


def test_a_model_directory_without_tokenizers_takes_the_shipped_ones(tiny_set, tmp_path):
    root = tmp_path / "set"
    for part in ("dit", "text_encoder", "vae"):
        path = getattr(tiny_set, part)
        (root / path.parent.relative_to(tiny_set.dit.parents[2])).mkdir(parents=True, exist_ok=True)
        (root / path.relative_to(tiny_set.dit.parents[2])).write_bytes(path.read_bytes())
    files = from_model_dir(root)
    assert (files.qwen_tokenizer, files.t5_tokenizer) == tuple(SHIPPED_TOKENIZERS.values())
    assert tokenizers_for(tiny_set.dit) == {"qwen_tokenizer": tiny_set.qwen_tokenizer,
                                            "t5_tokenizer": tiny_set.t5_tokenizer}  # its own, found beside it


@pytest.mark.parametrize("content, text", [
    (lzma.compress(b'{"version": "1.0"}' * 100)[:-20], "cut short"),
    (b"\xfd7zXZ\x00 not really xz", "not an intact .xz file"),
    (lzma.compress(b" " * 5000), "unpacks to more than 4096 bytes"),
    (lzma.compress(b"\xff\xfe not utf-8"), "not UTF-8 text"),
])
def test_a_damaged_or_hostile_xz_is_one_line(tmp_path, monkeypatch, content, text):
    monkeypatch.setattr(tokenizers, "MAX_TOKENIZER_BYTES", 4096)
    (tmp_path / "tokenizer.json.xz").write_bytes(content)
    with pytest.raises(AnimaError, match=f"cannot read Qwen tokenizer .*tokenizer.json.xz: .*{text}"):
        tokenizers._load(tmp_path, "Qwen")
