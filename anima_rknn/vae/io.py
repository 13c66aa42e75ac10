"""Read and write the Wan/ComfyUI VAE file: sizes from tensor names and shapes, the 5-D file layout, random weights.

The file keeps Wan's 3-D kernels and `time_conv`s; the single-frame network (vae/wan.py) uses only the last
temporal slice of each, so loading takes that slice and saving fills in the rest.
"""

from __future__ import annotations

import json
import math
import os
import re

import torch
from torch import Tensor

from ..core.gguf import is_gguf
from ..core.tensorfile import Header, load_tensors, read_header, save_tensors
from ..errors import AnimaError
from .wan import WAN21_LATENTS_MEAN, WAN21_LATENTS_STD, CausalConv2d, Resample, RMSNorm2d, WanVAE, WanVAEConfig

# Wan 2.1 has 4 levels (8x) of 2 residual blocks. The counts come from tensor names, not sizes, so they are
# bounded apart: a crafted header must not make us build (or decode to) something enormous.
MAX_LEVELS = 4
MAX_RES_BLOCKS = 8


def _file_shapes(vae: WanVAE) -> dict[str, tuple[int, ...]]:
    """Every tensor name of the Wan checkpoint for this module, with its shape in the file."""
    shapes: dict[str, tuple[int, ...]] = {}
    for module_name, module in vae.named_modules():
        prefix = f"{module_name}." if module_name else ""
        for param_name, param in module.named_parameters(recurse=False):
            shape = tuple(param.shape)
            if isinstance(module, CausalConv2d) and param_name == "weight":
                shape = (*shape[:2], shape[2], *shape[2:])  # [out, in, kt=k, k, k]
            elif isinstance(module, RMSNorm2d):
                shape = (shape[0],) + (1,) * (module.file_ndim - 1)
            shapes[prefix + param_name] = shape
        if isinstance(module, Resample) and module.time_conv_shape is not None:
            shapes[prefix + "time_conv.weight"] = module.time_conv_shape
            shapes[prefix + "time_conv.bias"] = module.time_conv_shape[:1]
    return shapes


def file_shapes(config: WanVAEConfig, decode_only: bool = False) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes of a Wan-format file for `config`, without allocating any weights."""
    with torch.device("meta"):
        return _file_shapes(WanVAE(config, with_encoder=not decode_only))


def random_vae(config: WanVAEConfig, seed: int) -> WanVAE:
    """A VAE with seeded random weights whose decodes are finite and mostly unsaturated.

    PyTorch's default conv init keeps activations O(1) through the RMS norms; gammas get a small
    random spread (instead of all ones) so a misplaced or mis-shaped gamma changes the output.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        vae = WanVAE(config)
        with torch.no_grad():
            for module in vae.modules():
                if isinstance(module, RMSNorm2d):
                    module.gamma.add_(0.1 * torch.randn_like(module.gamma))
    return vae.eval().requires_grad_(False)


def save_vae(vae: WanVAE, path: str | os.PathLike, dtype: torch.dtype = torch.bfloat16) -> None:
    """Write `vae` in the Wan/ComfyUI checkpoint format (names and 5-D shapes of the real file).

    The unused temporal kernel slices and `time_conv`s get seeded random values at the scale of the
    weights beside them, so the file looks like (and is only correct in the single-frame sense as) a
    real checkpoint. Non-default latent statistics go into the metadata.
    """
    if vae.encoder is None:
        raise AnimaError("cannot save a decode-only VAE: the Wan format needs the encoder too")
    generator = torch.Generator().manual_seed(0)
    params = dict(vae.named_parameters())
    tensors: dict[str, Tensor] = {}
    for name, shape in _file_shapes(vae).items():
        param = params.get(name)
        if param is None and name.endswith(".time_conv.bias"):
            value = torch.zeros(shape)
        elif param is None:  # a time_conv weight [out, in, 3, 1, 1]
            value = torch.randn(shape, generator=generator) / math.sqrt(shape[1] * shape[2])
        elif len(shape) == 5:
            kernel = param.detach().float().cpu()
            value = torch.randn(shape, generator=generator) * kernel.std()
            value[:, :, -1] = kernel
        else:
            value = param.detach().float().cpu().reshape(shape)
        tensors[name] = value.to(dtype).contiguous()
    config = vae.config
    metadata = None
    if config.latents_mean != WAN21_LATENTS_MEAN or config.latents_std != WAN21_LATENTS_STD:
        metadata = {
            "latents_mean": json.dumps(list(config.latents_mean)),
            "latents_std": json.dumps(list(config.latents_std)),
        }
    save_tensors(tensors, path, metadata)


def _metadata_stats(header: Header, key: str, default: tuple[float, ...], *, positive: bool) -> tuple[float, ...]:
    """Per-channel latent statistics from the metadata: a JSON list of finite (or positive) numbers."""
    if key not in header.metadata:
        return default
    try:
        values = json.loads(header.metadata[key])
        numbers = [float(v) for v in values if type(v) in (int, float)] if isinstance(values, list) else []
        valid = isinstance(values, list) and len(numbers) == len(values)
    except (ValueError, RecursionError, OverflowError):  # not JSON, too deep, a number past float range
        valid = False
    if not valid or not all(math.isfinite(v) and (v > 0 or not positive) for v in numbers):
        raise AnimaError(f"{header.path}: metadata {key} is not a JSON list of "
                         f"{'positive' if positive else 'finite'} numbers")
    return tuple(numbers)


