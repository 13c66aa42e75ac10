"""Is an image's fragility its own? One forecast's error against a random nudge of the same step, run to the end.

Issue 24's worst images lose 10+ dB to a single forecast (benchmarks/single_forecast.py). This asks whether the
forecast's error is to blame or the image's trajectory, which would magnify any small deviation. Per image, on the
uncached run (euler, 20 steps, CFG 4):

- **forecast**: `auto` with one forecast, at step K (budget 19, warm-up K - 1; K = 4 or 6 are such steps). Its
  growth is the final latent's relative distance from the uncached one over the distance right after step K.
- **nudge**: the uncached run's latent after step K plus smooth random noise (4x4-block Gaussian, bilinear, seeded
  by the image's index) of relative size --size, continued to the end through the pipeline's own resume path.
  Its growth is the final relative distance over --size.
- **budget=10**: the image's PSNR under `auto budget=10`, for the nudge as a flag (growth above --flag-growth: "this
  cached image may differ visibly") against the images below 30 dB. The nudge costs 20 - K steps.
- **how early the fate shows**: the forecast's growth after n more steps (the distance after step K + n over the
  distance after step K), ranked against its growth to the end and against the budget=10 PSNR. It reads the uncached
  twin exactly, at 2n passes: the reference any in-run estimate of the deviation can at best approximate. Beside it the
  x0 response at step K + 1: the distance between the two runs' x0 there over their latents' distance after step
  K, which a run could estimate with one extra pass if it knew the deviation's direction.

    OMP_NUM_THREADS=1 python benchmarks/perturbation_probe.py --sets tune --reference-dir REF [--step 6]
        [--size 0.005] [--flag-growth 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from auto_cache import SETS, Reference, per_set, ratio, run_one, set_names

from anima_rknn.bench.metrics import psnr, relative_l2, spearman
from anima_rknn.generation.params import GenerationParams
from anima_rknn.generation.pipeline import AnimaPipeline
from anima_rknn.generation.result import Conditioning
from anima_rknn.generation.resume import ResumeState
from anima_rknn.sampling.sample import StepEvent

STEPS, CFG = 20, 4.0
EARLY = (1, 3, 6, 10)  # steps after the forecast at which the twin's growth is ranked


def smooth_noise(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Gaussian noise averaged over 4x4 blocks and upsampled: a forecast's error is smooth, not per-pixel."""
    noise = torch.from_numpy(np.random.default_rng(seed).standard_normal(shape)).float()
    flat = noise.reshape(1, -1, *shape[-2:])
    return F.interpolate(F.avg_pool2d(flat, 4), size=shape[-2:], mode="bilinear").reshape(shape).numpy()


def trajectory(pipeline: AnimaPipeline, params: GenerationParams, conditioning: Conditioning,
               resume: ResumeState | None = None) -> list[StepEvent]:
    """Every step's event of one pass (a resumed one: of the steps after the state's)."""
    events: list[StepEvent] = []
    pipeline.denoise(conditioning, params, on_step=events.append, resume=resume)
    return events


def probe(pipeline: AnimaPipeline, reference: Reference, step: int, size: float) -> list[dict]:
    rows = []
    for i, base in enumerate(reference.params):
        conditioning = reference.conditioning(i)
        uncached = trajectory(pipeline, base, conditioning)
        at = uncached[step - 1]
        x = np.asarray(at.x, np.float32)
        noise = smooth_noise(x.shape, i)
        nudged = (x + size * np.linalg.norm(x) / np.linalg.norm(noise) * noise).astype(np.float32)
        resume = ResumeState(base, {}, step, nudged, conditioning, at.cache_state, at.sampler_state, 0.0)
        final = uncached[-1].x
        nudge = relative_l2(final, trajectory(pipeline, base, conditioning, resume)[-1].x) / size
        single = dataclasses.replace(base, cache="auto", cache_options={"budget": STEPS - 1, "warmup": step - 1})
        forecast = trajectory(pipeline, single, conditioning)
        if [e.step for e in forecast if not e.computed] != [step]:
            raise SystemExit(f"image {i}: a warm-up of {step - 1} did not put the one forecast on step {step}")
        after = relative_l2(uncached[step - 1].x, forecast[step - 1].x)
        budget = dataclasses.replace(base, cache="auto", cache_options={"budget": 10})
        rows.append({"nudge": nudge, "forecast": relative_l2(final, forecast[-1].x) / after,
                     "deviation": [relative_l2(u.x, f.x) for u, f in zip(uncached, forecast)],
                     "response": float(np.linalg.norm(forecast[step].x0 - uncached[step].x0)
                                       / np.linalg.norm(forecast[step - 1].x - uncached[step - 1].x)),
                     "forecast_psnr": psnr(reference.images[i], np.asarray(pipeline.decode(forecast[-1].x)[0])),
                     "budget10_psnr": psnr(reference.images[i], run_one(pipeline, budget, conditioning)[1])})
    return rows


