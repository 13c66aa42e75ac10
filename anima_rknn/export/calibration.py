"""A calibration set: the inputs each DiT subgraph really received in fp32 torch runs, and what it returned, in
rknn-toolkit2's dataset format, for quantizing a subgraph set and checking each quantized subgraph.

Layout of the folder (one per ONNX set: same DiT file, resolution and input shapes):

    calibration.json          what was run: the model, the size, one entry per captured pass (prompt, seed,
                              step, sigma, CFG branch, and whether it is held out of the calibration)
    b00_self_attn/            one folder per subgraph:
        000_x.npy ...         sample 000's inputs, one float32 .npy per input, in the subgraph's input order
        004_y.npy             a held-out sample's fp32 output (the reference the quantized subgraph is checked
                              against; calibrating samples keep their inputs only)
        dataset.txt           the toolkit's dataset file: one line per calibrating sample, its inputs' .npy
                              names space-separated (the toolkit reads them relative to this file)

The held-out samples (runs with prompts and seeds the calibration never saw) are in no dataset.txt: they are what
each quantized subgraph is checked on. Everything read back is checked like user input: the JSON whole, each
.npy's header (dtype and shape) before its data is read.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..core.files import Unreadable, atomic_path, open_small_file, output_folder, sha256_file, write_json
from ..errors import AnimaError
from .manifest import Field, _choice, _field, _int, _list_from, _number, _object, _sha256, plain_name, read_json
from .manifest import set_file, subgraph_name

CALIBRATION_FORMAT = "anima-rknn-calibration/1"
CALIBRATION_JSON = "calibration.json"
DATASET_FILE = "dataset.txt"
CAPTURING = ".capturing"  # marks a capture in progress (removed once calibration.json is written)
BRANCHES = ("cond", "uncond")
MAX_SAMPLES = 4096
MAX_PROMPT_CHARS = 4000


@dataclass(frozen=True)
class Sample:
    """One captured transformer pass: run `run` (a prompt and a seed), its step `step` at `sigma`, one branch."""

    run: int
    prompt: str
    seed: int
    step: int
    sigma: float
    branch: str
    held_out: bool


def sample_files(index: int, input_names: list[str]) -> list[str]:
    """Sample `index`'s input .npy names, in the subgraph's input order."""
    return [f"{index:03d}_{name}.npy" for name in input_names]


def output_file(index: int) -> str:
    return f"{index:03d}_y.npy"


class CalibrationWriter:
    """Writes a calibration set for the ONNX set `source` (its checked manifest) sample by sample; `finish` writes
    calibration.json last, so a folder without it is never taken for a complete set."""

    def __init__(self, folder: Path, source: dict[str, Any], overwrite: bool = False) -> None:
        # An interrupted capture (its marker still there) is started again in its own folder without --overwrite.
        self.folder = output_folder(folder, overwrite=overwrite, holds="other files", resumable=CAPTURING,
                                    names=[CALIBRATION_JSON, *(subgraph_name(e["index"]) for e in source["subgraphs"])])
        (self.folder / CALIBRATION_JSON).unlink(missing_ok=True)
        (self.folder / CAPTURING).touch()
        self.source = source
        self.samples: list[Sample] = []
        for entry in source["subgraphs"]:
            (self.folder / subgraph_name(entry["index"])).mkdir(exist_ok=True)

    def add(self, sample: Sample, records: dict[int, tuple[dict[str, np.ndarray], np.ndarray]]) -> None:
        """One pass's inputs and outputs of every subgraph (engine.accuracy.RecordingBackend.records)."""
        index = len(self.samples)
        for entry in self.source["subgraphs"]:
            inputs, output = records[entry["index"]]
            folder = self.folder / subgraph_name(entry["index"])
            names = [spec["name"] for spec in entry["inputs"]]
            for name, file in zip(names, sample_files(index, names)):
                np.save(folder / file, np.ascontiguousarray(inputs[name], dtype=np.float32))
            if sample.held_out:  # the reference of the check; the calibration itself needs inputs only
                np.save(folder / output_file(index), np.ascontiguousarray(output, dtype=np.float32))
        self.samples.append(sample)

    def finish(self) -> Path:
        samples = self.samples
        if not any(s.held_out for s in samples) or all(s.held_out for s in samples):
            raise AnimaError("a calibration set needs both calibrating and held-out passes")
        for entry in self.source["subgraphs"]:
            names = [spec["name"] for spec in entry["inputs"]]
            lines = [" ".join(sample_files(i, names)) for i, s in enumerate(samples) if not s.held_out]
            with atomic_path(self.folder / subgraph_name(entry["index"]) / DATASET_FILE, overwrite=True) as tmp:
                tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
        model = self.source["model"]
        write_json(self.folder / CALIBRATION_JSON, {
            "format": CALIBRATION_FORMAT, "model": {"file": model["file"], "sha256": model["sha256"]},
            "width": self.source["width"], "height": self.source["height"], "tokens": self.source["tokens"],
            "subgraphs": len(self.source["subgraphs"]),
            "samples": [{"run": s.run, "prompt": s.prompt, "seed": s.seed, "step": s.step, "sigma": s.sigma,
                         "branch": s.branch, "held_out": s.held_out} for s in samples],
        }, overwrite=True)
        (self.folder / CAPTURING).unlink()
        return self.folder


