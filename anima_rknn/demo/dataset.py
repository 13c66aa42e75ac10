"""Procedural captioned pictures: one shape of one colour on a plain background, at one of five places.

Every sample is a pure function of (seed, index), so a training run, a test and an evaluation all see the
same pictures. Some (shape colour, background colour) pairs never occur in training: prompts that name them
measure generalisation rather than memorisation. "Large" shapes (split "large") are not in the base model's
training at all: they are the concept the demo LoRA teaches.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import numpy as np
from PIL import Image, ImageDraw

IMAGE_SIZE = 64
SUPERSAMPLE = 4  # drawn 4x larger, then box-filtered down: smooth edges like a real picture

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "orange": (245, 140, 20),
    "yellow": (240, 220, 50),
    "green": (40, 160, 60),
    "blue": (40, 90, 220),
    "purple": (140, 60, 180),
    "white": (240, 240, 240),
    "black": (25, 25, 25),
}
SHAPES = ("circle", "square", "triangle")
# Shape centres as fractions of the image side.
POSITIONS: dict[str, tuple[float, float]] = {
    "top left": (0.25, 0.25),
    "top right": (0.75, 0.25),
    "bottom left": (0.25, 0.75),
    "bottom right": (0.75, 0.75),
    "center": (0.5, 0.5),
}
HALF_SIZE_RANGE = (9.0, 13.0)  # pixels at 64x64: half the side of the shape's bounding box
# The demo LoRA's concept, "large": about twice the size, drawn at the centre only (a corner cannot hold it).
# The word is in the demo tokenizers' vocabulary, but no base training caption contains it.
LARGE = "large"
LARGE_HALF_SIZE_RANGE = (19.0, 23.0)
LARGE_HALF_SIZE = 21.0
CENTRE_JITTER = 3.0  # pixels

_NAMES = list(COLOURS)
# Each shape colour meets one background it is never trained on; every colour stays in training otherwise.
HELD_OUT_PAIRS: frozenset[tuple[str, str]] = frozenset(
    (_NAMES[i], _NAMES[(i + 3) % len(_NAMES)]) for i in range(len(_NAMES))
)


@dataclasses.dataclass(frozen=True)
class ShapeSpec:
    shape: str
    colour: str
    background: str
    position: str
    half_size: float = 11.0
    offset: tuple[float, float] = (0.0, 0.0)  # pixels added to the position's centre
    large: bool = False  # captioned "large" (and drawn in LARGE_HALF_SIZE_RANGE)

    @property
    def caption(self) -> str:
        described = f"{LARGE} {self.colour}" if self.large else self.colour
        article = "an" if described[0] in "aeiou" else "a"
        return f"{article} {described} {self.shape} on a {self.background} background, {self.position}"

    @property
    def held_out(self) -> bool:
        return (self.colour, self.background) in HELD_OUT_PAIRS

    @property
    def centre(self) -> tuple[float, float]:
        fx, fy = POSITIONS[self.position]
        return fx * IMAGE_SIZE + self.offset[0], fy * IMAGE_SIZE + self.offset[1]


@functools.cache
def combinations(split: str = "all") -> tuple[ShapeSpec, ...]:
    """Every attribute combination (at the nominal size and place): "train", "held_out" or "all" of the base
    dataset, or "large": the large shapes of the training colour pairs, at the centre."""
    specs = tuple(ShapeSpec(shape, colour, background, position)
                  for colour, background in itertools.permutations(COLOURS, 2)
                  for shape in SHAPES for position in POSITIONS)
    if split == LARGE:
        return tuple(dataclasses.replace(s, half_size=LARGE_HALF_SIZE, large=True)
                     for s in specs if not s.held_out and s.position == "center")
    if split == "all":
        return specs
    if split not in ("train", "held_out"):
        raise ValueError(f"unknown split {split!r}")
    return tuple(s for s in specs if s.held_out == (split == "held_out"))


def vocabulary() -> list[str]:
    """Every word a caption can contain, in a fixed order."""
    words = ["a", "an", "on", "background", ","] + list(COLOURS) + list(SHAPES)
    words += [w for position in POSITIONS for w in position.split()]
    return list(dict.fromkeys(words))


def random_spec(rng: np.random.Generator, split: str = "train") -> ShapeSpec:
    """A random training (or held-out) combination with a jittered size and place."""
    pool = combinations(split)
    base = pool[int(rng.integers(len(pool)))]
    jitter = rng.uniform(-CENTRE_JITTER, CENTRE_JITTER, size=2)
    sizes = LARGE_HALF_SIZE_RANGE if base.large else HALF_SIZE_RANGE
    return dataclasses.replace(base, half_size=float(rng.uniform(*sizes)),
                               offset=(float(jitter[0]), float(jitter[1])))


def render(spec: ShapeSpec) -> np.ndarray:
    """The picture of `spec`: uint8 [64, 64, 3]."""
    big = IMAGE_SIZE * SUPERSAMPLE
    image = Image.new("RGB", (big, big), COLOURS[spec.background])
    draw = ImageDraw.Draw(image)
    # PIL fills pixels from x0 through x1 inclusive: shrinking by half a pixel about the centre shifted by
    # half a pixel makes the shape cover exactly [c - r, c + r).
    cx, cy = (c * SUPERSAMPLE - 0.5 for c in spec.centre)
    r = spec.half_size * SUPERSAMPLE - 0.5
    fill = COLOURS[spec.colour]
    if spec.shape == "circle":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill)
    elif spec.shape == "square":
        draw.rectangle((cx - r, cy - r, cx + r, cy + r), fill=fill)
    else:  # upright triangle filling its bounding box: base along the bottom, apex at top centre
        draw.polygon([(cx, cy - r), (cx + r, cy + r), (cx - r, cy + r)], fill=fill)
    return np.asarray(image.resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.BOX))


def sample(seed: int, index: int, split: str = "train") -> ShapeSpec:
    """Sample `index` of the dataset `seed`: the same on every machine."""
    return random_spec(np.random.default_rng((seed, index)), split)


def batch(seed: int, start: int, count: int, split: str = "train") -> tuple[np.ndarray, list[ShapeSpec]]:
    """Samples start .. start+count-1: images uint8 [count, 64, 64, 3] and their specs."""
    specs = [sample(seed, i, split) for i in range(start, start + count)]
    return np.stack([render(s) for s in specs]), specs
