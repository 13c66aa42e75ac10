"""`auto`'s `check` (issue 24), measured: a partial pass looks at each forecast a budget plans before it is trusted.

DBCache-style: the first DiT block runs on the latent at hand (the positive prompt's pass only: 1 / blocks of a
pass) and its output tokens are compared with their damped line through the last two computed steps
(sampling.auto_cache.probe_miss); the miss over the typical miss at that sigma and distance (the cache fit's typical_probe_miss)
scales the step's charge in the plan, which may then compute the step. This script

- fits the typical miss on the uncached runs of `tune` (every step computed, the first block's tokens kept by each
  full pass) and prints it beside the constants `auto` ships (fitted here);
- measures, per set, how well the partial pass's miss ranks the x0 forecast's real error across images at each
  step (uncached runs, where both are known at every step);
- runs `budget` plain and with `check=1` (the library's), and on `tune` alone the variant that was not shipped:
  refusing a forecast whose ratio exceeds a threshold, from a reserve of calls kept back from the plan.

    OMP_NUM_THREADS=1 python benchmarks/partial_pass_check.py [--sets tune,readme,h1,h2,h3] [--budgets 10,8]
        [--reference-dir REF]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
from pathlib import Path

import numpy as np
from auto_cache import SETS, Reference, evaluate, run_one, set_names

import anima_rknn.generation.pipeline as pipeline_module
from anima_rknn.bench.metrics import spearman
from anima_rknn.demo import demo_model_dir
from anima_rknn.model.model_set import from_model_dir
from anima_rknn.sampling.auto_cache import AutoCache, probe_miss
from anima_rknn.sampling.cache_fit import CacheFit

# The variant not shipped, on `tune` only: (reserve kept back, ratio above which a forecast is refused).
REFUSING = tuple((reserve, ratio) for reserve in (1, 2) for ratio in (1.5, 2.0))


class Recording(AutoCache):
    """Every step computed (budget = steps), each step's (sigma, first-block tokens) and measured x0 error kept."""

    def __init__(self, num_steps: int, fit: CacheFit) -> None:
        super().__init__(num_steps, budget=num_steps, check=True, fit=fit)
        self.seen: list[tuple[float, np.ndarray]] = []

    def record(self, x: np.ndarray, x0: np.ndarray) -> None:
        super().record(x, x0)
        self.seen.append((self._sigmas[self._computed[-1] - 1], self._probe_anchors[-1][1]))


class Refusing(AutoCache):
    """`budget` planned with `reserve` calls kept back; a forecast whose check ratio exceeds `ratio` is refused
    (computed) while the reserve lasts, instead of the ratio moving the plan."""

    def __init__(self, num_steps: int, fit: CacheFit, budget: int, reserve: int, ratio: float) -> None:
        super().__init__(num_steps, budget=budget - reserve, check=True, fit=fit)
        self.kept, self.ratio, self.refused = reserve, ratio, 0

    def _forecasts(self, plan: tuple[float, float, float], scale: float = 1.0) -> bool:
        if scale == 1.0:  # the plan itself (a ratio of exactly 1 changes nothing either way)
            return super()._forecasts(plan)
        refuse = scale > self.ratio and self.refused < self.kept
        self.refused += refuse
        self.budget += refuse
        return not refuse


