"""The `auto` cache on the trained demo model: PSNR vs mean transformer passes against the fixed schedules.

For every prompt the uncached image is the reference; each policy and setting runs from the same noise and the same
encoded prompt. Prints a Markdown table (per setting: passes mean / max and check's partial passes, PSNR mean /
median / worst, SSIM, adherence, error estimate vs true PSNR as a Spearman rank correlation, the cache's "may
differ" flag against the images under 30 dB, verify's re-runs), draws PSNR vs mean passes to --plot, and with
--json writes the raw figures, per image too (PSNR, the cache's estimate, flag and measured errors). An image
identical to its uncached one (verify's re-runs) counts at IDENTICAL_DB.

    python benchmarks/auto_cache.py [--sets readme] [--only LABELS] [--plot docs/auto_cache.png]

Named prompt sets (SETS): `tune`, the one every `auto` setting is chosen on (24 prompts, prompt seed 3, noise
seeds 5000 + i); `readme`, the README's table (benchmarks/demo_caching.py's 48 prompts, noise seeds 1000 + i);
`h1`-`h3`, held out for issue 24 (48 prompts each, prompt and noise seeds used nowhere else in the repo: read a
figure from them, never choose a setting on them). `tune-large` (192 prompts, prompt seed 404, noise seeds
40000 + i) is a second tuning set, for choosing per-image safeguards. `--sets readme,h1,h2,h3` prints every set's
table and then the worst set's figures per setting; `--plot` draws one curve per set. --prompts/--prompt-seed/
--seed still name an ad-hoc set. --reference-dir keeps the uncached latents, images and prompt encodings between
runs (a rerun only reruns the caches).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
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
from anima_rknn.sampling.samplers import SAMPLERS

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
    ("auto budget=8 verify=1", "auto", {"budget": 8, "verify": True}),
    ("auto budget=10 verify=1", "auto", {"budget": 10, "verify": True}),
    ("auto verify=1", "auto", {"verify": True}),
    ("auto budget=8 check=1", "auto", {"budget": 8, "check": True}),
    ("auto budget=10 check=1", "auto", {"budget": 10, "check": True}),
    ("auto budget=8 check=1 verify=1", "auto", {"budget": 8, "check": True, "verify": True}),
    ("auto budget=10 check=1 verify=1", "auto", {"budget": 10, "check": True, "verify": True}),
)

# An image identical to its uncached one (PSNR infinite: verify's re-runs) counts at this, above every cached
# image's median at budget 16 (56 dB on tune-large, benchmarks/budget_oracle.py).
IDENTICAL_DB = 60.0

# name: (prompts, prompt_set seed, noise seed of the first prompt)
SETS = {
    "tune": (24, 3, 5000),
    "readme": (48, 7, 1000),
    "h1": (48, 101, 31000),
    "h2": (48, 202, 32000),
    "h3": (48, 303, 33000),
    # A second tuning set, for per-image safeguards: `tune` holds one image that a single forecast breaks (README,
    # benchmarks/single_forecast.py), too few to choose a safeguard on. This one, measured, holds 3.
    "tune-large": (192, 404, 40000),
}


def set_names(parser: argparse.ArgumentParser, text: str) -> list[str]:
    """The named prompt sets of a comma list, or the parser's one-line error naming the first unknown one."""
    names = text.split(",")
    unknown = [n for n in names if n not in SETS]
    if unknown:
        parser.error(f"unknown prompt set {unknown[0]!r}; choose from {', '.join(SETS)}")
    return names


def ratio(part: int, whole: int) -> str:
    """part / whole to two places, or "-" where there is no whole (a recall on a set without low images)."""
    return f"{part / whole:.2f}" if whole else "-"


def per_set(names: list[str], reference_dir: Path | None, json_path: Path | None,
            measure: Callable[[AnimaPipeline, Reference], list], report: Callable[[str, list], str],
            steps: int = 20, cfg: float = 4.0) -> None:
    """For each named set: its uncached runs, `measure`'s per-image results, `report`'s text printed; then every
    set's results as JSON ({set: results}) to json_path. One thread, the demo model kept loaded."""
    torch.set_num_threads(1)
    pipeline = AnimaPipeline(from_model_dir(demo_model_dir()), keep_dit=True)
    results = {}
    for name in names:
        results[name] = measure(pipeline, Reference(pipeline, *SETS[name], steps, cfg, reference_dir))
        print(report(name, results[name]) + "\n", flush=True)
    if json_path is not None:
        json_path.write_text(json.dumps(results, indent=1) + "\n")


