"""ComfyUI-style prompt weights: "(word:1.2)", "(word)", nesting and "\\(" escapes; A1111's "[word]".

Rules (ComfyUI `comfy/sd1_clip.py` token_weights / parse_parentheses, re-derived):
* "(x)" gives x its surrounding weight times 1.1; "((x))" = 1.21.
* "(x:w)" gives x the weight w, replacing (not multiplying) the surrounding weight: "((x:1.5))" = 1.5,
  while "((x):1.5)" = 1.5 * 1.1 for x. The weight is the text after the LAST ':' inside the group; it
  counts only if that ':' is not the group's first character and the rest parses as a number
  (Python float syntax, surrounding spaces allowed); otherwise the whole inside is text at 1.1x.
* "[x]" divides the surrounding weight by 1.1, as A1111 does ("[[x]]" = 1 / 1.21); it takes no explicit weight
  (prompt editing, text/prompt_edit.py, has taken its "[a:b:when]" and "[a|b]" out before this parser runs).
* "\\(", "\\)", "\\[" and "\\]" are literal characters; any other backslash is ordinary text.
* Adjacent chunks with equal weight merge; empty chunks vanish; an empty prompt gives [].
Malformed input never raises (see MAX_NESTING below). Where ComfyUI behaves oddly we choose a local rule instead:
an unmatched "(" or ")" is a literal character and does not change how the rest is read
(ComfyUI turns the rest of the prompt into text after an unclosed "(", and a stray ")" shifts its
nesting count). A non-finite weight ("inf", "nan") is not accepted as a weight. Groups nest at most
MAX_NESTING deep (ComfyUI has no limit; 1.1 ** 100 is already 13,780x): deeper is one AnimaError line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import AnimaError

GROUP_FACTOR = 1.1
_CLOSERS = {"(": ")", "[": "]"}
MAX_NESTING = 100


@dataclass(frozen=True)
class _Symbol:
    char: str
    structural: bool  # True only for an unescaped parenthesis or bracket that has a partner


def _lex(text: str) -> list[_Symbol]:
    """Characters, with escapes resolved and unpaired parentheses and brackets demoted to text (a closer pairs
    with the innermost open group only when it is of its kind)."""
    symbols: list[_Symbol] = []
    i = 0
    while i < len(text):
        if text[i] == "\\" and text[i + 1 : i + 2] in ("(", ")", "[", "]"):
            symbols.append(_Symbol(text[i + 1], False))
            i += 2
        else:
            symbols.append(_Symbol(text[i], text[i] in "()[]"))
            i += 1
    open_positions: list[int] = []
    for pos, sym in enumerate(symbols):
        if not sym.structural:
            continue
        if sym.char in _CLOSERS:
            open_positions.append(pos)
        elif open_positions and _CLOSERS[symbols[open_positions[-1]].char] == sym.char:
            open_positions.pop()
        else:
            symbols[pos] = _Symbol(sym.char, False)
    for pos in open_positions:
        symbols[pos] = _Symbol(symbols[pos].char, False)
    return symbols


def _explicit_weight(inner: list[_Symbol]) -> tuple[list[_Symbol], float] | None:
    """Split "text:w" into (text, w) when the suffix after the last ':' is a finite number."""
    colon = max((pos for pos, sym in enumerate(inner) if sym.char == ":"), default=-1)
    if colon <= 0:
        return None
    suffix = inner[colon + 1 :]
    if any(sym.structural for sym in suffix):
        return None
    try:
        weight = float("".join(sym.char for sym in suffix))
    except ValueError:
        return None
    if not math.isfinite(weight):
        return None
    return inner[:colon], weight


def _walk(symbols: list[_Symbol], weight: float, out: list[tuple[str, float]], nesting: int = 0) -> None:
    if nesting > MAX_NESTING:
        raise AnimaError(f"prompt weights nest more than {MAX_NESTING} parentheses or brackets deep")
    text: list[str] = []
    i = 0
    while i < len(symbols):
        sym = symbols[i]
        if not (sym.structural and sym.char in _CLOSERS):
            text.append(sym.char)
            i += 1
            continue
        depth, close = 0, i
        for close in range(i, len(symbols)):
            if symbols[close].structural:
                depth += 1 if symbols[close].char in _CLOSERS else -1
                if depth == 0:
                    break
        out.append(("".join(text), weight))
        text = []
        inner = symbols[i + 1 : close]
        explicit = _explicit_weight(inner) if sym.char == "(" else None
        if sym.char == "[":
            _walk(inner, weight / GROUP_FACTOR, out, nesting + 1)
        elif explicit is None:
            _walk(inner, weight * GROUP_FACTOR, out, nesting + 1)
        else:
            _walk(*explicit, out, nesting + 1)
        i = close + 1
    out.append(("".join(text), weight))


def parse_prompt_weights(text: str) -> list[tuple[str, float]]:
    """Split a prompt into (text, weight) chunks; [] for an empty prompt. Raises AnimaError only for
    nesting deeper than MAX_NESTING."""
    pieces: list[tuple[str, float]] = []
    _walk(_lex(text), 1.0, pieces)
    merged: list[tuple[str, float]] = []
    for chunk, weight in pieces:
        if not chunk:
            continue
        if merged and merged[-1][1] == weight:
            merged[-1] = (merged[-1][0] + chunk, weight)
        else:
            merged.append((chunk, weight))
    return merged