def fit_typical(runs: list[list[tuple[float, np.ndarray]]]) -> np.ndarray:
    """ln miss = k0 + k1 sigma + (k2 + k3 sigma) ln d, least squares over every step from the third on and
    distances 1-4 of the uncached runs' first-block tokens."""
    rows = [(seen[k][0], d, probe_miss(seen[k][1], seen[k][0], seen[k - d], seen[k - d - 1]))
            for seen in runs for k in range(2, len(seen)) for d in range(1, min(4, k - 1) + 1)]
    r = np.array(rows)
    design = np.stack([np.ones(len(r)), r[:, 0], np.log(r[:, 1]), r[:, 0] * np.log(r[:, 1])], 1)
    return np.linalg.lstsq(design, np.log(r[:, 2]), rcond=None)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default="tune", help=f"comma list of prompt sets ({', '.join(SETS)})")
    parser.add_argument("--budgets", default="10,8")
    parser.add_argument("--reference-dir", type=Path, default=None, help="keep the uncached runs here")
    args = parser.parse_args()
    names = set_names(parser, args.sets)
    budgets = [int(b) for b in args.budgets.split(",")]
    made: list = []
    factory = pipeline_module.make_cache

    def make_cache(name: str, num_steps: int, options: dict | None = None, fit: CacheFit | None = None):
        made.append(factory(name, num_steps, options, fit) if made_by is None else made_by(num_steps, fit))
        return made[-1]

    made_by = None
    pipeline_module.make_cache = make_cache
    pipeline = pipeline_module.AnimaPipeline(from_model_dir(demo_model_dir()), keep_dit=True)

    def uncached(reference: Reference) -> list[Recording]:
        nonlocal made_by
        made_by, runs = Recording, []
        for i, params in enumerate(reference.params):
            run_one(pipeline, dataclasses.replace(params, cache="auto"), reference.conditioning(i))
            runs.append(made[-1])
        made_by = None
        return runs

    references = {name: Reference(pipeline, *SETS[name], 20, 4.0, args.reference_dir) for name in {"tune", *names}}
    coef = fit_typical([run.seen for run in uncached(references["tune"])])
    print("typical first-block miss, fit on `tune`: ln miss = {:.2f} + {:.2f} sigma + ({:.2f} + {:.2f} sigma) ln d; "
          "the demo's fit has {}".format(*coef, pipeline.cache_fit.typical_probe_miss), file=sys.stderr)
    header = ("| set | budget | check | passes mean + partial passes (pass-equivalents) | PSNR mean / worst | "
              "below 30 | forecasts the check computed / image |")
    lines = [header, "|---|---|---|---|---|---|---|"]
    for name in names:
        reference = references[name]
        runs = uncached(reference)
        # per step, across images: the partial pass's miss (distance 1) vs the x0 forecast's measured error
        ranks = [spearman([probe_miss(r.seen[k][1], r.seen[k][0], r.seen[k - 1], r.seen[k - 2]) for r in runs],
                          [r.measured_errors[k] for r in runs]) for k in range(2, len(runs[0].seen))]
        print(f"`{name}`: partial-pass miss vs the forecast's x0 error across images, per step 3-20 (Spearman): "
              f"{' '.join(f'{r:.2f}' for r in ranks)}; median {np.median(ranks):.2f}", file=sys.stderr)
        blocks = pipeline.dit_config.blocks
        for budget in budgets:
            settings = [("plain", {"budget": budget}), ("check=1", {"budget": budget, "check": True})]
            for label, options in settings:
                made.clear()
                entry = evaluate(pipeline, reference, "auto", options)
                partial = np.mean([r["partial_passes"] for r in entry["rows"]])
                checked = np.mean([len(cache.checked_steps) for cache in made])
                p = entry["psnr"]
                lines.append(f"| {name} | {budget} | {label} | {entry['passes']['mean']:.2f} + {partial:.2f} "
                             f"({partial / blocks:.2f}) | {p['mean']:.1f} / {p['worst']:.1f} | "
                             f"{entry['below']['30']} | {checked:.2f} |")
                print(lines[-1], file=sys.stderr)
            if name != "tune":
                continue
            for reserve, ratio in REFUSING:
                made_by = functools.partial(Refusing, budget=budget, reserve=reserve, ratio=ratio)
                made.clear()
                entry = evaluate(pipeline, reference, "auto", {"budget": budget, "check": True})
                made_by = None
                p = entry["psnr"]
                lines.append(f"| {name} | {budget} | refusing > {ratio:g}, {reserve} kept back | "
                             f"{entry['passes']['mean']:.2f} | {p['mean']:.1f} / {p['worst']:.1f} | "
                             f"{entry['below']['30']} | {np.mean([c.refused for c in made]):.2f} |")
                print(lines[-1], file=sys.stderr)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
