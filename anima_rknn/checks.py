"""The one vocabulary for checking values that arrive from outside (options, requests, JSON files, states).

Python counts a bool as an int, and float("nan") compares false with everything, so `isinstance(x, int)` and
`low <= x <= high` alone let True and NaN through: every check here refuses them. A failed check is one
AnimaError line that names the setting and shows the value, cut short.
"""

from __future__ import annotations

import math
from collections.abc import Collection

import numpy as np

from .errors import AnimaError

SHOWN_CHARS = 60  # a value shown in a message is cut to this many characters


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """repr(value) for a one-line message, cut to `limit` characters (a request may send megabytes)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def require(ok: bool, message: str) -> None:
    """Raise AnimaError(message) unless `ok`: option checks read as a list of rules."""
    if not ok:
        raise AnimaError(message)


def is_integer(value: object) -> bool:
    """A Python or NumPy integer, not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """A finite Python or NumPy real number, not a bool (nor an int too large for a float: False, not OverflowError)."""
    if not isinstance(value, (int, float, np.integer, np.floating)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def is_whole_number(value: object) -> bool:
    """An integer, or a finite float without a fraction (64.0: JSON has one number type, and a client that
    computes a size may send it so); 64.9 is not one."""
    return is_integer(value) or (is_number(value) and float(value).is_integer())


def is_int_in(value: object, low: int, high: int) -> bool:
    return is_integer(value) and low <= value <= high


def is_number_in(value: object, low: float, high: float) -> bool:
    return is_number(value) and low <= value <= high


def check_int(name: str, value: object, low: int, high: int | float = math.inf) -> int:
    """`value` if it is an integer from `low` to `high` (inclusive); else one AnimaError line naming `name`."""
    if not (is_integer(value) and low <= value <= high):
        bound = f"from {low} to {high}" if high != math.inf else f"of at least {low}"
        raise AnimaError(f"{name} must be an integer {bound}, got {shown(value)}")
    return value


def check_number(name: str, value: object, low: float = -math.inf, high: float = math.inf) -> float:
    """`value` if it is a finite number from `low` to `high` (inclusive); else one AnimaError line."""
    if not (is_number(value) and low <= value <= high):
        bounds = [f"from {low:g}" if low != -math.inf else "", f"to {high:g}" if high != math.inf else ""]
        bound = " ".join(b for b in bounds if b)
        raise AnimaError(f"{name} must be a finite number{' ' + bound if bound else ''}, got {shown(value)}")
    return value


def check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise AnimaError(f"{name} must be true or false, got {shown(value)}")
    return value


def check_choice(name: str, value: object, choices: Collection[str]) -> str:
    """`value` if it is one of `choices` (strings; a bool or a number is never one)."""
    if not isinstance(value, str) or value not in choices:
        raise AnimaError(f"unknown {name} {shown(value)}; choose one of {', '.join(choices)}")
    return value
