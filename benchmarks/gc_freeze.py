"""What core.memory.freeze_long_lived saves: demo-model jobs in one process that has imported the CLI and the
server (as `serve` has), timed before and after the modules' objects are frozen out of the collector's scans.

    python benchmarks/gc_freeze.py [--jobs 5] [--steps 20]

Prints the tracked objects, one full gc.collect()'s time, and the median job time unfrozen and frozen (the same
jobs, the same pictures: the pixels are compared).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch

from anima_rknn.cli.group import cli
import anima_rknn.server.app  # noqa: F401  (and what serve imports)
from anima_rknn.demo import demo_model_dir
from anima_rknn.generation.params import GenerationParams
from anima_rknn.generation.pipeline import AnimaPipeline
from anima_rknn.model.model_set import from_model_dir


def main() -> None:
    cli.load_all()  # every command's modules, as a long-lived process holds them
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    pipeline = AnimaPipeline(from_model_dir(demo_model_dir()), keep_dit=True)
    params = GenerationParams(prompt="a red circle", width=64, height=64, steps=args.steps, threads=1)
    pipeline.generate(params)  # the model loaded, the prompt encoded once: the jobs below are a server's

    def jobs() -> tuple[float, bytes]:
        seconds = []
        for _ in range(args.jobs):
            start = time.perf_counter()
            image = pipeline.generate(params).image
            seconds.append(time.perf_counter() - start)
        return statistics.median(seconds), image.tobytes()

    start = time.perf_counter()
    gc.collect()
    collect_s = time.perf_counter() - start
    objects = len(gc.get_objects())
    unfrozen, before = jobs()
    gc.collect()
    gc.freeze()
    frozen, after = jobs()
    print(f"tracked objects {objects}, one gc.collect() {collect_s:.3f} s")
    print(f"median job ({args.steps} steps, 64x64, demo model, 1 thread): unfrozen {unfrozen:.3f} s, frozen "
          f"{frozen:.3f} s ({unfrozen / frozen:.2f}x); same pixels: {before == after}")


if __name__ == "__main__":
    main()
