"""Tokenisation against the real tokenizers' recorded ids, and the small word-level tokenizers."""

import json
from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerFast

from anima_rknn.errors import AnimaError
from anima_rknn.text.tokenizers import PromptTokenizer, build_word_tokenizers

TOKENIZER_DATA = Path(__file__).resolve().parents[1] / "data" / "tokenizers"
CASES = json.loads((TOKENIZER_DATA / "test_vectors.json").read_text("utf-8"))["cases"]
CASE_IDS = [f"{i}-{case['category']}" for i, case in enumerate(CASES)]
PLAIN_CASES = [case for case in CASES if not set("()\\") & set(case["text"])]
PLAIN_IDS = [f"{CASES.index(case)}-{case['category']}" for case in PLAIN_CASES]


@pytest.fixture(scope="module")
def real(real_tokenizers: Path) -> PromptTokenizer:
    return PromptTokenizer.from_dirs(real_tokenizers / "qwen3", real_tokenizers / "t5")


def test_vectors_present() -> None:
    assert len(CASES) == 77 and len(PLAIN_CASES) > 50


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_chunk_path_matches_recorded_ids(real: PromptTokenizer, case: dict) -> None:
    # The exact calls encode() makes per chunk, applied to the whole text.
    assert real.qwen.encode(case["text"], add_special_tokens=False).ids == case["qwen_hf"]
    assert real.t5.encode(case["text"], add_special_tokens=False).ids + [real.t5_eos_id] == case["t5_hf"]


@pytest.mark.parametrize("case", PLAIN_CASES, ids=PLAIN_IDS)
def test_encode_matches_recorded_ids(real: PromptTokenizer, case: dict) -> None:
    tokens = real.encode(case["text"])
    assert tokens.qwen_ids == (case["qwen_hf"] or [151643])
    assert tokens.t5_ids == case["t5_hf"]
    assert tokens.t5_weights == [1.0] * len(case["t5_hf"])


def test_empty_prompt(real: PromptTokenizer) -> None:
    tokens = real.encode("")
    assert (tokens.qwen_ids, tokens.t5_ids, tokens.t5_weights) == ([151643], [1], [1.0])


def test_weighted_chunk_carries_its_weight(real: PromptTokenizer) -> None:
    tokens = real.encode("a (red:1.5) cat")
    # Chunks "a ", "red", " cat" are tokenised separately: T5 "a " = '▁','a','▁' (ids 3, 9, 3 as in the
    # vectors' "... are a helpful"), "red" = '▁red', " cat" = '▁cat'; Qwen "a " = 'a','Ġ', "red", "Ġcat".
    assert tokens.t5_ids == [3, 9, 3, real.t5.token_to_id("▁red"), real.t5.token_to_id("▁cat"), 1]
    assert tokens.t5_weights == [1.0, 1.0, 1.0, 1.5, 1.0, 1.0]
    qwen = real.qwen.token_to_id
    assert tokens.qwen_ids == [qwen("a"), qwen("Ġ"), qwen("red"), qwen("Ġcat")]


def test_nested_and_escaped_weights(real: PromptTokenizer) -> None:
    tokens = real.encode("((cat)) \\(dog\\)")
    cat = real.t5.token_to_id("▁cat")
    assert tokens.t5_ids[0] == cat and tokens.t5_weights[0] == pytest.approx(1.21)
    assert tokens.t5_weights[1:] == [1.0] * (len(tokens.t5_ids) - 1)
    assert tokens.t5_ids[1:] == real.t5.encode(" (dog)", add_special_tokens=False).ids + [1]


def test_missing_tokenizer_file_is_named(tmp_path: Path) -> None:
    build_word_tokenizers(["cat"], tmp_path / "qwen", tmp_path / "t5")
    with pytest.raises(AnimaError, match="T5 tokenizer file not found: .*nowhere.*tokenizer.json"):
        PromptTokenizer.from_dirs(tmp_path / "qwen", tmp_path / "nowhere")
    (tmp_path / "qwen" / "tokenizer.json").write_text("{ not json")
    with pytest.raises(AnimaError, match="cannot read Qwen tokenizer"):
        PromptTokenizer.from_dirs(tmp_path / "qwen", tmp_path / "t5")


WORDS = ["A", "cat", "red", "Dog", "cat", ","]


@pytest.fixture()
def small(tmp_path: Path) -> tuple[PromptTokenizer, Path]:
    build_word_tokenizers(WORDS, tmp_path / "qwen", tmp_path / "t5")
    return PromptTokenizer.from_dirs(tmp_path / "qwen", tmp_path / "t5"), tmp_path


def test_word_tokenizer_vocabularies(small: tuple[PromptTokenizer, Path]) -> None:
    tok, _ = small
    words = ["a", "cat", "red", "dog", ","]  # lower-cased, duplicates dropped, order kept
    assert tok.qwen.get_vocab() == {t: i for i, t in enumerate(["<|endoftext|>", "<unk>", *words])}
    assert tok.t5.get_vocab() == {t: i for i, t in enumerate(["<pad>", "</s>", "<unk>", *words])}
    assert (tok.qwen.get_vocab_size(), tok.t5.get_vocab_size()) == (7, 8)
    assert (tok.qwen_empty_id, tok.t5_eos_id) == (0, 1)


def test_word_tokenizer_encode(small: tuple[PromptTokenizer, Path]) -> None:
    tok, _ = small
    tokens = tok.encode("A (RED:1.5) cat, bird")
    # qwen: a=2 red=4 cat=3 ","=6 bird=<unk>=1 ; t5: a=3 red=5 cat=4 ","=7 bird=<unk>=2, then </s>=1
    assert tokens.qwen_ids == [2, 4, 3, 6, 1]
    assert tokens.t5_ids == [3, 5, 4, 7, 2, 1]
    assert tokens.t5_weights == [1.0, 1.5, 1.0, 1.0, 1.0, 1.0]
    assert tok.encode("") == type(tokens)(qwen_ids=[0], t5_ids=[1], t5_weights=[1.0])
    assert tok.t5.encode("dog").ids == [6, 1]  # the post-processor appends </s> like the real T5 file
    assert tok.qwen.encode("dog").ids == [5]


def test_word_tokenizer_loads_in_transformers(small: tuple[PromptTokenizer, Path]) -> None:
    # An independent loader of the same files must give the same ids.
    tok, folder = small
    for side, ours in (("qwen", tok.qwen), ("t5", tok.t5)):
        theirs = PreTrainedTokenizerFast.from_pretrained(folder / side)
        config = json.loads((folder / side / "tokenizer_config.json").read_text())
        assert theirs.eos_token == config["eos_token"] and theirs.unk_token == "<unk>"
        for text in ["a red cat", "Dog, CAT  zebra", "</s> a"]:
            assert theirs(text).input_ids == ours.encode(text).ids


@pytest.mark.parametrize("word", ["two words", "don't", "", "</s>", "<|endoftext|>"])
def test_word_tokenizer_rejects_bad_words(tmp_path: Path, word: str) -> None:
    with pytest.raises(AnimaError, match="tokenizer word"):
        build_word_tokenizers(["cat", word], tmp_path / "qwen", tmp_path / "t5")
    assert not (tmp_path / "qwen").exists()