def markdown(name: str, rows: list[dict], step: int, size: float, flag_growth: float) -> str:
    nudge, forecast = np.array([r["nudge"] for r in rows]), np.array([r["forecast"] for r in rows])
    low, flagged = np.array([r["budget10_psnr"] < 30 for r in rows]), nudge > flag_growth
    fragile = [i for i, r in enumerate(rows) if r["forecast_psnr"] < 30]
    caught = int((low & flagged).sum())
    lines = [f"`{name}`: {len(rows)} images, step {step}, nudge {size:g}: growth median forecast "
             f"{np.median(forecast):.2f} / nudge {np.median(nudge):.2f}; Spearman(forecast, nudge) "
             f"{spearman(list(forecast), list(nudge)):.2f}; Spearman(-nudge, budget=10 PSNR) "
             f"{spearman(list(-nudge), [r['budget10_psnr'] for r in rows]):.2f}",
             f"  flag nudge > {flag_growth:g}: {int(flagged.sum())} flagged, {int(low.sum())} below 30 dB at "
             f"budget=10, {caught} caught: recall {ratio(caught, int(low.sum()))}, precision "
             f"{ratio(caught, int(flagged.sum()))}"]
    budget10, deviation = [r["budget10_psnr"] for r in rows], np.array([r["deviation"] for r in rows])
    early = {n: deviation[:, step - 1 + n] / deviation[:, step - 1] for n in EARLY if step + n <= STEPS}
    lines.append("  the twin's growth after n steps, Spearman vs growth to the end / vs budget=10 PSNR: " + ", ".join(
        f"n={n} {spearman(list(g), list(forecast)):.2f} / {spearman(list(-g), budget10):.2f}"
        for n, g in early.items()))
    response = [r["response"] for r in rows]
    lines.append(f"  x0 response at step {step + 1}: median {np.median(response):.2f}, Spearman vs growth "
                 f"{spearman(response, list(forecast)):.2f} / -response vs budget=10 PSNR "
                 f"{spearman([-v for v in response], budget10):.2f}")
    for i in sorted(set(fragile) | set(np.flatnonzero(low)) | set(np.flatnonzero(flagged))):
        r = rows[i]
        lines.append(f"  image {i}: forecast growth {r['forecast']:.2f} ({r['forecast_psnr']:.1f} dB), nudge growth "
                     f"{r['nudge']:.2f}, budget=10 {r['budget10_psnr']:.1f} dB")
        if r["forecast_psnr"] < 30:
            lines.append("    the forecast's deviation after steps " + ", ".join(
                f"{s}: {r['deviation'][s - 1]:.4f}" for s in range(step, STEPS + 1)))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default="tune", help=f"comma list of prompt sets ({', '.join(SETS)})")
    parser.add_argument("--step", type=int, default=6, help="the step forecast, and nudged after")
    parser.add_argument("--size", type=float, default=0.005, help="the nudge's size, relative to the latent")
    parser.add_argument("--flag-growth", type=float, default=1.0, help="flag an image whose nudge grows past this")
    parser.add_argument("--reference-dir", type=Path, default=None, help="keep the uncached runs here")
    parser.add_argument("--json", type=Path, default=None, help="write {set: [per image], ...} here")
    args = parser.parse_args()
    names = set_names(parser, args.sets)
    if not 3 <= args.step < STEPS:
        parser.error(f"--step must be from 3 to {STEPS - 1}")
    per_set(names, args.reference_dir, args.json,
            lambda pipeline, reference: probe(pipeline, reference, args.step, args.size),
            lambda name, rows: markdown(name, rows, args.step, args.size, args.flag_growth), STEPS, CFG)


if __name__ == "__main__":
    main()