class Reference:
    """The uncached runs of a prompt set: settings, encodings, final latents and images, optionally kept on disk."""

    def __init__(self, pipeline: AnimaPipeline, prompts: int, prompt_seed: int, seed: int, steps: int, cfg: float,
                 folder: Path | None, sampler: str = "euler") -> None:
        self.specs = prompt_set(prompts, prompt_seed)
        self.params = [GenerationParams(prompt=spec.caption, width=IMAGE_SIZE, height=IMAGE_SIZE, steps=steps,
                                        cfg=cfg, seed=seed + i, sampler=sampler) for i, spec in enumerate(self.specs)]
        under = "" if sampler == "euler" else f"_{sampler}"  # euler's files keep their earlier names
        name = f"ref_p{prompts}_ps{prompt_seed}_s{seed}_n{steps}_c{cfg:g}{under}.npz"
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
            conditioning: Conditioning) -> tuple[np.ndarray, np.ndarray, object, dict]:
    """The final latent, its image, the Denoised, and the cache's state after the last step (its measurements)."""
    last: dict = {}
    denoised = pipeline.denoise(conditioning, params, on_step=lambda event: last.update(event.cache_state))
    image = np.zeros((IMAGE_SIZE, IMAGE_SIZE, 3), np.uint8)
    if denoised.sample.finite:
        image = np.asarray(pipeline.decode(denoised.sample.latent)[0])
    return denoised.sample.latent, image, denoised, last


def identical_as(value: float) -> float:
    """A PSNR, an identical image's (infinite) as IDENTICAL_DB."""
    return value if np.isfinite(value) else IDENTICAL_DB


def evaluate(pipeline: AnimaPipeline, reference: Reference, cache: str, options: dict) -> dict:
    rows, images = [], []
    for i, base in enumerate(reference.params):
        params = dataclasses.replace(base, cache=cache, cache_options=dict(options))
        latent, image, denoised, state = run_one(pipeline, params, reference.conditioning(i))
        images.append(image)
        rows.append({"passes": denoised.transformer_passes, "partial_passes": denoised.partial_passes,
                     "psnr": identical_as(psnr(reference.images[i], image)),
                     "ssim": ssim(reference.images[i], image),
                     "latent_error": relative_l2(reference.latents[i], latent),
                     "estimate": denoised.sample.error_estimate, "computed": denoised.sample.computed_steps,
                     "may_differ": denoised.sample.may_differ, "rerun_from": denoised.sample.rerun_from,
                     # auto's measured forecast error per computed step (empty for the fixed schedules)
                     "measured": dict(zip(state.get("measured_steps", []), state.get("measured_errors", [])))})
    psnrs = np.array([r["psnr"] for r in rows])
    passes = np.array([r["passes"] for r in rows])
    entry = {"cache": cache, "options": options, "rows": rows,
             "passes": {"mean": float(passes.mean()), "max": int(passes.max()),
                        "partial": float(np.mean([r["partial_passes"] for r in rows]))},
             "psnr": {"mean": float(psnrs.mean()), "median": float(np.median(psnrs)), "worst": float(psnrs.min())},
             "ssim": {"mean": float(np.mean([r["ssim"] for r in rows])), "worst": float(min(r["ssim"] for r in rows))},
             "adherence": adherence(judge(reference.specs, images))["all"],
             "below": {"30": int((psnrs < 30).sum()), "20": int((psnrs < 20).sum())}}
    if rows[0]["estimate"] is not None:
        # A larger estimated error should mean a lower PSNR: report the correlation of -estimate with PSNR.
        entry["spearman"] = spearman([-r["estimate"] for r in rows], list(psnrs))
        # The cache's "may differ visibly" flag against the images under 30 dB. Under verify a flagged image is
        # re-run (the uncached image again), so there the flag is counted as re-runs, not scored.
        flagged, low = np.array([bool(r["may_differ"]) for r in rows]), psnrs < 30
        entry["flag"] = {"flagged": int(flagged.sum()), "caught": int((flagged & low).sum())}
        entry["reruns"] = sum(r["rerun_from"] is not None for r in rows)
    return entry