def _shapes(header: Header) -> dict[str, tuple[int, ...]]:
    """Tensor shapes, a stable-diffusion.cpp GGUF's folded 5-D convolutions unfolded.

    GGML tensors have at most 4 dimensions, so stable-diffusion.cpp stores a conv3d weight [out, in, t, h, w] as
    [out * in, t, h, w] (its wan.hpp CausalConv3d allocates ne {w, h, t, in * out}; safetensors_io.cpp folds a
    5-D file tensor with `ne[0] = ne[0] * ne[1]`), and its converter writes that shape. The data is the 5-D
    tensor's, in the same order; `out` is the length of the layer's bias. A real 4-D weight has `out` rows."""
    shapes = {name: info.shape for name, info in header.tensors.items()}
    if not is_gguf(header.path):
        return shapes
    unfolded = dict(shapes)
    for name, shape in shapes.items():
        bias = shapes.get(name.removesuffix("weight") + "bias") if name.endswith(".weight") else None
        if len(shape) == 4 and bias and len(bias) == 1 and 0 < bias[0] < shape[0] and shape[0] % bias[0] == 0:
            unfolded[name] = (bias[0], shape[0] // bias[0], *shape[1:])
    return unfolded


def _infer_config(header: Header) -> WanVAEConfig:
    path, shapes = header.path, _shapes(header)

    def shape_of(key: str) -> tuple[int, ...]:  # of a conv weight that sizes the model
        if key not in shapes:
            raise AnimaError(f"{path}: not a Wan VAE file: missing {key}")
        if len(shapes[key]) < 4 or not all(shapes[key]):
            raise AnimaError(f"{path}: tensor {key} has shape {list(shapes[key])}, expected a conv weight")
        return shapes[key]

    z_dim = shape_of("decoder.conv1.weight")[1]
    # The decoder alone only fixes dim * mult; the encoder's first width pins dim itself.
    if "encoder.conv1.weight" in shapes:
        dim = shape_of("encoder.conv1.weight")[0]
    else:
        dim = shape_of("decoder.head.2.weight")[1]
    blocks = sorted({int(m[1]) for k in shapes if (m := re.match(r"decoder\.upsamples\.([0-9]{1,9})\.", k))})
    resamples = sum(f"decoder.upsamples.{i}.resample.1.weight" in shapes for i in blocks)
    levels = resamples + 1
    per_level, leftover = divmod(len(blocks) - resamples, levels)
    if leftover or per_level < 2 or blocks != list(range(len(blocks))):
        raise AnimaError(f"{path}: not a Wan VAE file: cannot make out the decoder.upsamples layout")
    if levels > MAX_LEVELS or per_level - 1 > MAX_RES_BLOCKS:
        raise AnimaError(f"{path}: decoder.upsamples has {levels} levels of {per_level - 1} residual blocks; "
                         f"at most {MAX_LEVELS} of {MAX_RES_BLOCKS} are read")
    widths = [shape_of(f"decoder.upsamples.{level * (per_level + 1)}.residual.2.weight")[0] for level in range(levels)]
    if any(width % dim for width in widths):
        raise AnimaError(f"{path}: decoder widths {widths} are not multiples of the base width {dim}")
    mean = _metadata_stats(header, "latents_mean", WAN21_LATENTS_MEAN, positive=False)
    std = _metadata_stats(header, "latents_std", WAN21_LATENTS_STD, positive=True)
    try:
        return WanVAEConfig(dim=dim, z_dim=z_dim, dim_mult=tuple(width // dim for width in reversed(widths)),
                            num_res_blocks=per_level - 1, latents_mean=mean, latents_std=std)
    except AnimaError as e:  # statistics that do not fit z_dim
        raise AnimaError(f"{path}: {e}") from None


def read_vae_config(path: str | os.PathLike) -> WanVAEConfig:
    """The VAE's sizes from the file header alone: a cheap check before any stage runs."""
    return _infer_config(read_header(path, "VAE"))


def load_vae(path: str | os.PathLike, *, decode_only: bool = True, dtype: torch.dtype = torch.float32) -> WanVAE:
    """Load a Wan/ComfyUI-named VAE file (safetensors, or a GGUF as ComfyUI-GGUF or stable-diffusion.cpp writes
    it); sizes (dim, z_dim, dim_mult, res blocks) come from its shapes."""
    header = read_header(path, "VAE")
    shapes, config = _shapes(header), _infer_config(header)
    with torch.device("meta"):
        vae = WanVAE(config, with_encoder=not decode_only)
    expected_shapes = _file_shapes(vae)
    tensors = load_tensors(path, "VAE")
    state: dict[str, Tensor] = {}
    for name, param in vae.named_parameters():
        if name not in tensors:
            raise AnimaError(f"{path}: not a Wan VAE file: missing {name}")
        tensor = tensors[name].reshape(shapes[name])  # as _shapes unfolded it
        if tuple(tensor.shape) != expected_shapes[name]:
            raise AnimaError(
                f"{path}: tensor {name} has shape {list(tensor.shape)}, expected {list(expected_shapes[name])}"
            )
        if tensor.ndim == 5:
            tensor = tensor[:, :, -1]  # the only temporal slice that sees a single frame
        state[name] = tensor.reshape(param.shape).to(dtype)
    vae.load_state_dict(state, strict=True, assign=True)
    return vae.eval().requires_grad_(False)
