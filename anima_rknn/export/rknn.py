"""Convert an exported ONNX subgraph set into .rknn files for the RK3588 NPU: fp16, or int8 (w8a8) where it holds.

Runs only where rknn-toolkit2 is installed (its own venv, see scripts/setup-rknn-env.sh). Conversion is
resumable: each finished file is recorded in a progress file, so an interrupted run redoes only what is
missing, and a .rknn only ever appears under its final name complete. Each ONNX source is placed beside its
.rknn (a hard link where the file system allows), so the converted set is self-contained: the x86 simulator
rebuilds its contexts from those, and the board needs only the .rknn files. A VAE set converts the same way: its
decoder, and its encoder where export-vae --encoder wrote one (vae_decoder.rknn, vae_encoder.rknn).

A quantized (w8a8) conversion calibrates each subgraph on a calibration set (export.calibration) through the
toolkit's hybrid-quantization steps, then checks it in the simulator against fp32 on the set's held-out passes:
below the threshold its output projection, output and attention core (softmax(QK^T)V) go back to fp16 (hybrid),
and if that is still below, the whole subgraph stays fp16. A quantized subgraph keeps the toolkit's step-1 files
beside its .rknn (.model, .data, .quantization.cfg): the simulator rebuilds its context from those, as it does an
fp16 one from the ONNX file.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from tqdm import tqdm

from ..core.files import (
    atomic_path,
    cached_sha256,
    check_space,
    held_folder,
    link_or_copy,
    same_disk,
    sha256_file,
    write_json,
)
from ..errors import AnimaError
from .calibration import Calibration, agreement
from .manifest import (
    MANIFEST,
    QUANT_SUFFIXES,
    SUBGRAPHS_FORMAT,
    check_file,
    check_set,
    clear_set_folder,
    open_set_folder,
    read_manifest,
    read_progress,
    rknn_name,
)

PROGRESS_FILE = "convert-progress.json"
TOOLKIT_MISSING = (
    "rknn-toolkit2 is not installed: run scripts/setup-rknn-env.sh and use .venv-rknn/bin/anima-rknn"
)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_MEMORY_LINE = re.compile(r"Total (Internal|Weight) Memory Size: ([\d.]+)\s*(B|KB|MB|GB)")
_UNITS = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}
QUANTIZE_DTYPES = ("fp16", "w8a8")  # what RK3588 runs of the toolkit's dtypes that serve (docs/npu-int8.md)
ALGORITHMS = ("normal", "mmse", "kl_divergence")
DEFAULT_ALGORITHM = "normal"  # as good as mmse and kl_divergence on held-out passes, and the fastest to build
# A quantized subgraph's worst held-out cosine against fp32 must reach this, or it falls back (docs/npu-int8.md).
DEFAULT_MIN_QUANT_COSINE = 0.999
_IO_DTYPE = re.compile(rb'"dtype": "(int8|float16|float32)"')
# The layers a hybrid subgraph keeps fp16: the output projection and the output (the toolkit names them after the
# output, y_mm ... y_int8), and the attention core (its fused exSDPAttention). The int8 output was where held-out
# passes lost most (a new prompt's output past the calibrated range; the uncond branch's far smaller one):
# docs/measurements/npu-int8.md.
_HYBRID_LAYERS = re.compile(r"^    (y_\S+|\S*sdpa\S*):$", re.MULTILINE)


@dataclass(frozen=True)
class Quantization:
    """How convert-rknn quantizes: the dtype, the toolkit's algorithm, the threshold, the checked calibration."""

    dtype: str
    algorithm: str
    min_cosine: float
    calibration: Calibration

    def identity(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "algorithm": self.algorithm, "min_cosine": self.min_cosine,
                "calibration_sha256": self.calibration.sha256}


