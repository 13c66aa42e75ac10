"""WebUI's picture tools without a model: /sdapi/v1/png-info (the `parameters` a PNG carries, read back as WebUI
parses them) and the extras (/extra-single-image, /extra-batch-images) with the upscalers this server has.

The upscalers are resizes: "Lanczos" is PIL's Lanczos, as WebUI's own upscaler of that name; "None" leaves the
picture as it is, as in WebUI's extras. WebUI's other extras (face restoration, a second upscaler blended in, a
caption) are refused when asked for, never skipped with a 200. An upscaled picture over MAX_IMAGE_PIXELS (the
bound every uploaded picture is held to) is refused before it is made.
"""

from __future__ import annotations

import io
import re
from typing import Any

from PIL import Image

from ..checks import check_number, shown
from ..generation.images import MAX_IMAGE_PIXELS
from .requests import BadRequest, decode_image

# The extras' upscalers: WebUI's name -> PIL's filter (None: no resize).
EXTRAS_UPSCALERS: dict[str, Image.Resampling | None] = {"None": None, "Lanczos": Image.Resampling.LANCZOS}
MAX_UPSCALE = 8.0  # WebUI's slider bound for upscaling_resize
MAX_BATCH = 16  # pictures in one /extra-batch-images request
# One "Key: value" of an infotext's last line, the value quoted when it holds a comma (WebUI's re_param).
_PARAM = re.compile(r'\s*(\w[\w \-/]+):\s*("(?:\\.|[^\\"])+"|[^,]*)(?:,|$)')
_SIZE = re.compile(r"(\d+)x(\d+)")


def parse_infotext(text: str) -> dict[str, str]:
    """An A1111 `parameters` text as WebUI's parse_generation_parameters reads it: Prompt, Negative prompt, each
    field of the last line (quotes taken off), and Size as Size-1 / Size-2."""
    *lines, last = text.strip().split("\n")
    if len(_PARAM.findall(last)) < 3:  # no settings line: it is all prompt
        lines, last = [*lines, last], ""
    prompt, negative, in_negative = [], [], False
    for line in lines:
        if line.startswith("Negative prompt:"):
            in_negative, line = True, line.removeprefix("Negative prompt:").strip()
        (negative if in_negative else prompt).append(line)
    found = {"Prompt": "\n".join(prompt), "Negative prompt": "\n".join(negative)}
    for key, value in _PARAM.findall(last):
        value = value.strip()
        if len(value) > 1 and value[0] == value[-1] == '"':
            value = value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
        size = _SIZE.fullmatch(value)
        if size is not None and key.strip() == "Size":
            found["Size-1"], found["Size-2"] = size[1], size[2]
        found[key.strip()] = value
    return found


def png_info(value: Any) -> dict[str, Any]:
    """/png-info's answer for the image in `value` (base64): WebUI's info, items and parameters. A file that is not
    an image, or a picture without a `parameters` text, is a 400 saying so."""
    image = decode_image("image", value).open()
    texts = {key: text for key, text in image.info.items() if isinstance(text, str)}
    info = texts.pop("parameters", None)
    if not info:
        raise BadRequest("image: the picture holds no generation parameters (no `parameters` text): it was not "
                         "made by this server or WebUI, or they were stripped")
    return {"info": info, "items": texts, "parameters": parse_infotext(info)}


def _ranged(body: dict[str, Any], field: str, default: float, low: float, high: float) -> float:
    """A number field from `low` to `high` (checks.check_number's one-line refusal, a 400), `default` if absent."""
    value = body.get(field)
    return float(check_number(field, default if value is None else value, low, high))


def _refuse_unsupported(body: dict[str, Any]) -> None:
    """What WebUI's extras would do besides the upscale, refused where asked for."""
    for field, what in (("gfpgan_visibility", "face restoration (GFPGAN)"),
                        ("codeformer_visibility", "face restoration (CodeFormer)"),
                        ("extras_upscaler_2_visibility", "a second upscaler")):
        if _ranged(body, field, 0.0, 0.0, 1.0) > 0:
            raise BadRequest(f"{field}: {what} is not supported by this server; leave it at 0")


def _upscaler(body: dict[str, Any]) -> Image.Resampling | None:
    name = body.get("upscaler_1", "None")
    if not isinstance(name, str) or name not in EXTRAS_UPSCALERS:
        raise BadRequest(f"upscaler_1 {shown(name)}: this server's upscalers are {', '.join(EXTRAS_UPSCALERS)}")
    return EXTRAS_UPSCALERS[name]


def target_size(body: dict[str, Any], width: int, height: int,
                resizing: bool = True) -> tuple[tuple[int, int], bool]:
    """The size an extras request asks for (resize_mode 0: times upscaling_resize; 1: upscaling_resize_w x _h,
    cropped to it when upscaling_crop, as WebUI), and whether to crop; when `resizing`, refused past
    MAX_IMAGE_PIXELS."""
    mode = body.get("resize_mode", 0)
    if mode not in (0, 1) or isinstance(mode, bool):
        raise BadRequest(f"resize_mode must be 0 (scale by upscaling_resize) or 1 (to upscaling_resize_w x "
                         f"upscaling_resize_h), got {shown(mode)}")
    crop = False
    if mode == 0:
        scale = _ranged(body, "upscaling_resize", 2.0, 1.0, MAX_UPSCALE)
        size = (round(width * scale), round(height * scale))
    else:
        size = (int(_ranged(body, "upscaling_resize_w", 512, 1, 1 << 16)),
                int(_ranged(body, "upscaling_resize_h", 512, 1, 1 << 16)))
        crop = body.get("upscaling_crop", True) is not False
    if resizing and size[0] * size[1] > MAX_IMAGE_PIXELS:
        raise BadRequest(f"the upscaled picture would be {size[0]}x{size[1]}, over this server's bound of "
                         f"{MAX_IMAGE_PIXELS} pixels: ask for a smaller size")
    return size, crop


def upscale(body: dict[str, Any], value: Any, field: str = "image") -> bytes:
    """One picture of an extras request, resized as it asks, as a PNG."""
    _refuse_unsupported(body)
    resample = _upscaler(body)
    image = decode_image(field, value).open()
    image = image.convert("RGBA" if "A" in image.getbands() or "transparency" in image.info else "RGB")
    size, crop = target_size(body, image.width, image.height, resizing=resample is not None)  # None: no resize
    if resample is not None:
        if crop:  # cover the box, then cut its middle out, as WebUI's "crop to fit"
            ratio = max(size[0] / image.width, size[1] / image.height)
            cover = (max(size[0], round(image.width * ratio)), max(size[1], round(image.height * ratio)))
            image = image.resize(cover, resample)
            left, top = (cover[0] - size[0]) // 2, (cover[1] - size[1]) // 2
            image = image.crop((left, top, left + size[0], top + size[1]))
        else:
            image = image.resize(size, resample)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def batch_images(body: dict[str, Any]) -> list[Any]:
    """/extra-batch-images' imageList: [{"data": base64, "name": ...}, ...], one to MAX_BATCH."""
    listed = body.get("imageList")
    if not (isinstance(listed, list) and 1 <= len(listed) <= MAX_BATCH
            and all(isinstance(item, dict) and "data" in item for item in listed)):
        raise BadRequest(f'imageList must be a list of 1 to {MAX_BATCH} {{"data": BASE64, "name": NAME}} objects')
    return [item["data"] for item in listed]
