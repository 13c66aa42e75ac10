"""A candidate check for `auto`'s budget (issue 24), measured and not shipped: a partial pass, DBCache-style.

Before a planned forecast is trusted, the first DiT block is run on the latent at hand (the positive prompt's
pass only: 1 / (2 * blocks) of a step's model cost) and its output tokens are compared with their extrapolation
from the last two computed steps, the forecaster's own damped line in sigma. The relative miss `eh`, over the
miss a typical run shows at that sigma and distance (a log-linear fit on the tuning set's uncached runs), is
the check's ratio. Measured here:

- how well `eh` ranks the forecast's real x0 error at each step across images (uncached runs, where both are
  known at every step);
- `budget` with the check refusing: a forecast whose ratio exceeds a threshold is refused and the step
  computed, from a reserve of calls kept back from the plan (the budget stays a hard per-image cap; tuning set
  only, since none of it beat the plain plan there);
- `budget` with the check in the plan: where the plan would forecast, the step's charge is scaled by its ratio
  and the plan made again over the same calls left, so a forecast the check finds costly is computed and the
  plan spreads one call fewer over the steps after it (the cap holds);
- the check as a per-image flag: the plan's charges of the forecast steps weighted by their ratios, ranked
  against PSNR (Spearman), beside the run's own error estimate.

The candidate lives here, not in the library: it patches the split engine (to keep the first block's tokens of
every positive pass) and the pipeline's cache factory for this process alone.

    OMP_NUM_THREADS=1 python benchmarks/partial_pass_check.py [--sets tune,readme,h1,h2,h3] [--own-level last]
        [--reference-dir REF]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np
import torch
from auto_cache import SETS, Reference, run_one, set_names

import anima_rknn.engine.split as split
import anima_rknn.generation.pipeline as pipeline_module
from anima_rknn.bench.metrics import psnr, spearman
from anima_rknn.demo import demo_model_dir
from anima_rknn.model.dit import layer_norm_modulate
from anima_rknn.model.model_set import from_model_dir
from anima_rknn.sampling.auto_cache import DAMPING, AutoCache

# (label, reserve, ratio): plain `budget` with the check only watching, the refusals (run on the tuning set
# alone), the check in the plan (ratio None).
PLAIN, IN_PLAN = ("plain", 0, float("inf")), ("in the plan", 0, None)
REFUSING = tuple((f"refusing > {ratio:g}, {reserve} kept back", reserve, ratio)
                 for reserve in (1, 2) for ratio in (1.5, 2.0))


class FirstBlock:
    """The first block's output tokens of every positive-prompt pass of the current run, and a probe for more."""

    def __init__(self) -> None:
        self.engine: split.SplitEngine | None = None
        self.positive: torch.Tensor | None = None
        self.seen: list[tuple[float, np.ndarray]] = []

    def reset(self) -> None:
        self.engine, self.positive, self.seen = None, None, []

    def tokens(self, x: torch.Tensor, sigma: float) -> np.ndarray:
        engine, state = self.engine, self.engine.dit.prologue(x, torch.tensor([float(sigma)]))
        context = self.positive.detach().float().contiguous().numpy()
        extra = (split.rope_inputs(state.rope), {"context": context}, {})
        for part, (shift, scale, gate) in enumerate(engine._block_modulations(float(sigma), state)[0]):
            y = engine.backend.run(part, {"x": layer_norm_modulate(state.tokens, shift, scale).numpy(), **extra[part]})
            state.tokens = state.tokens + gate * torch.from_numpy(y).float()
        return state.tokens.numpy().ravel().astype(np.float64)

    def patch(self) -> None:
        velocity = split.SplitEngine.velocity

        def watched(engine: split.SplitEngine, x: torch.Tensor, sigma: float, context: torch.Tensor):
            if self.engine is not engine:  # a run's first call is its positive prompt's (pipeline.denoise)
                self.engine, self.positive = engine, context
            if context is self.positive:
                self.seen.append((float(sigma), self.tokens(x, sigma)))
            return velocity(engine, x, sigma, context)

        split.SplitEngine.velocity = watched


