"""`anima-rknn calibrate-cache --fit all` on the shipped demo model, compared with the demo's shipped cache fit.

Each fitted curve: the largest difference in ln over sigma 0.1-0.8 and d 1-4 (bench.calibrate.curve_distance)
against the shipped fit's residual sd. The plan pair: the shipped pair's mean PSNR against the best pair's, in
paired standard errors (bench.cache_choices.choose_plan). The flag: the new flag_score against the shipped one in
units of its bootstrap sd (ln), and both flags (each with its own typical_miss) on the same fit and held-out runs.

    OMP_NUM_THREADS=1 python benchmarks/calibrate_demo.py --prompts 24 --held-out 6 --seeds 5000,5001 --out fit.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from pathlib import Path

import torch

from anima_rknn.bench.cache_choices import (
    FLAG_RECALL,
    FLAG_SIGMAS,
    LOW_PSNR,
    flag_counts,
)
from anima_rknn.bench.cache_curves import curve_distance
from anima_rknn.bench.calibrate import calibrate
from anima_rknn.demo import demo_model_dir
from anima_rknn.demo.dataset import IMAGE_SIZE
from anima_rknn.demo.evaluate import prompt_set
from anima_rknn.generation.params import GenerationParams
from anima_rknn.generation.pipeline import AnimaPipeline
from anima_rknn.model.model_set import from_model_dir
from anima_rknn.sampling.cache_fit import write_fit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=24, help="tuning prompts (prompt_set(N, 3), as `tune`)")
    parser.add_argument("--held-out", type=int, default=6)
    parser.add_argument("--seeds", default="5000,5001")
    parser.add_argument("--fit", default="all", choices=("all", "curves"))
    parser.add_argument("--out", type=Path, default=None, help="write the new fit here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    pipeline = AnimaPipeline(from_model_dir(demo_model_dir()), keep_dit=True)
    shipped = pipeline.cache_fit
    base = GenerationParams(prompt="x", width=IMAGE_SIZE, height=IMAGE_SIZE, steps=20, cfg=4.0, dtype="fp32",
                            backend="torch", vae_backend="torch")
    prompts = [spec.caption for spec in prompt_set(args.prompts, 3)]
    began = time.perf_counter()
    made = calibrate(pipeline, base, prompts, [int(s) for s in args.seeds.split(",")], args.held_out, fit=args.fit)
    new = made.fit
    print(f"{made.runs} runs, {made.calls} model calls, {time.perf_counter() - began:.0f} s\n")
    print("| number | shipped | calibrate-cache | difference | fit error | within |\n|---|---|---|---|---|---|")
    for name in ("typical_miss", "typical_probe_miss", "plan_growth"):
        distance, error = curve_distance(name, new, shipped), shipped.fit_error[name]
        print(f"| {name} | {getattr(shipped, name)} | {getattr(new, name)} | {distance:.2f} (ln, worst of the "
              f"grid) | {error:.2f} (residual sd) | {'yes' if distance <= error else 'no'} |")
    if made.plan is not None:
        plan, pair = made.plan, (shipped.plan_gain, shipped.plan_sigma)
        print(f"| plan_gain, plan_sigma | {pair} | {plan.plan} (best {plan.best}) | {plan.means[plan.best]:.2f} - "
              f"{plan.means[pair]:.2f} dB | 2 paired se | {'yes' if pair in plan.within else 'no'} |")
        spread = made.flag.spread
        gap = abs(math.log(new.flag_score / shipped.flag_score))
        print(f"| flag_score | {shipped.flag_score} | {new.flag_score} | {gap:.2f} (ln) | {2 * spread:.2f} (2 "
              f"bootstrap sd, ln) | {'yes' if gap <= 2 * spread else 'no'} |")
        gap, spread = abs(new.flag_sigma - shipped.flag_sigma), made.flag.sigma_spread
        print(f"| flag_sigma | {shipped.flag_sigma} | {new.flag_sigma} | {gap:.2f} | {2 * spread:.2f} (2 bootstrap "
              f"sd) | {'yes' if gap <= 2 * spread else 'no'} |")
        print(f"\nplan: {plan.describe()}")
        for flag_sigma in FLAG_SIGMAS:  # each flag_sigma at its own 80 %-recall threshold, the new typical_miss
            scores = sorted((r.score(new.typical_miss, flag_sigma) for r in made.fit_runs if r.psnr < LOW_PSNR),
                            reverse=True)
            threshold = scores[math.ceil(FLAG_RECALL * len(scores)) - 1]
            counts = flag_counts(made.fit_runs, new.typical_miss, flag_sigma, threshold, LOW_PSNR)
            print(f"flag_sigma {flag_sigma}: threshold {threshold:.3f}, precision "
                  f"{counts.caught / max(counts.flagged, 1):.3f} ({counts.describe()})")
        for label, fit in (("shipped", shipped), ("new", new)):
            for runs, where in ((made.fit_runs, "fit runs"), (made.held_runs, "held-out runs")):
                counts = flag_counts(runs, fit.typical_miss, fit.flag_sigma, fit.flag_score, LOW_PSNR)
                print(f"flag {label} on the {where}: {counts.describe()}")
    print(f"\nheld out: {made.held_out.describe()}")
    print(f"fit_error: {new.fit_error}")
    if args.out is not None:
        write_fit(args.out, new, overwrite=True)
        args.out.with_suffix(".runs.json").write_text(json.dumps(  # the runs, to choose again without running
            {"fit": [dataclasses.asdict(r) for r in made.fit_runs],
             "held_out": [dataclasses.asdict(r) for r in made.held_runs]}))


if __name__ == "__main__":
    main()