def check_quantize_options(dtype: str, algorithm: str, min_cosine: float) -> None:
    """Refuse an unknown dtype or algorithm, or a threshold outside (0, 1], in one line."""
    if dtype not in QUANTIZE_DTYPES:
        raise AnimaError(f"unknown quantization {dtype!r}: choose one of {', '.join(QUANTIZE_DTYPES)}")
    if algorithm not in ALGORITHMS:
        raise AnimaError(f"unknown quantization algorithm {algorithm!r}: choose one of {', '.join(ALGORITHMS)}")
    if not 0 < min_cosine <= 1:
        raise AnimaError(f"the quantized subgraphs' minimum cosine must be in (0, 1], got {min_cosine}")


def toolkit() -> tuple[type, str]:
    """The RKNN class and rknn-toolkit2's version, or the one-line install hint."""
    try:
        from rknn.api import RKNN
    except ImportError:
        raise AnimaError(TOOLKIT_MISSING) from None
    return RKNN, metadata.version("rknn-toolkit2")


def read_converted_manifest(rknn_dir: str | os.PathLike, *, dit_path: str | os.PathLike | None,
                            width: int, height: int, loras: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The manifest of a converted set, after checking it was made for this resolution and (given
    `dit_path`) this DiT file. The .rknn files themselves are hashed when first loaded."""
    manifest = read_manifest(rknn_dir)
    if "rknn" not in manifest:
        raise AnimaError(f"{rknn_dir} holds ONNX subgraphs, not .rknn ones: convert them with "
                         "`anima-rknn convert-rknn` first")
    check_set(manifest, rknn_dir, dit_path=dit_path, width=width, height=height, loras=loras)
    for record in manifest["rknn"]["subgraphs"]:
        check_precision(Path(rknn_dir) / record["rknn_file"], record)
    return manifest


def rknn_io_dtype(path: Path) -> str | None:
    """The dtype of a .rknn file's inputs and outputs as its header describes them (int8 in a quantized model,
    float16 in an fp16 one), None where the header does not say."""
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16)
    except OSError as e:
        raise AnimaError(f"cannot read {path}: {e.strerror or e}") from None
    found = {match.decode() for match in _IO_DTYPE.findall(head)}
    return "int8" if "int8" in found else ("float16" if found else None)


def check_precision(path: Path, record: dict[str, Any]) -> None:
    """The precision a manifest claims for a .rknn file (fp16 where it says none) is the file's own."""
    claimed = record.get("precision", "float16")
    io_dtype = rknn_io_dtype(path)
    if io_dtype is not None and (io_dtype == "int8") != (claimed != "float16"):
        raise AnimaError(f"{path.name}: the manifest says {claimed} but the file is "
                         + ("an int8 (quantized) model" if io_dtype == "int8" else "an fp16 model")
                         + ": convert it again")


@contextlib.contextmanager
def toolkit_output() -> Iterator[BinaryIO]:
    """Send the toolkit's console output to a temp file, and drop its warnings, for the block.

    It prints progress bars and notes from native code even with verbose=False, which would bury our own
    progress; redirecting the file descriptors catches the C++ side, and redirecting sys.stdout/stderr the
    Python side where those are not the descriptors (pytest's capture, notebooks). Its thousands of
    DeprecationWarnings (old onnx/NumPy APIs inside the toolkit) are nothing a user can act on.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    with (tempfile.TemporaryFile() as log, warnings.catch_warnings(),
          open(log.fileno(), "w", buffering=1, errors="replace", closefd=False) as text,
          contextlib.redirect_stdout(text), contextlib.redirect_stderr(text)):
        warnings.simplefilter("ignore", DeprecationWarning)
        saved = os.dup(1), os.dup(2)
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield log
        finally:
            text.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def log_text(log: BinaryIO) -> str:
    log.flush()
    log.seek(0)
    return _ANSI.sub("", log.read().decode(errors="replace"))


def toolkit_call(step: str, what: Path, log: BinaryIO, method: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Call an rknn-toolkit2 method; turn its two ways of failing into one AnimaError line.

    It either returns a non-zero code / None (the reason then sits in its log as an 'E ' line) or raises
    ValueError carrying a whole traceback whose last line is the reason.
    """
    try:
        result = method(*args, **kwargs)
    except ValueError as e:
        reason = next((line.strip() for line in reversed(str(e).splitlines()) if line.strip()), repr(e))
    else:
        if result is not None and not (isinstance(result, int) and result != 0):
            return result
        errors = [line[2:].strip() for line in log_text(log).splitlines() if line.startswith("E ")]
        reason = errors[-1] if errors else f"returned {result!r}"
    raise AnimaError(f"rknn-toolkit2 {step} failed for {what.name}: {reason}")


