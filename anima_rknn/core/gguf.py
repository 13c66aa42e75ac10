"""GGUF checkpoints (stable-diffusion.cpp, ComfyUI-GGUF, llama.cpp): a bounded header reader, memory-mapped
tensors, and a streaming writer.

The header is parsed here rather than by the gguf package's GGUFReader, which maps the whole file and builds a
numpy part for every element of every metadata array (151936 token strings in a Qwen3 file) and trusts the counts
it reads. Here every count and length is checked against the bytes left in the file before anything is read or
allocated, arrays are skipped rather than decoded (only short number arrays are kept), and nothing is read past
the file. The package supplies the type table (block sizes, bytes per block) and, in the tests, the reference.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import struct
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO, NamedTuple

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ..errors import AnimaError
from .files import Unreadable, atomic_path, open_small_file
from .quant import QuantizedTensor

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # version 1 (2023) used 32-bit counts and is not written by anything current
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NAME_BYTES = 1024  # ggml allows 64, stable-diffusion.cpp builds it with 128
MAX_KEY_BYTES = 65535  # the GGUF specification's limit
MAX_KEPT_STRING = 65536  # longer metadata strings (chat templates) are skipped, not decoded
MAX_KEPT_ARRAY = 16  # number arrays up to this length are kept (ComfyUI-GGUF's orig_shape); longer ones skipped
MAX_NESTING = 3
FLOAT_TYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
QUANTIZED_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
SUPPORTED_TYPES = (*FLOAT_TYPES, *QUANTIZED_TYPES)
ORIG_SHAPE_KEY = "comfy.gguf.orig_shape."  # ComfyUI-GGUF's record of a shape it had to flatten
_FINGERPRINT_SAMPLES, _FINGERPRINT_BLOCK = 64, 4096
# GGUF value types: fixed-size scalars by struct format; 8 is a string, 9 an array.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


class GGUFTensor(NamedTuple):
    dtype: str  # the GGML type's name: F32, BF16, Q8_0, ...
    shape: tuple[int, ...]  # PyTorch order (GGUF stores the innermost dimension first)
    begin: int  # byte offsets into the data section
    end: int


@dataclasses.dataclass(frozen=True)
class GGUFHeader:
    path: Path
    tensors: dict[str, GGUFTensor]  # in file order
    metadata: dict[str, str]  # scalars and strings as text, short number arrays as "[1, 2]"
    data_start: int  # the data section's offset in the file


def is_gguf(path: str | os.PathLike) -> bool:
    """Whether `path` is a regular file that begins as GGUF (files.open_small_file's checks, any size: only the
    magic is read; a FIFO is looked at without waiting on it)."""
    try:
        with open_small_file(path, sys.maxsize) as f:
            return f.read(len(MAGIC)) == MAGIC
    except (Unreadable, OSError):
        return False


def type_name(code: int) -> str:
    try:
        return GGMLQuantizationType(code).name
    except ValueError:
        return f"unknown type {code}"


def _bytes_for(dtype: str, shape: tuple[int, ...]) -> int:
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[dtype]]
    elements = 1
    for dim in shape:
        elements *= dim
    return elements // block * size


class _Cursor:
    """Reads from an open file, never past its end: every length is checked against what is left first."""

    def __init__(self, f: BinaryIO, size: int, path: Path) -> None:
        self.f, self.size, self.path, self.pos = f, size, path, 0

    def left(self) -> int:
        return self.size - self.pos

    def fail(self, what: str) -> AnimaError:
        return AnimaError(f"{self.path} is truncated or not a GGUF file ({what})")

    def read(self, n: int, what: str) -> bytes:
        if n > self.left():
            raise self.fail(f"{what} needs {n} bytes at offset {self.pos}, the file has {self.left()} left")
        data = self.f.read(n)
        if len(data) < n:  # shrank while we read
            raise self.fail(f"{what}: the file ended early")
        self.pos += n
        return data

    def skip(self, n: int, what: str) -> None:
        if n > self.left():
            raise self.fail(f"{what} declares {n} bytes at offset {self.pos}, the file has {self.left()} left")
        self.pos += n
        self.f.seek(self.pos)

    def unpack(self, fmt: str, what: str) -> int | float | bool:
        return struct.unpack("<" + fmt, self.read(struct.calcsize(fmt), what))[0]

    def count(self, what: str, least_bytes: int) -> int:
        """A 64-bit count of items of at least `least_bytes` each, refused when the file cannot hold them."""
        n = int(self.unpack("Q", what))
        if n * least_bytes > self.left():
            raise self.fail(f"{what} is {n}, more than the {self.left()} bytes left can hold")
        return n

    def string(self, what: str, limit: int) -> str | None:
        """A GGUF string; None (skipped) when it is longer than `limit` bytes."""
        n = self.count(f"the length of {what}", 1)
        if n > limit:
            self.skip(n, what)
            return None
        try:
            return self.read(n, what).decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8 text") from None


def _value(cur: _Cursor, kind: int, key: str, depth: int = 0) -> str | None:
    """One metadata value as text, or None when it is skipped (long strings, arrays other than short numbers)."""
    if kind in _SCALARS:
        return str(cur.unpack(_SCALARS[kind], f"metadata {key}"))
    if kind == _STRING:
        return cur.string(f"metadata {key}", MAX_KEPT_STRING)
    if kind != _ARRAY or depth >= MAX_NESTING:
        raise cur.fail(f"metadata {key} has value type {kind}, which GGUF does not define here")
    item = int(cur.unpack("I", f"metadata {key}'s element type"))
    if item in _SCALARS:
        width = struct.calcsize(_SCALARS[item])
        n = cur.count(f"metadata {key}'s length", width)
        if n > MAX_KEPT_ARRAY:
            cur.skip(n * width, f"metadata {key}")
            return None
        return str([struct.unpack("<" + _SCALARS[item], cur.read(width, f"metadata {key}"))[0] for _ in range(n)])
    n = cur.count(f"metadata {key}'s length", 8 if item == _STRING else 12)
    for _ in range(n):  # strings or nested arrays: walked, each bounded by the bytes left, and dropped
        if item == _STRING:
            cur.skip(cur.count(f"a string's length in metadata {key}", 1), f"metadata {key}")
        else:
            _value(cur, item, key, depth + 1)
    return None


def _tensor_info(cur: _Cursor, shown: int) -> tuple[str, int, tuple[int, ...], int]:
    name = cur.string(f"tensor {shown}'s name", MAX_NAME_BYTES)
    if name is None:
        raise cur.fail(f"tensor {shown}'s name is over {MAX_NAME_BYTES} bytes")
    dims = int(cur.unpack("I", f"tensor {name}'s rank"))
    if not 1 <= dims <= MAX_DIMS:
        raise AnimaError(f"{cur.path}: tensor {name} has {dims} dimensions; GGUF allows 1 to {MAX_DIMS}")
    ne = [int(cur.unpack("Q", f"tensor {name}'s shape")) for _ in range(dims)]
    code = int(cur.unpack("I", f"tensor {name}'s type"))
    offset = int(cur.unpack("Q", f"tensor {name}'s offset"))
    return name, code, tuple(reversed(ne)), offset


def _checked_type(path: Path, name: str, code: int, shape: tuple[int, ...]) -> str:
    dtype = type_name(code)
    if dtype not in SUPPORTED_TYPES:
        raise AnimaError(f"{path}: tensor {name} has GGML type {dtype}, which is not supported "
                         f"(supported: {', '.join(SUPPORTED_TYPES)})")
    block = GGML_QUANT_SIZES[GGMLQuantizationType[dtype]][0]
    if shape[-1] % block:
        raise AnimaError(f"{path}: tensor {name} has rows of {shape[-1]} values, not whole {dtype} blocks of {block}")
    return dtype


def read_gguf_header(path: str | os.PathLike, what: str) -> GGUFHeader:
    """Every tensor's name, type, shape and place, and the metadata, checked against the file's size: a damaged
    or crafted file is one line naming the problem, and nothing is read or allocated beyond what the file holds."""
    path = Path(path)
    if not path.is_file():
        raise AnimaError(f"{what} file not found: {path}")
    try:
        with open(path, "rb") as f:
            cur = _Cursor(f, os.fstat(f.fileno()).st_size, path)
            if cur.read(4, "the magic") != MAGIC:
                raise cur.fail("it does not begin with GGUF")
            version = int(cur.unpack("I", "the version"))
            if version not in VERSIONS:
                raise AnimaError(f"{path}: GGUF version {version} is not supported (only {VERSIONS[0]} and "
                                 f"{VERSIONS[1]}; a byte-swapped, big-endian file reads as a huge version)")
            n_tensors = cur.count("the tensor count", 8 + 4 + 8 + 4 + 8)
            n_kv = cur.count("the metadata count", 8 + 4 + 1)
            metadata: dict[str, str] = {}
            alignment = DEFAULT_ALIGNMENT
            for i in range(n_kv):
                key = cur.string(f"metadata key {i}", MAX_KEY_BYTES)
                if key is None:
                    raise cur.fail(f"metadata key {i} is over {MAX_KEY_BYTES} bytes")
                value = _value(cur, int(cur.unpack("I", f"metadata {key}'s type")), key)
                if key == "general.alignment":
                    alignment = int(value) if value is not None and value.isdigit() else 0
                    if alignment <= 0 or alignment & (alignment - 1) or alignment > 1 << 20:
                        raise AnimaError(f"{path}: general.alignment {value} is not a power of two up to 1 MiB")
                if value is not None:
                    metadata[key] = value
            infos = [_tensor_info(cur, i) for i in range(n_tensors)]
            data_start = -(-cur.pos // alignment) * alignment
            size = cur.size
    except OSError as e:
        raise AnimaError(f"cannot read {what} file {path}: {e.strerror or e}") from None
    return GGUFHeader(path, _checked_tensors(path, infos, alignment, size - data_start), metadata, data_start)


def _checked_tensors(path: Path, infos: list[tuple[str, int, tuple[int, ...], int]], alignment: int,
                     data_bytes: int) -> dict[str, GGUFTensor]:
    if data_bytes < 0 and infos:
        raise AnimaError(f"{path} is truncated: the data section is missing")
    tensors: dict[str, GGUFTensor] = {}
    for name, code, shape, offset in infos:
        if name in tensors:
            raise AnimaError(f"{path}: tensor {name} appears twice")
        dtype = _checked_type(path, name, code, shape)
        if any(dim > data_bytes * 8 for dim in shape):  # bounds the product below before it is taken
            raise AnimaError(f"{path}: tensor {name} has shape {list(shape)}, larger than the file")
        nbytes = _bytes_for(dtype, shape)
        if offset % alignment:
            raise AnimaError(f"{path}: tensor {name} starts at {offset}, not a multiple of the alignment {alignment}")
        if offset + nbytes > data_bytes:
            raise AnimaError(f"{path} is truncated: tensor {name} ({dtype} {list(shape)}) needs bytes "
                             f"{offset}..{offset + nbytes} of a data section of {max(data_bytes, 0)}")
        tensors[name] = GGUFTensor(dtype, shape, offset, offset + nbytes)
    covered = 0
    for name, info in sorted(tensors.items(), key=lambda item: item[1].begin):
        if info.begin < covered:
            raise AnimaError(f"{path}: tensor {name}'s data overlaps the tensor before it")
        covered = info.end
    return tensors


def map_gguf(header: GGUFHeader) -> dict[str, torch.Tensor | QuantizedTensor]:
    """Every tensor through one private memory map of the file: float types as tensors of their dtype (used in
    place), quantized ones as QuantizedTensor (their blocks in place). Pages are read as they are used."""
    size = header.path.stat().st_size
    if header.tensors and max(t.end for t in header.tensors.values()) > size - header.data_start:
        raise AnimaError(f"{header.path} is truncated: it changed after its header was read")
    try:
        data = torch.from_file(str(header.path), shared=False, size=size, dtype=torch.uint8)
    except RuntimeError as e:
        raise AnimaError(f"cannot map {header.path}: {str(e).partition(chr(10))[0]}") from None
    tensors: dict[str, torch.Tensor | QuantizedTensor] = {}
    for name, info in header.tensors.items():
        raw = data[header.data_start + info.begin: header.data_start + info.end]
        if info.dtype in FLOAT_TYPES:
            dtype = FLOAT_TYPES[info.dtype]
            if raw.storage_offset() % dtype.itemsize:  # an alignment of 1 may leave it unaligned
                raw = raw.clone()
            tensors[name] = raw.view(dtype).view(info.shape)
        else:
            tensors[name] = QuantizedTensor(raw.view(-1, _bytes_for(info.dtype, info.shape[-1:])), info.dtype,
                                            info.shape)
    return tensors


def orig_shapes(header: GGUFHeader) -> dict[str, tuple[int, ...]]:
    """The shapes ComfyUI-GGUF recorded for tensors it stored flattened (5-D convolutions)."""
    shapes = {}
    for key, value in header.metadata.items():
        if key.startswith(ORIG_SHAPE_KEY) and value.startswith("["):
            dims = value.strip("[]").split(",")
            if all(d.strip().isdigit() for d in dims):
                shapes[key.removeprefix(ORIG_SHAPE_KEY)] = tuple(int(d) for d in dims)
    return shapes


def gguf_fingerprint(header: GGUFHeader) -> str:
    """As core.tensorfile.fingerprint: sha256 over the size, the whole header and 64 spread 4 KiB blocks."""
    size = header.path.stat().st_size
    digest = hashlib.sha256(f"gguf {size}".encode())
    with open(header.path, "rb") as f:
        digest.update(f.read(header.data_start))
        for i in range(_FINGERPRINT_SAMPLES):
            f.seek(header.data_start + (size - header.data_start) * i // _FINGERPRINT_SAMPLES)
            digest.update(f.read(_FINGERPRINT_BLOCK))
    return digest.hexdigest()


# ------------------------------------------------------------------------------------------------------ writing

def _string(text: str) -> bytes:
    data = text.encode("utf-8")
    return struct.pack("<Q", len(data)) + data


def write_gguf(path: str | os.PathLike, table: Sequence[tuple[str, str, tuple[int, ...]]],
               encode: Callable[[str], np.ndarray], metadata: Mapping[str, str], *, overwrite: bool = True) -> None:
    """A GGUF version 3 file as ggml writes it (alignment 32, string metadata), published whole. `table` gives
    each tensor's name, GGML type name and PyTorch shape; `encode(name)` its bytes, asked for one tensor at a
    time as it is written, so a model is never held whole in memory."""
    head = bytearray(MAGIC + struct.pack("<IQQ", 3, len(table), len(metadata)))
    for key, value in metadata.items():
        head += _string(key) + struct.pack("<I", _STRING) + _string(value)
    offset = 0
    for name, dtype, shape in table:
        head += _string(name) + struct.pack("<I", len(shape)) + struct.pack(f"<{len(shape)}Q", *reversed(shape))
        head += struct.pack("<IQ", GGMLQuantizationType[dtype].value, offset)
        offset += -(-_bytes_for(dtype, shape) // DEFAULT_ALIGNMENT) * DEFAULT_ALIGNMENT
    head += bytes(-len(head) % DEFAULT_ALIGNMENT)
    try:
        with atomic_path(path, overwrite=overwrite) as tmp, open(tmp, "wb") as f:
            f.write(head)
            for name, dtype, shape in table:
                data = np.ascontiguousarray(encode(name))
                if data.nbytes != _bytes_for(dtype, shape):
                    raise ValueError(f"{name}: {data.nbytes} bytes for {dtype} {list(shape)}")
                f.write(memoryview(data).cast("B"))
                f.write(bytes(-data.nbytes % DEFAULT_ALIGNMENT))
    except OSError as e:
        raise AnimaError(f"cannot write {path}: {e.strerror or e}") from None
