"""`anima-rknn quantize`: a checkpoint (safetensors or GGUF) written as a GGUF file of one GGML type, as
stable-diffusion.cpp's convert mode writes it: the same tensor names, the same choice of what stays unquantized,
no metadata but the source's own strings (this project's sizes), so stable-diffusion.cpp, ComfyUI-GGUF and this
project's reader all load it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ..core.gguf import is_gguf, map_gguf, read_gguf_header, write_gguf
from ..core.quant import ENCODABLE, QuantizedTensor, encode
from ..core.tensorfile import load_tensors, read_header
from ..errors import AnimaError

QUANTIZE_TYPES = tuple(t.lower() for t in ENCODABLE)
# stable-diffusion.cpp (ModelLoader::tensor_should_be_converted) leaves these in their file dtype: biases,
# scales, and the embedders and final layers of the DiT families, whose errors reach every token.
_KEPT = re.compile(r"(\.bias$|\.scale$|x_embedder\.|t_embedder\.|y_embedder\.|pos_embed|context_embedder\.|"
                   r"final_layer\.|img_in\.|txt_in\.|time_in\.|vector_in\.|guidance_in\.|time_embed\.|label_emb\.|"
                   r"embedding)")
_FLOAT_NAMES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}
# GGML's quantized type names (q8_0, q4_k, q3_k_m, iq4_xs, ...): a GGUF file's, which a user of stable-diffusion.cpp
# (its --type) may take for a compute precision.
_GGML_WEIGHT_TYPE = re.compile(r"i?q[1-8](_[0-9a-z]+)*", re.IGNORECASE)


def weight_type_given_as_dtype(name: str, value: object, choices: tuple[str, ...] | list[str],
                               then: str = "and stay quantized whatever the dtype is") -> str | None:
    """The one line that explains a GGML weight type given as the compute precision `name` (`then`: what becomes
    of a GGUF's quantized weights under that setting); None when `value` is no such type."""
    if not (isinstance(value, str) and _GGML_WEIGHT_TYPE.fullmatch(value)):
        return None
    qtype = value.lower() if value.lower() in QUANTIZE_TYPES else "q8_0"
    return (f"{name} {value} is a GGUF weight type, not a compute precision (one of {', '.join(choices)}): "
            f"quantized weights come from a .gguf DiT (`anima-rknn quantize DIT -o DIT.gguf --type {qtype}` writes "
            f"one) {then}")


def _stored_type(tensor: torch.Tensor | QuantizedTensor) -> str:
    if isinstance(tensor, QuantizedTensor):
        return "F32"  # a quantized source tensor kept as it is gets dequantized
    return _FLOAT_NAMES.get(tensor.dtype, "F32")


def tensor_type(name: str, shape: tuple[int, ...], target: str, stored: str) -> str:
    """What `name` is written as: `target`, unless stable-diffusion.cpp would keep it (then its stored float
    type), or it is 1-D (norm weights: F32, as llama.cpp keeps them), or its rows are not whole blocks."""
    if target in _FLOAT_NAMES.values():
        return target
    if len(shape) < 2:
        return "F32"
    block = GGML_QUANT_SIZES[GGMLQuantizationType[target]][0]
    if _KEPT.search(name) or shape[-1] % block:
        return stored
    return target


def quantize_checkpoint(source: str | os.PathLike, out: str | os.PathLike, qtype: str, *,
                        overwrite: bool = False) -> dict[str, int]:
    """Write `source` as a GGUF of GGML type `qtype` (one of QUANTIZE_TYPES); returns how many tensors went to
    each type. Tensors are read, encoded and written one at a time."""
    target = qtype.upper()
    if target not in ENCODABLE:
        raise AnimaError(f"unknown GGUF type {qtype!r}; choose from {', '.join(QUANTIZE_TYPES)}")
    source, out = Path(source), Path(out)
    if out.suffix.lower() != ".gguf":
        raise AnimaError(f"the output {out} must end in .gguf")
    header = read_header(source, "checkpoint")
    tensors = (map_gguf(read_gguf_header(source, "checkpoint")) if is_gguf(source)
               else load_tensors(source, "checkpoint"))
    table = [(name, tensor_type(name, tuple(t.shape), target, _stored_type(t)), tuple(t.shape))
             for name, t in tensors.items()]
    if target not in {dtype for _, dtype, _ in table}:
        block = GGML_QUANT_SIZES[GGMLQuantizationType[target]][0]
        raise AnimaError(f"no tensor of {source.name} can be {target}: its rows are not multiples of {block} "
                         "values; choose q8_0 or another 32-value type")

    def encoded(name: str) -> np.ndarray:
        tensor = tensors[name]
        dense = tensor.dequantize() if isinstance(tensor, QuantizedTensor) else tensor
        dtype = next(d for n, d, _ in table if n == name)
        return encode(dense, dtype)

    metadata = {k: v for k, v in header.metadata.items() if k.startswith("anima_rknn.")}
    write_gguf(out, table, encoded, metadata, overwrite=overwrite)
    counts: dict[str, int] = {}
    for _, dtype, _ in table:
        counts[dtype] = counts.get(dtype, 0) + 1
    return counts
