"""Prompt -> Qwen3 ids (text encoder input) and T5 ids + weights (LLM adapter queries).

Both tokenizers are read with `tokenizers.Tokenizer.from_file`: transformers 5 rebuilds T5's
normaliser and then differs from the real tokenizer on some inputs.
"""

from __future__ import annotations

import base64
import json
import lzma
import math
import os
import re
import struct
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
# A tokenizer file's normaliser and pre-tokeniser may make text longer (NFKC, byte-level, a Replace); that growth is
# bounded from their JSON at load (_growth). The bound is an upper one, worked out per step: the real Qwen3 file
# comes to 12 characters per prompt character (NFC 3 x byte-level 4), the real T5 file to 75 (its Precompiled map
# 18 x its regex Replace 2 x Metaspace 2, plus 3 prefix characters), the demo's files to 3 (lower-casing). 128 keeps
# these and refuses a Replace of "a" by 100,000 "a"s, or eight chained Replaces that double the text.
MAX_TEXT_GROWTH = 128
# What one prompt may grow to: tokenizers holds about 50 bytes per normalised character (measured), so at most about
# 150 MB; a prompt of the settings' 20,000 characters fits under any accepted growth (20,000 x 128 = 2.56 M).
MAX_NORMALIZED_CHARS = 3_000_000


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


# The growth of each normaliser and pre-tokeniser type: out <= a * n + b characters for n in (see _growth).
_FIXED_GROWTH: dict[str, float] = {
    "NFC": 3, "NFD": 4,  # Unicode's stated limits per code point
    "NFKC": 18, "NFKD": 18,
    "Lowercase": 3,  # a char lower-cases to at most 3 (Rust's char::to_lowercase)
    "BertNormalizer": 36,  # a CJK char spaced on both sides (3) x accents split (4) x lower-case (3)
    "ByteLevel": 4,  # one char per UTF-8 byte (the pre-tokeniser's prefix space is added in _growth)
    "Strip": 1, "StripAccents": 1, "Nmt": 1,
    # The pre-tokenisers that only split (and drop) text.
    "Split": 1, "Punctuation": 1, "Whitespace": 1,
    "WhitespaceSplit": 1, "CharDelimiterSplit": 1,
    "Digits": 1, "UnicodeScripts": 1, "BertPreTokenizer": 1,
    "FixedLength": 1,
}
_QUANTIFIER = re.compile(r"[*+]|\{(\d*),(\d*)\}|\{(\d+)\}")


def _repeats(quantifier: re.Match) -> bool:
    """Whether a quantifier can repeat its atom more than once ("?", {0,1} and {1} cannot)."""
    if quantifier[0] in "*+":
        return True
    _, high, exact = quantifier.groups()
    if exact is not None:
        return int(exact) > 1
    return high == "" or int(high) > 1


def _nested_repetition(pattern: str) -> bool:
    """Whether the regex repeats a group that itself repeats or alternates, as in (a+)+ or (a|a)*: the shape whose
    backtracking grows exponentially, which Oniguruma ends in a panic after seconds. A small scanner, as Python's re
    does not parse Oniguruma's syntax (\\p{L}); it errs on the side of refusing (any alternation counts)."""
    stack = [[False]]  # per open group: whether it holds a repetition or an alternation
    last_group: bool | None = None  # the just-closed group's flag, while it is the atom a quantifier would apply to
    i = 0
    while i < len(pattern):
        char = pattern[i]
        quantifier = _QUANTIFIER.match(pattern, i)
        if quantifier and quantifier[0] != "{,}":  # "{,}" is literal text
            if _repeats(quantifier):
                if last_group:
                    return True
                stack[-1][0] = True
            i = quantifier.end()
            if i < len(pattern) and pattern[i] in "?+":  # lazy or possessive form of the same quantifier
                i += 1
            last_group = None
            continue
        last_group = None
        if char == "\\":
            i += 2
            continue
        if char == "[":  # a class, possibly nested ([a-z&&[^b]]); a "]" right after "[" or "[^" is literal
            depth, i = 1, i + 1
            i += pattern.startswith("^", i)
            i += pattern.startswith("]", i)
            while i < len(pattern) and depth:
                depth += {"[": 1, "]": -1}.get(pattern[i], 0)
                i += 2 if pattern[i] == "\\" else 1
            continue
        if char == "(":
            stack.append([False])
        elif char == ")" and len(stack) > 1:
            (last_group,) = stack.pop()
            stack[-1][0] |= last_group
        elif char == "|":
            stack[-1][0] = True
        i += 1
    return False