def build_model(onnx_path: Path, target: str, log: BinaryIO, verbose: bool = False) -> Any:
    """An RKNN object holding `onnx_path` compiled for `target` in fp16 (call inside toolkit_output())."""
    rknn_class, _ = toolkit()
    rknn = rknn_class(verbose=verbose)
    try:
        toolkit_call("config", onnx_path, log, rknn.config,
                     target_platform=target, float_dtype="float16", optimization_level=3)
        toolkit_call("load_onnx", onnx_path, log, rknn.load_onnx, model=str(onnx_path))
        toolkit_call("build", onnx_path, log, rknn.build, do_quantization=False)
    except BaseException:
        rknn.release()
        raise
    return rknn


def quantized_model(step1: tuple[Path, Path, Path], log: BinaryIO, verbose: bool = False) -> Any:
    """An RKNN object holding the int8 model of the toolkit's step-1 files (.model, .data, .quantization.cfg)."""
    rknn_class, _ = toolkit()
    rknn = rknn_class(verbose=verbose)
    try:
        toolkit_call("hybrid_quantization_step2", step1[2], log, rknn.hybrid_quantization_step2, *map(str, step1))
    except BaseException:
        rknn.release()
        raise
    return rknn


def simulator_model(set_dir: Path, entry: dict[str, Any], record: dict[str, Any], target: str,
                    log: BinaryIO) -> Any:
    """A subgraph's model for the x86 simulator, built again from the sources its set keeps: the ONNX file of an
    fp16 subgraph, the step-1 files of a quantized one (each checked against the manifest first)."""
    if record.get("precision", "float16") == "float16":
        onnx_path = set_dir / entry["file"]
        if not onnx_path.exists():
            raise AnimaError(f"{onnx_path} is missing: the simulator builds each context from the ONNX file beside "
                             "its .rknn (run convert-rknn again into this folder to add it)")
        check_file(onnx_path, entry["sha256"])
        return build_model(onnx_path, target, log)
    sources = tuple(set_dir / f["file"] for f in record["quant_files"])
    for path, f in zip(sources, record["quant_files"]):
        check_file(path, f["sha256"])
    return quantized_model(sources, log)  # type: ignore[arg-type]


def compiler_memory(build_log: str) -> dict[str, int]:
    """The compiler's own internal (activation) and weight sizes from its verbose build log."""
    sizes = {}
    for kind, number, unit in _MEMORY_LINE.findall(build_log):
        sizes[f"{kind.lower()}_bytes"] = round(float(number) * _UNITS[unit])
    return sizes


def _held_out_cosine(rknn: Any, held: list[tuple[Any, list[np.ndarray], np.ndarray]], what: Path,
                     log: BinaryIO) -> float:
    """The worst cosine against fp32 of a built model in the simulator over the held-out samples (NaN: -1)."""
    toolkit_call("init_runtime", what, log, rknn.init_runtime, target=None)
    worst = 1.0
    for _, inputs, want in held:
        outputs = toolkit_call("inference", what, log, rknn.inference, inputs=inputs,
                               data_format=["nchw"] * len(inputs))
        cosine, _ = agreement(np.asarray(outputs[0], dtype=np.float32).reshape(want.shape), want)
        worst = min(worst, cosine if np.isfinite(cosine) else -1.0)
    return round(worst, 7)