def markdown(report: dict) -> str:
    lines = [f"`{report['set']}`: demo model, {report['prompts']} prompts (prompt-set seed {report['prompt_seed']}, "
             f"noise seeds {report['seed']}+), {report['sampler']}, {report['steps']} steps, CFG {report['cfg']:g}; "
             f"uncached: "
             f"{2 * report['steps']} passes, adherence {report['reference_adherence']:.0%}.", "",
             "| policy | passes mean / max | PSNR mean / median / worst (dB) | below 30 / 20 dB | SSIM mean / worst | "
             "adherence | estimate vs PSNR (Spearman) | flagged (of them below 30 dB; verify: re-run) |",
             "|---|---|---|---|---|---|---|---|"]
    for label, e in report["settings"].items():
        p, s = e["psnr"], e["ssim"]
        rank = f"{e['spearman']:.2f}" if "spearman" in e else ""
        flag = "" if "flag" not in e else (f"{e['reruns']} re-run" if e["options"].get("verify")
                                           else f"{e['flag']['flagged']} ({e['flag']['caught']})")
        partial = f" (+{e['passes']['partial']:.1f} partial)" if e["passes"].get("partial") else ""
        lines.append(f"| {label} | {e['passes']['mean']:.1f} / {e['passes']['max']}{partial} | {p['mean']:.1f} / "
                     f"{p['median']:.1f} / {p['worst']:.1f} | {e['below']['30']} / {e['below']['20']} | "
                     f"{s['mean']:.4f} / {s['worst']:.4f} | {e['adherence']:.0%} | {rank} | {flag} |")
    scored = [(label, e) for label, e in report["settings"].items() if "flag" in e and not e["options"].get("verify")]
    if scored:
        lines.append("")
    for label, e in scored:
        low, flagged, caught = e["below"]["30"], e["flag"]["flagged"], e["flag"]["caught"]
        lines.append(f"Flag `may differ`, {label}: {flagged} flagged, {caught} of the {low} below 30 dB: recall "
                     f"{ratio(caught, low)}, precision {ratio(caught, flagged)}.")
    return "\n".join(lines)


def worst_of(reports: list[dict]) -> str:
    """Per setting, the worst figure over the sets and the set it came from: the most mean passes, the lowest mean
    PSNR, the lowest single image, the weakest Spearman."""
    lines = [f"Worst over the sets {', '.join(r['set'] for r in reports)}:", "",
             "| policy | passes mean (most) | PSNR mean (lowest) | PSNR worst (lowest) | estimate vs PSNR (lowest) |",
             "|---|---|---|---|---|"]
    for label in reports[0]["settings"]:
        entries = [(r["set"], r["settings"][label]) for r in reports if label in r["settings"]]

        def pick(key, worst=min, digits=1):
            name, value = worst(((n, key(e)) for n, e in entries), key=lambda item: item[1])
            return f"{value:.{digits}f} ({name})"

        rank = pick(lambda e: e["spearman"], digits=2) if all("spearman" in e for _, e in entries) else ""
        lines.append(f"| {label} | {pick(lambda e: e['passes']['mean'], max)} | {pick(lambda e: e['psnr']['mean'])} | "
                     f"{pick(lambda e: e['psnr']['worst'])} | {rank} |")
    return "\n".join(lines)


def plot(reports: list[dict], path: Path) -> None:
    """PSNR vs mean passes, one curve per set: auto's budgets joined (mean solid, worst image dashed), its
    tolerances as triangles, check as plus signs, verify as diamonds (with check too), the fixed schedules as
    squares, each set in its own colour."""
    from matplotlib.figure import Figure  # no pyplot: no display backend needed

    figure = Figure(figsize=(9.5, 4.6), dpi=120)
    axes = figure.add_subplot()
    for n, report in enumerate(reports):
        colour, settings = f"C{n % 10}", report["settings"].values()
        budgets = sorted((e["passes"]["mean"], e["psnr"]["mean"], e["psnr"]["worst"])
                         for e in settings if _planned(e))
        if budgets:
            axes.plot([b[0] for b in budgets], [b[1] for b in budgets], "o-", color=colour,
                      label=f"{report['set']}: auto budget, mean")
            axes.plot([b[0] for b in budgets], [b[2] for b in budgets], "o--", color=colour, alpha=0.5, mfc="none",
                      label=f"{report['set']}: worst")
        for e in settings:
            if _planned(e):
                continue
            marker = ("s" if e["cache"] != "auto" else "D" if e["options"].get("verify")
                      else "P" if e["options"].get("check") else "^")
            axes.plot(e["passes"]["mean"], e["psnr"]["mean"], marker, color=colour)
            axes.plot(e["passes"]["mean"], e["psnr"]["worst"], marker, color=colour, alpha=0.5, mfc="none")
    axes.plot([], [], "^", color="grey", label="auto tolerance")
    axes.plot([], [], "P", color="grey", label="auto budget check=1")
    axes.plot([], [], "D", color="grey", label="auto verify=1")
    axes.plot([], [], "s", color="grey", label="fixed schedules")
    axes.axhline(45, color="grey", lw=0.6, ls=":")
    axes.axhline(30, color="grey", lw=0.6, ls=":")
    first = reports[0]
    axes.set_xlabel(f"transformer passes per image (mean; uncached: {2 * first['steps']})")
    axes.set_ylabel("PSNR vs uncached image (dB)")
    axes.set_title(f"Demo model, {first['sampler']}, {first['steps']} steps, CFG {first['cfg']:g}; filled: mean, "
                   "open: worst image")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: the worst points sit low
    figure.tight_layout()
    figure.savefig(path)


