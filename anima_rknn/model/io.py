"""Load and save the DiT + LLM adapter file (`net.` or `model.diffusion_model.` prefix, bf16 on disk), or a GGUF of
it (stable-diffusion.cpp's or ComfyUI-GGUF's, any prefix), whose quantized linear layers stay quantized."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence

import torch

from ..core.gguf import is_gguf, map_gguf, read_gguf_header
from ..core.quant import QuantizedTensor
from ..core.tensorfile import Header, check_shapes, load_tensors, read_header, save_tensors
from ..errors import AnimaError
from .adapter import LLMAdapter
from .config import CONTEXT_TOKENS, DiTConfig, infer_dit_config
from .dit import AnimaDiT, HostLinear
from .lora import Lora, attach_loras, merge_loras
from .quantized import install_quantized, quantized_layers

PREFIXES = ("model.diffusion_model.", "net.")
ADAPTER_PREFIX = "llm_adapter."
CONTEXT_TOKENS_KEY = "anima_rknn.context_tokens"
IMAGE_SIZE_KEY = "anima_rknn.demo.image_size"  # written by train-demo: the one size that model knows
MAX_CONTEXT_TOKENS = 4096  # the adapter's output rows; each is a cross-attention key for every image token
MAX_IMAGE_SIZE = 4096  # pixels, as for --width/--height
_BODY = re.compile(r"blocks\.\d+\.(self_attn|cross_attn|mlp)\.")
# Weights a fixed run can compute with once and then free (SplitEngine.fix_run): copied out of the file map,
# since pages read through the map stay resident as long as any tensor of it lives.
_RELEASABLE = re.compile(r"blocks\.\d+\.(adaln_modulation_|cross_attn\.[kv]_proj\.)")


def _strip(name: str) -> str:
    for prefix in PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name


def _metadata_int(header: Header, key: str, default: int | None, low: int, high: int, step: int = 1) -> int | None:
    """A whole number from the file's metadata, checked like a command-line option."""
    value = header.metadata.get(key)
    if value is None:
        return default
    number = int(value) if re.fullmatch(r"[0-9]{1,9}", value) else None
    if number is None or not low <= number <= high or number % step:
        multiple = f", a multiple of {step}" if step > 1 else ""
        raise AnimaError(f"{header.path}: metadata {key} is {value[:40]!r}; "
                         f"expected a whole number from {low} to {high}{multiple}")
    return number


def read_dit_config(path: str | os.PathLike) -> DiTConfig:
    """Sizes from the file header, every tensor's presence and shape checked; no tensor data is read."""
    header = read_header(path, "DiT")
    shapes = {_strip(k): info.shape for k, info in header.tensors.items()}
    context_tokens = _metadata_int(header, CONTEXT_TOKENS_KEY, CONTEXT_TOKENS, 1, MAX_CONTEXT_TOKENS)
    try:
        config = infer_dit_config(shapes, context_tokens)
        check_shapes(shapes, expected_shapes(config), "Anima DiT")
    except AnimaError as e:  # name the file: the same checks serve shapes from anywhere
        raise AnimaError(f"{header.path}: {e}") from None
    return config


def trained_image_size(path: str | os.PathLike) -> int | None:
    """The image size a small trained model was made for, if its file says so (the real Anima does not)."""
    return _metadata_int(read_header(path, "DiT"), IMAGE_SIZE_KEY, None, 16, MAX_IMAGE_SIZE, 16)


def expected_shapes(config: DiTConfig) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        return {k: tuple(v.shape) for k, v in AnimaDiT(config).state_dict().items()}


def _mapped(path: str | os.PathLike) -> dict[str, torch.Tensor | QuantizedTensor]:
    """Every tensor of the file through one new memory map; its pages stay resident while any of them lives.
    A GGUF file's quantized tensors come as QuantizedTensor (their blocks, in place)."""
    if is_gguf(path):
        return {_strip(k): v for k, v in map_gguf(read_gguf_header(path, "DiT")).items()}
    return {_strip(k): v for k, v in load_tensors(path, "DiT").items()}


