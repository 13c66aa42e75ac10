"""The `auto` cache on the trained demo model: PSNR vs mean transformer passes against the fixed schedules.

For every prompt the uncached image is the reference; each policy and setting runs from the same noise and the
same encoded prompt. Prints a Markdown table (per setting: passes mean / max, PSNR mean / median / worst, SSIM,
adherence, error estimate vs true PSNR as a Spearman rank correlation), draws PSNR vs mean passes to --plot,
and with --json writes the raw figures.

    python benchmarks/auto_cache.py [--prompts 48] [--prompt-seed 7] [--seed 1000] [--plot docs/auto_cache.png]

The defaults are the README's held-out set: benchmarks/demo_caching.py's 48 prompts with noise seeds 1000 + i.
The settings were tuned on --prompts 24 --prompt-seed 3 --seed 5000 (other prompts, other noise).
--reference-dir keeps the uncached latents, images and prompt encodings between runs (tuning reruns only the
cached policies).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import torch

from anima_rknn.bench.metrics import psnr, relative_l2, spearman, ssim
from anima_rknn.demo import demo_model_dir
from anima_rknn.demo.dataset import IMAGE_SIZE
from anima_rknn.demo.evaluate import adherence, judge, prompt_set
from anima_rknn.generation.params import GenerationParams
from anima_rknn.generation.pipeline import AnimaPipeline
from anima_rknn.generation.result import Conditioning
from anima_rknn.model.model_set import from_model_dir

# (label, cache, options): the fixed schedules at their defaults, and auto along its tolerance and budget axes.
SETTINGS = (
    ("spectrum", "spectrum", {}),
    ("spectrum-plus", "spectrum-plus", {}),
    ("reuse", "reuse", {}),
    ("auto budget=7", "auto", {"budget": 7}),
    ("auto budget=8", "auto", {"budget": 8}),
    ("auto budget=9", "auto", {"budget": 9}),
    ("auto budget=10", "auto", {"budget": 10}),
    ("auto tol=0.1", "auto", {"tol": 0.1}),
    ("auto (tol=0.05)", "auto", {}),
    ("auto tol=0.025", "auto", {"tol": 0.025}),
)

class Reference:
    """The uncached runs of a prompt set: settings, encodings, final latents and images, optionally kept on disk."""

    def __init__(self, pipeline: AnimaPipeline, prompts: int, prompt_seed: int, seed: int, steps: int, cfg: float,
                 folder: Path | None) -> None:
        self.specs = prompt_set(prompts, prompt_seed)
        self.params = [GenerationParams(prompt=spec.caption, width=IMAGE_SIZE, height=IMAGE_SIZE, steps=steps,
                                        cfg=cfg, seed=seed + i) for i, spec in enumerate(self.specs)]
        name = f"ref_p{prompts}_ps{prompt_seed}_s{seed}_n{steps}_c{cfg:g}.npz"
        path = folder / name if folder is not None else None
        if path is not None and path.exists():
            stored = np.load(path)
            self.contexts = [(stored["pos"][i], stored["neg"][i]) for i in range(prompts)]
            self.latents, self.images = list(stored["latents"]), list(stored["images"])
            return
        self.contexts, self.latents, self.images = [], [], []
        for params in self.params:
            c = pipeline.encode(params.prompt, params.negative, params.dtype)
            self.contexts.append((c.positive.numpy(), c.negative.numpy()))
            latent, image = run_one(pipeline, params, c)[:2]
            self.latents.append(latent)
            self.images.append(image)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            np.savez(path, pos=np.stack([p for p, _ in self.contexts]), neg=np.stack([n for _, n in self.contexts]),
                     latents=np.stack(self.latents), images=np.stack(self.images))

    def conditioning(self, i: int) -> Conditioning:
        positive, negative = self.contexts[i]
        return Conditioning(torch.from_numpy(positive), torch.from_numpy(negative), 0.0)


def run_one(pipeline: AnimaPipeline, params: GenerationParams,
            conditioning: Conditioning) -> tuple[np.ndarray, np.ndarray, object]:
    denoised = pipeline.denoise(conditioning, params)
    image = np.zeros((IMAGE_SIZE, IMAGE_SIZE, 3), np.uint8)
    if denoised.sample.finite:
        image = np.asarray(pipeline.decode(denoised.sample.latent)[0])
    return denoised.sample.latent, image, denoised


def evaluate(pipeline: AnimaPipeline, reference: Reference, cache: str, options: dict) -> dict:
    rows, images = [], []
    for i, base in enumerate(reference.params):
        params = dataclasses.replace(base, cache=cache, cache_options=dict(options))
        latent, image, denoised = run_one(pipeline, params, reference.conditioning(i))
        images.append(image)
        rows.append({"passes": denoised.transformer_passes, "psnr": psnr(reference.images[i], image),
                     "ssim": ssim(reference.images[i], image),
                     "latent_error": relative_l2(reference.latents[i], latent),
                     "estimate": denoised.sample.error_estimate})
    psnrs = np.array([r["psnr"] for r in rows])
    passes = np.array([r["passes"] for r in rows])
    entry = {"cache": cache, "options": options, "rows": rows,
             "passes": {"mean": float(passes.mean()), "max": int(passes.max())},
             "psnr": {"mean": float(psnrs.mean()), "median": float(np.median(psnrs)), "worst": float(psnrs.min())},
             "ssim": {"mean": float(np.mean([r["ssim"] for r in rows])), "worst": float(min(r["ssim"] for r in rows))},
             "adherence": adherence(judge(reference.specs, images))["all"]}
    if rows[0]["estimate"] is not None:
        # A larger estimated error should mean a lower PSNR: report the correlation of -estimate with PSNR.
        entry["spearman"] = spearman([-r["estimate"] for r in rows], list(psnrs))
    return entry


def markdown(report: dict) -> str:
    lines = [f"Demo model, {report['prompts']} prompts (prompt-set seed {report['prompt_seed']}, noise seeds "
             f"{report['seed']}+), {report['steps']} steps, CFG {report['cfg']:g}; uncached: {2 * report['steps']} "
             f"passes, adherence {report['reference_adherence']:.0%}.", "",
             "| policy | passes mean / max | PSNR mean / median / worst (dB) | SSIM mean / worst | adherence | "
             "estimate vs PSNR (Spearman) |", "|---|---|---|---|---|---|"]
    for label, e in report["settings"].items():
        p, s = e["psnr"], e["ssim"]
        rank = f"{e['spearman']:.2f}" if "spearman" in e else ""
        lines.append(f"| {label} | {e['passes']['mean']:.1f} / {e['passes']['max']} | {p['mean']:.1f} / "
                     f"{p['median']:.1f} / {p['worst']:.1f} | {s['mean']:.4f} / {s['worst']:.4f} | "
                     f"{e['adherence']:.0%} | {rank} |")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    from matplotlib.figure import Figure  # no pyplot: no display backend needed

    figure = Figure(figsize=(7, 4.2), dpi=120)
    axes = figure.add_subplot()
    autos = [e for e in report["settings"].values() if e["cache"] == "auto"]
    for colour, by_budget, name in (("C3", True, "auto, budget"), ("C4", False, "auto, tolerance")):
        points = sorted((e["passes"]["mean"], e["psnr"]["mean"], e["psnr"]["worst"])
                        for e in autos if ("budget" in e["options"]) == by_budget)
        axes.plot([p[0] for p in points], [p[1] for p in points], "o-", color=colour, label=f"{name}, mean")
        axes.plot([p[0] for p in points], [p[2] for p in points], "o--", color=colour, alpha=0.5, mfc="none",
                  label=f"{name}, worst")
    for n, (label, e) in enumerate((label, e) for label, e in report["settings"].items() if e["cache"] != "auto"):
        colour = ("C0", "C1", "C2")[n % 3]
        axes.plot(e["passes"]["mean"], e["psnr"]["mean"], "s", color=colour, label=f"{label}, mean")
        axes.plot(e["passes"]["mean"], e["psnr"]["worst"], "s", color=colour, alpha=0.4, mfc="none",
                  label=f"{label}, worst")
    axes.axhline(45, color="grey", lw=0.6, ls=":")
    axes.axhline(30, color="grey", lw=0.6, ls=":")
    axes.set_xlabel("transformer passes per image (mean; uncached: 40)")
    axes.set_ylabel("PSNR vs uncached image (dB)")
    axes.set_title(f"Demo model, {report['prompts']} prompts, {report['steps']} steps, CFG {report['cfg']:g}")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, ncol=2, loc="lower right")
    figure.tight_layout()
    figure.savefig(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="model directory (default: the demo model)")
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--prompt-seed", type=int, default=7, help="prompt_set's seed (7: demo_caching.py's set)")
    parser.add_argument("--seed", type=int, default=1000, help="noise seed of the first prompt")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--cfg", type=float, default=4.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reference-dir", type=Path, default=None, help="keep the uncached runs here")
    parser.add_argument("--only", default=None, help="comma list of setting labels to run (default: all)")
    parser.add_argument("--plot", type=Path, default=None, help="write the PSNR-vs-passes plot here (PNG)")
    parser.add_argument("--json", type=Path, default=None, help="write the raw figures here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pipeline = AnimaPipeline(from_model_dir(args.model or demo_model_dir()), keep_dit=True)
    reference = Reference(pipeline, args.prompts, args.prompt_seed, args.seed, args.steps, args.cfg, args.reference_dir)
    chosen = SETTINGS if args.only is None else [s for s in SETTINGS if s[0] in args.only.split(",")]
    report = {"prompts": args.prompts, "prompt_seed": args.prompt_seed, "seed": args.seed, "steps": args.steps,
              "cfg": args.cfg, "reference_adherence": adherence(judge(reference.specs, reference.images))["all"],
              "settings": {}}
    for label, cache, options in chosen:
        print(f"running {label}", file=sys.stderr)
        report["settings"][label] = evaluate(pipeline, reference, cache, options)
    print(markdown(report))
    if args.plot is not None:
        plot(report, args.plot)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