def _planned(entry: dict) -> bool:
    """An auto budget without verify or check: a point on the budget curve."""
    options = entry["options"]
    return entry["cache"] == "auto" and "budget" in options and not options.get("verify") and not options.get("check")


def run_set(pipeline: AnimaPipeline, name: str, spec: tuple[int, int, int], args: argparse.Namespace,
            chosen: list) -> dict:
    prompts, prompt_seed, seed = spec
    reference = Reference(pipeline, prompts, prompt_seed, seed, args.steps, args.cfg, args.reference_dir, args.sampler)
    report = {"set": name, "prompts": prompts, "prompt_seed": prompt_seed, "seed": seed, "steps": args.steps,
              "cfg": args.cfg, "sampler": args.sampler,
              "reference_adherence": adherence(judge(reference.specs, reference.images))["all"], "settings": {}}
    for label, cache, options in chosen:
        print(f"{name}: running {label}", file=sys.stderr)
        report["settings"][label] = evaluate(pipeline, reference, cache, options)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="model directory (default: the demo model)")
    parser.add_argument("--sets", default=None,
                        help=f"comma list of named prompt sets ({', '.join(SETS)}; default: readme, or the "
                             "ad-hoc set of --prompts/--prompt-seed/--seed when one of them is given)")
    parser.add_argument("--prompts", type=int, default=None, help="an ad-hoc set: its number of prompts")
    parser.add_argument("--prompt-seed", type=int, default=None, help="an ad-hoc set: prompt_set's seed")
    parser.add_argument("--seed", type=int, default=None, help="an ad-hoc set: noise seed of the first prompt")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--cfg", type=float, default=4.0)
    parser.add_argument("--sampler", default="euler", choices=sorted(SAMPLERS),
                        help="every run's sampler, the uncached reference's too (its noise is keyed by step)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reference-dir", type=Path, default=None, help="keep the uncached runs here")
    parser.add_argument("--only", default=None, help="comma list of setting labels to run (default: all)")
    parser.add_argument("--plot", type=Path, default=None, help="write the PSNR-vs-passes plot here (PNG)")
    parser.add_argument("--json", type=Path, default=None, help="write the raw figures here")
    args = parser.parse_args()
    adhoc = (args.prompts, args.prompt_seed, args.seed)
    if args.sets is not None and any(v is not None for v in adhoc):
        parser.error("--sets names its sets: --prompts, --prompt-seed and --seed are for an ad-hoc one")
    if any(v is not None for v in adhoc):
        readme = SETS["readme"]
        sets = {"ad-hoc": tuple(readme[i] if v is None else v for i, v in enumerate(adhoc))}
    else:
        sets = {n: SETS[n] for n in set_names(parser, args.sets or "readme")}
    chosen = SETTINGS if args.only is None else [s for s in SETTINGS if s[0] in args.only.split(",")]
    if not chosen:
        parser.error(f"--only names no setting; the labels are: {', '.join(s[0] for s in SETTINGS)}")
    torch.set_num_threads(args.threads)
    pipeline = AnimaPipeline(from_model_dir(args.model or demo_model_dir()), keep_dit=True)
    reports = [run_set(pipeline, name, spec, args, chosen) for name, spec in sets.items()]
    print("\n\n".join(markdown(r) for r in reports))
    if len(reports) > 1:
        print("\n" + worst_of(reports))
    if args.plot is not None:
        plot(reports, args.plot)
    if args.json is not None:
        args.json.write_text(json.dumps(reports if len(reports) > 1 else reports[0], indent=1) + "\n")


if __name__ == "__main__":
    main()