def extrapolated(sigma: float, anchors: list[tuple[float, np.ndarray]]) -> np.ndarray:
    (sigma_a, a), (sigma_b, b) = anchors[-1], anchors[-2]
    return a + DAMPING * (sigma - sigma_a) / (sigma_a - sigma_b) * (a - b)


def miss(sigma: float, anchors: list[tuple[float, np.ndarray]], tokens: np.ndarray) -> float:
    return float(np.linalg.norm(extrapolated(sigma, anchors) - tokens) / np.linalg.norm(tokens))


def fit_typical(rows: list[tuple[float, int, float]]) -> np.ndarray:
    """log eh = c0 + c1 sigma + (c2 + c3 sigma) log d, least squares over (sigma, distance, eh)."""
    r = np.array(rows)
    design = np.stack([np.ones(len(r)), r[:, 0], np.log(r[:, 1]), r[:, 0] * np.log(r[:, 1])], 1)
    return np.linalg.lstsq(design, np.log(r[:, 2]), rcond=None)[0]


def typical(coef: np.ndarray, sigma: float, distance: int) -> float:
    return float(np.exp(coef[0] + coef[1] * sigma + (coef[2] + coef[3] * sigma) * np.log(distance)))


def own_level(first: FirstBlock, coef: np.ndarray, sigmas: list[float], computed: list[int], how: str) -> float:
    """The run's own measured first-block miss at its computed steps, over the typical one: the last (`last`) or
    their median (`median`); `fit` trusts the fit's level (1)."""
    ratios = [miss(sigmas[computed[i] - 1], first.seen[i - 2:i], first.seen[i][1])
              / typical(coef, sigmas[computed[i] - 1], computed[i] - computed[i - 1]) for i in range(2, len(computed))]
    if how == "fit" or not ratios:
        return 1.0
    return ratios[-1] if how == "last" else float(np.median(ratios))


