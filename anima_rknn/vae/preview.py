"""Live previews of a running generation: the denoised estimate x0 of a step, made visible.

The cheap way (ComfyUI's latent previews, stable-diffusion.cpp's `--preview proj`) is a linear projection of
the latent channels to RGB at latent resolution: one [h*w, 16] x [16, 3] product per step. The projection of
the real Wan 2.1 / Qwen-Image VAE is published; any other VAE gets one fitted by least squares to its own
decodes, stored beside the VAE file as `<vae stem>.preview.json` (make-tiny and train-demo write it).
The slow way decodes x0 with the VAE itself.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from ..checks import is_integer, is_number_in, require, shown
from ..core.files import Unreadable, read_small_json, save_png, write_json
from ..core.tensorfile import fingerprint, read_shapes
from ..errors import AnimaError
from .io import load_vae, read_vae_config
from .tiling import decode_tiled
from .wan import WanVAE, WanVAEConfig

if TYPE_CHECKING:  # the sampler's record, read duck-typed: this layer does not import the sampler
    from ..sampling.sample import StepEvent

PREVIEW_FORMAT = "anima-rknn-preview/1"
PREVIEW_SUFFIX = ".preview.json"
MAX_PREVIEW_BYTES = 64 << 10  # a 16 x 3 projection is about 1 KiB of JSON
MAX_FACTOR = 1000.0  # a larger factor would only ever clip; bounding it keeps float32 from overflowing
# Projection previews are upscaled (bilinear) to about this long side, never past the VAE's own factor. The latent
# holds all there is to see; more pixels only cost PNG encoding (256 px: 15-25 ms, over 1% of a mid-model step).
PREVIEW_SIDE = 128

# The published latent-to-RGB factors of Wan 2.1 (ComfyUI, comfy/latent_formats.py, class Wan21:
# latent_rgb_factors, one row per latent channel, and latent_rgb_factors_bias). ComfyUI samples in the model's
# latent space (CFGGuider.inner_sample applies process_in; the step callback hands its previewer that space's
# denoised x0), and Wan21.process_in is (raw - latents_mean) / latents_std: the normalised latent that our x0
# is too. So the factors apply to x0 unchanged; no diag(std) W, b + mean W conversion is needed. Its previewer
# maps the product from [-1, 1] to [0, 1], which published_wan21() folds in: W / 2 and (b + 1) / 2.
WAN21_LATENT_RGB_FACTORS = (
    (-0.1299, -0.1692, 0.2932), (0.0671, 0.0406, 0.0442), (0.3568, 0.2548, 0.1747), (0.0372, 0.2344, 0.1420),
    (0.0313, 0.0189, -0.0328), (0.0296, -0.0956, -0.0665), (-0.3477, -0.4059, -0.2925), (0.0166, 0.1902, 0.1975),
    (-0.0412, 0.0267, -0.1364), (-0.1293, 0.0740, 0.1636), (0.0680, 0.3019, 0.1128), (0.0032, 0.0581, 0.0639),
    (-0.1251, 0.0927, 0.1699), (0.0060, -0.0633, 0.0005), (0.3477, 0.2275, 0.2950), (0.1984, 0.0913, 0.1861),
)  # fmt: skip
WAN21_LATENT_RGB_BIAS = (-0.1835, -0.0868, -0.3360)


@dataclass(frozen=True, eq=False)
class LatentProjection:
    """rgb = x0 . matrix + bias per latent pixel, in [0, 1] (clipped): a [channels, 3] matrix and a 3-bias."""

    matrix: np.ndarray
    bias: np.ndarray

    def __post_init__(self) -> None:
        matrix, bias = (np.array(a, dtype=np.float32) for a in (self.matrix, self.bias))
        if matrix.ndim != 2 or matrix.shape[1] != 3 or matrix.shape[0] < 1 or bias.shape != (3,):
            raise AnimaError(f"a latent projection is a [channels, 3] matrix and 3 biases, "
                             f"got {list(matrix.shape)} and {list(bias.shape)}")
        for array in (matrix, bias):
            array.setflags(write=False)
        object.__setattr__(self, "matrix", matrix)
        object.__setattr__(self, "bias", bias)

    @property
    def channels(self) -> int:
        return self.matrix.shape[0]

    def rgb(self, x0: np.ndarray) -> np.ndarray:
        """[h, w, 3] float32 in [0, 1] of a latent [1, channels, h, w] (the first of a batch); NaN shows black."""
        x0 = np.asarray(x0, dtype=np.float32)
        if x0.ndim != 4 or x0.shape[1] != self.channels:
            raise AnimaError(f"the preview projection takes a latent [batch, {self.channels}, h, w], "
                             f"got {list(x0.shape)}")
        _, channels, height, width = x0.shape
        with np.errstate(invalid="ignore", over="ignore"):
            rgb = x0[0].reshape(channels, -1).T @ self.matrix + self.bias
        return np.nan_to_num(rgb, nan=0.0).clip(0.0, 1.0).reshape(height, width, 3)

    def to_image(self, x0: np.ndarray, upscale: int = 1) -> Image.Image:
        """The projection as an RGB image, `upscale` times the latent's size (bilinear: smooth, no blocks)."""
        image = _to_image(self.rgb(x0))
        if upscale > 1:
            image = image.resize((image.width * upscale, image.height * upscale), Image.Resampling.BILINEAR)
        return image


