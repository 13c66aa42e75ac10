"""Exact rescaling of the decoder's residual stream, so an fp16 accelerator (the RK3588 NPU) never overflows.

Measured in rknn-toolkit2's simulator (README, "The VAE decoder on the NPU"): the RMS norms do not overflow on
their sums of squares, even at 4000x fp16's range, but one activation of the residual stream past fp16's 65504
turns the decoded image into NaN. Every RMS norm divides its input by its own size, so the stream between
the first conv and the head's norm can be carried at 1/c of its size without changing anything else: divide
by c whatever writes into it (the first conv, each residual branch's last conv, the attention projection) and
the biases of the convs that read the already scaled stream (shortcuts, upsamplers). c is a power of two, so
the scaled weights are exact; c is chosen from the stream's peak on the latents of real pictures.

The encoder's residual stream (its first conv to its head's norm) is built of the same blocks and is rescaled the
same way (`encoder=True`), from its peak on the pictures themselves. Measured on two varied pictures at 64 and
512 px: 22 on the demo VAE, 2.4-2.8 on the tiny and mid random VAEs, 4.0 on the full-size random one (256 px),
with the norms' per-pixel sums of squares at most 2.6e3: nowhere near fp16's 65504, so c is 1 for all of them.
The mechanism is there for a VAE file whose encoder is louder (the real Wan 2.1 weights were not available here).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import torch
from torch import Tensor

from ..core.tensorfile import read_shapes
from .io import load_vae
from .preview import fit_latents, varied_images
from .wan import AttentionBlock, Resample, ResidualBlock, WanVAE

FP16_MAX = 65504.0
# The largest stream value wanted after rescaling: 32x headroom for latents larger than the calibration's.
STREAM_TARGET = 2048.0


def picture_latents(vae_path: str | os.PathLike, count: int, side: int, seed: int = 0) -> tuple[WanVAE, Tensor]:
    """The fp32 decoder of a VAE file and the latents of `count` varied pictures of `side` px: its encoder's
    posterior means (a decode-only file gets seeded normal latents instead, as preview fitting does)."""
    decode_only = "encoder.conv1.weight" not in read_shapes(vae_path, "VAE")
    vae = load_vae(vae_path, decode_only=decode_only)
    latents = fit_latents(vae, varied_images(count, side, seed))[:count]  # the clean encodings come first
    vae.encoder = vae.conv1 = None  # only the decoder is used from here: free the encoder
    return vae, latents


def stream_peak(vae: WanVAE, latents: Tensor) -> float:
    """Largest |value| of the decoder's residual stream (fp32) over `latents` decoded one at a time."""
    return _peak(vae.decoder, vae.decode, latents)


def encoder_stream_peak(vae: WanVAE, images: Tensor) -> float:
    """Largest |value| of the encoder's residual stream (fp32) over `images` ([n, 3, H, W] in [0, 1]) encoded one
    at a time."""
    if vae.encoder is None:
        raise ValueError("the VAE was loaded decode-only")
    return _peak(vae.encoder, vae.encode, images)


def _peak(net: torch.nn.Module, run: Callable[[Tensor], Tensor], inputs: Tensor) -> float:
    peak = 0.0

    def record(module: torch.nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> None:
        nonlocal peak
        peak = max(peak, float(output.detach().abs().max()))

    writers = [net.conv1, *(m for m in net.modules() if isinstance(m, (ResidualBlock, AttentionBlock, Resample)))]
    hooks = [module.register_forward_hook(record) for module in writers]
    try:
        with torch.no_grad():
            for x in inputs:
                run(x[None])
    finally:
        for hook in hooks:
            hook.remove()
    return peak


def stream_scale(peak: float) -> float:
    """The power of two to divide the stream by so its peak stays at most STREAM_TARGET (1 when it already does)."""
    return 1.0 if peak <= STREAM_TARGET else 2.0 ** math.ceil(math.log2(peak / STREAM_TARGET))


@torch.no_grad()
def rescale_stream(vae: WanVAE, scale: float, *, encoder: bool = False) -> None:
    """Carry the decoder's (the encoder's) residual stream at 1/`scale` of its size, in place; the decoded image
    (the latent) is unchanged."""
    net = vae.encoder if encoder else vae.decoder
    net.conv1.weight.div_(scale)
    net.conv1.bias.div_(scale)
    for module in net.modules():
        if isinstance(module, ResidualBlock):
            last = module.residual[-1]
            last.weight.div_(scale)
            last.bias.div_(scale)
            if isinstance(module.shortcut, torch.nn.Conv2d):
                module.shortcut.bias.div_(scale)
        elif isinstance(module, AttentionBlock):
            module.proj.weight.div_(scale)
            module.proj.bias.div_(scale)
        elif isinstance(module, Resample):  # up: nearest + conv; down: zero pad + stride-2 conv
            module.resample[-1].bias.div_(scale)
