"""Reading and writing safetensors checkpoints with one-line errors for every way a file can be wrong.

`read_header` parses and checks the header itself before safetensors ever opens the file, so a crafted or
damaged file is refused with a line that names the file and the tensor, and never makes us allocate or
read past what the file holds: every tensor's bytes must be present, so sizes read from shapes are bounded
by the file's real size.

A GGUF file (stable-diffusion.cpp, ComfyUI-GGUF, llama.cpp) is read too wherever weights are (core.gguf): its
header through the same `Header`, its tensors dequantized to fp32 or `convert` by `load_tensors`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import reprlib
import struct
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from ..errors import AnimaError
from .files import atomic_path
from .gguf import gguf_fingerprint, is_gguf, map_gguf, orig_shapes, read_gguf_header
from .quant import QuantizedTensor

_FINGERPRINT_SAMPLES, _FINGERPRINT_BLOCK = 64, 4096
MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit
MAX_RANK = 8
_MAX_ELEMENTS = 2**63  # safetensors counts sizes and elements in 64-bit integers
# Bytes per element of the safetensors dtypes torch can read (the sub-byte F4/F6 types are left out).
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
               "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "C64": 8, "I64": 8, "U64": 8, "F64": 8}
WEIGHT_DTYPES = ("F16", "BF16", "F32", "F64")
_PICKLE_OR_ZIP = (b"\x80", b"PK\x03\x04")  # how pickles (protocol 2+) and torch.save's zip files begin
_SURROGATE = re.compile("[\ud800-\udfff]")
_BRIEF = reprlib.Repr()  # a value from the file, cut short for a message
_BRIEF.maxlevel, _BRIEF.maxlist, _BRIEF.maxstring = 3, 9, 40


class TensorInfo(NamedTuple):
    dtype: str
    shape: tuple[int, ...]
    begin: int  # byte offsets into the data section, which starts after the header
    end: int


@dataclasses.dataclass(frozen=True)
class Header:
    path: Path
    tensors: dict[str, TensorInfo]  # in file order
    metadata: dict[str, str]


def _shown(text: str, limit: int = 120) -> str:
    """A name from a file as it may appear in a one-line message: printable and not too long."""
    text = text if text.isprintable() else repr(text)
    return text if len(text) <= limit else text[:limit] + "..."


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object as safetensors reads one: each name once (else it silently keeps the last), and no
    lone surrogate escape (which it refuses) in a name or text."""
    unique: dict[str, Any] = {}
    for key, value in pairs:
        if key in unique:
            raise ValueError(f"duplicate name {_shown(key)}")
        if _SURROGATE.search(key) or (isinstance(value, str) and _SURROGATE.search(value)):
            raise ValueError(f"a lone surrogate escape in {_shown(key)}")
        unique[key] = value
    return unique


def _is_int(value: object) -> bool:
    return type(value) is int  # bool is an int subclass, and True is no size


def _parse_json(raw: bytes, path: Path) -> object:
    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=_json_object)
    except UnicodeDecodeError:
        raise AnimaError(f"{path} is truncated or not a safetensors file (its header is not UTF-8 text)") from None
    except RecursionError:
        raise AnimaError(f"{path} is truncated or not a safetensors file (its header nests too deeply)") from None
    except ValueError as e:  # JSONDecodeError, a duplicate name, an over-long number
        reason = str(e).partition("\n")[0]
        raise AnimaError(f"{path} is truncated or not a safetensors file (header: {reason})") from None


def _read_raw_header(path: Path, what: str) -> tuple[bytes, int]:
    """The header's bytes and the size of the data section after it."""
    if not path.is_file():
        raise AnimaError(f"{what} file not found: {path}")
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise AnimaError(f"{path} is truncated or not a safetensors file ({size} bytes)")
            (length,) = struct.unpack("<Q", head)
            if length > MAX_HEADER_BYTES and head.startswith(_PICKLE_OR_ZIP):
                raise AnimaError(f"{path} is truncated or not a safetensors file "
                                 "(it looks like a PyTorch pickle, which is never loaded)")
            if length > MAX_HEADER_BYTES:
                raise AnimaError(f"{path} is truncated or not a safetensors file "
                                 f"(header length {length} is over the {MAX_HEADER_BYTES} byte limit)")
            if length > size - 8:
                raise AnimaError(f"{path} is truncated or not a safetensors file "
                                 f"(header length {length}, but only {size - 8} bytes follow)")
            raw = f.read(length)
    except OSError as e:
        raise AnimaError(f"cannot read {what} file {path}: {e.strerror or e}") from None
    if len(raw) < length:  # shrank while we read
        raise AnimaError(f"{path} is truncated: {length - len(raw)} bytes missing")
    return raw, size - 8 - length


def _metadata(value: object, path: Path) -> dict[str, str]:
    if value is None:  # safetensors writes nothing, and reads null as nothing
        return {}
    if not isinstance(value, dict):
        raise AnimaError(f"{path}: __metadata__ is a JSON {type(value).__name__}, expected an object of strings")
    for key, item in value.items():
        if not isinstance(item, str):
            raise AnimaError(f"{path}: __metadata__ {_shown(key)} is a JSON {type(item).__name__}, expected a string")
    return value


