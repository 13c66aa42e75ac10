"""How a user's images enter a generation: the img2img init image and the inpainting mask.

A file or an upload becomes an `ImageInput` (its bytes and their sha256, the fingerprint a resume state keeps).
`open_image` decodes it with every check a file from outside needs: a size bound before reading, a pixel bound
read from the header before decoding (a 100-byte PNG can claim 20000x20000), a full decode so a truncated file
fails now, EXIF orientation applied. Everything that goes wrong is one AnimaError line naming the input.

The rest is A1111's img2img arithmetic (modules/images.py, modules/masking.py, modules/processing.py), in its
names and conventions: a mask is an 8-bit L image, white = repaint; resize modes, mask blur, the "fill" masked
content, the crop region of "inpaint only masked", and the overlay that pastes a result back so that the
unmasked pixels stay exactly the original's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import re
import stat

import numpy as np
import torch
from PIL import ExifTags, Image, ImageFilter, ImageOps, UnidentifiedImageError

from ..checks import check_choice, check_int, require, shown
from ..core.files import Unreadable, read_small_file
from ..errors import AnimaError

MAX_IMAGE_BYTES = 64 << 20  # a file or upload larger than this is refused before decoding
MAX_IMAGE_PIXELS = 8192 * 8192  # decompression-bomb bound: refused from the header, before decoding
# A side longer than this is refused from the header too: a 1 x 65535 picture passes the pixel bound, but a resize
# of it to cover a square makes a 64 x 4-million-pixel one on the way.
MAX_IMAGE_SIDE = 16384
# The largest picture a resize may make on its way (Pillow resizes across, then down: out_width x in_height),
# as many pixels as the largest input, so that no resize holds more than the input bound does.
MAX_RESIZE_PIXELS = MAX_IMAGE_PIXELS
RESIZE_MODES = ("just_resize", "crop_and_resize", "resize_and_fill")  # A1111's resize_mode 0, 1, 2
MASKED_CONTENT = ("fill", "original", "latent_noise", "latent_nothing")  # A1111's inpainting_fill 0..3
INPAINT_AREAS = ("whole", "masked")  # A1111's inpaint_full_res false / true

# The formats a user's picture comes in. Pillow reads dozens more (PCX, SGI, FLI, ...); decoders of formats nobody
# sends are attack surface for an upload, not features. (A phone's JPEG with an MPO block opens through JPEG.)
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF", "AVIF")

# EXIF orientation -> the transpose that shows the picture upright (as ImageOps.exif_transpose).
_UPRIGHT = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_SIDEWAYS = (5, 6, 7, 8)  # orientations whose upright picture swaps width and height
_ALPHA_MODES = ("RGBA", "LA", "PA", "RGBa")
_SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_REASON_CHARS = 100  # a decoder's own words, cut to this in a message


def _label(name: str) -> str:
    """`name` as a message shows it: as given, unless it would break the one line (a newline in a path)."""
    return name if name.isprintable() else shown(name, 200)


def _refused(name: str, why: str) -> AnimaError:
    return AnimaError(f"image {_label(name)}: {why}")


def _reason(error: Exception) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 3] + "..."


def _too_many_bytes(name: str) -> AnimaError:
    limit = f"{MAX_IMAGE_BYTES >> 20} MiB" if MAX_IMAGE_BYTES % (1 << 20) == 0 else f"{MAX_IMAGE_BYTES} bytes"
    return _refused(name, f"larger than {limit}")


def _too_many_pixels(name: str) -> AnimaError:
    # One wording whether the header check here or Pillow's own bomb check caught it.
    return _refused(name, f"more than {MAX_IMAGE_PIXELS} pixels, refused before decoding")


def _formats() -> list[str]:
    """IMAGE_FORMATS that this Pillow reads (AVIF only newer ones): Image.open fails on a name it lacks."""
    Image.init()  # every plugin registered, once
    return [name for name in IMAGE_FORMATS if name in Image.OPEN]


def _header(data: bytes, name: str) -> tuple[Image.Image, int]:
    """The image with only its header read (the pixels not decoded), and its EXIF orientation (1: upright)."""
    formats = _formats()
    try:
        image = Image.open(io.BytesIO(data), formats=formats)
        # The base class's getexif reads the header's EXIF only: PngImageFile's decodes all the pixels to look for
        # an eXIf chunk after them, and size() must not decode (nor may it disagree with open_image).
        orientation = Image.Image.getexif(image).get(ExifTags.Base.Orientation, 1)
    # Pillow warns above its own limit and refuses at twice it; both are caught where warnings are errors, and
    # the warnings filter is left alone (changing it is not thread-safe). Ours is lower: checked just below.
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise _too_many_pixels(name) from None
    except UnidentifiedImageError:
        raise _refused(name, f"not an image (this reads {', '.join(formats)})") from None
    except Exception as e:  # a decoder fails on bad bytes in its own way: ValueError, SyntaxError, struct.error...
        raise _refused(name, f"unreadable ({_reason(e)})") from None
    if image.width * image.height > MAX_IMAGE_PIXELS:
        raise _too_many_pixels(name)
    if max(image.size) > MAX_IMAGE_SIDE:
        raise _refused(name, f"{image.width}x{image.height} has a side over {MAX_IMAGE_SIDE} px, refused before "
                             "decoding")
    return image, orientation


def open_image(data: bytes, name: str) -> Image.Image:
    """The picture in `data`, decoded whole (a truncated or corrupt file fails here, not halfway through a run),
    turned upright by its EXIF orientation, its mode otherwise as stored; an animation's first frame. One
    AnimaError line naming `name` for bytes that are not an image, a truncated or corrupt file, and more than
    MAX_IMAGE_PIXELS pixels (read from the header, before decoding)."""
    image, orientation = _header(data, name)
    try:
        image.load()
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):  # a GIF frame's, a TIFF tile's size
        raise _too_many_pixels(name) from None
    except Exception as e:  # as in _header: "image file is truncated", a zlib error, a bad JPEG marker...
        raise _refused(name, f"truncated or corrupt ({_reason(e)})") from None
    upright = _UPRIGHT.get(orientation)
    return image.transpose(upright) if upright is not None else image


@dataclasses.dataclass(frozen=True, eq=False)
class ImageInput:
    """An image a run starts from: its file's bytes and a name saying where they came from.

    Equal (and hashed) by sha256 alone, so a resume state's settings, which keep only the fingerprint, compare
    equal to a run given the same file again."""

    data: bytes | None  # None: only the fingerprint is known (read back from a resume state / JSON record)
    name: str  # the path as given, or "upload"
    sha256: str  # hex digest of data

    @classmethod
    def from_path(cls, path: str | os.PathLike) -> ImageInput:
        name = os.fspath(path)
        try:
            info = os.stat(path)
        except FileNotFoundError:
            raise _refused(name, "no such file") from None
        except OSError as e:
            raise _refused(name, f"cannot read it: {e.strerror or e}") from None
        if stat.S_ISDIR(info.st_mode):
            raise _refused(name, "a folder, not a file")
        if info.st_size > MAX_IMAGE_BYTES:  # refused from its size, before a byte is read
            raise _too_many_bytes(name)
        try:
            data = read_small_file(path, MAX_IMAGE_BYTES)  # a FIFO is not waited on, a file grown since not read
        except Unreadable as e:
            raise _refused(name, str(e)) from None
        return cls.from_bytes(data, name)

    @classmethod
    def from_bytes(cls, data: bytes, name: str = "upload") -> ImageInput:
        if not data:
            raise _refused(name, "empty")
        if len(data) > MAX_IMAGE_BYTES:
            raise _too_many_bytes(name)
        data = bytes(data)
        return cls(data, name, hashlib.sha256(data).hexdigest())

    @classmethod
    def from_json(cls, value: object) -> ImageInput:
        """The fingerprint-only input as_json() wrote (a resume state's, a record's)."""
        if not (isinstance(value, dict) and value.keys() == {"name", "sha256"} and isinstance(value["name"], str)):
            raise AnimaError(f'an image record must be {{"name": ..., "sha256": ...}}, got {shown(value)}')
        if not (isinstance(value["sha256"], str) and _SHA256.fullmatch(value["sha256"])):
            raise _refused(value["name"], f"sha256 must be 64 lowercase hex digits, got {shown(value['sha256'])}")
        return cls(None, value["name"], value["sha256"])

    def as_json(self) -> dict[str, str]:
        return {"name": self.name, "sha256": self.sha256}

    def _data(self) -> bytes:
        if self.data is None:
            raise AnimaError(f"image {_label(self.name)} was given by fingerprint only: pass the file again")
        return self.data

    def open(self) -> Image.Image:
        return open_image(self._data(), self.name)

    def size(self) -> tuple[int, int]:
        """(width, height) of the upright picture, from the header alone: the pixels are not decoded (so a
        truncated file is caught by open(), not here), the pixel bound and the other header checks are made."""
        image, orientation = _header(self._data(), self.name)
        return image.size[::-1] if orientation in _SIDEWAYS else image.size

    def __eq__(self, other: object) -> bool:
        return self.sha256 == other.sha256 if isinstance(other, ImageInput) else NotImplemented

    def __hash__(self) -> int:
        return hash(self.sha256)

    def __repr__(self) -> str:
        return f"ImageInput({self.name!r}, {self.sha256[:12]!r})"


def _eight_bit(image: Image.Image) -> Image.Image:
    """An image of 16-bit or wider samples (I;16*, I, F) as 8-bit L; any other image as it is.

    Pillow's own convert clips such values to 0..255, which turns a 16-bit PNG white. Here they are read as 16-bit
    samples, the high byte kept (value >> 8: 0xFFFF -> 255, 0x8000 -> 128): a 16-bit PNG opens as I;16, or as I
    in older Pillows, so I is read the same way, and so is F (clipped to 0..65535 and floored: one rule for every
    wide mode; a float TIFF of values in 0..1, measurement data rather than a picture, comes out black)."""
    if image.mode in _SIXTEEN_BIT:
        samples = np.asarray(image).astype(np.uint16)
    elif image.mode in ("I", "F"):
        samples = np.clip(np.nan_to_num(np.asarray(image, dtype=np.float64)), 0, 65535).astype(np.uint16)
    else:
        return image
    return Image.fromarray((samples >> 8).astype(np.uint8))


def _has_alpha(image: Image.Image) -> bool:
    return image.mode in _ALPHA_MODES or "transparency" in image.info  # the latter: a tRNS colour or palette entry


def to_rgb(image: Image.Image, background: tuple[int, int, int] = (255, 255, 255)) -> Image.Image:
    """8-bit RGB from any mode. Transparency (RGBA, LA, a palette's or a tRNS colour) is composited over
    `background`: white, as A1111 flattens an init image. 16-bit and wider samples keep their high byte
    (_eight_bit says why); CMYK, 1, P and the rest by Pillow's conversions."""
    image = _eight_bit(image)
    if _has_alpha(image):
        base = Image.new("RGBA", image.size, (*background, 255))
        return Image.alpha_composite(base, image.convert("RGBA")).convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")


def to_mask(image: Image.Image, invert: bool = False) -> Image.Image:
    """An 8-bit L mask, white = repaint (A1111's convention), from any mode: the luminance, 16-bit samples read as
    to_rgb does. An image with an alpha channel that is not opaque everywhere is A1111's alpha mask
    (create_binary_mask): the alpha is the mask, opaque = repaint (a stroke on a transparent layer), kept soft
    rather than cut at 128 (the mask blur and the latent mask take soft values). `invert` swaps what is repainted
    (A1111's inpainting_mask_invert)."""
    image = _eight_bit(image)
    if image.mode in _ALPHA_MODES and (alpha := image.convert("RGBA").getchannel("A")).getextrema() != (255, 255):
        mask = alpha
    else:
        mask = image.convert("L")
    return ImageOps.invert(mask) if invert else mask


def mask_from_alpha(image: Image.Image) -> Image.Image:
    """OpenAI's edits convention: where the mask image is fully transparent (alpha 0) is repainted. Returns the L
    mask (255 = repaint)."""
    if not _has_alpha(image):
        raise AnimaError("the mask must have an alpha channel: OpenAI's edits paint where it is transparent")
    return image.convert("RGBA").getchannel("A").point([255] + [0] * 255)


def _edge_band(edge: Image.Image, size: tuple[int, int]) -> Image.Image:
    """A one-pixel row or column stretched across a band of `size`: each pixel repeated, exactly."""
    return edge.resize(size, Image.Resampling.NEAREST)


def resize_image(image: Image.Image, width: int, height: int, mode: str) -> Image.Image:
    """A1111's resize modes (modules/images.py resize_image, modes 0-2), Lanczos resampling:

    just_resize: stretched to width x height. crop_and_resize: scaled to cover width x height, the centre kept.
    resize_and_fill: scaled to fit, centred, and the empty bands filled with the picture's edge rows (or columns)
    stretched outward, as A1111 does. Each band has its own height here: A1111 gives the far one the near one's,
    which leaves a black line when the leftover is odd. The image keeps its mode (RGB or L)."""
    check_choice("resize mode", mode, RESIZE_MODES)
    check_int("resize width", width, 1)
    check_int("resize height", height, 1)
    check_resize(image.size, (width, height), mode)
    if mode == "just_resize":
        return image.resize((width, height), Image.Resampling.LANCZOS)
    # Which side decides, by cross-multiplying (no float ratios): wider = the picture is wider than the target.
    wider = image.width * height > width * image.height
    if mode == "crop_and_resize":
        # Floored, the covering side is still at least the target's: wider means image.width * height // image.height
        # >= width, and the same for the other side.
        scaled_w, scaled_h = ((image.width * height // image.height, height) if wider
                              else (width, image.height * width // image.width))
        scaled = image.resize((scaled_w, scaled_h), Image.Resampling.LANCZOS)
        left, top = scaled_w // 2 - width // 2, scaled_h // 2 - height // 2
        return scaled.crop((left, top, left + width, top + height))
    taller = image.width * height < width * image.height
    scaled_w = max(1, image.width * height // image.height) if taller else width
    scaled_h = max(1, image.height * width // image.width) if wider else height
    scaled = image.resize((scaled_w, scaled_h), Image.Resampling.LANCZOS)
    result = Image.new(image.mode, (width, height))
    left, top = width // 2 - scaled_w // 2, height // 2 - scaled_h // 2
    result.paste(scaled, (left, top))
    if wider:  # bands above and below
        bottom = height - top - scaled_h
        if top:
            result.paste(_edge_band(scaled.crop((0, 0, width, 1)), (width, top)), (0, 0))
        if bottom:
            result.paste(_edge_band(scaled.crop((0, scaled_h - 1, width, scaled_h)), (width, bottom)),
                         (0, top + scaled_h))
    elif taller:  # bands left and right
        right = width - left - scaled_w
        if left:
            result.paste(_edge_band(scaled.crop((0, 0, 1, height)), (left, height)), (0, 0))
        if right:
            result.paste(_edge_band(scaled.crop((scaled_w - 1, 0, scaled_w, height)), (right, height)),
                         (left + scaled_w, 0))
    return result


def _sizes_on_the_way(size: tuple[int, int], target: tuple[int, int], mode: str) -> list[tuple[int, int]]:
    """The pictures resize_image makes going from `size` to `target`: the scaled one, and Pillow's half-way one
    (it resizes across, then down: scaled width x input height)."""
    (in_w, in_h), (width, height) = size, target
    if mode == "crop_and_resize":  # scaled to cover (as resize_image computes it)
        scaled = (in_w * height // in_h, height) if in_w * height > width * in_h else (width, in_h * width // in_w)
    else:  # just_resize, and resize_and_fill's scaled-to-fit picture, never larger than the target
        scaled = target
    return [scaled, (scaled[0], in_h), target]


def check_resize(size: tuple[int, int], target: tuple[int, int], mode: str = "just_resize",
                 what: str = "the picture") -> None:
    """Refuse, before any pixel is touched, a resize from `size` to `target` that would make a picture of more than
    MAX_RESIZE_PIXELS pixels on its way (a 1 x 16384 picture covering 64 x 64 is first 64 x 1 million)."""
    for w, h in _sizes_on_the_way(size, target, mode):
        if w * h > MAX_RESIZE_PIXELS:
            raise AnimaError(f"{what}: resizing {size[0]}x{size[1]} to {target[0]}x{target[1]} ({mode}) would make "
                             f"a {w}x{h} picture on the way, over {MAX_RESIZE_PIXELS} pixels; choose a size nearer "
                             "its shape")


def blur_mask(mask: Image.Image, radius: int) -> Image.Image:
    """A1111's mask blur: Gaussian, radius `radius` px (0: unchanged)."""
    check_int("mask blur", radius, 0)
    return mask.filter(ImageFilter.GaussianBlur(radius)) if radius else mask


def inside(blurred: Image.Image, mask: Image.Image) -> Image.Image:
    """The blurred mask kept to where `mask` is not 0: the soft edge falls inside the mask, and every pixel outside
    it pastes back as the original's exactly (the mask blur would otherwise blend 8 px of the original around an
    outpainting's old edges)."""
    return Image.composite(blurred, Image.new("L", mask.size, 0), mask.convert("L").point([0] + [255] * 255))


def _require_same_size(what: str, image: Image.Image, base: Image.Image) -> None:
    require(image.size == base.size, f"the {what} is {image.width}x{image.height} but the image is "
                                     f"{base.width}x{base.height}; they must be the same size")


# A1111's fill (modules/masking.py fill): blurs of these radii, each composited that many times, large to small.
_FILL_BLURS = ((256, 1), (64, 1), (16, 2), (4, 4), (2, 2))


def _box_means(values: np.ndarray, half: int, axis: int) -> np.ndarray:
    """The mean over a window of 2 * half + 1 along `axis`, cut at the borders (the mean of what is inside).
    Shifted sums rather than a running sum: half is 2 (see _blur), and numpy's cumsum across rows is slow."""
    along = np.moveaxis(values, axis, 0)
    sums = along.copy()
    for shift in range(1, half + 1):
        sums[shift:] += along[:-shift]
        sums[:-shift] += along[shift:]
    index = np.arange(len(along))
    inside = np.minimum(index + half, len(along) - 1) - np.maximum(index - half, 0) + 1
    sums /= inside.reshape(-1, *[1] * (along.ndim - 1)).astype(along.dtype)
    return np.moveaxis(sums, 0, axis)


def _resized(values: np.ndarray, size: tuple[int, int], resample: Image.Resampling) -> np.ndarray:
    """Each channel of an H x W x C float array resized by Pillow (in floats, mode F) to size = (width, height)."""
    return np.stack([np.asarray(Image.fromarray(np.ascontiguousarray(values[..., c])).resize(size, resample))
                     for c in range(values.shape[2])], axis=2)


def _blur(values: np.ndarray, sigma: int) -> np.ndarray:
    """A Gaussian of standard deviation ~`sigma` over the first two axes of an H x W x C float array.

    Three box blurs, each of variance half * (half + 1) / 3 (the central limit theorem), as Pillow's GaussianBlur
    does; Pillow's own takes only 8-bit images, and the weights here need floats (a pixel far from any unmasked
    one has a weight far below 1/255). A blur of sigma is smooth over sigma / 2 pixels (its spectrum at the
    Nyquist frequency of a grid that coarse is exp(-2 pi^2), 3e-9, of its peak), so a wide one is computed on that
    grid (area-averaged down, bilinear back up): the 256-px blur of a 2048-px image on 16 x 16, in 2-px blurs."""
    height, width = values.shape[:2]
    factor = max(1, sigma // 2)
    if factor > 1:
        small = _resized(values, (-(-width // factor), -(-height // factor)), Image.Resampling.BOX)
        return _resized(_blur(small, sigma // factor), (width, height), Image.Resampling.BILINEAR)
    half = max(1, round((sigma * sigma + 0.25) ** 0.5 - 0.5))
    for axis in (0, 1):
        for _ in range(3):
            values = _box_means(values, half, axis)
    return values


def fill_masked(image: Image.Image, mask: Image.Image) -> Image.Image:
    """A1111's "fill" masked content: the masked (white) pixels of an RGB image replaced by colours spread in from
    the unmasked ones, so the model starts from the surroundings' colours. Unmasked pixels are unchanged exactly.

    As A1111: blurs of the unmasked pixels at falling radii composited one over the other, each with alpha = how
    much unmasked area its blur gathered, the original itself last (alpha = 1 - mask). A1111 blurs premultiplied
    8-bit RGBa, whose colours far from the unmasked area are rounded away; here each blur is a normalised
    convolution in floats (blur(colour * weight) / blur(weight)), and the bottom layer is the mean colour of the
    unmasked pixels, so every masked pixel gets a colour. An all-white mask: the image's mean colour."""
    _require_same_size("mask", mask, image)
    pixels = np.asarray(image, dtype=np.float32)
    weight = 1 - np.asarray(mask.convert("L"), dtype=np.float32)[..., None] / 255  # 1 = unmasked, keep its colour
    total = float(weight.sum())
    mean = (pixels * weight).sum((0, 1)) / total if total > 0 else pixels.mean((0, 1))
    filled = np.broadcast_to(mean, pixels.shape).copy()
    for radius, repeats in _FILL_BLURS:
        gathered = _blur(np.concatenate([pixels * weight, weight], axis=2), radius)
        area = gathered[..., 3:]
        # Clipped: where the gathered area is float noise (a pixel far from any unmasked one), so is the colour.
        colour = np.clip(np.divide(gathered[..., :3], area, out=np.zeros_like(pixels), where=area > 0), 0, 255)
        alpha = 1 - (1 - np.clip(area, 0, 1)) ** repeats  # `repeats` composites of the same layer
        filled += (colour - filled) * alpha
    filled += (pixels - filled) * weight  # weight 1: exactly the pixel again (within float error, rounded away)
    return Image.fromarray(np.clip(np.rint(filled), 0, 255).astype(np.uint8))


def mask_box(mask: Image.Image, padding: int) -> tuple[int, int, int, int] | None:
    """The bounding box (left, top, right, bottom; right and bottom exclusive) of the mask's non-zero pixels grown
    by `padding` px and clipped to the image, as A1111's get_crop_region; None for an empty mask."""
    check_int("inpaint padding", padding, 0)
    box = mask.convert("L").getbbox()
    if box is None:
        return None
    left, top, right, bottom = box
    return (max(left - padding, 0), max(top - padding, 0),
            min(right + padding, mask.width), min(bottom + padding, mask.height))


def _grow(low: int, high: int, size: int, limit: int) -> tuple[int, int]:
    """The span [low, high) grown about its centre to `size`, shifted to lie inside [0, limit) where it fits, else
    cut to it."""
    low -= (size - (high - low)) // 2
    high = low + size
    if high > limit:
        low, high = low - (high - limit), limit
    if low < 0:
        low, high = 0, min(high - low, limit)
    return low, high


def expand_box(box: tuple[int, int, int, int], width: int, height: int, image_w: int,
               image_h: int) -> tuple[int, int, int, int]:
    """A1111's expand_crop_region: the box grown on its short side to the width:height aspect ratio (rounded to
    the nearest pixel, where A1111 truncates), shifted to stay inside the image_w x image_h image where it can, so
    the crop, resized to width x height, is not distorted; where the grown side exceeds the image it is cut to
    the image, as in A1111."""
    left, top, right, bottom = box
    require(0 <= left < right <= image_w and 0 <= top < bottom <= image_h,
            f"the box {box} must be a non-empty part of the {image_w}x{image_h} image")
    box_w, box_h = right - left, bottom - top
    if box_w * height > box_h * width:  # wider than width:height: grow the height
        top, bottom = _grow(top, bottom, (2 * box_w * height + width) // (2 * width), image_h)
    else:
        left, right = _grow(left, right, (2 * box_h * width + height) // (2 * height), image_w)
    return left, top, right, bottom


def outpaint_canvas(image: Image.Image, left: int, top: int, right: int,
                    bottom: int) -> tuple[Image.Image, Image.Image]:
    """The RGB or L image on a canvas grown by those pixels on each side, the new area holding the image's edge
    pixels stretched outward (the corners its corner pixels: a start for "fill"), and the L mask that is 255 on the
    new area and 0 on the original."""
    amounts = {"left": left, "top": top, "right": right, "bottom": bottom}
    for side, amount in amounts.items():
        check_int(f"outpaint {side}", amount, 0)
    require(any(amounts.values()), "outpainting needs at least one side to grow by a pixel or more")
    canvas_w, canvas_h = image.width + left + right, image.height + top + bottom
    require(canvas_w * canvas_h <= MAX_IMAGE_PIXELS,
            f"the outpainted canvas {canvas_w}x{canvas_h} is more than {MAX_IMAGE_PIXELS} pixels")
    pixels = np.asarray(image)
    pad = ((top, bottom), (left, right)) + ((0, 0),) * (pixels.ndim - 2)
    mask = np.full((canvas_h, canvas_w), 255, dtype=np.uint8)
    mask[top: top + image.height, left: left + image.width] = 0
    return Image.fromarray(np.pad(pixels, pad, mode="edge")), Image.fromarray(mask)


def paste_back(original: Image.Image, result: Image.Image, box: tuple[int, int, int, int] | None,
               mask: Image.Image) -> Image.Image:
    """A1111's overlay: `result` (resized to the box's size when box is given, with Lanczos; box None: result has
    the original's size) composited over `original` with `mask` (the blurred L mask, the original's size) as
    alpha: mask 0 keeps the original's pixels exactly, 255 takes the result's."""
    _require_same_size("mask", mask, original)
    result = result.convert(original.mode)
    if box is None:
        _require_same_size("result", result, original)
        placed = result
    else:
        left, top, right, bottom = box
        placed = original.copy()  # outside the box there is no result: the original, whatever the mask says
        placed.paste(result.resize((right - left, bottom - top), Image.Resampling.LANCZOS), (left, top))
    return Image.composite(placed, original, mask.convert("L"))


def image_to_tensor(image: Image.Image) -> torch.Tensor:
    """An RGB image as float32 [1, 3, H, W] in [0, 1]."""
    if image.mode != "RGB":
        raise ValueError(f"image_to_tensor takes an RGB image (to_rgb makes one), got mode {image.mode}")
    pixels = np.asarray(image, dtype=np.float32) / 255
    return torch.from_numpy(pixels).permute(2, 0, 1).unsqueeze(0).contiguous()


def latent_mask(mask: Image.Image, latent_w: int, latent_h: int) -> np.ndarray:
    """The pixel mask at latent resolution, float32 [1, 1, latent_h, latent_w] in [0, 1] (1 = repaint)."""
    check_int("latent width", latent_w, 1)
    check_int("latent height", latent_h, 1)
    # BOX: each latent pixel gets the share of its own patch of pixels that is masked, so a soft edge keeps its
    # values and a latent pixel wholly outside the mask stays exactly 0. Pillow's BILINEAR (and the rest) widen
    # their kernel by the scale when shrinking, reaching into the neighbouring patches: a hard edge on the 8-px
    # grid would repaint a ring of latent pixels that hold no masked pixel. In floats ("F"), not rounded to 8 bits.
    small = mask.convert("L").convert("F").resize((latent_w, latent_h), Image.Resampling.BOX)
    return np.clip(np.asarray(small, dtype=np.float32) / 255, 0, 1)[None, None]
