"""The `manifest.json` of a subgraph set, shared by the ONNX export and the RKNN conversion.

A set is made for one resolution and one DiT file (or, a VAE set, for one tile size and one VAE file: its decoder,
and its encoder beside it where `export-vae --encoder` wrote one);
these checks refuse to use it for anything else. The
manifest is checked whole, like user input, before any file it names is opened: every field the code uses has
its type and a bounded range, and every file it names is a plain name inside the set's own folder (no paths,
no links leading out), so a crafted set can neither make the program read elsewhere nor allocate much.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from ..checks import is_int_in, is_number_in, shown
from ..core.files import Unreadable, cached_sha256, is_temporary, output_folder, read_small_json
from ..errors import AnimaError
from ..model.lora import MAX_LORAS
from ..model.lora import MAX_SCALE as MAX_LORA_SCALE

SUBGRAPHS_FORMAT = "anima-rknn-subgraphs/1"
VAE_FORMAT = "anima-rknn-vae/1"  # the VAE decoder for one latent tile (index 0), the encoder for one image tile (1)
SET_KINDS = {SUBGRAPHS_FORMAT: "dit", VAE_FORMAT: "vae"}
VAE_DECODER_KIND = "vae_decoder"
VAE_ENCODER_KIND = "vae_encoder"
VAE_KINDS = (VAE_DECODER_KIND, VAE_ENCODER_KIND)  # a VAE set's subgraphs in this order: the decoder alone, or both
MAX_Z_DIM = 1024
MAX_STREAM = 1e30  # a decoder's activations: far past fp32's useful range for images
MANIFEST = "manifest.json"
# A DiT set's 3 * blocks subgraphs in execution order: index i is block i // 3, part SUBGRAPH_KINDS[i % 3].
SUBGRAPH_KINDS = ("self_attn", "cross_attn", "mlp")
SUBGRAPH_DTYPES = ("float32", "float16")
MAX_SIDE = 8192  # pixels
MAX_CONTEXT_TOKENS = 65536
MODEL_LIMITS = {"blocks": 1024, "hidden": 65536, "heads": 1024, "head_dim": 4096, "context_dim": 65536}
MAX_BYTES = 1 << 50  # file and compiler memory sizes; far beyond any NPU, small enough for float arithmetic
MAX_SECONDS = 1e7
MAX_JSON_BYTES = 1 << 23  # a quantized set writes about 1.1 KB per subgraph: 3.4 MB at 1,024 blocks
_SHA256 = re.compile(r"[0-9a-f]{64}")
_TOKEN = re.compile(r"[0-9A-Za-z._+-]{1,40}")  # target platform, toolkit version
# Block numbers have at least two digits (b07; sets before 100 blocks) and as many as MODEL_LIMITS' 1024 need.
_SUBGRAPH_FILE = re.compile(
    r"(b\d{2,4}_(self_attn|cross_attn|mlp)|vae_(decoder|encoder))\.(onnx|rknn|model|data|quantization\.cfg)")
# A converted subgraph's precision: fp16 whole, int8 whole, or int8 with its attention core in fp16.
PRECISIONS = ("float16", "w8a8", "hybrid")
# The toolkit's hybrid-quantization step-1 files a quantized subgraph keeps beside its .rknn, in step 2's order.
QUANT_SUFFIXES = (".model", ".data", ".quantization.cfg")


def subgraph_name(index: int) -> str:
    """Subgraph `index`'s file name in a set, without the suffix: b07_cross_attn."""
    return f"b{index // 3:02d}_{SUBGRAPH_KINDS[index % 3]}"


@dataclass(frozen=True)
class Field:
    """A place in a JSON state file, for one-line errors: 'rknn-512/manifest.json: subgraphs[3].file: ...'."""

    file: str
    path: str = ""

    def __getitem__(self, key: str | int) -> Field:
        if isinstance(key, int):
            step = f"[{key}]"
        elif key.isidentifier():
            step = f".{key}" if self.path else key
        else:
            step = f"[{_show(key)}]"
        return Field(self.file, self.path + step)

    def fail(self, problem: str) -> NoReturn:
        raise AnimaError(f"{self.file}: {self.path}: {problem}" if self.path else f"{self.file}: {problem}")