def convert_one(onnx_path: Path, rknn_path: Path, target: str, overwrite: bool = False,
                held: list[tuple[Any, list[np.ndarray], np.ndarray]] | None = None) -> dict[str, Any]:
    """Compile one ONNX subgraph to fp16 .rknn; with `held` (held-out samples) also measure it in the simulator."""
    started = time.perf_counter()
    # Verbose builds print the compiler's memory table, and also dump debug ONNX models (weights included)
    # into the working folder: build from a scratch folder that is thrown away.
    with toolkit_output() as log, tempfile.TemporaryDirectory() as scratch, contextlib.chdir(scratch):
        rknn = build_model(onnx_path, target, log, verbose=True)
        try:
            # Exported in the scratch folder, then published by the one writer: a full disk is its one line
            # naming the file and the space, not the toolkit's wrapped OSError naming a temporary.
            toolkit_call("export_rknn", onnx_path, log, rknn.export_rknn, "float16.rknn")
            with atomic_path(rknn_path, overwrite=overwrite, size=os.path.getsize("float16.rknn")) as tmp:
                shutil.copyfile("float16.rknn", tmp)
            measured = {} if held is None else {"held_out_cosine": {
                "float16": _held_out_cosine(rknn, held, onnx_path, log)}}
        finally:
            rknn.release()
        memory = compiler_memory(log_text(log))
    return {
        "rknn_file": rknn_path.name,
        "rknn_sha256": sha256_file(rknn_path),
        "rknn_bytes": rknn_path.stat().st_size,
        "convert_s": round(time.perf_counter() - started, 3),
        **memory,
        **measured,
    }


def hybrid_step1(onnx_path: Path, index: int, quantization: Quantization, target: str) -> tuple[Path, Path, Path]:
    """The toolkit's hybrid-quantization step 1 in the working folder: the int8 model's .model, .data and
    .quantization.cfg (its calibrated ranges), from the calibration set's dataset of subgraph `index`."""
    rknn_class, _ = toolkit()
    with toolkit_output() as log:
        rknn = rknn_class(verbose=False)
        try:
            toolkit_call("config", onnx_path, log, rknn.config, target_platform=target,
                         quantized_dtype=quantization.dtype, quantized_algorithm=quantization.algorithm,
                         quantized_method="channel", optimization_level=3)
            toolkit_call("load_onnx", onnx_path, log, rknn.load_onnx, model=str(onnx_path))
            toolkit_call("hybrid_quantization_step1", onnx_path, log, rknn.hybrid_quantization_step1,
                         dataset=str(quantization.calibration.dataset(index)))
        finally:
            rknn.release()
    return tuple(Path.cwd() / f"{onnx_path.stem}{suffix}" for suffix in QUANT_SUFFIXES)  # type: ignore[return-value]


def _hybrid(step1: tuple[Path, Path, Path]) -> tuple[Path, Path, Path] | None:
    """Step 1's files with the output projection, the output and any attention core set to fp16 (None where the
    toolkit's configuration has no such layers or already lists some)."""
    text = step1[2].read_text(encoding="utf-8")
    layers = _HYBRID_LAYERS.findall(text)
    if not layers or "custom_quantize_layers: {}" not in text:
        return None
    listed = "".join(f"\n    {name}: float16" for name in layers)
    cfg = step1[2].with_name(f"hybrid{step1[2].suffix}")
    cfg.write_text(text.replace("custom_quantize_layers: {}", f"custom_quantize_layers:{listed}", 1), encoding="utf-8")
    return step1[0], step1[1], cfg