def _precompiled_growth(charsmap: str) -> int:
    """The longest replacement a Precompiled (SentencePiece) map holds: the map is a u32 trie size, the trie, then
    NUL-terminated UTF-8 replacements, and each matched piece (one character or more) becomes one of them."""
    blob = base64.b64decode(charsmap)
    (trie_size,) = struct.unpack_from("<I", blob)
    return max(len(piece.decode("utf-8", "replace")) for piece in blob[4 + trie_size:].split(b"\0"))


def _growth(spec: dict | None, source: str) -> tuple[float, float]:
    """(a, b): a normaliser or pre-tokeniser (as its JSON) turns n characters into at most a * n + b; a regex that
    backtracks exponentially is refused here too."""
    if spec is None:
        return 1, 0
    kind = spec.get("type")
    if kind == "Sequence":
        a, b = 1.0, 0.0
        for part in spec.get("normalizers", spec.get("pretokenizers", [])):
            part_a, part_b = _growth(part, source)
            a, b = part_a * a, part_a * b + part_b  # the next step applies to this step's output
        return a, b
    pattern = spec.get("pattern", {})
    if "Regex" in pattern and _nested_repetition(pattern["Regex"]):
        raise AnimaError(f"{source}: its {kind} pattern {pattern['Regex'][:80]!r} repeats a repeated or alternating "
                         "group, which backtracks without bound on some prompts; refused")
    if kind == "Replace":
        content = len(spec.get("content", ""))
        width = len(pattern.get("String", ""))  # a regex is taken as matching the empty string (the upper bound)
        return (max(1.0, content / width), 0) if width else (1.0 + content, content)
    if kind == "Prepend":
        return 1, len(spec.get("prepend", ""))
    if kind == "Precompiled":
        return max(1, _precompiled_growth(spec.get("precompiled_charsmap", ""))), 0
    if kind == "Metaspace":  # spaces become U+2581 one for one; a prefix U+2581 per piece unless "never"
        return (1, 0) if spec.get("prepend_scheme") == "never" else (2, 1)
    if kind == "ByteLevel" and spec.get("add_prefix_space"):  # a prefix space per piece, then one char per byte
        return 8, 4
    if kind not in _FIXED_GROWTH:
        raise AnimaError(f"{source}: it has a {kind!r} step, which this program does not know how to bound; refused")
    return _FIXED_GROWTH[kind], 0


def _text_growth(tokenizer: Tokenizer, source: str) -> float:
    """How many characters one prompt character may become before the model splits it into tokens (which never
    outnumber the characters), refused above MAX_TEXT_GROWTH."""
    steps = [tokenizer.normalizer, tokenizer.pre_tokenizer]
    specs = [None if step is None else json.loads(step.__getstate__()) for step in steps]
    a, b = 1.0, 0.0
    for spec in specs:
        step_a, step_b = _growth(spec, source)
        a, b = step_a * a, step_a * b + step_b
    growth = a + b  # per character of a chunk of at least one character
    if not math.isfinite(growth) or growth > MAX_TEXT_GROWTH:
        raise AnimaError(f"{source}: its normalizer and pre-tokenizer can make a prompt up to {growth:.3g} times "
                         f"longer; at most {MAX_TEXT_GROWTH} is accepted (the real Qwen3 and T5 files: 12 and 75)")
    return growth


