"""How a user's images enter a generation (generation/images.py): files and uploads opened with every check (each
failure one AnimaError line naming the input), any mode made RGB or an L mask, and A1111's img2img arithmetic
(resize modes, mask blur, "fill", the crop region of "only masked", outpainting, the overlay), checked against
closed forms and exact pixel values on real files written with PIL."""

from __future__ import annotations

import hashlib
import io
import json
import os
import struct
import warnings
import zlib

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from PIL import ExifTags, Image

from anima_rknn.errors import AnimaError
from anima_rknn.generation import images
from anima_rknn.generation.images import (
    RESIZE_MODES,
    ImageInput,
    blur_mask,
    expand_box,
    fill_masked,
    image_to_tensor,
    latent_mask,
    mask_box,
    mask_from_alpha,
    open_image,
    outpaint_canvas,
    paste_back,
    resize_image,
    to_mask,
    to_rgb,
)

RED, GREEN, BLUE, WHITE, BLACK = (255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 255), (0, 0, 0)


def encoded(image: Image.Image, format: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=format, **options)
    return buffer.getvalue()


def array(image: Image.Image) -> np.ndarray:
    return np.asarray(image).astype(int)


def refused(call, *args, naming: str) -> str:
    """The message of the AnimaError `call(*args)` must raise: one line that names the input."""
    with pytest.raises(AnimaError) as raised:
        call(*args)
    message = str(raised.value)
    assert "\n" not in message and naming in message, message
    return message


def patterned(width: int = 12, height: int = 8) -> Image.Image:
    """An RGB image whose every pixel differs: (x * 20, y * 30, 100)."""
    x, y = np.meshgrid(np.arange(width), np.arange(height))
    return Image.fromarray(np.stack([x * 20, y * 30, np.full_like(x, 100)], axis=2).astype(np.uint8))


def with_ihdr_size(png: bytes, width: int, height: int) -> bytes:
    """A real PNG whose header claims another size, with the header's CRC made right again."""
    data = bytearray(png)
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


# ------------------------------------------------------------------------------------------------------ opening


@pytest.mark.parametrize("format, options", [("PNG", {}), ("WEBP", {"lossless": True}), ("BMP", {}),
                                             ("TIFF", {})])
def test_lossless_formats_round_trip_exactly(format, options):
    image = patterned()
    opened = open_image(encoded(image, format, **options), f"picture.{format.lower()}")
    assert opened.size == (12, 8)
    assert np.array_equal(array(to_rgb(opened)), array(image))


def test_a_jpeg_opens_close_to_what_was_saved():
    image = Image.new("RGB", (32, 16), (200, 40, 90))
    opened = open_image(encoded(image, "JPEG", quality=95), "photo.jpg")
    assert opened.mode == "RGB" and opened.size == (32, 16)
    assert np.abs(array(opened) - (200, 40, 90)).max() <= 3


def test_an_animated_gif_opens_its_first_frame():
    frames = [Image.new("RGB", (8, 8), RED), Image.new("RGB", (8, 8), BLUE)]
    data = encoded(frames[0], "GIF", save_all=True, append_images=frames[1:])
    assert Image.open(io.BytesIO(data)).n_frames == 2
    opened = open_image(data, "anim.gif")
    assert opened.mode == "P" and to_rgb(opened).getpixel((4, 4)) == RED


def test_exif_orientation_6_turns_the_picture_upright():
    # Stored 40 wide, 20 tall, its top-left 10x10 red. Orientation 6: shown turned a quarter clockwise, so the
    # picture is 20 wide and 40 tall and the stored top-left corner is its top-right corner.
    stored = Image.new("RGB", (40, 20), BLUE)
    stored.paste(RED, (0, 0, 10, 10))
    exif = Image.Exif()
    exif[ExifTags.Base.Orientation] = 6
    data = encoded(stored, "JPEG", quality=95, exif=exif)
    upright = open_image(data, "phone.jpg")
    assert upright.size == (20, 40)
    assert np.abs(np.array(upright.getpixel((15, 4))) - RED).max() <= 8
    assert np.abs(np.array(upright.getpixel((4, 4))) - BLUE).max() <= 8
    assert ImageInput.from_bytes(data).size() == (20, 40)  # from the header, turned the same way


