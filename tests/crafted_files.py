"""Damaged and crafted model files: safetensors taken apart and put back together byte for byte, and a
pickle planted where a model file belongs."""

from __future__ import annotations

import json
import pickle
import struct
from collections.abc import Callable
from pathlib import Path


def split(path: Path) -> tuple[dict, bytes]:
    """(header as parsed JSON, data section) of a file safetensors wrote."""
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + length]), raw[8 + length:]


def write(path: Path, header: object, data: bytes = b"") -> Path:
    """A file with `header` (a JSON value, or raw bytes) and `data` after it, length prefix and all."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def edited(source: Path, target: Path, change: Callable[[dict], object]) -> Path:
    """`source` with its parsed header changed in place by `change`, written to `target`."""
    header, data = split(source)
    change(header)
    return write(target, header, data)


class _Plant:
    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple:
        return open, (self.marker, "w")


def planted_pickle(marker: Path, protocol: int = pickle.HIGHEST_PROTOCOL) -> bytes:
    """A pickle (of a dict, as torch.save writes) whose loading creates `marker`: a reader that unpickles
    leaves that file behind."""
    return pickle.dumps({"state_dict": _Plant(marker)}, protocol=protocol)


def tokenizer_with(source: Path, target: Path, **steps: object) -> Path:
    """The tokenizer.json `source` with its top-level steps (normalizer, pre_tokenizer, ...) replaced, written to
    `target`."""
    tokenizer = json.loads(source.read_text("utf-8"))
    tokenizer.update(steps)
    target.write_text(json.dumps(tokenizer), "utf-8")
    return target


def replace(pattern: str, content: str, regex: bool = False) -> dict:
    """A Replace normaliser step, as tokenizer.json spells it."""
    return {"type": "Replace", "pattern": {"Regex" if regex else "String": pattern}, "content": content}


def growing_normalizer(copies: int = 100_000) -> dict:
    """Each "a" becomes `copies` of it: about 5 MB of the tokenizer's memory per letter of a prompt at 100,000."""
    return {"type": "Sequence", "normalizers": [{"type": "Lowercase"}, replace("a", "a" * copies)]}


def doubling_normalizers(count: int) -> dict:
    """`count` chained Replaces that each double the a's: 2**count letters per "a"."""
    return {"type": "Sequence", "normalizers": [replace("a", "aa") for _ in range(count)]}


def split_by(regex: str) -> dict:
    """A pre-tokeniser that splits on `regex` (Oniguruma syntax), its matches kept as pieces."""
    return {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}
