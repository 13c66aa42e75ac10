"""A model's cache numbers: the constants `auto` fits to one model's runs (its flag's typical miss and threshold,
its check's typical partial-pass miss, its plan's growth and gain), read from a small JSON file that travels with the
model set, next to the DiT: `<dit name>.cache-fit.json`. `anima-rknn calibrate-cache` writes one for any model;
the demo model ships its own. A model without one runs `auto` in tolerance mode only (caches.make_cache refuses
budget, check and verify there). The story of each number: docs/research/auto-cache-constants.md.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any

from ..core.files import Unreadable, read_small_json, write_json
from ..errors import AnimaError

FIT_FORMAT = "anima-rknn.cache-fit/1"
FIT_SUFFIX = ".cache-fit.json"
MAX_FIT_BYTES = 64 * 1024
MAX_FIT_ERRORS = 16  # fit_error's entries (calibrate-cache writes 9; files of 8 and fewer, as first made, still read)
HOW_TO_FIT = "make one with `anima-rknn calibrate-cache` (docs/calibrate-cache.md)"


@dataclasses.dataclass(frozen=True)
class CacheFit:
    """One model's fitted cache numbers (every field but the notes is used by sampling.auto_cache)."""

    typical_miss: tuple[float, float, float, float]  # flag: ln miss = a + b ln d + c sigma + e sigma ln d
    flag_sigma: float  # flag: the calls scored are those at sigma <= this
    flag_score: float  # flag: a geometric-mean miss / typical miss at or above this flags the image
    typical_probe_miss: tuple[float, float, float, float]  # check: ln miss = a + b sigma + (c + e sigma) ln d
    plan_growth: tuple[float, float]  # budget plan: a forecast's error grows like d ** (g0 + g1 sigma)
    plan_gain: float  # budget plan: an error's growth to the image, 1 + gain at sigma 1 ...
    plan_sigma: float  # ... ramping up linearly from 1 at this sigma
    fitted_on: str  # what it was fitted on (model, prompts, steps)
    # residual sd (natural log) of each regression (fit prompts; _held_out: held-out ones); flag_score: sd of its ln
    # and flag_sigma: sd of its ln, of it, over bootstrap resamples; plan_psnr_se: dB (docs/calibrate-cache.md)
    fit_error: dict[str, float]
    dit: str | None = None  # fingerprint of the DiT file it was fitted on (core.tensorfile.fingerprint)

    def to_json(self) -> dict[str, Any]:
        return {"format": FIT_FORMAT, **dataclasses.asdict(self)}


# name -> (length, low, high): what a field may hold (a tuple of `length` numbers, or a number when length is 0)
_NUMBERS = {"typical_miss": (4, -50.0, 50.0), "flag_sigma": (0, 0.0, 1.0), "flag_score": (0, 0.0, 1e6),
            "typical_probe_miss": (4, -50.0, 50.0), "plan_growth": (2, -10.0, 10.0), "plan_gain": (0, 0.0, 100.0),
            "plan_sigma": (0, 0.0, 0.999)}


def fit_path(dit: str | os.PathLike) -> Path:
    """Where the cache fit of the DiT file `dit` lives: next to it, named after it."""
    dit = Path(dit)
    return dit.with_name(dit.name.removesuffix(".safetensors") + FIT_SUFFIX)


def _number(value: Any, low: float, high: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and low <= value <= high


def parse_fit(value: Any, where: str) -> CacheFit:
    """A cache fit from its JSON, every field checked; anything else is one AnimaError naming `where`."""
    if not isinstance(value, dict) or value.get("format") != FIT_FORMAT:
        raise AnimaError(f"{where} is not an {FIT_FORMAT} cache fit")
    fields = {f.name for f in dataclasses.fields(CacheFit)}
    if set(value) - {"format"} != fields:
        raise AnimaError(f"{where}: a cache fit holds exactly {', '.join(sorted(fields))}")
    numbers: dict[str, Any] = {}
    for name, (length, low, high) in _NUMBERS.items():
        item = value[name]
        ok = (isinstance(item, (list, tuple)) and len(item) == length and all(_number(v, low, high) for v in item)) \
            if length else _number(item, low, high)
        if not ok:
            raise AnimaError(f"{where}: {name} must be " + (f"{length} numbers" if length else "a number")
                             + f" from {low:g} to {high:g}")
        numbers[name] = tuple(float(v) for v in item) if length else float(item)
    errors, notes, dit = value["fit_error"], value["fitted_on"], value["dit"]
    if not (isinstance(errors, dict) and len(errors) <= MAX_FIT_ERRORS and all(
            isinstance(k, str) and _number(v, 0.0, 100.0) for k, v in errors.items())):
        raise AnimaError(f"{where}: fit_error must map a few names to numbers from 0 to 100")
    if not (isinstance(notes, str) and len(notes) <= 2000) or not (dit is None or (
            isinstance(dit, str) and len(dit) == 64 and all(c in "0123456789abcdef" for c in dit))):
        raise AnimaError(f"{where}: fitted_on must be a short text and dit a sha256 fingerprint or null")
    return CacheFit(**numbers, fitted_on=notes, fit_error={k: float(v) for k, v in errors.items()}, dit=dit)


def read_fit(path: str | os.PathLike) -> CacheFit:
    try:
        value = read_small_json(path, MAX_FIT_BYTES)
    except Unreadable as e:
        raise AnimaError(f"cache fit {path}: {e}") from None
    except OSError as e:
        raise AnimaError(f"cache fit {path} cannot be read: {e.strerror or e}") from None
    return parse_fit(value, f"cache fit {path}")


def fit_of_model(dit: str | os.PathLike, dit_fingerprint: str) -> CacheFit | None:
    """The cache fit next to the DiT file `dit` (None: it has none); refused when it was fitted on another DiT."""
    path = fit_path(dit)
    if not path.is_file():
        return None
    fit = read_fit(path)
    if fit.dit is not None and fit.dit != dit_fingerprint:
        raise AnimaError(f"the cache fit {path} was fitted on another DiT than {Path(dit).name}: "
                         f"remove it, or {HOW_TO_FIT}")
    return fit


def write_fit(path: str | os.PathLike, fit: CacheFit, *, overwrite: bool) -> None:
    """Written whole or not at all (core.files.write_json publishes a finished temporary file)."""
    parse_fit(fit.to_json(), "the fit made")  # never write what this module would refuse to read
    write_json(path, fit.to_json(), overwrite=overwrite)
