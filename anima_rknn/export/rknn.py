"""Convert an exported ONNX subgraph set into .rknn files for the RK3588 NPU (fp16, no quantisation).

Runs only where rknn-toolkit2 is installed (its own venv, see scripts/setup-rknn-env.sh). Conversion is
resumable: each finished file is recorded in a progress file, so an interrupted run redoes only what is
missing, and a .rknn only ever appears under its final name complete. Each ONNX source is placed beside its
.rknn (a hard link where the file system allows), so the converted set is self-contained: the x86 simulator
rebuilds its contexts from those, and the board needs only the .rknn files. A VAE set converts the same way: its
decoder, and its encoder where export-vae --encoder wrote one (vae_decoder.rknn, vae_encoder.rknn).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any, BinaryIO

from tqdm import tqdm

from ..core.files import atomic_path, cached_sha256, check_space, held_folder, link_or_copy, sha256_file, write_json
from ..errors import AnimaError
from .manifest import (
    MANIFEST,
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
    return manifest


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


def compiler_memory(build_log: str) -> dict[str, int]:
    """The compiler's own internal (activation) and weight sizes from its verbose build log."""
    sizes = {}
    for kind, number, unit in _MEMORY_LINE.findall(build_log):
        sizes[f"{kind.lower()}_bytes"] = round(float(number) * _UNITS[unit])
    return sizes


def convert_one(onnx_path: Path, rknn_path: Path, target: str, overwrite: bool = False) -> dict[str, Any]:
    started = time.perf_counter()
    # Verbose builds print the compiler's memory table, and also dump debug ONNX models (weights included)
    # into the working folder: build from a scratch folder that is thrown away.
    with toolkit_output() as log, tempfile.TemporaryDirectory() as scratch, contextlib.chdir(scratch):
        rknn = build_model(onnx_path, target, log, verbose=True)
        try:
            with atomic_path(rknn_path, overwrite=overwrite) as tmp:
                toolkit_call("export_rknn", onnx_path, log, rknn.export_rknn, str(tmp))
        finally:
            rknn.release()
        memory = compiler_memory(log_text(log))
    return {
        "rknn_file": rknn_path.name,
        "rknn_sha256": sha256_file(rknn_path),
        "rknn_bytes": rknn_path.stat().st_size,
        "convert_s": round(time.perf_counter() - started, 3),
        **memory,
    }


def _is_own_copy(path: Path, expected_sha256: str) -> bool:
    """A file this conversion wrote and that is still intact; links are never ours, so they are replaced."""
    return path.is_file() and not path.is_symlink() and cached_sha256(path) == expected_sha256


def convert_subgraphs(
    subgraph_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    target: str = "rk3588",
    progress: bool = True,
    overwrite: bool = False,
) -> Path:
    """Convert every subgraph in `subgraph_dir` to `out_dir`/*.rknn, each beside a copy of its ONNX source;
    return `out_dir`/manifest.json.

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
    onnx_names = [entry["file"] for entry in source["subgraphs"]]
    rknn_names = [rknn_name(name) for name in onnx_names]
    # Each .rknn is about its graph's size; the graphs come as hard links (no space) where the disk allows.
    check_space(out_dir, sum((source_dir / name).stat().st_size for name in onnx_names), "the converted set")

    def folder() -> Path:
        return open_set_folder(out_dir, overwrite=overwrite, names=[*onnx_names, *rknn_names, PROGRESS_FILE],
                               resumable=PROGRESS_FILE)

    with held_folder(folder):  # held for the whole conversion: a second one into the folder is refused
        identity = {
            "source_sha256": sha256_file(source_dir / MANIFEST),
            "target": target,
            "toolkit_version": toolkit_version,
        }
        progress_path = out_dir / PROGRESS_FILE
        done = read_progress(progress_path, identity, rknn_names)  # checked before anything in out_dir changes
        if done is None and not overwrite:
            raise AnimaError(f"{out_dir} holds the conversion of another set, target or toolkit version; "
                             "pass --overwrite to replace it")
        done = done or {}
        clear_set_folder(out_dir, keep=[*onnx_names, *rknn_names, PROGRESS_FILE])
        # What is here now is this conversion's own interrupted work (or --overwrite's to replace): a file that
        # appears at one of its names later is not, and stays.
        ours = {path.name for path in out_dir.iterdir()} if not overwrite else {*onnx_names, *rknn_names}
        records = []
        for entry in tqdm(source["subgraphs"], desc="rknn convert", unit="subgraph", disable=not progress):
            onnx_path, rknn_path = out_dir / entry["file"], out_dir / rknn_name(entry["file"])
            if not _is_own_copy(onnx_path, entry["sha256"]):
                link_or_copy(source_dir / entry["file"], onnx_path, overwrite=onnx_path.name in ours)
            record = done.get(rknn_path.name)
            if record is None or not _is_own_copy(rknn_path, record["rknn_sha256"]):
                record = convert_one(onnx_path, rknn_path, target, overwrite=rknn_path.name in ours)
                done[rknn_path.name] = record
                write_json(progress_path, {**identity, "done": done}, overwrite=True)
            records.append({"index": entry["index"], **record})

        manifest_path = out_dir / MANIFEST
        write_json(manifest_path, {**source, "rknn": {**identity, "subgraphs": records}}, overwrite=overwrite)
        return manifest_path
