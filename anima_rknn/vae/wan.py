"""The Wan 2.1 / Qwen-Image VAE, in the 2-D form that is exact for single images.

Wan's causal 3-D convolutions pad two zero frames in front of the clip, so on one frame only the last
temporal kernel slice ever touches data: each becomes a 2-D convolution with `weight[:, :, -1]`. The
3-D resamplers skip their `time_conv` on the first frame, so they are plain 2-D resamplers here.
Parameter names mirror the Wan/ComfyUI checkpoint names, so a module's state dict *is* the file's
key set (minus the unused `time_conv`s); only shapes differ, and `_file_shapes` records how.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import Tensor, nn

from ..core.files import atomic_path
from ..core.tensorfile import Header, load_tensors, read_header
from ..errors import AnimaError

WAN21_LATENTS_MEAN = (
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
    0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
)  # fmt: skip
WAN21_LATENTS_STD = (
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
    3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160,
)  # fmt: skip


@dataclass(frozen=True)
class WanVAEConfig:
    dim: int = 96
    z_dim: int = 16
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    latents_mean: tuple[float, ...] = WAN21_LATENTS_MEAN
    latents_std: tuple[float, ...] = WAN21_LATENTS_STD

    def __post_init__(self) -> None:
        # Accept lists (JSON, CLI) but store tuples so configs compare and hash by value.
        for name in ("dim_mult", "latents_mean", "latents_std"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if len(self.latents_mean) != self.z_dim or len(self.latents_std) != self.z_dim:
            raise AnimaError(
                f"VAE latents_mean/latents_std need {self.z_dim} entries (z_dim), "
                f"got {len(self.latents_mean)}/{len(self.latents_std)}"
            )
        if self.dim < 1 or self.z_dim < 1 or not self.dim_mult or self.num_res_blocks < 1:
            raise AnimaError(f"invalid VAE config: {self}")

    @property
    def scale_factor(self) -> int:
        """Image pixels per latent pixel along each side (8 for Wan 2.1)."""
        return 2 ** (len(self.dim_mult) - 1)


class CausalConv2d(nn.Conv2d):
    """Single-frame form of Wan's CausalConv3d; its file weight is [out, in, k, k, k]."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int) -> None:
        super().__init__(in_channels, out_channels, kernel_size, padding=kernel_size // 2)


class RMSNorm2d(nn.Module):
    """Wan's RMS_norm over channels; `file_ndim` is the rank its gamma has in checkpoints."""

    def __init__(self, channels: int, file_ndim: int) -> None:
        super().__init__()
        self.scale = channels**0.5
        self.gamma = nn.Parameter(torch.ones(channels, 1, 1))
        self.file_ndim = file_ndim

    def forward(self, x: Tensor) -> Tensor:
        # Statistics in fp32: bf16/fp16 sums of squares over hundreds of channels lose too much.
        return F.normalize(x.float(), dim=1).to(x.dtype) * self.scale * self.gamma


class ResidualBlock(nn.Module):
    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        # Indices follow Wan's Sequential (norm, SiLU, conv, norm, SiLU, dropout, conv): they are the
        # checkpoint names residual.0/.2/.3/.6.
        self.residual = nn.Sequential(
            RMSNorm2d(in_dim, file_ndim=4),
            nn.SiLU(),
            CausalConv2d(in_dim, out_dim, 3),
            RMSNorm2d(out_dim, file_ndim=4),
            nn.SiLU(),
            nn.Identity(),
            CausalConv2d(out_dim, out_dim, 3),
        )
        self.shortcut = CausalConv2d(in_dim, out_dim, 1) if in_dim != out_dim else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        return self.residual(x) + self.shortcut(x)


class AttentionBlock(nn.Module):
    """Single-head self-attention over all pixels of the image (Wan's per-frame middle attention)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = RMSNorm2d(dim, file_ndim=3)
        self.to_qkv = nn.Conv2d(dim, dim * 3, 1)
        self.proj = nn.Conv2d(dim, dim, 1)

    def forward(self, x: Tensor) -> Tensor:
        b, c, h, w = x.shape
        q, k, v = self.to_qkv(self.norm(x)).flatten(2).transpose(1, 2).chunk(3, dim=-1)
        out = F.scaled_dot_product_attention(q, k, v)
        return x + self.proj(out.transpose(1, 2).reshape(b, c, h, w))


class Resample(nn.Module):
    """2x nearest up (halving channels) or stride-2 down, as `resample.1` in the file.

    `temporal` marks Wan's 3-D resamplers: their file entry also has a `time_conv`, which never acts
    on a first (here: only) frame, so it is written on save and ignored on load.
    """

    def __init__(self, dim: int, up: bool, temporal: bool) -> None:
        super().__init__()
        if up:
            # "nearest" equals Wan's "nearest-exact" at scale 2 (both take pixel i // 2) and, unlike it, exports
            # to ONNX (Resize) for the NPU.
            self.resample = nn.Sequential(
                nn.Upsample(scale_factor=2.0, mode="nearest"), nn.Conv2d(dim, dim // 2, 3, padding=1)
            )
        else:
            # Pad right/bottom only, then stride 2: Wan's asymmetric downsampling.
            self.resample = nn.Sequential(nn.ZeroPad2d((0, 1, 0, 1)), nn.Conv2d(dim, dim, 3, stride=2))
        time_out = dim * 2 if up else dim
        self.time_conv_shape = (time_out, dim, 3, 1, 1) if temporal else None

    def forward(self, x: Tensor) -> Tensor:
        return self.resample(x)


def _middle(dim: int) -> nn.Sequential:
    return nn.Sequential(ResidualBlock(dim, dim), AttentionBlock(dim), ResidualBlock(dim, dim))


def _head(in_dim: int, out_dim: int) -> nn.Sequential:
    return nn.Sequential(RMSNorm2d(in_dim, file_ndim=4), nn.SiLU(), CausalConv2d(in_dim, out_dim, 3))


class Encoder(nn.Module):
    def __init__(self, config: WanVAEConfig) -> None:
        super().__init__()
        widths = [config.dim * m for m in (1, *config.dim_mult)]
        levels = len(config.dim_mult)
        self.conv1 = CausalConv2d(3, widths[0], 3)
        blocks: list[nn.Module] = []
        for level in range(levels):
            in_dim, out_dim = widths[level], widths[level + 1]
            for i in range(config.num_res_blocks):
                blocks.append(ResidualBlock(in_dim if i == 0 else out_dim, out_dim))
            if level < levels - 1:
                # Wan 2.1 halves time at every level but the first.
                blocks.append(Resample(out_dim, up=False, temporal=level > 0))
        self.downsamples = nn.Sequential(*blocks)
        self.middle = _middle(widths[-1])
        self.head = _head(widths[-1], 2 * config.z_dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.middle(self.downsamples(self.conv1(x))))


class Decoder(nn.Module):
    def __init__(self, config: WanVAEConfig) -> None:
        super().__init__()
        mults = config.dim_mult[::-1]
        levels = len(mults)
        self.conv1 = CausalConv2d(config.z_dim, config.dim * mults[0], 3)
        self.middle = _middle(config.dim * mults[0])
        blocks: list[nn.Module] = []
        in_dim = config.dim * mults[0]
        for level, mult in enumerate(mults):
            out_dim = config.dim * mult
            for i in range(config.num_res_blocks + 1):
                blocks.append(ResidualBlock(in_dim if i == 0 else out_dim, out_dim))
            if level < levels - 1:
                # Mirror of the encoder: temporal except the level facing the encoder's first.
                blocks.append(Resample(out_dim, up=True, temporal=level < levels - 2))
                in_dim = out_dim // 2
        self.upsamples = nn.Sequential(*blocks)
        self.head = _head(config.dim * mults[-1], 3)

    def forward(self, z: Tensor) -> Tensor:
        return self.head(self.upsamples(self.middle(self.conv1(z))))


class WanVAE(nn.Module):
    """Wan 2.1 VAE for single images. Latents in and out are the DiT's normalised latents."""

    def __init__(self, config: WanVAEConfig, with_encoder: bool = True) -> None:
        super().__init__()
        self.config = config
        self.encoder = Encoder(config) if with_encoder else None
        self.conv1 = CausalConv2d(2 * config.z_dim, 2 * config.z_dim, 1) if with_encoder else None
        self.conv2 = CausalConv2d(config.z_dim, config.z_dim, 1)
        self.decoder = Decoder(config)

    @property
    def scale_factor(self) -> int:
        return self.config.scale_factor

    def _latent_stats(self, like: Tensor) -> tuple[Tensor, Tensor]:
        def as_column(values: tuple[float, ...]) -> Tensor:
            return torch.tensor(values, dtype=like.dtype, device=like.device).view(1, -1, 1, 1)

        return as_column(self.config.latents_mean), as_column(self.config.latents_std)

    def decode(self, z: Tensor) -> Tensor:
        """Normalised latent [B, z_dim, h, w] -> image [B, 3, s*h, s*w] in [0, 1], float32."""
        z = z.to(self.conv2.weight.dtype)
        mean, std = self._latent_stats(z)
        x = self.decoder(self.conv2(z * std + mean))
        return (x.float().clamp(-1.0, 1.0) + 1.0) / 2.0

    def forward(self, z: Tensor) -> Tensor:
        """Same as `decode`, so the module can be traced or exported as the decoder."""
        return self.decode(z)

    def encode(self, image: Tensor) -> Tensor:
        """Image [B, 3, H, W] in [0, 1] -> normalised posterior-mean latent [B, z_dim, H/s, W/s]."""
        if self.encoder is None or self.conv1 is None:
            raise AnimaError("this VAE was loaded decode-only; load it with decode_only=False to encode")
        s = self.scale_factor
        if image.shape[-2] % s or image.shape[-1] % s:
            raise AnimaError(f"image size {tuple(image.shape[-2:])} is not a multiple of {s}")
        x = image.to(self.conv2.weight.dtype) * 2.0 - 1.0
        mu = self.conv1(self.encoder(x))[:, : self.config.z_dim]
        mean, std = self._latent_stats(mu)
        return ((mu - mean) / std).float()


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
    with atomic_path(path, overwrite=True) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)