def _to_image(rgb: np.ndarray) -> Image.Image:
    return Image.fromarray((rgb * 255.0).round().astype(np.uint8))


def published_wan21() -> LatentProjection:
    """ComfyUI's Wan 2.1 factors, as a projection of the normalised latent to [0, 1]."""
    return LatentProjection(np.array(WAN21_LATENT_RGB_FACTORS) / 2.0, (np.array(WAN21_LATENT_RGB_BIAS) + 1.0) / 2.0)


def is_wan21(config: WanVAEConfig) -> bool:
    """The real Wan 2.1 / Qwen-Image VAE's sizes and latent statistics (a random VAE of those sizes also is;
    make-tiny stores a fitted projection for its sets, which comes first)."""
    return config == WanVAEConfig()


# ---- fitting a projection to a VAE's own decodes -------------------------------------------------------------


def varied_images(count: int, side: int, seed: int = 0) -> torch.Tensor:
    """[count, 3, side, side] in [0, 1]: smooth random colour fields with a few flat patches on them, so that
    the fit sees the whole colour cube, gradients and edges."""
    rng = np.random.default_rng(seed)
    images = []
    for index in range(count):
        grid = 2 + index % 4  # coarse to finer colour fields
        field = torch.from_numpy(rng.random((1, 3, grid, grid), dtype=np.float32))
        image = F.interpolate(field, size=(side, side), mode="bicubic", align_corners=True)[0]
        for _ in range(3):
            top, left = rng.integers(0, side * 3 // 4, size=2)
            size = int(rng.integers(side // 8, side // 3))
            image[:, top : top + size, left : left + size] = torch.from_numpy(rng.random((3, 1, 1), dtype=np.float32))
        images.append(image.clamp(0.0, 1.0))
    return torch.stack(images)


def fit_latents(vae: WanVAE, images: torch.Tensor | None = None, seed: int = 0) -> torch.Tensor:
    """Latents to fit a projection on: the VAE's encodings of `images` ([n, 3, H, W] in [0, 1]; by default
    8 `varied_images` of 128 px), which is what denoised estimates look like, and the same again half mixed
    with noise, like the estimates of early steps and of random-weight models (on demo-model runs this adds
    1.1-1.3 dB on average over all steps' x0, and nothing at the last step). A VAE file without its encoder
    gets seeded normal latents instead."""
    images = varied_images(8, 128, seed) if images is None else images
    generator = torch.Generator().manual_seed(seed)
    if vae.encoder is None:
        shape = (2 * len(images), vae.config.z_dim, *(side // vae.scale_factor for side in images.shape[-2:]))
        return torch.randn(shape, generator=generator)
    with torch.no_grad():
        clean = torch.cat([vae.encode(image[None]) for image in images])
    return torch.cat([clean, 0.5 * clean + 0.5 * torch.randn(clean.shape, generator=generator)])


def fit_projection(vae: WanVAE, latents: torch.Tensor | np.ndarray) -> LatentProjection:
    """Least squares (with a bias) from latent pixels to the VAE's decode of them, average-pooled to latent
    resolution."""
    latents = torch.as_tensor(latents, dtype=torch.float32)
    with torch.no_grad():
        pooled = torch.cat([F.avg_pool2d(vae.decode(z[None]), vae.scale_factor) for z in latents])
    features = latents.permute(0, 2, 3, 1).reshape(-1, latents.shape[1]).double().numpy()
    targets = pooled.permute(0, 2, 3, 1).reshape(-1, 3).double().numpy()
    design = np.concatenate([features, np.ones((len(features), 1))], axis=1)
    solution, *_ = np.linalg.lstsq(design, targets, rcond=None)
    return LatentProjection(solution[:-1], solution[-1])


# ---- the stored projection beside the VAE file ---------------------------------------------------------------


def preview_file(vae_path: str | os.PathLike) -> Path:
    vae_path = Path(vae_path)
    return vae_path.with_name(vae_path.stem + PREVIEW_SUFFIX)


def write_projection(projection: LatentProjection, vae_path: str | os.PathLike) -> Path:
    """Store `projection` beside the VAE file it was fitted for (replacing an earlier one)."""
    path = preview_file(vae_path)
    write_json(path, {"format": PREVIEW_FORMAT, "vae_fingerprint": fingerprint(vae_path, "VAE"),
                      "matrix": projection.matrix.tolist(), "bias": projection.bias.tolist()}, overwrite=True)
    return path


def _numbers(value: object, length: int) -> list[float] | None:
    """`value` if it is a list of `length` numbers of size at most MAX_FACTOR (so finite), else None."""
    if not isinstance(value, list) or len(value) != length:
        return None
    if not all(is_number_in(v, -MAX_FACTOR, MAX_FACTOR) for v in value):
        return None
    return [float(v) for v in value]


def _read_record(path: Path) -> object:
    try:
        return read_small_json(path, MAX_PREVIEW_BYTES)
    except Unreadable as e:
        raise AnimaError(f"{path} is not a JSON preview projection: {e}") from None


def read_projection(path: str | os.PathLike, vae_path: str | os.PathLike) -> LatentProjection:
    """A stored projection, checked like any untrusted input and against the VAE file it claims to be for."""
    path = Path(path)
    channels = read_vae_config(vae_path).z_dim
    record = _read_record(path)
    keys = {"format", "vae_fingerprint", "matrix", "bias"}
    if not isinstance(record, dict) or set(record) != keys:
        raise AnimaError(f"{path}: a preview projection is a JSON object with exactly the keys "
                         f"{', '.join(sorted(keys))}")
    if record["format"] != PREVIEW_FORMAT:
        raise AnimaError(f"{path}: format {shown(record['format'], 40)} is not {PREVIEW_FORMAT!r}")
    rows = record["matrix"] if isinstance(record["matrix"], list) and len(record["matrix"]) == channels else [None]
    matrix, bias = [_numbers(row, 3) for row in rows], _numbers(record["bias"], 3)
    if any(row is None for row in matrix) or bias is None:
        raise AnimaError(f"{path}: matrix must be {channels} rows of 3 numbers and bias 3 numbers, "
                         f"each finite and at most {MAX_FACTOR:g} in size")
    if record["vae_fingerprint"] != fingerprint(vae_path, "VAE"):
        raise AnimaError(f"{path} was fitted for another VAE file than {Path(vae_path).name}; delete it "
                         "(a projection is then fitted on the spot) or store a new one")
    return LatentProjection(np.array(matrix), np.array(bias))


def fit_file(vae_path: str | os.PathLike, images: torch.Tensor | None = None) -> LatentProjection:
    """The projection of a VAE file, fitted to its decodes of `fit_latents` (of `images`, if given)."""
    decode_only = "encoder.conv1.weight" not in read_shapes(vae_path, "VAE")
    vae = load_vae(vae_path, decode_only=decode_only)
    return fit_projection(vae, fit_latents(vae, images))


def store_projection(vae_path: str | os.PathLike, images: torch.Tensor | None = None) -> Path:
    """Fit the projection of a VAE file (its weights as stored, not as trained in float32) and store it beside
    it (make-tiny, train-demo). Returns the stored file's path."""
    return write_projection(fit_file(vae_path, images), vae_path)


def projection_for(vae_path: str | os.PathLike) -> LatentProjection:
    """The preview projection of a VAE file: the one stored beside it, else the published one of the real Wan 2.1
    VAE, else one fitted on the spot (seconds for small VAEs, a minute for a full-size one: a model set should
    carry its `.preview.json`). A stored file that is broken or for another VAE is refused, never skipped."""
    stored = preview_file(vae_path)
    if stored.exists():
        return read_projection(stored, vae_path)
    if is_wan21(read_vae_config(vae_path)):
        return published_wan21()
    return fit_file(vae_path)


# ---- the step listener ---------------------------------------------------------------------------------------


class PreviewWriter:
    """A sampler step listener: every `every` steps (and at the last) writes x0 as a small PNG to `path`,
    replacing it atomically, so a viewer polling the file never reads half of one.

    By default the latent projection, upscaled to about PREVIEW_SIDE pixels; `vae_decode` decodes x0 with the VAE
    (full size, in `tile`-px tiles when larger), loading it once, at the first preview. `seconds` is the
    time spent previewing so far."""

    def __init__(self, path: str | os.PathLike, vae_path: str | os.PathLike, every: int = 1,
                 vae_decode: bool = False, tile: int = 512) -> None:
        require(is_integer(every) and every >= 1,
                f"the preview interval must be a whole number of steps >= 1, got {every!r}")
        require(is_integer(tile) and tile >= 64 and tile % 8 == 0,
                f"the preview VAE tile must be a multiple of 8 pixels >= 64, got {tile!r}")
        self.path, self.vae_path = Path(path), Path(vae_path)
        self.every, self.vae_decode, self.tile = every, vae_decode, tile
        self.config = read_vae_config(vae_path)
        # Resolved now, so a bad stored projection fails before the run rather than at its first step.
        self.projection = None if vae_decode else projection_for(vae_path)
        self._vae: WanVAE | None = None
        self.seconds = 0.0

    def render(self, x0: np.ndarray) -> Image.Image:
        if self.projection is not None:
            longest = max(x0.shape[-2:])
            return self.projection.to_image(x0, max(1, min(self.config.scale_factor, PREVIEW_SIDE // longest)))
        if self._vae is None:
            self._vae = load_vae(self.vae_path)
        overlap = 8 * min(8, self.tile // 16)
        with torch.no_grad():
            pixels = decode_tiled(self._vae, torch.from_numpy(np.asarray(x0[:1], dtype=np.float32)), self.tile, overlap)
        return _to_image(np.nan_to_num(pixels[0].permute(1, 2, 0).numpy(), nan=0.0).clip(0.0, 1.0))

    def __call__(self, event: StepEvent) -> None:
        if event.step % self.every and event.step != event.total:
            return
        started = time.perf_counter()
        save_png(self.render(event.x0), self.path, overwrite=True, durable=False)  # scratch: no fsync per step
        self.seconds += time.perf_counter() - started