def load_dit(path: str | os.PathLike, dtype: torch.dtype = torch.float32, *, denoise_only: bool = False,
             loras: Sequence[Lora] = (), just_in_time: bool = False, dequantize: bool = False) -> AnimaDiT:
    """The DiT with sizes read from the file; attention/MLP bodies in `dtype`, everything else fp32.

    Tensors already stored in their target dtype are used in place from a memory map of the file; the others
    are converted from a second map that is closed afterwards, so the pages read for them leave memory too.
    `denoise_only` loads just what the denoising loop needs, in the least memory: no LLM adapter
    (`llm_adapter` is None), and the host weights (AdaLN, embedders, final layer) left in the file's dtype,
    used in place and upcast to fp32 at use.
    `just_in_time` leaves body weights stored narrower than `dtype` (the file's bf16 for fp32 bodies) as they
    are, used in place, and the bodies cast them one at a time as they run (model.dit.cast_weights): the
    memory of the file's dtype at the speed of `dtype`.
    `loras` (opened for this DiT) are merged in fp32; only the weights they touch are copied: bodies then take
    `dtype`, host weights fp32.
    A GGUF file's quantized linear layers stay quantized (model.quantized: dequantized as they run, LoRAs added
    then), unless `dequantize` (an export) asks for plain weights; its other quantized tensors (norms, the
    adapter's embedding) are dequantized at load.
    """
    config = read_dit_config(path)
    expected = expected_shapes(config)
    if denoise_only:
        expected = {k: v for k, v in expected.items() if not k.startswith(ADAPTER_PREFIX)}

    def target(name: str, stored: torch.dtype) -> torch.dtype:
        if _BODY.match(name):
            return stored if just_in_time and stored.itemsize < dtype.itemsize else dtype
        return stored if denoise_only else torch.float32

    def usable_in_place(name: str, tensor: torch.Tensor) -> bool:
        return tensor.dtype == target(name, tensor.dtype) and not (denoise_only and _RELEASABLE.match(name))

    with torch.device("meta"):
        model = AnimaDiT(config)
    if denoise_only:
        model.llm_adapter = None
    tensors = {k: v for k, v in _mapped(path).items() if k in expected}
    if not dequantize:
        tensors = install_quantized(model, tensors, HostLinear)
        attach_loras(quantized_layers(model), loras)
    dense = {k: v.dequantize(target(k, torch.float32)) for k, v in tensors.items() if isinstance(v, QuantizedTensor)}
    merged = {} if not loras else merge_loras({k: v for k, v in (_mapped(path) | dense).items() if k in tensors},
                                              loras, lambda name: dtype if _BODY.match(name) else torch.float32)
    done = dense.keys() | merged.keys()
    in_place = {k: v for k, v in tensors.items() if k not in done and usable_in_place(k, v)}
    converted = {k: v.to(target(k, v.dtype), copy=True) for k, v in _mapped(path).items()
                 if k in tensors and k not in in_place and k not in done}
    model.load_state_dict(in_place | converted | dense | merged, strict=True, assign=True)
    model.body_dtype = dtype
    return model.eval().requires_grad_(False)


def load_llm_adapter(path: str | os.PathLike, loras: Sequence[Lora] = ()) -> LLMAdapter:
    """The LLM adapter alone, in fp32, from its own memory map of the DiT file, with `loras` merged."""
    config = read_dit_config(path)
    with torch.device("meta"):
        adapter = LLMAdapter(config)
    mapped = install_quantized(adapter, {k.removeprefix(ADAPTER_PREFIX): v for k, v in _mapped(path).items()
                                         if k.startswith(ADAPTER_PREFIX)}, HostLinear)
    attach_loras({ADAPTER_PREFIX + k: v for k, v in quantized_layers(adapter).items()}, loras)
    mapped = {ADAPTER_PREFIX + k: v.dequantize() if isinstance(v, QuantizedTensor) else v for k, v in mapped.items()}
    if loras:
        mapped |= merge_loras(mapped, loras, lambda name: torch.float32)
    tensors = {k.removeprefix(ADAPTER_PREFIX): v.float() for k, v in mapped.items()}
    adapter.load_state_dict(tensors, strict=True, assign=True)
    return adapter.eval().requires_grad_(False)


def save_dit(model: AnimaDiT, path: str | os.PathLike, dtype: torch.dtype = torch.bfloat16,
             metadata: dict[str, str] | None = None, overwrite: bool = True) -> None:
    """Write the real layout: `net.` prefix, `dtype` tensors, sizes recoverable from shapes alone."""
    if model.llm_adapter is None:
        raise ValueError("a denoise-only DiT has no LLM adapter to save; load it whole")
    meta = {"anima_rknn.config": json.dumps(model.config.to_dict()), **(metadata or {})}
    if model.config.context_tokens != CONTEXT_TOKENS:
        meta[CONTEXT_TOKENS_KEY] = str(model.config.context_tokens)
    save_tensors({f"net.{k}": v.to(dtype) for k, v in model.state_dict().items()}, path, meta, overwrite=overwrite)


def random_dit(config: DiTConfig, seed: int = 0) -> AnimaDiT:
    """Seeded random weights. The AdaLN gates start small so a random model's velocity stays O(1)."""
    generator = torch.Generator().manual_seed(seed)
    model = AnimaDiT(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim == 1 and "norm" in name:
                param.copy_(1 + 0.1 * torch.randn(param.shape, generator=generator))
            elif param.ndim == 2:
                param.copy_(torch.randn(param.shape, generator=generator) / param.shape[1] ** 0.5)
            else:
                param.copy_(0.02 * torch.randn(param.shape, generator=generator))
    return model.eval().requires_grad_(False)