def _tensor(name: str, entry: object, path: Path, dtypes: Collection[str]) -> TensorInfo:
    where = f"{path}: tensor {_shown(name)}"
    if not isinstance(entry, dict):
        raise AnimaError(f"{where} is a JSON {type(entry).__name__}, expected an object")
    for key in ("dtype", "shape", "data_offsets"):
        if key not in entry:
            raise AnimaError(f"{where} has no {key}")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise AnimaError(f"{where} has unknown dtype {_BRIEF.repr(dtype)}")
    if dtype not in dtypes:
        expected = "a floating-point weight" if dtypes == WEIGHT_DTYPES else " or ".join(dtypes)
        raise AnimaError(f"{where} has dtype {dtype}; {expected} is expected")
    if not isinstance(shape, list) or len(shape) > MAX_RANK or not all(_is_int(d) and d >= 0 for d in shape):
        raise AnimaError(f"{where}: shape {_BRIEF.repr(shape)} is not a list of at most {MAX_RANK} "
                         "non-negative whole numbers")
    elements = 1
    for dim in shape:
        elements *= dim
        if max(dim, elements) >= _MAX_ELEMENTS:
            raise AnimaError(f"{where}: shape {shape} is too large")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(o) and o >= 0 for o in offsets):
        raise AnimaError(f"{where}: data_offsets {_BRIEF.repr(offsets)} are not two non-negative "
                         "whole numbers")
    begin, end = offsets
    if begin > end:
        raise AnimaError(f"{where}: data_offsets [{begin}, {end}] are reversed")
    if end - begin != elements * DTYPE_BYTES[dtype]:
        raise AnimaError(f"{where}: data_offsets [{begin}, {end}] hold {end - begin} bytes, but {dtype} "
                         f"{list(shape)} needs {elements * DTYPE_BYTES[dtype]}")
    return TensorInfo(dtype, tuple(shape), begin, end)


def _check_layout(tensors: Mapping[str, TensorInfo], data_bytes: int, path: Path) -> None:
    """The tensors tile the data section exactly, as safetensors requires: no overlap, no gap, no tail."""
    previous, covered = None, 0
    for name, info in sorted(tensors.items(), key=lambda item: (item[1].begin, item[1].end)):
        if info.begin < covered:
            raise AnimaError(f"{path}: tensor {_shown(name)}: data_offsets [{info.begin}, {info.end}] overlap "
                             f"tensor {_shown(previous)}")
        if info.begin > covered:
            raise AnimaError(f"{path}: tensor {_shown(name)}: data_offsets [{info.begin}, {info.end}] leave "
                             f"{info.begin - covered} bytes unused before it")
        previous, covered = name, info.end
    if covered > data_bytes:
        raise AnimaError(f"{path} is truncated: {covered - data_bytes} bytes missing")
    if covered < data_bytes:
        raise AnimaError(f"{path} is not a whole safetensors file: {data_bytes - covered} bytes follow "
                         "the last tensor")


def read_header(path: str | os.PathLike, what: str, dtypes: Collection[str] = WEIGHT_DTYPES) -> Header:
    """The file's tensors and metadata from its header alone, every entry checked; tensors of a dtype
    outside `dtypes` are refused by name. A GGUF file is read where weights are asked for (the default `dtypes`),
    its dtypes then GGML type names (Q8_0, BF16, ...) and its offsets into its own data section."""
    path = Path(path)
    if is_gguf(path):
        if dtypes != WEIGHT_DTYPES:
            raise AnimaError(f"{path} is a GGUF file; a {what} file is a safetensors file")
        gguf = read_gguf_header(path, what)
        shapes = orig_shapes(gguf)
        tensors = {name: TensorInfo(info.dtype, _unflattened(shapes.get(name), info.shape), info.begin, info.end)
                   for name, info in gguf.tensors.items()}
        return Header(path, tensors, gguf.metadata)
    raw, data_bytes = _read_raw_header(path, what)
    header = _parse_json(raw, path)
    if not isinstance(header, dict):
        raise AnimaError(f"{path} is truncated or not a safetensors file "
                         f"(its header is a JSON {type(header).__name__}, not an object)")
    metadata = _metadata(header.pop("__metadata__", None), path)
    tensors = {name: _tensor(name, entry, path, dtypes) for name, entry in header.items()}
    _check_layout(tensors, data_bytes, path)
    return Header(path, tensors, metadata)


def read_shapes(path: str | os.PathLike, what: str, *,
                dtypes: Collection[str] = WEIGHT_DTYPES) -> dict[str, tuple[int, ...]]:
    """Tensor names -> shapes from the header alone (no tensor data is read)."""
    return {name: info.shape for name, info in read_header(path, what, dtypes).tensors.items()}


def read_metadata(path: str | os.PathLike, what: str, *, dtypes: Collection[str] = WEIGHT_DTYPES) -> dict[str, str]:
    return read_header(path, what, dtypes).metadata