def convert_one_quantized(entry: dict[str, Any], onnx_path: Path, rknn_path: Path, target: str,
                          quantization: Quantization, ours: set[str] = frozenset()) -> dict[str, Any]:
    """Quantize one subgraph, falling back to hybrid and then fp16 below the threshold; publish the chosen .rknn
    (after, for a quantized one, the step-1 files the simulator rebuilds it from), replacing only files in `ours`."""
    started = time.perf_counter()
    held = list(quantization.calibration.held_out(entry))
    with tempfile.TemporaryDirectory() as scratch, contextlib.chdir(scratch):
        step1 = hybrid_step1(onnx_path, entry["index"], quantization, target)
        cosines: dict[str, float] = {}
        for precision, sources in (("w8a8", step1), ("hybrid", _hybrid(step1))):
            if sources is None:
                continue
            with toolkit_output() as log:
                rknn = quantized_model(sources, log, verbose=True)
                try:
                    toolkit_call("export_rknn", onnx_path, log, rknn.export_rknn, f"{precision}.rknn")
                    cosines[precision] = _held_out_cosine(rknn, held, onnx_path, log)
                finally:
                    rknn.release()
                memory = compiler_memory(log_text(log))
            if cosines[precision] >= quantization.min_cosine:
                break
        else:  # neither held: the whole subgraph stays fp16
            record = convert_one(onnx_path, rknn_path, target, rknn_path.name in ours, held)
            record["held_out_cosine"] = {**cosines, **record["held_out_cosine"]}
            return {**record, "convert_s": round(time.perf_counter() - started, 3), "precision": "float16"}
        quant_files = []
        for path, suffix in zip(sources, QUANT_SUFFIXES):
            published = rknn_path.with_name(rknn_path.stem + suffix)
            with atomic_path(published, overwrite=published.name in ours) as tmp:
                shutil.copyfile(path, tmp)
            quant_files.append({"file": published.name, "sha256": sha256_file(published)})
        with atomic_path(rknn_path, overwrite=rknn_path.name in ours) as tmp:
            shutil.copyfile(f"{precision}.rknn", tmp)
    return {
        "rknn_file": rknn_path.name,
        "rknn_sha256": sha256_file(rknn_path),
        "rknn_bytes": rknn_path.stat().st_size,
        "convert_s": round(time.perf_counter() - started, 3),
        **memory,
        "precision": precision,
        "held_out_cosine": cosines,
        "quant_files": quant_files,
    }


def _is_own_copy(path: Path, expected_sha256: str) -> bool:
    """A file this conversion wrote and that is still intact; links are never ours, so they are replaced."""
    return path.is_file() and not path.is_symlink() and cached_sha256(path) == expected_sha256


def _is_done(out_dir: Path, record: dict[str, Any] | None) -> bool:
    """A finished subgraph of an interrupted conversion: its .rknn (and the step-1 files of a quantized one)
    intact."""
    if record is None:
        return False
    files = [(record["rknn_file"], record["rknn_sha256"]),
             *((f["file"], f["sha256"]) for f in record.get("quant_files", []))]
    return all(_is_own_copy(out_dir / name, digest) for name, digest in files)