def checked_budget(first: FirstBlock, coef: np.ndarray, budget: int, reserve: int, ratio: float | None,
                   level: str = "fit"):
    class Checked(AutoCache):
        """`budget` planned with `reserve` calls kept back; a forecast the first block refuses takes one. With
        `ratio` None, the check's ratio scales the step's charge in the plan instead, over the same calls left."""

        def __init__(self, num_steps: int) -> None:
            super().__init__(num_steps, budget=budget - reserve)
            self.kept, self.refused, self.weighted, self.charged, self.scale = reserve, 0, 0.0, 0.0, 1.0

        def _plan_charges(self) -> np.ndarray:
            charges = super()._plan_charges()
            charges[self._step] *= self.scale  # the step at hand (1-based _step + 1)
            return charges

        def forecast(self, x: np.ndarray) -> np.ndarray:
            step, distance = self._step + 1, len(self._open) + 1
            sigma = self._sigmas[step - 1]
            found = miss(sigma, first.seen[-2:], first.tokens(torch.from_numpy(np.asarray(x, np.float32)), sigma))
            found /= typical(coef, sigma, distance) * own_level(first, coef, self._sigmas, self._computed, level)
            charge = self._plan_charges()[step - 1, distance - 1]
            self.weighted, self.charged = self.weighted + charge * found, self.charged + charge
            left = self.budget - len(self._computed)
            if ratio is None and left > 0:
                self.scale = found
                refuse = not self._plan_forecasts(step, left)
                self.scale = 1.0
            else:
                refuse = ratio is not None and found > ratio and self.refused < self.kept and left > 0
                self.budget += refuse
            if refuse:
                self.refused += 1
                self._skipped.append(step)  # withdrawn by the sampler, which runs the model instead
                return np.full(self._shape, np.nan, np.float32)
            return super().forecast(x)

    return Checked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default="tune", help=f"comma list of prompt sets ({', '.join(SETS)})")
    parser.add_argument("--budgets", default="10,8")
    parser.add_argument("--own-level", default=None, choices=("last", "median"),
                        help="also run the check in the plan with the ratio over the run's own measured level")
    parser.add_argument("--reference-dir", type=Path, default=None, help="keep the uncached runs here")
    args = parser.parse_args()
    names = set_names(parser, args.sets)
    torch.set_num_threads(1)
    first = FirstBlock()
    first.patch()
    made: dict = {}
    factory = pipeline_module.make_cache
    pipeline_module.make_cache = lambda name, n, options=None: made["cls"](n) if made else factory(name, n, options)
    pipeline = pipeline_module.AnimaPipeline(from_model_dir(demo_model_dir()), keep_dit=True)

    def uncached_misses(reference: Reference) -> tuple[list, list]:
        """(sigma, distance, eh) of every step at distances 1-4, and per image per step (eh, measured x0 error)."""
        rows, per_image = [], []
        for i, params in enumerate(reference.params):
            first.reset()
            made["cls"] = lambda n: AutoCache(n, budget=n)  # every step computed, its forecast error measured
            state = run_one(pipeline, dataclasses.replace(params, cache="auto"), reference.conditioning(i))[3]
            made.clear()
            seen, measured = first.seen, dict(zip(state["measured_steps"], state["measured_errors"]))
            for k in range(2, len(seen)):
                for d in range(1, min(4, k - 1) + 1):
                    rows.append((seen[k][0], d, miss(seen[k][0], seen[k - d - 1:k - d + 1], seen[k][1])))
            per_image.append([(miss(seen[k][0], seen[k - 2:k], seen[k][1]), measured[k + 1])
                              for k in range(2, len(seen))])
        return rows, per_image

    tune = Reference(pipeline, *SETS["tune"], 20, 4.0, args.reference_dir)
    rows, tune_misses = uncached_misses(tune)
    coef = fit_typical(rows)
    print(f"typical first-block miss, fit on `tune`: log eh = {coef[0]:.3f} + {coef[1]:.3f} sigma + "
          f"({coef[2]:.3f} + {coef[3]:.3f} sigma) log d", file=sys.stderr)
    lines = ["| set | budget | check | passes mean | PSNR mean / worst | below 30 | computed by the check / image | "
             "flag vs PSNR | estimate vs PSNR |", "|---|---|---|---|---|---|---|---|---|"]
    for name in names:
        reference = tune if name == "tune" else Reference(pipeline, *SETS[name], 20, 4.0, args.reference_dir)
        per_image = np.array(tune_misses if name == "tune" else uncached_misses(reference)[1])  # [image, step, (eh, e)]
        ranks = [spearman(list(per_image[:, j, 0]), list(per_image[:, j, 1])) for j in range(per_image.shape[1])]
        print(f"`{name}`: eh vs the forecast's x0 error across images, per step 3-20 (Spearman): "
              f"{' '.join(f'{r:.2f}' for r in ranks)}; median {np.median(ranks):.2f}", file=sys.stderr)
        for budget in (int(b) for b in args.budgets.split(",")):
            settings = [(*s, "fit") for s in ((PLAIN, *REFUSING, IN_PLAN) if name == "tune" else (PLAIN, IN_PLAN))]
            if args.own_level:
                settings.append((f"in the plan, own level ({args.own_level})", 0, None, args.own_level))
            for label, reserve, ratio, level in settings:
                psnrs, passes, refused, weighted, estimates = [], [], [], [], []
                for i, params in enumerate(reference.params):
                    first.reset()
                    caches: list = []
                    cls = checked_budget(first, coef, budget, reserve, ratio, level)
                    made["cls"] = lambda n, cls=cls: caches.append(cls(n)) or caches[-1]
                    _, image, denoised, _ = run_one(pipeline, dataclasses.replace(params, cache="auto"),
                                                    reference.conditioning(i))
                    made.clear()
                    cache = caches[-1]
                    psnrs.append(psnr(reference.images[i], image))
                    passes.append(denoised.transformer_passes)
                    refused.append(cache.refused)
                    weighted.append(cache.weighted / max(cache.charged, 1e-12))
                    estimates.append(denoised.sample.error_estimate)
                p = np.array(psnrs)
                ranked = [spearman([-v for v in values], psnrs) for values in (weighted, estimates)]
                lines.append(f"| {name} | {budget} | {label} | {np.mean(passes):.2f} | {p.mean():.1f} / "
                             f"{p.min():.1f} | {(p < 30).sum()} | {np.mean(refused):.2f} | {ranked[0]:.2f} | "
                             f"{ranked[1]:.2f} |")
                print(lines[-1], file=sys.stderr)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
