"""Does a picture follow its prompt? Read background colour, shape colour, position, shape type and size
(ordinary or the demo LoRA's "large") back off an image, score a model set on a fixed prompt set, and draw a
contact sheet.

The reader uses only the dataset's definitions (palette, positions, shape geometry), never a model: it is
checked on the true dataset pictures before it is trusted with generated ones.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import textwrap
from collections.abc import Callable, Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFont
from tqdm import tqdm

from ..checks import is_int_in, shown
from ..errors import AnimaError
from ..generation.params import GenerationParams
from ..generation.pipeline import AnimaPipeline
from ..model.lora import LoraRef
from ..model.model_set import from_model_dir
from . import dataset
from .dataset import ShapeSpec

ATTRIBUTES = ("background", "colour", "position", "shape", "size")
_PALETTE_NAMES = list(dataset.COLOURS)
_PALETTE = np.array([dataset.COLOURS[n] for n in _PALETTE_NAMES], dtype=np.float32)
# Half the smallest distance between two palette colours (orange-yellow, ~86): a pixel further than this
# from the background colour belongs to the shape.
_SHAPE_THRESHOLD = 0.5 * min(np.linalg.norm(a - b) for i, a in enumerate(_PALETTE) for b in _PALETTE[i + 1:])
_MIN_SHAPE_PIXELS = 40  # the smallest true shape (a triangle of half-size 9) covers ~160
# Filled share of the bounding box: square 1, circle pi/4, triangle 1/2; cut halfway between.
_SQUARE_ABOVE, _TRIANGLE_BELOW = (1 + np.pi / 4) / 2, (np.pi / 4 + 0.5) / 2
# Bounding-box side above which a shape is large: halfway between the ordinary (<= 26) and large (>= 38) sides.
_LARGE_ABOVE = dataset.HALF_SIZE_RANGE[1] + dataset.LARGE_HALF_SIZE_RANGE[0]


@dataclasses.dataclass(frozen=True)
class Reading:
    background: str
    colour: str | None  # None: no shape found
    position: str | None
    shape: str | None
    large: bool | None = None

    def matches(self, spec: ShapeSpec) -> dict[str, bool]:
        return {"background": self.background == spec.background, "colour": self.colour == spec.colour,
                "position": self.position == spec.position, "shape": self.shape == spec.shape,
                "size": self.large == spec.large}


def _nearest_colour(rgb: np.ndarray) -> str:
    return _PALETTE_NAMES[int(np.argmin(np.linalg.norm(_PALETTE - rgb, axis=1)))]


def _shape_mask(pixels: np.ndarray, background_rgb: np.ndarray) -> np.ndarray:
    """Pixels far from the background, without isolated specks (a pixel needs 3 such neighbours)."""
    mask = np.linalg.norm(pixels - background_rgb, axis=-1) > _SHAPE_THRESHOLD
    padded = np.pad(mask, 1)
    h, w = mask.shape
    neighbours = sum(padded[1 + dy:1 + dy + h, 1 + dx:1 + dx + w]
                     for dy in (-1, 0, 1) for dx in (-1, 0, 1) if dy or dx)
    return mask & (neighbours >= 3)


def read_image(image: np.ndarray) -> Reading:
    """uint8 [64, 64, 3] -> what the picture shows, in the dataset's words."""
    pixels = image.astype(np.float32)
    border = np.concatenate([pixels[:2].reshape(-1, 3), pixels[-2:].reshape(-1, 3),
                             pixels[:, :2].reshape(-1, 3), pixels[:, -2:].reshape(-1, 3)])
    background_rgb = np.median(border, axis=0)
    background = _nearest_colour(background_rgb)
    mask = _shape_mask(pixels, background_rgb)
    if mask.sum() < _MIN_SHAPE_PIXELS:
        return Reading(background, None, None, None)
    colour = _nearest_colour(np.median(pixels[mask], axis=0))
    ys, xs = np.nonzero(mask)
    size = dataset.IMAGE_SIZE
    anchors = {name: (fx * size, fy * size) for name, (fx, fy) in dataset.POSITIONS.items()}
    position = min(anchors, key=lambda n: (anchors[n][0] - xs.mean()) ** 2 + (anchors[n][1] - ys.mean()) ** 2)
    height, width = ys.max() - ys.min() + 1, xs.max() - xs.min() + 1
    fill = mask.sum() / (height * width)
    shape = "square" if fill > _SQUARE_ABOVE else "triangle" if fill < _TRIANGLE_BELOW else "circle"
    return Reading(background, colour, position, shape, bool(max(height, width) > _LARGE_ABOVE))


CONCEPTS = ("none", dataset.LARGE)