def load_tensors(path: str | os.PathLike, what: str, strip: Sequence[str] = (), skip: Sequence[str] = (), *,
                 dtypes: Collection[str] = WEIGHT_DTYPES, convert: torch.dtype | None = None,
                 ) -> dict[str, torch.Tensor]:
    """Memory-mapped tensors, with the first matching prefix in `strip` removed and names in `skip` left out.

    With `convert`, each tensor is read through its own map and converted: a map's pages stay resident while
    any tensor from it lives, so this way a converted tensor's file pages go at once.
    A GGUF file's quantized tensors are dequantized (to `convert`, else fp32).
    """
    header = read_header(path, what, dtypes)
    if is_gguf(header.path):
        return _load_gguf(header.path, what, strip, skip, convert)
    names = {}
    for key in header.tensors:
        name = next((key[len(p):] for p in strip if key.startswith(p)), key)
        if not (skip and name.startswith(tuple(skip))):
            names[key] = name
    try:
        if convert is None:
            with safe_open(header.path, framework="pt") as f:
                return {name: f.get_tensor(key) for key, name in names.items()}
        tensors = {}
        for key, name in names.items():
            with safe_open(header.path, framework="pt") as f:
                tensors[name] = f.get_tensor(key).to(convert)
        return tensors
    except (SafetensorError, OSError) as e:  # the file changed after its header was checked
        reason = str(e).partition("\n")[0]
        raise AnimaError(f"{header.path} is truncated or not a safetensors file ({reason})") from None


def _unflattened(recorded: tuple[int, ...] | None, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape ComfyUI-GGUF recorded for a tensor it flattened (GGUF has at most 4 dimensions), if it fits."""
    return recorded if recorded is not None and math.prod(recorded) == math.prod(shape) else shape


def _load_gguf(path: Path, what: str, strip: Sequence[str], skip: Sequence[str],
               convert: torch.dtype | None) -> dict[str, torch.Tensor]:
    header = read_gguf_header(path, what)
    shapes = orig_shapes(header)
    tensors = {}
    for key, tensor in map_gguf(header).items():
        name = next((key[len(p):] for p in strip if key.startswith(p)), key)
        if skip and name.startswith(tuple(skip)):
            continue
        if isinstance(tensor, QuantizedTensor):
            tensor = tensor.dequantize(convert or torch.float32)
        elif convert is not None:
            tensor = tensor.to(convert)
        tensors[name] = tensor.reshape(_unflattened(shapes.get(key), tuple(tensor.shape)))
    return tensors


def fingerprint(path: str | os.PathLike, what: str) -> str:
    """A cheap, stable identity of a safetensors file: sha256 over its size, its whole header (every tensor's
    name, dtype, shape and offsets) and 64 blocks of 4 KiB spread evenly over its data.

    A full sha256 of Anima's 5.3 GB reads for a minute on the board at every checkpoint and resume; this reads
    about 256 KiB. It changes with any other file, any re-save, any change of layout or of any sampled block;
    only an in-place edit of the same bytes count that misses every sampled block would go unseen."""
    header = read_header(path, what)
    if is_gguf(header.path):
        return gguf_fingerprint(read_gguf_header(path, what))
    size = header.path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with open(header.path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        digest.update(f.read(int(header_len)))
        start = 8 + int(header_len)
        for i in range(_FINGERPRINT_SAMPLES):
            f.seek(start + (size - start) * i // _FINGERPRINT_SAMPLES)
            digest.update(f.read(_FINGERPRINT_BLOCK))
    return digest.hexdigest()


def check_shapes(found: Mapping[str, Sequence[int]], expected: Mapping[str, Sequence[int]], what: str) -> None:
    """Every expected tensor present with its shape; the first problem is named."""
    for name, shape in expected.items():
        if name not in found:
            raise AnimaError(f"not an {what} checkpoint: missing tensor {name}")
        if tuple(found[name]) != tuple(shape):
            raise AnimaError(f"{what} tensor {name} has shape {list(found[name])}, expected {list(shape)}")


def save_tensors(tensors: Mapping[str, torch.Tensor], path: str | os.PathLike,
                 metadata: Mapping[str, str] | None = None, *, overwrite: bool = True) -> None:
    """A safetensors file, published whole (atomic_path, refused up front when the disk cannot take its size); a
    failed write (a full disk, a file size limit) is one line naming the file and the space, and leaves nothing."""
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    size = sum(t.numel() * t.element_size() for t in tensors.values()) + 64 * len(tensors) + (8 << 10)
    with atomic_path(path, overwrite=overwrite, size=size) as tmp:
        try:
            save_file(tensors, str(tmp), metadata=dict(metadata or {}))
        except SafetensorError as e:  # safetensors' writer reports the system's error as its own
            raise _os_error(str(e)) from None


def _os_error(message: str) -> OSError:
    """The OSError behind a SafetensorError's text ("I/O error: No space left on device (os error 28)")."""
    reason = message.partition("\n")[0].removeprefix("Error while serializing: ").removeprefix("I/O error: ")
    code = re.search(r" [(]os error ([0-9]+)[)]$", reason)
    return OSError(int(code[1]) if code else None, re.sub(r" [(]os error [0-9]+[)]$", "", reason))
