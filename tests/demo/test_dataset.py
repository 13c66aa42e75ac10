"""The procedural dataset: determinism, geometry checked against area formulas, and the held-out split."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tokenizers import Tokenizer

from anima_rknn.demo import dataset
from anima_rknn.demo.dataset import COLOURS, ShapeSpec
from anima_rknn.text import build_word_tokenizers


def _shape_pixels(image: np.ndarray, spec: ShapeSpec) -> np.ndarray:
    """Share of each pixel covered by the shape, from the linear mix of the two colours (red vs blue)."""
    fg, bg = (np.array(COLOURS[c], dtype=float) for c in (spec.colour, spec.background))
    return (image[..., 2] - bg[2]) / (fg[2] - bg[2])


def test_same_seed_same_pictures_other_seed_others() -> None:
    a_images, a_specs = dataset.batch(3, 10, 8)
    b_images, b_specs = dataset.batch(3, 10, 8)
    c_images, _ = dataset.batch(4, 10, 8)
    assert a_specs == b_specs and np.array_equal(a_images, b_images)
    assert a_images.shape == (8, 64, 64, 3) and a_images.dtype == np.uint8
    assert not np.array_equal(a_images, c_images)


@pytest.mark.parametrize(("shape", "area"), [("square", 20 * 20), ("circle", math.pi * 10**2), ("triangle", 20 * 20 / 2)])
def test_shape_area_and_place_match_geometry(shape: str, area: float) -> None:
    spec = ShapeSpec(shape, "red", "blue", "top right", half_size=10.0, offset=(1.0, -2.0))
    coverage = _shape_pixels(dataset.render(spec).astype(float), spec)
    assert coverage.sum() == pytest.approx(area, rel=0.015)
    ys, xs = np.mgrid[0:64, 0:64] + 0.5  # pixel centres
    cx, cy = 0.75 * 64 + 1.0, 0.25 * 64 - 2.0
    centroid_y = cy + (10.0 / 3 if shape == "triangle" else 0.0)  # a triangle's centroid is a third down from the middle
    assert (coverage * xs).sum() / coverage.sum() == pytest.approx(cx, abs=0.1)
    assert (coverage * ys).sum() / coverage.sum() == pytest.approx(centroid_y, abs=0.1)


def test_captions() -> None:
    assert ShapeSpec("circle", "red", "blue", "top left").caption == "a red circle on a blue background, top left"
    assert ShapeSpec("square", "orange", "black", "center").caption == "an orange square on a black background, center"


def test_held_out_pairs_never_reach_training() -> None:
    assert len(dataset.HELD_OUT_PAIRS) == len(COLOURS)
    train = [dataset.sample(0, i) for i in range(2000)]
    assert not any(s.held_out for s in train)
    assert all(s.held_out for s in (dataset.sample(0, i, "held_out") for i in range(100)))
    # Every colour still appears as shape and as background in training, and every value of each attribute.
    assert {s.colour for s in train} == {s.background for s in train} == set(COLOURS)
    assert {s.shape for s in train} == set(dataset.SHAPES) and {s.position for s in train} == set(dataset.POSITIONS)
    assert len(dataset.combinations("train")) + len(dataset.combinations("held_out")) == 8 * 7 * 3 * 5
    assert all(s.colour != s.background for s in dataset.combinations())


def test_every_caption_word_is_in_the_vocabulary(tmp_path) -> None:
    build_word_tokenizers(dataset.vocabulary(), tmp_path / "qwen3", tmp_path / "t5")
    t5 = Tokenizer.from_file(str(tmp_path / "t5" / "tokenizer.json"))
    unknown = t5.token_to_id("<unk>")
    for spec in dataset.combinations():
        assert unknown not in t5.encode(spec.caption).ids, spec.caption