def test_size_reads_the_header_without_decoding_the_pixels():
    png = encoded(patterned(64, 48), "PNG")
    cut = ImageInput.from_bytes(png[: len(png) // 2], "cut.png")
    assert cut.size() == (64, 48)  # the pixels are missing, and not looked at
    refused(cut.open, naming="cut.png")


@pytest.mark.parametrize("data, why", [
    (b"hello, this is a text file\n", "not an image"),
    (b"", "not an image"),
    (encoded(Image.new("RGB", (64, 64), RED), "PNG")[:20], "unreadable"),  # cut inside the header
])
def test_bytes_that_are_not_an_image_are_refused_naming_the_input(data, why):
    assert why in refused(open_image, data, "notes.txt", naming="notes.txt")


def test_a_truncated_png_is_refused_when_opened_not_later():
    noise = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    png = encoded(Image.fromarray(noise), "PNG")
    assert "truncated or corrupt" in refused(open_image, png[: len(png) // 2], "half.png", naming="half.png")


def test_a_corrupt_jpeg_is_refused():
    jpeg = bytearray(encoded(patterned(64, 64), "JPEG"))
    jpeg[200:400] = bytes(200)  # scan data and tables zeroed
    refused(open_image, bytes(jpeg[:300]), "broken.jpg", naming="broken.jpg")


def test_a_decompression_bomb_is_refused_from_its_header():
    bomb = with_ihdr_size(encoded(Image.new("L", (8, 8)), "PNG"), 20000, 20000)  # 400 megapixels claimed
    assert "more than" in refused(open_image, bomb, "bomb.png", naming="bomb.png")
    refused(ImageInput.from_bytes(bomb, "bomb.png").size, naming="bomb.png")


def test_pillows_bomb_warning_raised_as_an_error_is_the_same_refusal():
    # 100 megapixels: over Pillow's warning limit, under its error limit; where warnings are errors.
    bomb = with_ihdr_size(encoded(Image.new("L", (8, 8)), "PNG"), 10000, 10000)
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        assert "more than" in refused(open_image, bomb, "bomb.png", naming="bomb.png")


def test_the_pixel_bound_is_width_times_height(monkeypatch):
    data = encoded(Image.new("RGB", (10, 10)), "PNG")
    monkeypatch.setattr(images, "MAX_IMAGE_PIXELS", 100)
    assert open_image(data, "ok.png").size == (10, 10)
    monkeypatch.setattr(images, "MAX_IMAGE_PIXELS", 99)
    assert "more than 99 pixels" in refused(open_image, data, "big.png", naming="big.png")


def test_formats_outside_the_list_are_refused():
    # Pillow reads PCX; a picture from a user does not come in it, and its decoder is not exposed to uploads.
    refused(open_image, encoded(Image.new("RGB", (4, 4)), "PCX"), "old.pcx", naming="old.pcx")


# ------------------------------------------------------------------------------------------------- ImageInput


def test_an_input_from_a_path_holds_its_bytes_and_their_sha256(tmp_path):
    path = tmp_path / "init.png"
    path.write_bytes(encoded(patterned(), "PNG"))
    given = ImageInput.from_path(path)
    assert given.name == str(path) and given.data == path.read_bytes()
    assert given.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert np.array_equal(array(given.open()), array(patterned()))
    assert given.size() == (12, 8)


def test_a_missing_file_a_folder_and_a_fifo_are_refused(tmp_path):
    assert "no such file" in refused(ImageInput.from_path, tmp_path / "gone.png", naming="gone.png")
    assert "folder" in refused(ImageInput.from_path, tmp_path, naming=str(tmp_path))
    os.mkfifo(tmp_path / "pipe")
    assert "not a regular file" in refused(ImageInput.from_path, tmp_path / "pipe", naming="pipe")  # not waited on


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_file_is_refused(tmp_path):
    path = tmp_path / "secret.png"
    path.write_bytes(encoded(patterned(), "PNG"))
    path.chmod(0)
    assert "cannot read" in refused(ImageInput.from_path, path, naming="secret.png")


def test_a_file_over_the_byte_bound_is_refused_from_its_size(tmp_path):
    path = tmp_path / "huge.png"
    with open(path, "wb") as f:
        f.truncate(images.MAX_IMAGE_BYTES + 1)  # sparse: no 64 MiB written
    assert "larger than 64 MiB" in refused(ImageInput.from_path, path, naming="huge.png")


def test_empty_and_oversized_uploads_are_refused(monkeypatch):
    assert "empty" in refused(ImageInput.from_bytes, b"", naming="upload")
    monkeypatch.setattr(images, "MAX_IMAGE_BYTES", 100)
    assert ImageInput.from_bytes(bytes(100)).name == "upload"
    assert "larger than 100 bytes" in refused(ImageInput.from_bytes, bytes(101), "big", naming="big")


def test_inputs_are_equal_and_hashed_by_sha256_alone():
    data = encoded(patterned(), "PNG")
    from_path_like = ImageInput.from_bytes(data, "a.png")
    upload = ImageInput.from_bytes(data)
    fingerprint = ImageInput.from_json(upload.as_json())
    other = ImageInput.from_bytes(encoded(Image.new("RGB", (2, 2)), "PNG"))
    assert from_path_like == upload == fingerprint and hash(from_path_like) == hash(fingerprint)
    assert other != upload and len({from_path_like, upload, fingerprint, other}) == 2
    assert upload != upload.sha256  # only another input compares
    assert repr(upload) == f"ImageInput('upload', {upload.sha256[:12]!r})"


def test_as_json_round_trips_through_json_text():
    given = ImageInput.from_bytes(b"\x89PNG some bytes", "in/it.png")
    record = json.loads(json.dumps(given.as_json()))
    assert record == {"name": "in/it.png", "sha256": hashlib.sha256(b"\x89PNG some bytes").hexdigest()}
    back = ImageInput.from_json(record)
    assert back == given and back.data is None and back.name == "in/it.png"


GOOD_SHA = "0" * 64


@pytest.mark.parametrize("value", [
    None, [], "a.png", {"name": "a.png"}, {"sha256": GOOD_SHA}, {"name": 3, "sha256": GOOD_SHA},
    {"name": "a.png", "sha256": GOOD_SHA, "data": "..."}, {"name": "a.png", "sha256": "A" * 64},
    {"name": "a.png", "sha256": "0" * 63}, {"name": "a.png", "sha256": "g" * 64}, {"name": "a.png", "sha256": 0},
])
def test_from_json_refuses_anything_but_a_record(value):
    with pytest.raises(AnimaError) as raised:
        ImageInput.from_json(value)
    assert "\n" not in str(raised.value)


def test_a_fingerprint_only_input_cannot_be_opened():
    fingerprint = ImageInput.from_json({"name": "init.png", "sha256": GOOD_SHA})
    assert "pass the file again" in refused(fingerprint.open, naming="init.png")
    refused(fingerprint.size, naming="init.png")


# ------------------------------------------------------------------------------------------------- conversions


def reopened(image: Image.Image, format: str = "PNG", **options) -> Image.Image:
    return open_image(encoded(image, format, **options), f"test.{format.lower()}")


def test_grayscale_becomes_gray_rgb():
    assert to_rgb(reopened(Image.new("L", (2, 2), 77))).getpixel((0, 0)) == (77, 77, 77)


def test_a_palette_image_without_transparency_takes_its_palette_colours():
    image = Image.new("P", (2, 1))
    image.putpalette([*RED, *(10, 20, 30)])
    image.putpixel((1, 0), 1)
    opened = reopened(image)
    assert opened.mode == "P"
    assert [to_rgb(opened).getpixel((x, 0)) for x in (0, 1)] == [RED, (10, 20, 30)]


def test_a_palette_images_transparent_entry_is_white():
    image = Image.new("P", (2, 1))
    image.putpalette([*RED, *BLUE])
    image.putpixel((1, 0), 1)
    rgb = to_rgb(reopened(image, transparency=0))
    assert [rgb.getpixel((x, 0)) for x in (0, 1)] == [WHITE, BLUE]


def test_rgba_is_composited_over_white_or_the_background_given():
    half_red = reopened(Image.new("RGBA", (1, 1), (255, 0, 0, 128)))
    # over white: 255 * (1 - 128/255) = 127 in G and B; over black: 255 * 128/255 = 128 in R
    assert to_rgb(half_red).getpixel((0, 0)) == (255, 127, 127)
    assert to_rgb(half_red, background=BLACK).getpixel((0, 0)) == (128, 0, 0)
    assert to_rgb(reopened(Image.new("RGBA", (1, 1), (9, 9, 9, 0)))).getpixel((0, 0)) == WHITE


def test_a_pngs_transparent_colour_is_white():
    image = Image.new("RGB", (2, 1), BLACK)
    image.putpixel((1, 0), (1, 2, 3))
    opened = reopened(image, transparency=BLACK)  # a tRNS colour key: RGB with black see-through
    assert opened.mode == "RGB"
    rgb = to_rgb(opened)
    assert [rgb.getpixel((x, 0)) for x in (0, 1)] == [WHITE, (1, 2, 3)]


def test_la_is_composited_over_white():
    image = Image.new("LA", (2, 1), (100, 255))
    image.putpixel((1, 0), (100, 0))
    rgb = to_rgb(reopened(image))
    assert [rgb.getpixel((x, 0)) for x in (0, 1)] == [(100, 100, 100), WHITE]


def test_cmyk_becomes_its_rgb():
    image = Image.new("CMYK", (3, 1), (0, 0, 0, 0))
    image.putpixel((1, 0), (255, 0, 0, 0))  # full cyan ink
    image.putpixel((2, 0), (0, 0, 0, 255))  # full black ink
    rgb = to_rgb(reopened(image, "TIFF"))
    assert [rgb.getpixel((x, 0)) for x in range(3)] == [WHITE, (0, 255, 255), BLACK]


def test_a_one_bit_image_is_black_and_white():
    image = Image.new("1", (2, 1), 0)
    image.putpixel((1, 0), 1)
    opened = reopened(image)
    assert opened.mode == "1"
    rgb = to_rgb(opened)
    assert [rgb.getpixel((x, 0)) for x in (0, 1)] == [BLACK, WHITE]


SIXTEEN_BIT = np.array([[0xFFFF, 0x8000, 0x7FFF, 0x00FF]], dtype=np.uint16)
EIGHT_BIT = [255, 128, 127, 0]  # value >> 8


def test_a_16_bit_png_keeps_the_high_byte():
    opened = reopened(Image.fromarray(SIXTEEN_BIT))
    assert opened.mode.startswith("I")  # I;16 here; a plain convert("RGB") would clip these to 255
    assert list(array(to_rgb(opened))[0, :, 0]) == EIGHT_BIT
    assert list(array(to_mask(opened))[0]) == EIGHT_BIT


def test_big_endian_16_bit_and_32_bit_samples_are_read_as_16_bit():
    big_endian = Image.frombytes("I;16B", (4, 1), SIXTEEN_BIT.astype(">u2").tobytes())
    assert list(array(to_rgb(big_endian))[0, :, 1]) == EIGHT_BIT
    wide = Image.fromarray(np.array([[70000, -5, 0x8000, 0x80FF]], dtype=np.int32))  # mode I: clipped to 0..65535
    assert wide.mode == "I" and list(array(to_mask(wide))[0]) == [255, 0, 128, 128]
    floats = Image.fromarray(np.array([[65535.0, 32768.9, -1.0, np.nan]], dtype=np.float32))
    assert floats.mode == "F" and list(array(to_mask(floats))[0]) == [255, 128, 0, 0]


def test_a_colour_mask_is_its_luminance_and_invert_swaps_it():
    image = Image.new("RGB", (3, 1), RED)
    image.putpixel((1, 0), GREEN)
    image.putpixel((2, 0), WHITE)
    # ITU-R 601-2 luma, Pillow's L: 0.299 R + 0.587 G + 0.114 B
    assert list(array(to_mask(reopened(image)))[0]) == [76, 150, 255]
    assert list(array(to_mask(reopened(image), invert=True))[0]) == [255 - 76, 255 - 150, 0]


def test_a_mask_with_transparency_is_its_alpha_and_an_opaque_one_its_luminance():
    # A stroke painted on a transparent layer whose hidden colour is white: the stroke is what is repainted.
    layer = Image.new("RGBA", (3, 1), (255, 255, 255, 0))
    layer.putpixel((1, 0), (255, 255, 255, 255))
    layer.putpixel((2, 0), (0, 0, 0, 128))
    assert list(array(to_mask(reopened(layer)))[0]) == [0, 255, 128]
    opaque = Image.new("RGBA", (1, 1), (*GREEN, 255))
    assert list(array(to_mask(reopened(opaque)))[0]) == [150]


def test_mask_from_alpha_repaints_only_where_fully_transparent():
    image = Image.new("RGBA", (3, 1), (0, 0, 0, 0))
    image.putpixel((1, 0), (0, 0, 0, 1))
    image.putpixel((2, 0), (255, 255, 255, 255))
    mask = mask_from_alpha(reopened(image))
    assert mask.mode == "L" and list(array(mask)[0]) == [255, 0, 0]


def test_mask_from_alpha_refuses_an_image_without_alpha():
    with pytest.raises(AnimaError, match="^the mask must have an alpha channel: OpenAI's edits paint where it is "
                                         "transparent$"):
        mask_from_alpha(reopened(Image.new("RGB", (2, 2), WHITE)))


# ---------------------------------------------------------------------------------------------------- resizing


def banded(width: int, height: int, colours: list[tuple[int, int, int]]) -> Image.Image:
    """Vertical bands of equal width, left to right."""
    pixels = np.zeros((height, width, 3), dtype=np.uint8)
    band = width // len(colours)
    for i, colour in enumerate(colours):
        pixels[:, i * band: (i + 1) * band] = colour
    return Image.fromarray(pixels)


def close_to(pixels: np.ndarray, colour: tuple[int, ...], levels: int = 2) -> bool:
    return bool(np.abs(pixels.astype(int) - colour).max() <= levels)


SIDES_AND_MIDDLE = banded(400, 200, [GREEN, RED, BLUE, GREEN])  # green | red | blue | green


def test_just_resize_stretches_everything_in():
    out = array(resize_image(SIDES_AND_MIDDLE, 100, 100, "just_resize"))
    assert out.shape == (100, 100, 3)
    # each band 25 px wide after the stretch; Lanczos rings for ~3 px beside an edge
    for x0, colour in ((0, GREEN), (25, RED), (50, BLUE), (75, GREEN)):
        assert close_to(out[:, x0 + 4: x0 + 21], colour), x0


def test_crop_and_resize_covers_then_keeps_the_centre():
    # 400x200 -> 100x100: scaled to 200x100, the centre 100 columns kept: the red and blue bands, no green.
    out = array(resize_image(SIDES_AND_MIDDLE, 100, 100, "crop_and_resize"))
    assert out.shape == (100, 100, 3)
    assert close_to(out[:, 4:46], RED) and close_to(out[:, 54:96], BLUE)
    tall = SIDES_AND_MIDDLE.transpose(Image.Transpose.TRANSPOSE)  # 200x400, bands top to bottom
    out = array(resize_image(tall, 100, 100, "crop_and_resize"))
    assert close_to(out[4:46], RED) and close_to(out[54:96], BLUE)


def test_resize_and_fill_fits_then_stretches_the_edge_rows_across_the_bands():
    # 200x100: a horizontal ramp in R, G 0 in the top half and 200 in the bottom; to 100x100 it is scaled to
    # 100x50 at rows 25..74, and the bands above and below repeat its first and last rows.
    x = np.arange(200)
    pixels = np.zeros((100, 200, 3), dtype=np.uint8)
    pixels[..., 0] = x
    pixels[50:, :, 1] = 200
    out = array(resize_image(Image.fromarray(pixels), 100, 100, "resize_and_fill"))
    assert out.shape == (100, 100, 3)
    assert (out[:25] == out[25]).all() and (out[75:] == out[74]).all()
    assert close_to(out[25, 10:90, 1:], (0, 0)) and close_to(out[74, 10:90, 1:], (200, 0))
    assert out[25, 90, 0] - out[25, 10, 0] > 150  # the band is the edge row itself, ramp and all


def test_resize_and_fill_leaves_no_black_line_when_the_leftover_is_odd():
    # 101 rows for a 50-row picture: 25 above, 26 below (A1111 would paste 25 below and leave row 100 black)
    out = array(resize_image(Image.new("RGB", (200, 100), (90, 90, 90)), 100, 101, "resize_and_fill"))
    assert out.shape == (101, 100, 3) and (out == 90).all()


def test_resize_and_fill_of_a_tall_mask_fills_left_and_right():
    mask = Image.new("L", (100, 200), 0)
    mask.paste(255, (0, 0, 50, 200))  # left half white
    out = resize_image(mask, 100, 100, "resize_and_fill")  # scaled to 50x100 at columns 25..74
    assert out.mode == "L"
    out = array(out)
    assert (out[:, :25] == 255).all() and (out[:, 75:] == 0).all()


def test_resize_keeps_an_image_of_the_same_aspect_whole():
    for mode in RESIZE_MODES:
        out = array(resize_image(Image.new("RGB", (64, 32), (10, 200, 30)), 32, 16, mode))
        assert out.shape == (16, 32, 3) and (out == (10, 200, 30)).all(), mode


def test_an_unknown_resize_mode_names_the_choices():
    with pytest.raises(AnimaError) as raised:
        resize_image(Image.new("RGB", (8, 8)), 8, 8, "fit")
    assert all(mode in str(raised.value) for mode in RESIZE_MODES)


# ------------------------------------------------------------------------------------------------------ masks


def half_white(width: int = 64, height: int = 64, split: int = 32) -> Image.Image:
    mask = Image.new("L", (width, height), 0)
    mask.paste(255, (0, 0, split, height))
    return mask


def test_blur_zero_leaves_the_mask_and_a_blur_softens_the_edge_about_its_middle():
    mask = half_white()
    assert np.array_equal(array(blur_mask(mask, 0)), array(mask))
    blurred = array(blur_mask(mask, 4))
    row = blurred[32]
    # symmetric about the edge at x = 32: the columns either side sum to white, the far ones untouched
    assert row[31] > 128 > row[32] and abs(row[31] + row[32] - 255) <= 2
    assert row[0] == 255 and row[63] == 0 and 0 < row[36] < row[28] < 255
    with pytest.raises(AnimaError):
        blur_mask(mask, -1)


def test_fill_replaces_the_masked_pixels_by_the_surrounding_colour():
    pixels = np.zeros((64, 64, 3), dtype=np.uint8)
    pixels[:] = (30, 180, 60)
    pixels[16:48, 16:48] = RED  # what the mask hides
    mask = Image.new("L", (64, 64), 0)
    mask.paste(255, (16, 16, 48, 48))
    out = array(fill_masked(Image.fromarray(pixels), mask))
    assert close_to(out, (30, 180, 60))


def test_fill_spreads_each_side_s_colour_into_the_masked_band():
    image = banded(64, 32, [RED, BLUE])
    mask = Image.new("L", (64, 32), 0)
    mask.paste(255, (16, 0, 48, 32))
    out = array(fill_masked(image, mask))
    row = out[16]
    assert close_to(row[16], RED, 4) and close_to(row[47], BLUE, 4)  # beside each side, its colour
    assert (np.diff(row[16:48, 0]) <= 0).all() and (np.diff(row[16:48, 2]) >= 0).all()  # red fades into blue
    assert np.array_equal(row[16:48, 0], row[16:48, 2][::-1])  # the same from either side


def test_fill_keeps_every_unmasked_pixel_exactly():
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, (40, 56, 3), dtype=np.uint8)
    mask = rng.choice([0, 0, 128, 255], (40, 56)).astype(np.uint8)  # a quarter soft
    out = array(fill_masked(Image.fromarray(pixels), Image.fromarray(mask)))
    assert np.array_equal(out[mask == 0], pixels[mask == 0])


def test_fill_under_an_all_white_mask_is_the_mean_colour():
    image = banded(64, 16, [BLACK, (200, 100, 50)])
    assert (array(fill_masked(image, Image.new("L", (64, 16), 255))) == (100, 50, 25)).all()


def test_fill_refuses_a_mask_of_another_size():
    with pytest.raises(AnimaError, match="16x16 but the image is 32x32"):
        fill_masked(Image.new("RGB", (32, 32)), Image.new("L", (16, 16)))


def test_mask_box_is_the_padded_bounding_box_clipped_to_the_image():
    mask = Image.new("L", (100, 80), 0)
    assert mask_box(mask, 10) is None
    mask.paste(255, (10, 20, 30, 40))  # columns 10..29, rows 20..39
    assert mask_box(mask, 0) == (10, 20, 30, 40)
    assert mask_box(mask, 5) == (5, 15, 35, 45)
    assert mask_box(mask, 25) == (0, 0, 55, 65)
    mask.putpixel((99, 79), 1)  # any non-zero value counts
    assert mask_box(mask, 8) == (2, 12, 100, 80)


def test_expand_box_grows_the_short_side_to_the_aspect_about_the_centre():
    assert expand_box((40, 45, 60, 55), 512, 512, 100, 100) == (40, 40, 60, 60)  # 20x10 -> 20x20
    assert expand_box((45, 40, 55, 60), 512, 512, 100, 100) == (40, 40, 60, 60)  # 10x20 -> 20x20
    assert expand_box((40, 40, 60, 60), 1024, 512, 100, 100) == (30, 40, 70, 60)  # 2:1 -> 40x20
    assert expand_box((40, 40, 60, 60), 512, 512, 100, 100) == (40, 40, 60, 60)  # already square


def test_expand_box_shifts_inside_the_image_and_cuts_only_what_cannot_fit():
    assert expand_box((0, 0, 20, 10), 64, 64, 100, 100) == (0, 0, 20, 20)  # -5..15 shifted down
    assert expand_box((80, 95, 100, 100), 64, 64, 100, 100) == (80, 80, 100, 100)  # 87..107 shifted up
    assert expand_box((0, 20, 100, 30), 64, 64, 100, 40) == (0, 0, 100, 40)  # 100 tall cannot fit in 40


@given(st.data())
def test_expand_box_stays_inside_keeps_the_box_and_takes_the_aspect_where_it_fits(data):
    image_w, image_h = data.draw(st.integers(1, 400)), data.draw(st.integers(1, 400))
    left = data.draw(st.integers(0, image_w - 1))
    right = data.draw(st.integers(left + 1, image_w))
    top = data.draw(st.integers(0, image_h - 1))
    bottom = data.draw(st.integers(top + 1, image_h))
    width, height = data.draw(st.integers(1, 2048)), data.draw(st.integers(1, 2048))
    x1, y1, x2, y2 = expand_box((left, top, right, bottom), width, height, image_w, image_h)
    assert 0 <= x1 <= left < right <= x2 <= image_w and 0 <= y1 <= top < bottom <= image_h
    box_w, box_h = right - left, bottom - top
    if box_w * height > box_h * width:  # wider than the aspect: the height grows, to the nearest pixel or the image
        exact = box_w * height / width
        assert (x1, x2) == (left, right) and (abs((y2 - y1) - exact) <= 0.5 or y2 - y1 == image_h < exact)
    else:
        exact = box_h * width / height
        assert (y1, y2) == (top, bottom) and (abs((x2 - x1) - exact) <= 0.5 or x2 - x1 == image_w < exact)


def test_outpaint_canvas_grows_with_the_edges_stretched_and_masks_the_new_area():
    image = patterned(10, 6)
    canvas, mask = outpaint_canvas(image, 3, 2, 0, 4)
    assert canvas.size == mask.size == (13, 12) and canvas.mode == "RGB" and mask.mode == "L"
    pixels, source, mask = array(canvas), array(image), array(mask)
    assert np.array_equal(pixels[2:8, 3:], source)
    assert (pixels[:2, 3:] == source[0]).all() and (pixels[8:, 3:] == source[-1]).all()
    assert (pixels[2:8, :3] == source[:, :1]).all()
    assert (pixels[:2, :3] == source[0, 0]).all() and (pixels[8:, :3] == source[-1, 0]).all()  # the corners
    assert (mask[2:8, 3:] == 0).all() and mask.sum() == 255 * (13 * 12 - 10 * 6)


def test_outpaint_canvas_of_a_mask_and_its_refusals():
    canvas, _ = outpaint_canvas(Image.new("L", (4, 4), 200), 0, 0, 4, 0)
    assert canvas.mode == "L" and canvas.size == (8, 4) and (array(canvas) == 200).all()
    with pytest.raises(AnimaError, match="at least one side"):
        outpaint_canvas(Image.new("RGB", (4, 4)), 0, 0, 0, 0)
    with pytest.raises(AnimaError, match="outpaint left"):
        outpaint_canvas(Image.new("RGB", (4, 4)), -1, 0, 8, 0)


def test_paste_back_keeps_the_original_where_the_mask_is_0_and_takes_the_result_where_255():
    rng = np.random.default_rng(2)
    original, result = (rng.integers(0, 256, (24, 36, 3), dtype=np.uint8) for _ in range(2))
    mask = np.zeros((24, 36), dtype=np.uint8)
    mask[:, 12:24], mask[:, 24:] = 128, 255
    out = array(paste_back(Image.fromarray(original), Image.fromarray(result), None, Image.fromarray(mask)))
    assert np.array_equal(out[:, :12], original[:, :12]) and np.array_equal(out[:, 24:], result[:, 24:])
    blend = (result[:, 12:24].astype(int) * 128 + original[:, 12:24].astype(int) * 127) / 255
    assert np.abs(out[:, 12:24] - blend).max() <= 1


def test_paste_back_into_a_box_resizes_the_result_to_it_and_leaves_the_rest():
    original = patterned(64, 48)
    mask = Image.new("L", (64, 48), 255)  # even a mask that says "repaint" everywhere: outside the box no result
    out = array(paste_back(original, Image.new("RGB", (64, 64), BLUE), (10, 8, 42, 40), mask))
    inside = np.zeros((48, 64), dtype=bool)
    inside[8:40, 10:42] = True
    assert (out[inside] == BLUE).all() and np.array_equal(out[~inside], array(original)[~inside])


def test_image_to_tensor_is_channels_first_in_0_to_1():
    image = Image.new("RGB", (3, 2), (255, 0, 51))
    tensor = image_to_tensor(image)
    assert tensor.dtype == torch.float32 and tensor.shape == (1, 3, 2, 3)
    assert torch.allclose(tensor[0, :, 1, 2], torch.tensor([1.0, 0.0, 0.2]))


def test_latent_mask_is_the_area_average_of_each_patch():
    left = latent_mask(half_white(64, 64, 32), 8, 8)
    assert left.dtype == np.float32 and left.shape == (1, 1, 8, 8)
    assert (left[..., :4] == 1).all() and (left[..., 4:] == 0).all()
    block = Image.new("L", (64, 64), 0)
    block.paste(255, (40, 8, 48, 16))  # exactly latent pixel (5, 1)
    one = latent_mask(block, 8, 8)[0, 0]
    assert one[1, 5] == 1 and one.sum() == 1
    block.paste(0, (40, 12, 48, 16))  # half of it
    assert latent_mask(block, 8, 8)[0, 0, 1, 5] == 0.5 and latent_mask(block, 8, 8).sum() == 0.5