def tokenizer_file(folder: str | os.PathLike) -> Path:
    """A tokenizer folder's file: tokenizer.json, or tokenizer.json.xz (how the package ships the real ones)."""
    path = Path(folder) / "tokenizer.json"
    packed = path.with_name(path.name + ".xz")
    return packed if not path.is_file() and packed.is_file() else path


def _unpack(path: Path, limit: int) -> bytes:
    """An .xz file's contents, never more than `limit` bytes unpacked (a small file may unpack to gigabytes)."""
    unpacker = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
    try:
        data = unpacker.decompress(read_small_file(path, limit), max_length=limit + 1)
    except lzma.LZMAError as e:
        raise Unreadable(f"not an intact .xz file ({e})") from None
    if len(data) > limit:
        raise Unreadable(f"unpacks to more than {limit} bytes")
    if not unpacker.eof:
        raise Unreadable("the .xz file is cut short")
    return data


def _load(folder: str | os.PathLike, side: str) -> Tokenizer:
    path = tokenizer_file(folder)
    if not path.is_file():
        raise AnimaError(f"{side} tokenizer file not found: {path}")
    try:
        raw = _unpack(path, MAX_TOKENIZER_BYTES) if path.suffix == ".xz" else read_small_file(path, MAX_TOKENIZER_BYTES)
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

    def __init__(self, qwen: Tokenizer, t5: Tokenizer, qwen_file: Path | None = None,
                 t5_file: Path | None = None) -> None:
        self.qwen = qwen
        self.t5 = t5
        # How messages name each side: by its file where there is one.
        self.sources = {side: f"the {side} tokenizer" + (f" {path}" if path else "")
                        for side, path in (("Qwen", qwen_file), ("T5", t5_file))}
        self.growth = max(_text_growth(qwen, self.sources["Qwen"]), _text_growth(t5, self.sources["T5"]))
        self.qwen_empty_id = _special_id(qwen, QWEN_EMPTY_TOKEN, "Qwen")
        self.t5_eos_id = _special_id(t5, T5_EOS_TOKEN, "T5")

    @classmethod
    def from_dirs(cls, qwen_dir: str | os.PathLike, t5_dir: str | os.PathLike) -> PromptTokenizer:
        return cls(_load(qwen_dir, "Qwen"), _load(t5_dir, "T5"), tokenizer_file(qwen_dir), tokenizer_file(t5_dir))

    def _ids(self, side: str, chunk: str) -> list[int]:
        tokenizer = self.qwen if side == "Qwen" else self.t5
        try:
            return tokenizer.encode(chunk, add_special_tokens=False).ids
        except BaseException as e:
            # A regex that backtracks past Oniguruma's limit ends in a Rust panic, raised as pyo3's PanicException: a
            # BaseException, which `except Exception` lets through. Everything else that is not an Exception
            # (Ctrl-C, SystemExit) goes on as it came.
            if not isinstance(e, Exception) and type(e).__name__ != "PanicException":
                raise
            reason = str(e).partition("\n")[0]
            raise AnimaError(f"{self.sources[side]} failed on this prompt: {reason}") from None

    def encode(self, prompt: str) -> TokenizedPrompt:
        # Every accepted tokenizer grows a character to at most self.growth; this bounds the whole prompt's.
        if (len(prompt) + 1) * self.growth > MAX_NORMALIZED_CHARS:
            raise AnimaError(f"the prompt has {len(prompt)} characters; these tokenizers take at most "
                             f"{int(MAX_NORMALIZED_CHARS // self.growth) - 1}")
        qwen_ids: list[int] = []
        t5_ids: list[int] = []
        t5_weights: list[float] = []
        for chunk, weight in parse_prompt_weights(prompt):
            qwen_ids += self._ids("Qwen", chunk)
            chunk_t5 = self._ids("T5", chunk)
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