# Wan 2.1 has 4 levels (8x) of 2 residual blocks. The counts come from tensor names, not sizes, so they are
# bounded apart: a crafted header must not make us build (or decode to) something enormous.
MAX_LEVELS = 4
MAX_RES_BLOCKS = 8


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


def _infer_config(header: Header) -> WanVAEConfig:
    path, shapes = header.path, {name: info.shape for name, info in header.tensors.items()}

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
    """Load a Wan/ComfyUI-named VAE file; sizes (dim, z_dim, dim_mult, res blocks) come from its shapes."""
    config = read_vae_config(path)
    with torch.device("meta"):
        vae = WanVAE(config, with_encoder=not decode_only)
    expected_shapes = _file_shapes(vae)
    tensors = load_tensors(path, "VAE")
    state: dict[str, Tensor] = {}
    for name, param in vae.named_parameters():
        if name not in tensors:
            raise AnimaError(f"{path}: not a Wan VAE file: missing {name}")
        tensor = tensors[name]
        if tuple(tensor.shape) != expected_shapes[name]:
            raise AnimaError(
                f"{path}: tensor {name} has shape {list(tensor.shape)}, expected {list(expected_shapes[name])}"
            )
        if tensor.ndim == 5:
            tensor = tensor[:, :, -1]  # the only temporal slice that sees a single frame
        state[name] = tensor.reshape(param.shape).to(dtype)
    vae.load_state_dict(state, strict=True, assign=True)
    return vae.eval().requires_grad_(False)