def _show(value: Any) -> str:
    """A short one-line picture of a JSON value for an error message."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        if len(value) > 8 or any(isinstance(item, (list, dict)) for item in value):
            return "a list"
        return "[" + ", ".join(map(_show, value)) + "]"
    return json.dumps(value) if value is None or isinstance(value, bool) else shown(value)


def _field(obj: dict[str, Any], at: Field, key: str, check: Callable[..., Any], *args: Any) -> Any:
    if key not in obj:
        at[key].fail("missing")
    return check(obj[key], at[key], *args)


def _object(value: Any, at: Field) -> dict[str, Any]:
    if not isinstance(value, dict):
        at.fail(f"expected an object, got {_show(value)}")
    return value


def _list(value: Any, at: Field, length: int) -> list[Any]:
    if not isinstance(value, list):
        at.fail(f"expected a list, got {_show(value)}")
    if len(value) != length:
        at.fail(f"expected {length} entries, got {len(value)}")
    return value


def _int(value: Any, at: Field, low: int, high: int) -> int:
    if not is_int_in(value, low, high):
        at.fail(f"expected a whole number from {low} to {high}, got {_show(value)}")
    return value


def _number(value: Any, at: Field, low: float, high: float) -> float:
    if not is_number_in(value, low, high):  # also refuses NaN, infinities and integers too large for a float
        at.fail(f"expected a number from {low} to {high}, got {_show(value)}")
    return value


def _same(value: Any, expected: Any) -> bool:
    """Equal and of the same JSON type (True is not 1 here)."""
    if isinstance(expected, list):
        return isinstance(value, list) and len(value) == len(expected) and all(map(_same, value, expected))
    return type(value) is type(expected) and value == expected


def _equal(value: Any, at: Field, expected: Any) -> Any:
    if not _same(value, expected):
        at.fail(f"expected {_show(expected)}, got {_show(value)}")
    return value


def _choice(value: Any, at: Field, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        at.fail(f"expected one of {', '.join(choices)}, got {_show(value)}")
    return value


def _sha256(value: Any, at: Field) -> str:
    if not isinstance(value, str) or not _SHA256.fullmatch(value):
        at.fail(f"expected a sha256 (64 lowercase hex digits), got {_show(value)}")
    return value


def _token(value: Any, at: Field) -> str:
    if not isinstance(value, str) or not _TOKEN.fullmatch(value):
        at.fail(f"expected a short name of letters, digits and ._+-, got {_show(value)}")
    return value


def _side(value: Any, at: Field) -> int:
    if _int(value, at, 16, MAX_SIDE) % 16:
        at.fail(f"expected a multiple of 16, got {value}")
    return value


def _name_problem(name: str, suffix: str | None) -> str | None:
    if not name:
        return "is empty"
    if "\0" in name:
        return "contains a NUL character"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "contains a control character"
    if name.startswith(("/", "\\")):
        return "is an absolute path"
    if "/" in name or "\\" in name:
        return "contains a path separator"
    if name == "..":
        return "is '..'"
    if name.startswith("."):
        return "starts with '.'"
    try:
        if len(os.fsencode(name)) > 200:
            return "is too long"
    except UnicodeError:
        return "is not valid text for a file name"
    if suffix is not None and not name.endswith(suffix):
        return f"does not end in {suffix}"
    return None


def plain_name(value: Any, at: Field, suffix: str | None = None) -> str:
    """A file name as a set may name its files: one name in its own folder, nothing that could lead elsewhere."""
    if not isinstance(value, str):
        at.fail(f"expected a file name, got {_show(value)}")
    problem = _name_problem(value, suffix)
    if problem is not None:
        at.fail(f"{_show(value)} is not a plain file name: it {problem}")
    return value


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def set_file(folder: Path, name: str, at: Field) -> Path:
    """`folder/name` (a plain name), refused when it is a link leading out of `folder`.

    The link is followed with lstat and readlink only: the outside target is never opened, and the message is
    the same whether it exists or not. (os.path's checks answer False where the file system refuses a look.)
    """
    path = folder / name
    if os.path.islink(path) and not _within(os.path.realpath(path), os.path.realpath(folder)):
        at.fail(f"{_show(name)} is a link leading out of {folder}")
    return path


def read_json(path: Path, at: Field) -> Any:
    """A small JSON state file; anything else (not a regular file, too large, not UTF-8, not JSON, nested too
    deep) is one line naming it."""
    try:
        return read_small_json(path, MAX_JSON_BYTES)
    except Unreadable as e:
        at.fail(str(e))


def input_shapes(kind: str, *, tokens: int, hidden: int, head_dim: int, context_tokens: int,
                 context_dim: int) -> dict[str, list[int]]:
    """The named inputs of one body; RoPE tables are 4-D so they broadcast over heads without a Transpose."""
    x = [1, tokens, hidden]
    if kind == "self_attn":
        rope = [1, 1, tokens, head_dim]
        return {"x": x, "rope_cos": rope, "rope_sin": rope}
    if kind == "cross_attn":
        return {"x": x, "context": [1, context_tokens, context_dim]}
    return {"x": x}


def rknn_name(onnx_name: str) -> str:
    return Path(onnx_name).with_suffix(".rknn").name


def _tensors(value: Any, at: Field, shapes: Mapping[str, list[int]], dtype: str) -> list[Any]:
    specs = _list(value, at, len(shapes))
    for i, (spec, (name, shape)) in enumerate(zip(specs, shapes.items())):
        spec = _object(spec, at[i])
        _field(spec, at[i], "name", _equal, name)
        _field(spec, at[i], "shape", _equal, shape)
        _field(spec, at[i], "dtype", _equal, dtype)
    return specs


def _check_subgraph(value: Any, at: Field, index: int, dims: Mapping[str, int], dtype: str) -> None:
    entry = _object(value, at)
    kind = SUBGRAPH_KINDS[index % 3]
    _field(entry, at, "index", _equal, index)
    _field(entry, at, "block", _equal, index // 3)
    _field(entry, at, "kind", _equal, kind)
    _field(entry, at, "file", plain_name, ".onnx")
    _field(entry, at, "sha256", _sha256)
    _field(entry, at, "inputs", _tensors, input_shapes(kind, **dims), dtype)
    _field(entry, at, "outputs", _tensors, {"y": [1, dims["tokens"], dims["hidden"]]}, dtype)


def check_record(value: Any, at: Field, name: str, index: int | None = None) -> dict[str, Any]:
    """One converted file's record, in the manifest (with its `index`) or the conversion's progress file."""
    record = _object(value, at)
    if index is not None:
        _field(record, at, "index", _equal, index)
    _field(record, at, "rknn_file", plain_name, ".rknn")
    _field(record, at, "rknn_file", _equal, name)
    _field(record, at, "rknn_sha256", _sha256)
    _field(record, at, "rknn_bytes", _int, 0, MAX_BYTES)
    _field(record, at, "convert_s", _number, 0, MAX_SECONDS)
    for key in ("internal_bytes", "weight_bytes"):  # the compiler's figures, when its log had them
        if key in record:
            _field(record, at, key, _int, 0, MAX_BYTES)
    _check_precision(record, at, name)
    return record


def _check_precision(record: dict[str, Any], at: Field, name: str) -> None:
    """A quantized conversion's fields: the precision chosen, the held-out cosines measured, and for an int8
    subgraph the step-1 files (named after its .rknn) the simulator rebuilds it from."""
    precision = _field(record, at, "precision", _choice, PRECISIONS) if "precision" in record else "float16"
    if "held_out_cosine" in record:
        cosines = _field(record, at, "held_out_cosine", _object)
        for key, value in cosines.items():
            _choice(key, at["held_out_cosine"], PRECISIONS)
            _number(value, at["held_out_cosine"][key], -1.0, 1.0)
        if precision not in cosines and "precision" in record:
            at["held_out_cosine"].fail(f"has no figure for the precision chosen, {precision}")
    if precision == "float16":
        if "quant_files" in record:
            at["quant_files"].fail("an fp16 subgraph has no quantization files")
        return
    files = _field(record, at, "quant_files", _list, len(QUANT_SUFFIXES))
    stem = name.removesuffix(".rknn")
    for i, (value, suffix) in enumerate(zip(files, QUANT_SUFFIXES)):
        item = _object(value, at["quant_files"][i])
        _field(item, at["quant_files"][i], "file", _equal, stem + suffix)
        _field(item, at["quant_files"][i], "sha256", _sha256)


def _check_quantization(value: Any, at: Field) -> None:
    quantization = _object(value, at)
    _field(quantization, at, "dtype", _choice, ("w8a8",))
    _field(quantization, at, "algorithm", _choice, ("normal", "mmse", "kl_divergence"))
    _field(quantization, at, "min_cosine", _number, 0.0, 1.0)
    _field(quantization, at, "calibration_sha256", _sha256)


def _check_conversion(value: Any, at: Field, entries: list[dict[str, Any]]) -> None:
    conversion = _object(value, at)
    _field(conversion, at, "source_sha256", _sha256)
    _field(conversion, at, "target", _token)
    _field(conversion, at, "toolkit_version", _token)
    if "quantization" in conversion:
        _check_quantization(conversion["quantization"], at["quantization"])
    records = _field(conversion, at, "subgraphs", _list, len(entries))
    for index, (record, entry) in enumerate(zip(records, entries)):
        check_record(record, at["subgraphs"][index], rknn_name(entry["file"]), index)


def check_manifest(value: Any, at: Field) -> dict[str, Any]:
    """`value` if it is a whole, consistent subgraph-set manifest; otherwise one line naming the first problem."""
    manifest = _object(value, at)
    if _same(manifest.get("format"), VAE_FORMAT):
        return _check_vae_manifest(manifest, at)
    if not _same(manifest.get("format"), SUBGRAPHS_FORMAT):
        at.fail(f"not an {SUBGRAPHS_FORMAT} manifest")
    model = _field(manifest, at, "model", _object)
    _field(model, at["model"], "file", plain_name)
    _field(model, at["model"], "sha256", _sha256)
    sizes = {key: _field(model, at["model"], key, _int, 1, limit) for key, limit in MODEL_LIMITS.items()}
    width, height = (_field(manifest, at, key, _side) for key in ("width", "height"))
    dims = {
        "tokens": _field(manifest, at, "tokens", _equal, (width // 16) * (height // 16)),
        "context_tokens": _field(manifest, at, "context_tokens", _int, 1, MAX_CONTEXT_TOKENS),
        "hidden": sizes["hidden"], "head_dim": sizes["head_dim"], "context_dim": sizes["context_dim"],
    }
    dtype = _field(manifest, at, "dtype", _choice, SUBGRAPH_DTYPES)
    entries = _field(manifest, at, "subgraphs", _list, 3 * sizes["blocks"])
    for index, entry in enumerate(entries):
        _check_subgraph(entry, at["subgraphs"][index], index, dims, dtype)
    if len({entry["file"] for entry in entries}) != len(entries):
        at["subgraphs"].fail("two entries name the same file")
    if "rknn" in manifest:
        _check_conversion(manifest["rknn"], at["rknn"], entries)
    for index, lora in enumerate(_field(manifest, at, "loras", _list_up_to, MAX_LORAS) if "loras" in manifest else []):
        _check_lora(lora, at["loras"][index])
    return manifest


def _list_up_to(value: Any, at: Field, most: int) -> list[Any]:
    if not isinstance(value, list) or len(value) > most:
        at.fail(f"expected a list of at most {most} entries, got {_show(value)}")
    return value


def _check_lora(value: Any, at: Field) -> None:
    """A LoRA baked into the subgraphs: its file name, sha256 and scale."""
    lora = _object(value, at)
    _field(lora, at, "file", plain_name, ".safetensors")
    _field(lora, at, "sha256", _sha256)
    _field(lora, at, "scale", _number, -MAX_LORA_SCALE, MAX_LORA_SCALE)


def _loras_text(loras: list[dict[str, Any]]) -> str:
    return ", ".join(f"{lora['file']}:{lora['scale']:g}" for lora in loras) or "none"


def vae_tile_shapes(z_dim: int, scale_factor: int, tile: int) -> tuple[list[int], list[int]]:
    """The decoder tile's input (normalised latent) and output (RGB in [0, 1]) shapes; the encoder's are the other
    way round."""
    return [1, z_dim, tile // scale_factor, tile // scale_factor], [1, 3, tile, tile]


def vae_entry(manifest: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """The subgraph entry of a checked VAE set's decoder or encoder (`kind`), None where the set has none."""
    index = VAE_KINDS.index(kind)
    return manifest["subgraphs"][index] if index < len(manifest["subgraphs"]) else None


def vae_record(manifest: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """The conversion record of a converted VAE set's decoder or encoder, None where it has none."""
    index = VAE_KINDS.index(kind)
    records = manifest.get("rknn", {}).get("subgraphs", [])
    return records[index] if index < len(records) else None


def _list_from(value: Any, at: Field, least: int, most: int, what: str) -> list[Any]:
    if not isinstance(value, list):
        at.fail(f"expected a list, got {_show(value)}")
    if not least <= len(value) <= most:
        at.fail(f"expected {what}, got {len(value)}")
    return value


def _check_stream(manifest: dict[str, Any], at: Field, peak_key: str, scale_key: str) -> None:
    """The fp16 calibration of a residual stream (vae.rescale): its fp32 peak and the power of two it is divided by;
    peak null for a set only ONNX Runtime runs (export/vae.py), whose scale is then 1."""
    if manifest.get(peak_key, 0) is None:
        stream_scale = _field(manifest, at, scale_key, _number, 1, 1)
    else:
        _field(manifest, at, peak_key, _number, 0, MAX_STREAM)
        stream_scale = _field(manifest, at, scale_key, _number, 1, MAX_STREAM)
    if math.log2(stream_scale) % 1:
        at[scale_key].fail(f"expected a power of two, got {_show(stream_scale)}")


def _check_vae_manifest(manifest: dict[str, Any], at: Field) -> dict[str, Any]:
    """A VAE set made from one VAE file: the decoder's ONNX graph for one latent tile, and optionally the encoder's
    for the image tile of the same size (nothing else)."""
    model = _field(manifest, at, "model", _object)
    _field(model, at["model"], "file", plain_name)
    _field(model, at["model"], "sha256", _sha256)
    z_dim = _field(model, at["model"], "z_dim", _int, 1, MAX_Z_DIM)
    scale = _field(model, at["model"], "scale_factor", _choice_int, (1, 2, 4, 8))
    tile = _field(manifest, at, "tile", _int, scale, MAX_SIDE)
    if tile % scale:
        at["tile"].fail(f"expected a multiple of the VAE's scale {scale}, got {tile}")
    overlap = _field(manifest, at, "overlap", _int, 0, tile // 2)
    if overlap % scale:
        at["overlap"].fail(f"expected a multiple of the VAE's scale {scale}, got {overlap}")
    _field(manifest, at, "dtype", _equal, "float32")
    _check_stream(manifest, at, "stream_peak", "stream_scale")  # the decoder's
    entries = _field(manifest, at, "subgraphs", _list_from, 1, 2, "1 or 2 entries (the decoder, then the encoder)")
    z_shape, image_shape = vae_tile_shapes(z_dim, scale, tile)
    parts = {VAE_DECODER_KIND: ({"z": z_shape}, {"y": image_shape}),
             VAE_ENCODER_KIND: ({"image": image_shape}, {"y": z_shape})}
    for index, (entry, kind) in enumerate(zip(entries, VAE_KINDS)):
        at_entry = at["subgraphs"][index]
        entry = _object(entry, at_entry)
        _field(entry, at_entry, "index", _equal, index)
        _field(entry, at_entry, "kind", _equal, kind)
        _field(entry, at_entry, "file", plain_name, ".onnx")
        _field(entry, at_entry, "sha256", _sha256)
        _field(entry, at_entry, "inputs", _tensors, parts[kind][0], "float32")
        _field(entry, at_entry, "outputs", _tensors, parts[kind][1], "float32")
    if len(entries) == 2:
        if entries[0]["file"] == entries[1]["file"]:
            at["subgraphs"].fail("two entries name the same file")
        _check_stream(manifest, at, "encoder_stream_peak", "encoder_stream_scale")
    if "rknn" in manifest:
        _check_conversion(manifest["rknn"], at["rknn"], entries)
    return manifest


def _choice_int(value: Any, at: Field, choices: tuple[int, ...]) -> int:
    if isinstance(value, bool) or value not in choices:
        at.fail(f"expected one of {', '.join(map(str, choices))}, got {_show(value)}")
    return value


def set_kind(manifest: dict[str, Any]) -> str:
    """"dit" for the DiT's subgraphs, "vae" for a VAE set (the decoder, and the encoder where it has one)."""
    return SET_KINDS[manifest["format"]]


def read_manifest(subgraph_dir: str | os.PathLike, kind: str | None = "dit") -> dict[str, Any]:
    """The set's manifest, checked whole (see check_manifest), its files all inside `subgraph_dir`; refused
    when it is not a set of `kind` ("dit", "vae"; None takes either)."""
    folder = Path(subgraph_dir)
    at = Field(str(folder / MANIFEST))
    path = set_file(folder, MANIFEST, at)
    if not os.path.lexists(path):
        command = "export-vae" if kind == "vae" else "export-onnx"
        raise AnimaError(f"{folder} holds no {MANIFEST}: export a subgraph set with "
                         f"`anima-rknn {command}` first")
    manifest = check_manifest(read_json(path, at), at)
    if kind is not None and set_kind(manifest) != kind:
        raise AnimaError(f"{folder} holds " + ("a VAE decoder set, not DiT subgraphs" if kind == "dit"
                                              else "DiT subgraphs, not a VAE decoder set"))
    for index, entry in enumerate(manifest["subgraphs"]):
        set_file(folder, entry["file"], at["subgraphs"][index]["file"])
    for index, record in enumerate(manifest.get("rknn", {}).get("subgraphs", [])):
        set_file(folder, record["rknn_file"], at["rknn"]["subgraphs"][index]["rknn_file"])
        for i, item in enumerate(record.get("quant_files", [])):
            set_file(folder, item["file"], at["rknn"]["subgraphs"][index]["quant_files"][i]["file"])
    return manifest


def read_progress(path: Path, identity: Mapping[str, str],
                  rknn_names: Iterable[str]) -> dict[str, dict[str, Any]] | None:
    """The files an interrupted conversion finished, from its progress file, checked like a manifest: none
    when there is no such file, None when it is the progress of another source, target or toolkit."""
    at = Field(str(path))
    set_file(path.parent, path.name, at)
    if not os.path.lexists(path):
        return {}
    progress = _object(read_json(path, at), at)
    if any(not _same(progress.get(key), identity.get(key)) for key in {*identity, "quantization"}):
        return None
    done = _field(progress, at, "done", _object)
    names = set(rknn_names)
    for name, record in done.items():
        if name not in names:
            at["done"][name].fail("not a file of this set")
        check_record(record, at["done"][name], name)
    return done


def open_set_folder(folder: Path, *, overwrite: bool, names: Iterable[str], resumable: str | None = None) -> Path:
    """The output folder of a set, refused when it holds anything (a set or other files) unless `overwrite`,
    or `resumable`, the marker of this command's own interrupted work."""
    holds = "a subgraph set" if os.path.lexists(folder / MANIFEST) else "other files"
    return output_folder(folder, overwrite=overwrite, holds=holds, resumable=resumable, names=[*names, MANIFEST])


def clear_set_folder(folder: Path, keep: Iterable[str]) -> None:
    """Before writing a set: its manifest first (a half-replaced folder must never look like a complete set),
    then subgraph files of an earlier, different set, and temporaries a killed run left."""
    ours = {*keep, MANIFEST}
    (folder / MANIFEST).unlink(missing_ok=True)
    for path in folder.iterdir():
        stale = _SUBGRAPH_FILE.fullmatch(path.name) and path.name not in ours
        temporary = is_temporary(path) and any(path.name.startswith(f".{name}.") for name in ours)
        if (stale or temporary) and not path.is_dir():
            path.unlink()


def check_set(manifest: dict[str, Any], subgraph_dir: str | os.PathLike, *, dit_path: str | os.PathLike | None,
              width: int, height: int, loras: list[dict[str, Any]] | None = None) -> None:
    """Resolution, (given `loras`) the LoRAs baked in, and (given `dit_path`) the DiT file the set was exported
    from. `loras` are LoRA identities ({file, sha256, scale}); the order they were merged in does not matter."""
    if (manifest["width"], manifest["height"]) != (width, height):
        raise AnimaError(f"subgraphs in {subgraph_dir} were exported for {manifest['width']}x{manifest['height']}, "
                         f"asked for {width}x{height}")
    if loras is not None:
        baked = manifest.get("loras", [])
        if sorted((b["sha256"], float(b["scale"])) for b in baked) != sorted((r["sha256"], r["scale"]) for r in loras):
            raise AnimaError(f"subgraphs in {subgraph_dir} were baked with LoRAs {_loras_text(baked)}, this run asks "
                             f"for {_loras_text(loras)}: export a set with the same --lora options")
    if dit_path is not None:
        check_source(manifest, dit_path, "DiT", f"subgraphs in {subgraph_dir} were")


def check_source(manifest: dict[str, Any], source: str | os.PathLike, what: str, subject: str) -> None:
    """The model file a set was made from (by its sha256, hashed once per file version): `subject` ("subgraphs
    in DIR were") exported from `source`, a `what` ("DiT", "VAE") file."""
    if not Path(source).is_file():
        raise AnimaError(f"{what} file not found: {source}")
    digest = cached_sha256(source)
    if digest != manifest["model"]["sha256"]:
        raise AnimaError(f"{subject} exported from a different {what} file "
                         f"({manifest['model']['file']}, sha256 {manifest['model']['sha256'][:12]}...; "
                         f"{Path(source).name} has sha256 {digest[:12]}...)")


def check_file(path: Path, expected_sha256: str) -> None:
    if not os.path.exists(path):
        raise AnimaError(f"subgraph file {path} is missing")
    if not os.path.isfile(path):
        raise AnimaError(f"subgraph file {path} is not a regular file")
    try:
        digest = cached_sha256(path)
    except OSError as e:
        raise AnimaError(f"cannot read subgraph file {path}: {e.strerror or e}") from None
    if digest != expected_sha256:
        raise AnimaError(f"subgraph file {path} is corrupt (sha256 differs from the manifest): "
                         "export or convert it again")
