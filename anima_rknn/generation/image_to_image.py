"""What an image-to-image run starts from, and how its result goes back into the picture.

In pixels (`Source`): the init image at the size the model works at (resized by the resize mode, or, inpainting
only the masked area, the crop around the mask), the blurred mask there, and what the decoded result is pasted
over: A1111's overlay, which keeps every pixel outside the mask exactly. In latents (`start_latent`): the
encoded image with the masked content applied, noised to the first sigma of the truncated schedule,
x = (1 - sigma) z + sigma eps, as diffusers' flow-matching img2img pipelines noise it (scheduler.scale_noise).
Hires fix: the first pass's latent or image upscaled to the hires size (`upscale_latent`, `upscale_image`).
Everything here is checked before any model loads: prepare_source runs in AnimaPipeline.prepare.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from ..errors import AnimaError
from ..sampling.inpaint import Inpaint
from .images import (
    MAX_IMAGE_PIXELS,
    blur_mask,
    check_resize,
    inside,
    expand_box,
    fill_masked,
    latent_mask,
    mask_box,
    outpaint_canvas,
    paste_back,
    resize_image,
    to_mask,
    to_rgb,
)
from .params import GenerationParams

_LATENT_MODES = {"latent": "bilinear", "latent-bicubic": "bicubic", "latent-nearest-exact": "nearest-exact"}


@dataclasses.dataclass
class Source:
    """An img2img or inpainting run's start in pixels, at the working size (the run's width x height)."""

    image: Image.Image  # RGB, what the VAE encodes (the masked area filled when masked content is "fill")
    mask: Image.Image | None  # L, blurred, 255 = repaint; None: img2img of the whole picture
    original: Image.Image  # the picture the result goes back into (the working image, or the whole init image)
    paste_mask: Image.Image | None  # the blurred mask at the original's size
    box: tuple[int, int, int, int] | None  # where an only-masked crop came from in the original


def check_sizes(params: GenerationParams) -> None:
    """Every picture the run's resizes, outpainting and hires fix make on the way, bounded from the images'
    headers and the settings alone, before a pixel is decoded (check_resize's bound): one AnimaError line naming
    the step and the limit."""
    if params.init_image is not None:
        width, height = params.init_image.size()
        if params.mask is not None:
            params.mask.size()  # its header's bounds
        if params.outpaint is not None:
            left, top, right, bottom = params.outpaint
            width, height = width + left + right, height + top + bottom
            if width * height > MAX_IMAGE_PIXELS:
                raise AnimaError(f"the outpainted canvas {width}x{height} is more than {MAX_IMAGE_PIXELS} pixels")
        if params.inpaint_area != "masked" or (params.mask is None and params.outpaint is None):
            check_resize((width, height), (params.width, params.height), params.resize_mode, "the init image")
    if params.hires:
        target = params.hires_size()
        if params.hires_upscaler == "lanczos":
            check_resize((params.width, params.height), target, "crop_and_resize", "the hires fix")
        else:  # the latent is interpolated to cover the hires size: bounded in the pixels it stands for
            cover = _cover(params.width // 8, params.height // 8, target[0] // 8, target[1] // 8)
            check_resize((params.width, params.height), (cover[0] * 8, cover[1] * 8), "just_resize", "the hires fix")


def prepare_source(params: GenerationParams) -> Source | None:
    """The run's Source (None without an init image), every size on the way checked first (check_sizes); a bad
    image or mask is one AnimaError line."""
    check_sizes(params)
    if params.init_image is None:
        return None
    width, height = params.width, params.height
    image = to_rgb(params.init_image.open())
    if params.outpaint is not None:
        image, mask = outpaint_canvas(image, *params.outpaint)
    elif params.mask is not None:
        mask = to_mask(params.mask.open(), invert=params.invert_mask)
        if mask.size != image.size:
            raise AnimaError(f"the mask is {mask.width}x{mask.height} px, the init image {image.width}x"
                             f"{image.height}: give a mask of the image's size")
        if mask.getbbox() is None:
            raise AnimaError("the mask is empty (nothing in it is white): nothing would be repainted; leave the mask "
                             "out for img2img of the whole picture" + (" or drop --invert-mask" if params.invert_mask
                                                                       else ""))
    else:
        resized = resize_image(image, width, height, params.resize_mode)
        return Source(resized, None, resized, None, None)
    if params.inpaint_area == "masked":
        blurred = blur_mask(mask, params.mask_blur)
        box = expand_box(mask_box(blurred, params.inpaint_padding), width, height, image.width, image.height)
        work = image.crop(box).resize((width, height), Image.Resampling.LANCZOS)
        work_mask = blurred.crop(box).resize((width, height), Image.Resampling.LANCZOS)
        return Source(_filled(work, work_mask, params), work_mask, image, inside(blurred, mask), box)
    work = resize_image(image, width, height, params.resize_mode)
    sharp = resize_image(mask, width, height, params.resize_mode)
    work_mask = blur_mask(sharp, params.mask_blur)
    return Source(_filled(work, work_mask, params), work_mask, work, inside(work_mask, sharp), None)


def _filled(image: Image.Image, mask: Image.Image, params: GenerationParams) -> Image.Image:
    return fill_masked(image, mask) if params.masked_content == "fill" else image


def noised(latent: np.ndarray, noise: np.ndarray, sigma: float) -> np.ndarray:
    """The latent noised to `sigma` on the flow's straight path (diffusers' FlowMatch scale_noise)."""
    return ((1.0 - sigma) * latent + sigma * noise).astype(np.float32)


def start_latent(latent: np.ndarray, noise: np.ndarray, sigma: float, source: Source,
                 params: GenerationParams, content_noise: np.ndarray) -> tuple[np.ndarray, Inpaint | None]:
    """The first latent of an img2img / inpainting pass, and the Inpaint that holds the unmasked part.

    The masked content replaces the masked latent pixels before the noise is added, as A1111 does with its
    rounded latent mask: latent noise (`content_noise`, a draw of its own) or nothing (zeros). Only the start:
    what the Inpaint keeps outside the mask, a soft edge's share included, is the original's latent."""
    if source.mask is None:
        return noised(latent, noise, sigma), None
    mask = latent_mask(source.mask, latent.shape[-1], latent.shape[-2])
    start = latent
    if params.masked_content in ("latent_noise", "latent_nothing"):
        fill = content_noise if params.masked_content == "latent_noise" else np.zeros_like(latent)
        start = np.where(np.round(mask) > 0, fill, latent).astype(np.float32)
    return noised(start, noise, sigma), Inpaint(latent, noise, mask)


def finish(image: Image.Image, source: Source | None) -> Image.Image:
    """The decoded picture back into the original: pasted over it with the blurred mask (outside the mask the
    original's pixels, exactly), an only-masked crop into its box; img2img without a mask as decoded."""
    if source is None or source.mask is None:
        return image
    return paste_back(source.original, image, source.box, source.paste_mask)


def _cover(width: int, height: int, target_w: int, target_h: int) -> tuple[int, int]:
    """The size width x height scales to so it covers target_w x target_h (then centre-cropped)."""
    scale = max(target_w / width, target_h / height)
    return max(target_w, round(width * scale)), max(target_h, round(height * scale))


def upscale_latent(latent: np.ndarray, width: int, height: int, upscaler: str) -> np.ndarray:
    """The first pass's latent at the hires size (width x height pixels): interpolated by torch (A1111's "Latent"
    upscalers, no antialiasing) to cover it, then centre-cropped where the aspect ratio changes."""
    target_w, target_h = width // 8, height // 8
    cover_w, cover_h = _cover(latent.shape[-1], latent.shape[-2], target_w, target_h)
    mode = _LATENT_MODES[upscaler]
    up = F.interpolate(torch.from_numpy(latent), size=(cover_h, cover_w), mode=mode,
                       **({} if mode == "nearest-exact" else {"align_corners": False})).numpy()
    top, left = (cover_h - target_h) // 2, (cover_w - target_w) // 2
    return np.ascontiguousarray(up[..., top : top + target_h, left : left + target_w], dtype=np.float32)


def upscale_image(image: Image.Image, width: int, height: int) -> Image.Image:
    """The first pass's picture at the hires size: Lanczos, scaled to cover and centre-cropped."""
    return resize_image(image, width, height, "crop_and_resize")
