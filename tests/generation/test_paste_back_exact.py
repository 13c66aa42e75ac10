"""Outside the mask the original's pixels come back exactly (as WebUI pastes the original back): outpainting and
inpainting, the whole picture and only the masked area, on a real picture (a crop of the docs' own)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from anima_rknn.generation.images import ImageInput
from anima_rknn.generation.params import GenerationParams
from anima_rknn.generation.pipeline import AnimaPipeline

DOCS = Path(__file__).resolve().parents[2] / "docs"
BASE = GenerationParams(prompt="a red circle", width=64, height=64, steps=4, seed=7, vae_backend="torch",
                        strength=0.9, mask_blur=8)


@pytest.fixture(scope="module")
def pipeline(tiny_set):
    return AnimaPipeline(tiny_set)


@pytest.fixture(scope="module")
def picture(tmp_path_factory) -> ImageInput:
    path = tmp_path_factory.mktemp("real") / "real.png"
    Image.open(DOCS / "image_to_image.png").convert("RGB").crop((40, 40, 104, 104)).save(path)
    return ImageInput.from_path(path)


def test_outpainting_gives_back_the_original_exactly(pipeline, picture, one_thread):
    params = dataclasses.replace(BASE, init_image=picture, outpaint=(16, 0, 16, 0), width=96, strength=1.0)
    pixels = np.asarray(pipeline.generate(params).image).astype(int)
    original = np.asarray(picture.open().convert("RGB")).astype(int)
    assert np.abs(pixels[:, 16:80] - original).max() == 0  # up to its old edges, not 8 px short of them


@pytest.mark.parametrize("area", ["whole", "masked"])
def test_inpainting_gives_back_every_pixel_outside_the_mask_exactly(pipeline, picture, tmp_path, one_thread, area):
    mask = Image.new("L", (64, 64), 0)
    mask.paste(255, (20, 20, 44, 44))
    mask.save(tmp_path / "mask.png")
    params = dataclasses.replace(BASE, init_image=picture, mask=ImageInput.from_path(tmp_path / "mask.png"),
                                 inpaint_area=area)
    pixels = np.asarray(pipeline.generate(params).image).astype(int)
    original = np.asarray(picture.open().convert("RGB")).astype(int)
    outside = np.asarray(mask) == 0
    assert np.abs(pixels - original)[outside].max() == 0
    assert np.abs(pixels - original)[~outside].mean() > 2  # the masked part was repainted