def convert_subgraphs(
    subgraph_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    target: str = "rk3588",
    progress: bool = True,
    overwrite: bool = False,
    quantization: Quantization | None = None,
) -> Path:
    """Convert every subgraph in `subgraph_dir` to `out_dir`/*.rknn, each beside a copy of its ONNX source;
    return `out_dir`/manifest.json. With `quantization`, each is quantized where it holds (see the module's note).

    `out_dir` must be new or empty, or hold this command's own interrupted work (its progress file, for the
    same source, target and toolkit), unless `overwrite`.
    """
    _, toolkit_version = toolkit()
    source_dir, out_dir = Path(subgraph_dir).resolve(), Path(out_dir).resolve()  # builds run elsewhere
    if out_dir == source_dir:
        raise AnimaError(f"convert into a folder other than {source_dir}: its manifest.json would be replaced")
    source = read_manifest(source_dir, kind=None)  # DiT subgraphs or a VAE set (decoder, encoder): converted alike
    if source.get("stream_peak", 0) is None or source.get("encoder_stream_peak", 0) is None:
        raise AnimaError(f"the VAE set in {source_dir} was exported for ONNX Runtime only, without the fp16 "
                         "calibration the NPU needs: export one with `anima-rknn export-vae`")
    for entry in source["subgraphs"]:
        check_file(source_dir / entry["file"], entry["sha256"])
    if quantization is not None and (source["format"] != SUBGRAPHS_FORMAT or source.get("loras")):
        raise AnimaError("only a DiT subgraph set without baked-in LoRAs can be quantized: convert this one with "
                         "--quantize fp16")
    onnx_names = [entry["file"] for entry in source["subgraphs"]]
    rknn_names = [rknn_name(name) for name in onnx_names]
    # Each .rknn is about its graph's size; the graphs come as hard links (no space) on the source's disk, else as
    # copies.
    graphs = sum((source_dir / name).stat().st_size for name in onnx_names)
    check_space(out_dir, graphs * (1 if same_disk(source_dir, out_dir) else 2), "the converted set")
    quant_names = [] if quantization is None else [
        Path(name).stem + suffix for name in onnx_names for suffix in QUANT_SUFFIXES]

    def folder() -> Path:
        return open_set_folder(out_dir, overwrite=overwrite,
                               names=[*onnx_names, *rknn_names, *quant_names, PROGRESS_FILE], resumable=PROGRESS_FILE)

    with held_folder(folder):  # held for the whole conversion: a second one into the folder is refused
        identity = {
            "source_sha256": sha256_file(source_dir / MANIFEST),
            "target": target,
            "toolkit_version": toolkit_version,
            **({} if quantization is None else {"quantization": quantization.identity()}),
        }
        progress_path = out_dir / PROGRESS_FILE
        done = read_progress(progress_path, identity, rknn_names)  # checked before anything in out_dir changes
        if done is None and not overwrite:
            raise AnimaError(f"{out_dir} holds the conversion of another set, target, toolkit version or "
                             "quantization; pass --overwrite to replace it")
        done = done or {}
        clear_set_folder(out_dir, keep=[*onnx_names, *rknn_names, *quant_names, PROGRESS_FILE])
        # The marker of this conversion's own work before its first file: one killed before finishing a subgraph
        # (a quantized one takes minutes) is resumed, not refused as a folder of other files.
        write_json(progress_path, {**identity, "done": done}, overwrite=True)
        # What is here now is this conversion's own interrupted work (or --overwrite's to replace): a file that
        # appears at one of its names later is not, and stays.
        ours = ({path.name for path in out_dir.iterdir()} if not overwrite
                else {*onnx_names, *rknn_names, *quant_names})
        records = []
        for entry in tqdm(source["subgraphs"], desc="rknn convert", unit="subgraph", disable=not progress):
            onnx_path, rknn_path = out_dir / entry["file"], out_dir / rknn_name(entry["file"])
            if not _is_own_copy(onnx_path, entry["sha256"]):
                link_or_copy(source_dir / entry["file"], onnx_path, overwrite=onnx_path.name in ours)
            record = done.get(rknn_path.name)
            if not _is_done(out_dir, record):
                if quantization is None:
                    record = convert_one(onnx_path, rknn_path, target, overwrite=rknn_path.name in ours)
                else:  # its step-1 files are ours exactly when its .rknn is
                    record = convert_one_quantized(entry, onnx_path, rknn_path, target, quantization, ours)
                done[rknn_path.name] = record
                write_json(progress_path, {**identity, "done": done}, overwrite=True)
            records.append({"index": entry["index"], **record})

        manifest_path = out_dir / MANIFEST
        write_json(manifest_path, {**source, "rknn": {**identity, "subgraphs": records}}, overwrite=overwrite)
        return manifest_path
