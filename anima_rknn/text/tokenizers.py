"""Prompt -> Qwen3 ids (text encoder input) and T5 ids + weights (LLM adapter queries).

Both tokenizers are read with `tokenizers.Tokenizer.from_file`: transformers 5 rebuilds T5's
normaliser and then differs from the real tokenizer on some inputs.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

from ..core.files import Unreadable, atomic_path, read_small_file
from ..errors import AnimaError
from .prompt import parse_prompt_weights

QWEN_EMPTY_TOKEN = "<|endoftext|>"
T5_EOS_TOKEN = "</s>"
UNK_TOKEN = "<unk>"
T5_SPECIALS = ("<pad>", T5_EOS_TOKEN, UNK_TOKEN)  # ids 0, 1, 2 as in the real T5 vocabulary
QWEN_SPECIALS = (QWEN_EMPTY_TOKEN, UNK_TOKEN)
MAX_TOKENIZER_BYTES = 64 * 2**20  # the real Qwen3 tokenizer.json is 11 MB


@dataclass(frozen=True)
class TokenizedPrompt:
    qwen_ids: list[int]
    t5_ids: list[int]
    t5_weights: list[float]  # one per t5 id; scales the adapter's output row


def _special_id(tokenizer: Tokenizer, token: str, side: str) -> int:
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        raise AnimaError(f"the {side} tokenizer has no {token} token")
    return token_id


def _load(folder: str | os.PathLike, side: str) -> Tokenizer:
    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        raise AnimaError(f"{side} tokenizer file not found: {path}")
    try:
        raw = read_small_file(path, MAX_TOKENIZER_BYTES)
    except Unreadable as e:
        raise AnimaError(f"cannot read {side} tokenizer {path}: {e}") from None
    try:
        tokenizer = Tokenizer.from_str(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise AnimaError(f"cannot read {side} tokenizer {path}: it is not UTF-8 text (JSON expected)") from None
    except Exception as e:  # the library raises bare Exceptions for malformed JSON
        reason = str(e).partition("\n")[0]
        raise AnimaError(f"cannot read {side} tokenizer {path}: {reason}") from None
    # Prompts are never cut or padded here; the adapter output is cut to 512 rows later.
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


class PromptTokenizer:
    """Tokenises each weighted chunk separately (as ComfyUI / stable-diffusion.cpp do) and concatenates."""

    def __init__(self, qwen: Tokenizer, t5: Tokenizer) -> None:
        self.qwen = qwen
        self.t5 = t5
        self.qwen_empty_id = _special_id(qwen, QWEN_EMPTY_TOKEN, "Qwen")
        self.t5_eos_id = _special_id(t5, T5_EOS_TOKEN, "T5")

    @classmethod
    def from_dirs(cls, qwen_dir: str | os.PathLike, t5_dir: str | os.PathLike) -> PromptTokenizer:
        return cls(_load(qwen_dir, "Qwen"), _load(t5_dir, "T5"))

    def encode(self, prompt: str) -> TokenizedPrompt:
        qwen_ids: list[int] = []
        t5_ids: list[int] = []
        t5_weights: list[float] = []
        for chunk, weight in parse_prompt_weights(prompt):
            qwen_ids += self.qwen.encode(chunk, add_special_tokens=False).ids
            chunk_t5 = self.t5.encode(chunk, add_special_tokens=False).ids
            t5_ids += chunk_t5
            t5_weights += [weight] * len(chunk_t5)
        # The text encoder needs at least one token; Anima feeds <|endoftext|> rather than zeros.
        return TokenizedPrompt(
            qwen_ids=qwen_ids or [self.qwen_empty_id],
            t5_ids=t5_ids + [self.t5_eos_id],
            t5_weights=t5_weights + [1.0],
        )


def _word_tokenizer(specials: tuple[str, ...], words: list[str]) -> Tokenizer:
    """WordLevel model holding specials then words; the specials are also registered as special added
    tokens so that a literal "</s>" in a prompt maps to its id, as in the real files."""
    vocab = {token: i for i, token in enumerate([*specials, *words])}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation()])
    tokenizer.add_special_tokens(list(specials))
    return tokenizer


def _vocabulary(words: list[str]) -> list[str]:
    """Lower-cased, de-duplicated words, each of which must survive pre-tokenisation whole
    (which also keeps out anything shaped like a special token, e.g. "<unk>")."""
    probe = _word_tokenizer((UNK_TOKEN,), [])
    vocabulary: list[str] = []
    for word in words:
        normalised = probe.normalizer.normalize_str(word)
        pieces = probe.pre_tokenizer.pre_tokenize_str(normalised)
        if len(pieces) != 1 or pieces[0][0] != normalised:
            raise AnimaError(f"tokenizer word {word!r} is not one word for a whitespace/punctuation split")
        if normalised not in vocabulary:
            vocabulary.append(normalised)
    return vocabulary


def _save(tokenizer: Tokenizer, folder: Path, config: dict[str, object]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_path(folder / "tokenizer.json", overwrite=True) as tmp:
        tokenizer.save(str(tmp))
    with atomic_path(folder / "tokenizer_config.json", overwrite=True) as tmp:
        tmp.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def build_word_tokenizers(words: list[str], qwen_dir: str | os.PathLike, t5_dir: str | os.PathLike) -> None:
    """Write small word-level stand-ins for the Qwen3 and T5 tokenizers (same file layout and code path).

    Qwen side: <|endoftext|>=0, <unk>=1, then the words. T5 side: <pad>=0, </s>=1, <unk>=2, then the
    words, with a post-processor that appends </s> like the real T5 file. Unknown words map to <unk>.
    """
    vocabulary = _vocabulary(words)
    if not vocabulary:
        raise AnimaError("a word tokenizer needs at least one word")
    qwen = _word_tokenizer(QWEN_SPECIALS, vocabulary)
    t5 = _word_tokenizer(T5_SPECIALS, vocabulary)
    t5.post_processor = processors.TemplateProcessing(
        single=f"$A {T5_EOS_TOKEN}",
        pair=f"$A {T5_EOS_TOKEN} $B {T5_EOS_TOKEN}",
        special_tokens=[(T5_EOS_TOKEN, T5_SPECIALS.index(T5_EOS_TOKEN))],
    )
    # PreTrainedTokenizerFast makes transformers use tokenizer.json as is instead of rebuilding it.
    common = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": UNK_TOKEN}
    _save(qwen, Path(qwen_dir), common | {"eos_token": QWEN_EMPTY_TOKEN, "pad_token": QWEN_EMPTY_TOKEN})
    _save(t5, Path(t5_dir), common | {"eos_token": T5_EOS_TOKEN, "pad_token": "<pad>"})
