"""The Wan 2.1 / Qwen-Image VAE, in the 2-D form that is exact for single images.

Wan's causal 3-D convolutions pad two zero frames in front of the clip, so on one frame only the last
temporal kernel slice ever touches data: each becomes a 2-D convolution with `weight[:, :, -1]`. The
3-D resamplers skip their `time_conv` on the first frame, so they are plain 2-D resamplers here.
Parameter names mirror the Wan/ComfyUI checkpoint names, so a module's state dict *is* the file's
key set (minus the unused `time_conv`s); only shapes differ, and `io.file_shapes` records how.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

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
