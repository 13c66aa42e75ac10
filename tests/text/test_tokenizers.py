"""Tokenisation against the real tokenizers' recorded ids, and the small word-level tokenizers."""

import json
from pathlib import Path

import pytest
from crafted_files import doubling_normalizers, growing_normalizer, replace, split_by, tokenizer_with
from transformers import PreTrainedTokenizerFast

from anima_rknn.errors import AnimaError
from anima_rknn.text.tokenizers import MAX_NORMALIZED_CHARS, MAX_TEXT_GROWTH, PromptTokenizer, build_word_tokenizers

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


def test_the_real_tokenizers_growth_is_within_the_bound(real: PromptTokenizer) -> None:
    # The bound each real file comes to (tokenizers.py says how); the limit must keep both.
    assert real.growth == 75 <= MAX_TEXT_GROWTH
    # The settings' longest prompt (20,000 characters) fits, and tokenises in far fewer ids than characters.
    assert len(real.encode("a red cat, " * 1818).qwen_ids) < 20_000


HOSTILE_STEPS = {
    # The normaliser: about 5 MB of memory per prompt letter, 100 GB for a 20,000-letter prompt.
    "a huge Replace": ({"normalizer": growing_normalizer()}, "can make a prompt up to 3e\\+05 times longer"),
    "eight chained doublings": ({"normalizer": doubling_normalizers(8)}, "up to 256 times longer"),
    "a Replace of what matches an empty regex": ({"normalizer": replace("x*", "y" * 200, regex=True)},
                                                 "up to 401 times longer"),
    "a Prepend of 200 characters": ({"normalizer": {"type": "Prepend", "prepend": "y" * 200}},
                                    "up to 201 times longer"),
    "a nested repetition": ({"pre_tokenizer": split_by("(a+)+$")}, "repeats a repeated or alternating group"),
    "a repeated alternation in a Replace": ({"normalizer": replace("(a|aa)*b", "", regex=True)},
                                            "repeats a repeated or alternating group"),
}


@pytest.mark.parametrize("case", HOSTILE_STEPS)
def test_a_tokenizer_that_grows_or_backtracks_is_refused_at_load(small, case: str) -> None:
    _, folder = small
    steps, pattern = HOSTILE_STEPS[case]
    bad = tokenizer_with(folder / "qwen" / "tokenizer.json", folder / "qwen" / "tokenizer.json", **steps)
    with pytest.raises(AnimaError, match=f"^the Qwen tokenizer {bad}: .*{pattern}"):
        PromptTokenizer.from_dirs(folder / "qwen", folder / "t5")


def test_five_chained_doublings_are_still_accepted(small) -> None:
    # 32 times per letter is within the bound: the rule refuses growth, not Replaces.
    _, folder = small
    tokenizer_with(folder / "t5" / "tokenizer.json", folder / "t5" / "tokenizer.json",
                   normalizer=doubling_normalizers(5))
    tokens = PromptTokenizer.from_dirs(folder / "qwen", folder / "t5").encode("red a")
    assert tokens.t5_ids == [5, 2, 1]  # red, then "a" * 32 (one unknown word), then </s>


def test_a_regex_that_backtracks_past_the_limit_is_one_error_naming_the_file(small) -> None:
    # Polynomial, not nested, so it passes the load check; Oniguruma gives up on 100 letters, a Rust panic
    # (pyo3's PanicException, a BaseException) that must come out as the one AnimaError.
    _, folder = small
    bad = tokenizer_with(folder / "t5" / "tokenizer.json", folder / "t5" / "tokenizer.json",
                         pre_tokenizer={"type": "Sequence",
                                        "pretokenizers": [{"type": "Whitespace"}, split_by("a*a*a*a*a*a*\\d")]})
    tokenizer = PromptTokenizer.from_dirs(folder / "qwen", folder / "t5")
    assert tokenizer.encode("a cat").t5_ids == [3, 4, 1]  # a short prompt still tokenises
    with pytest.raises(AnimaError, match=f"^the T5 tokenizer {bad} failed on this prompt: .*retry-limit-in-match"):
        tokenizer.encode("a" * 100)


def test_a_prompt_past_what_the_tokenizers_may_grow_to_is_refused(small) -> None:
    tokenizer, _ = small
    most = int(MAX_NORMALIZED_CHARS // tokenizer.growth) - 1  # the demo's lower-casing grows 3 times at most
    with pytest.raises(AnimaError, match=f"^the prompt has {most + 1} characters; these tokenizers take at most "
                                         f"{most}$"):
        tokenizer.encode("c" * (most + 1))
