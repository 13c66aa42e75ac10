"""Step caching on a trained model: the demo model over many prompts, each cache against the uncached run.

For every prompt the uncached image is the reference; each cache runs from the same noise. Prints, per cache,
PSNR and SSIM to the reference (mean, median, worst), prompt adherence (all four attributes right) and
transformer steps computed, as a Markdown table, or JSON with --json.

    python benchmarks/demo_caching.py [--model DIR] [--prompts 60] [--steps 20] [--cfg 4] [--json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from anima_rknn.bench.metrics import psnr, ssim
from anima_rknn.demo import demo_model_dir
from anima_rknn.demo.evaluate import adherence, generate_images, judge, prompt_set
from anima_rknn.generation.pipeline import AnimaPipeline
from anima_rknn.model.model_set import from_model_dir
from anima_rknn.sampling.caches import make_cache

CACHES = ("spectrum", "spectrum-plus", "reuse")


def computed_steps(cache: str, steps: int) -> int:
    """Steps that run the model; the schedules do not depend on the values, so placeholders will do."""
    policy = make_cache(cache, steps)
    zero = np.zeros(4, dtype=np.float32)
    for _ in range(steps):
        if policy.should_skip():
            policy.forecast(zero)
        else:
            policy.record(zero, zero)
    return len(policy.computed_steps)


def run(model: Path, prompts: int, steps: int, cfg: float, seed: int) -> dict:
    specs = prompt_set(prompts)
    pipeline = AnimaPipeline(from_model_dir(model), keep_dit=True)
    images = {cache: generate_images(model, specs, steps=steps, cfg=cfg, seed=seed, cache=cache, pipeline=pipeline)
              for cache in ("none", *CACHES)}
    report = {"prompts": prompts, "steps": steps, "cfg": cfg, "caches": {}}
    for cache, pictures in images.items():
        entry = {"adherence": adherence(judge(specs, pictures)), "computed_steps": computed_steps(cache, steps)}
        if cache != "none":
            pairs = list(zip(images["none"], pictures))
            values = {"psnr": [psnr(a, b) for a, b in pairs], "ssim": [ssim(a, b) for a, b in pairs]}
            for metric, v in values.items():
                entry[metric] = {"mean": float(np.mean(v)), "median": float(np.median(v)), "worst": float(np.min(v))}
        report["caches"][cache] = entry
    return report


def markdown(report: dict) -> str:
    lines = [f"Demo model, {report['prompts']} prompts, {report['steps']} steps, CFG {report['cfg']}; "
             "PSNR/SSIM against the uncached image from the same noise.", "",
             "| cache | computed steps | PSNR mean / median / worst (dB) | SSIM mean / worst | adherence (all 4) |",
             "|---|---|---|---|---|"]
    for cache, e in report["caches"].items():
        if cache == "none":
            quality = "reference", "reference"
        else:
            p, s = e["psnr"], e["ssim"]
            quality = f"{p['mean']:.1f} / {p['median']:.1f} / {p['worst']:.1f}", f"{s['mean']:.4f} / {s['worst']:.4f}"
        lines.append(f"| {cache} | {e['computed_steps']}/{report['steps']} | {quality[0]} | {quality[1]} | "
                     f"{e['adherence']['all']:.0%} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="model directory (default: the demo model)")
    parser.add_argument("--prompts", type=int, default=60)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--cfg", type=float, default=4.0)
    parser.add_argument("--seed", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    report = run(args.model or demo_model_dir(), args.prompts, args.steps, args.cfg, args.seed)
    print(json.dumps(report, indent=2) if args.json else markdown(report))


if __name__ == "__main__":
    main()