def prompt_set(count: int = 24, seed: int = 7, concept: str = "none") -> list[ShapeSpec]:
    """A fixed set of prompts, every third one a held-out colour pair, no combination twice.

    With concept "large" every second prompt asks for a large shape instead (the demo LoRA's concept)."""
    if concept == dataset.LARGE:
        pool = dataset.combinations(dataset.LARGE)
        if not is_int_in(count, 2, 2 * len(pool)):
            raise AnimaError(f"the prompt set with large shapes has 2 to {2 * len(pool)} prompts, "
                             f"got {shown(count, 40)}")
        large = [pool[i] for i in np.random.default_rng((seed, 1)).permutation(len(pool))[:count // 2]]
        base = prompt_set(count - count // 2, seed)
        return [spec for pair in zip(base, large) for spec in pair] + base[len(large):]
    if concept != "none":
        raise AnimaError(f"unknown concept {shown(concept, 40)}; choose one of {', '.join(CONCEPTS)}")
    pools = {split: list(dataset.combinations(split)) for split in ("train", "held_out")}
    # count - count // 3 train and count // 3 held-out prompts must fit their pools
    most = min(3 * len(pools["train"]) // 2, 3 * len(pools["held_out"]) + 2)
    if not is_int_in(count, 1, most):
        raise AnimaError(f"the prompt set has 1 to {most} prompts, got {shown(count, 40)}")
    rng = np.random.default_rng(seed)
    order = {split: rng.permutation(len(pool)) for split, pool in pools.items()}
    taken = {"train": 0, "held_out": 0}
    specs = []
    for i in range(count):
        split = "held_out" if i % 3 == 2 else "train"
        specs.append(pools[split][order[split][taken[split]]])
        taken[split] += 1
    return specs


@dataclasses.dataclass(frozen=True)
class Judged:
    spec: ShapeSpec
    reading: Reading
    image: np.ndarray  # uint8 [64, 64, 3]

    @property
    def hits(self) -> dict[str, bool]:
        return self.reading.matches(self.spec)


def generate_images(model_dir: str | os.PathLike, specs: Sequence[ShapeSpec], *, steps: int = 20, cfg: float = 4.0,
                    seed: int = 1000, cache: str = "none", loras: Sequence[LoraRef] = (),
                    lora_ignore_unmatched: bool = False, threads: int | None = None,
                    pipeline: AnimaPipeline | None = None, progress: bool = False) -> list[np.ndarray]:
    """One image per prompt at the dataset's size; prompt i uses seed + i (a non-finite one comes back black);
    `loras` merged into the DiT; `threads` as GenerationParams' (torch's and ONNX Runtime's; None: as torch is).

    The settings are checked before the model loads; `progress` shows a bar on stderr from then on."""
    size = dataset.IMAGE_SIZE
    all_params = [GenerationParams(prompt=spec.caption, width=size, height=size, steps=steps, cfg=cfg,
                                   seed=seed + i, cache=cache, loras=list(loras),
                                   lora_ignore_unmatched=lora_ignore_unmatched, threads=threads)
                  for i, spec in enumerate(specs)]
    pipeline = pipeline or AnimaPipeline(from_model_dir(model_dir), keep_dit=True)
    plans = [pipeline.prepare(params) for params in all_params]  # before the model loads
    images = []
    for plan in tqdm(plans, desc="generate", unit="prompt", file=sys.stderr, dynamic_ncols=True,
                     disable=not progress):
        result = pipeline.generate(plan)
        images.append(np.asarray(result.image) if result.image is not None else np.zeros((size, size, 3), np.uint8))
    return images


def judge(specs: Sequence[ShapeSpec], images: Sequence[np.ndarray]) -> list[Judged]:
    return [Judged(spec, read_image(image), image) for spec, image in zip(specs, images)]


def adherence(judged: Sequence[Judged], keep: Callable[[Judged], bool] = lambda j: True) -> dict[str, float]:
    """Share of prompts right on each attribute, and on all of them at once."""
    chosen = [j for j in judged if keep(j)]
    if not chosen:
        return {}
    scores = {a: float(np.mean([j.hits[a] for j in chosen])) for a in ATTRIBUTES}
    scores["all"] = float(np.mean([all(j.hits.values()) for j in chosen]))
    return scores


# Rows of the adherence table: the base training combinations, the held-out ones, the LoRA's large shapes.
PROMPT_KINDS: dict[str, Callable[[Judged], bool]] = {
    "train": lambda j: not j.spec.held_out and not j.spec.large, "held-out": lambda j: j.spec.held_out,
    dataset.LARGE: lambda j: j.spec.large, "all": lambda j: True}


def adherence_table(judged: Sequence[Judged]) -> str:
    lines = [f"{'prompts':<10}{'n':>4}" + "".join(f"{a:>12}" for a in (*ATTRIBUTES, "all"))]
    for name, keep in PROMPT_KINDS.items():
        if name == dataset.LARGE and not any(keep(j) for j in judged):
            continue  # a prompt set without the LoRA concept
        scores = adherence(judged, keep)
        n = sum(keep(j) for j in judged)
        lines.append(f"{name:<10}{n:>4}"
                     + "".join(f"{scores.get(a, float('nan')):>12.0%}" for a in (*ATTRIBUTES, "all")))
    return "\n".join(lines)


def contact_sheet(judged: Sequence[Judged], columns: int = 6, scale: int = 2) -> Image.Image:
    """A grid of the pictures, each with its prompt and the attributes the reader got wrong."""
    font = ImageFont.load_default()
    cell = dataset.IMAGE_SIZE * scale
    text_h = 56  # three lines of prompt and one of verdict
    rows = -(-len(judged) // columns)
    sheet = Image.new("RGB", (columns * cell, rows * (cell + text_h)), "white")
    draw = ImageDraw.Draw(sheet)
    for i, j in enumerate(judged):
        x, y = (i % columns) * cell, (i // columns) * (cell + text_h)
        sheet.paste(Image.fromarray(j.image).resize((cell, cell), Image.Resampling.NEAREST), (x, y))
        wrong = [a for a, ok in j.hits.items() if not ok]
        label = textwrap.wrap(j.spec.caption, 21)[:3]
        label.append(("held-out: " if j.spec.held_out else "") + ("ok" if not wrong else "wrong " + ",".join(wrong)))
        draw.multiline_text((x + 2, y + cell + 1), "\n".join(label), fill="black", font=font, spacing=1)
    return sheet