def agreement(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    """Cosine similarity and max error relative to the reference's largest magnitude, in float64."""
    g, w = got.astype(np.float64).ravel(), want.astype(np.float64).ravel()
    cosine = float(g @ w / max(np.linalg.norm(g) * np.linalg.norm(w), np.finfo(np.float64).tiny))
    return cosine, float(np.abs(g - w).max() / max(np.abs(w).max(), np.finfo(np.float64).tiny))


def _prompt(value: Any, at: Field) -> str:
    if not isinstance(value, str) or len(value) > MAX_PROMPT_CHARS:
        at.fail(f"expected a prompt of at most {MAX_PROMPT_CHARS} characters")
    return value


def _bool(value: Any, at: Field) -> bool:
    if not isinstance(value, bool):
        at.fail("expected true or false")
    return value


def _check_sample(value: Any, at: Field) -> Sample:
    sample = _object(value, at)
    return Sample(run=_field(sample, at, "run", _int, 0, MAX_SAMPLES), prompt=_field(sample, at, "prompt", _prompt),
                  seed=_field(sample, at, "seed", _int, 0, 2**64 - 1), step=_field(sample, at, "step", _int, 0, 10000),
                  sigma=_field(sample, at, "sigma", _number, 0.0, 1.0),
                  branch=_field(sample, at, "branch", _choice, BRANCHES),
                  held_out=_field(sample, at, "held_out", _bool))


@dataclass(frozen=True)
class Calibration:
    """A checked calibration set, for one ONNX set."""

    folder: Path
    samples: tuple[Sample, ...]
    sha256: str  # of calibration.json: the conversion's identity records it

    def dataset(self, index: int) -> Path:
        return self.folder / subgraph_name(index) / DATASET_FILE

    def held_out(self, entry: dict[str, Any]) -> Iterator[tuple[Sample, list[np.ndarray], np.ndarray]]:
        """Each held-out sample of subgraph `entry` (an ONNX manifest entry): its inputs in order, its fp32 output."""
        folder = self.folder / subgraph_name(entry["index"])
        names = [spec["name"] for spec in entry["inputs"]]
        shapes = [spec["shape"] for spec in entry["inputs"]]
        for i, sample in enumerate(self.samples):
            if sample.held_out:
                inputs = [read_npy(folder / file, shape) for file, shape in zip(sample_files(i, names), shapes)]
                yield sample, inputs, read_npy(folder / output_file(i), entry["outputs"][0]["shape"])


def _check_header(f: BinaryIO, path: Path, shape: list[int]) -> None:
    version = np.lib.format.read_magic(f)
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    found, fortran, dtype = read_header(f)
    if dtype != np.float32 or list(found) != list(shape) or fortran:
        raise AnimaError(f"calibration file {path}: expected a float32 array of shape {shape}, "
                         f"got {dtype} {list(found)}")


def read_npy(path: Path, shape: list[int], data: bool = True) -> np.ndarray | None:
    """A float32 .npy of `shape`; its header is checked before any data is read (no pickles, no other size).
    With `data` False only the header is checked."""
    count = int(np.prod(shape))
    try:
        # A regular file no larger than its array and a header (a FIFO is never waited on, a huge file never read).
        with open_small_file(path, count * 4 + (1 << 16)) as f:
            _check_header(f, path, shape)
            if not data:
                return None
            array = np.fromfile(f, dtype=np.float32, count=count)
    except (OSError, ValueError, Unreadable) as e:
        raise AnimaError(f"cannot read calibration file {path}: {e}") from None
    if array.size != count:
        raise AnimaError(f"calibration file {path} is cut short")
    return array.reshape(shape)


def read_calibration(folder: str | os.PathLike, source: dict[str, Any]) -> Calibration:
    """The calibration set in `folder`, refused in one line unless it was captured for the ONNX set `source`
    (same DiT file, resolution and subgraph count) and every file it needs is there with the right shape."""
    folder = Path(folder)
    at = Field(str(folder / CALIBRATION_JSON))
    path = set_file(folder, CALIBRATION_JSON, at)
    if not os.path.lexists(path):
        raise AnimaError(f"{folder} holds no calibration set ({CALIBRATION_JSON} missing)")
    data = _object(read_json(path, at), at)
    if data.get("format") != CALIBRATION_FORMAT:
        at.fail(f"not an {CALIBRATION_FORMAT} file")
    model = _field(data, at, "model", _object)
    _field(model, at["model"], "file", plain_name)
    digest = _field(model, at["model"], "sha256", _sha256)
    if digest != source["model"]["sha256"]:
        raise AnimaError(f"the calibration set in {folder} was captured from another DiT file ({model['file']}, "
                         f"sha256 {digest[:12]}...), not the one of this set ({source['model']['file']}, "
                         f"sha256 {source['model']['sha256'][:12]}...)")
    size = (_field(data, at, "width", _int, 16, 8192), _field(data, at, "height", _int, 16, 8192))
    if size != (source["width"], source["height"]):
        raise AnimaError(f"the calibration set in {folder} was captured at {size[0]}x{size[1]}, this set is "
                         f"{source['width']}x{source['height']}")
    _field(data, at, "subgraphs", _choice_count, len(source["subgraphs"]))
    raw = _field(data, at, "samples", _list_from, 2, MAX_SAMPLES, f"2 to {MAX_SAMPLES} samples")
    samples = tuple(_check_sample(s, at["samples"][i]) for i, s in enumerate(raw))
    if not any(s.held_out for s in samples) or all(s.held_out for s in samples):
        at["samples"].fail("expected both calibrating and held-out samples")
    for entry in source["subgraphs"]:  # every file there, each header right: no surprise mid-conversion
        sub = folder / subgraph_name(entry["index"])
        names = [spec["name"] for spec in entry["inputs"]]
        for i, sample in enumerate(samples):
            files = [*sample_files(i, names), *([output_file(i)] if sample.held_out else [])]
            for file, spec in zip(files, [*entry["inputs"], *entry["outputs"]]):
                read_npy(set_file(sub, file, at), spec["shape"], data=False)
        set_file(sub, DATASET_FILE, at)
    return Calibration(folder, samples, sha256_file(path))


def _choice_count(value: Any, at: Field, count: int) -> int:
    if isinstance(value, bool) or value != count:
        at.fail(f"captured for a set of {value} subgraphs, this set has {count}")
    return value


