"""How fragile each image is: its PSNR when `auto` forecasts one step of the run and computes every other.

Issue 24's worst images stay below 30 dB at every budget (benchmarks/auto_cache.py). This asks whether any plan
could save them at 20 steps: per image, `auto` runs with budget = steps - 1 (one forecast) and warm-up w, so its one
forecast falls on a step its plan picks after w (4, 6, 9, 10, 12, 14, 16, 18 for w = 3, 5, ..., 17); the image's
PSNR against the uncached one from the same noise says what that single forecast costs. An image that one
forecast puts below 30 dB cannot be held at 30 dB by any plan that forecasts that step, whatever its budget.

    OMP_NUM_THREADS=1 python benchmarks/single_forecast.py --sets tune,h2 --reference-dir REF [--json out.json]

Prints, per set, the median and worst PSNR per forecast step over the images, and the images whose worst single
forecast is below 30 dB with their PSNR per step.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np
from auto_cache import SETS, Reference, per_set, run_one, set_names

from anima_rknn.bench.metrics import psnr
from anima_rknn.generation.pipeline import AnimaPipeline

STEPS, CFG = 20, 4.0


def single_forecasts(pipeline: AnimaPipeline, reference: Reference, warmups: list[int]) -> list[dict[int, float]]:
    """Per image: {the step forecast: PSNR} over the warm-ups."""
    images = []
    for i, base in enumerate(reference.params):
        by_step: dict[int, float] = {}
        for warmup in warmups:
            params = dataclasses.replace(base, cache="auto", cache_options={"budget": STEPS - 1, "warmup": warmup})
            _, image, denoised, _ = run_one(pipeline, params, reference.conditioning(i))
            if len(denoised.sample.skipped_steps) != 1:
                raise SystemExit(f"image {i}, warm-up {warmup}: auto forecast {denoised.sample.skipped_steps} "
                                 "(its forecast refused as non-finite?), not one step")
            by_step[denoised.sample.skipped_steps[0]] = psnr(reference.images[i], image)
        images.append(by_step)
    return images


def markdown(name: str, images: list[dict[int, float]]) -> str:
    steps = sorted(images[0])
    table = np.array([[image[s] for s in steps] for image in images])
    fragile = [(i, image) for i, image in enumerate(images) if min(image.values()) < 30]
    lines = [f"`{name}`: {len(images)} images, one step of {STEPS} forecast (CFG {CFG:g}); "
             f"{len(fragile)} images fall below 30 dB on some single forecast.", "",
             "| forecast step | " + " | ".join(str(s) for s in steps) + " |",
             "|---|" + "---|" * len(steps),
             "| median PSNR | " + " | ".join(f"{v:.1f}" for v in np.median(table, axis=0)) + " |",
             "| worst PSNR | " + " | ".join(f"{v:.1f}" for v in table.min(axis=0)) + " |",
             "| images < 30 dB | " + " | ".join(str(int(n)) for n in (table < 30).sum(axis=0)) + " |"]
    lines += [f"- image {i}: " + ", ".join(f"step {s} {image[s]:.1f}" for s in steps) for i, image in fragile]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default="tune", help=f"comma list of prompt sets ({', '.join(SETS)})")
    parser.add_argument("--warmups", default="3,5,7,9,11,13,15,17",
                        help="auto's warm-ups: each places the one forecast on a later step")
    parser.add_argument("--reference-dir", type=Path, default=None, help="keep the uncached runs here")
    parser.add_argument("--json", type=Path, default=None, help="write {set: [{step: PSNR}, ...]} here")
    args = parser.parse_args()
    names = set_names(parser, args.sets)
    warmups = [int(w) for w in args.warmups.split(",")]
    if any(not 2 <= w < STEPS - 1 for w in warmups):
        parser.error(f"every warm-up must be from 2 to {STEPS - 2}")
    per_set(names, args.reference_dir, args.json,
            lambda pipeline, reference: single_forecasts(pipeline, reference, warmups), markdown, STEPS, CFG)


if __name__ == "__main__":
    main()
