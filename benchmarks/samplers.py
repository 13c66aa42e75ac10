"""The samplers measured: passes, time, quality against each sampler's own 100-step image, prompt adherence, and
what each step cache does under each sampler, on the demo model and on the mid random model.

For every prompt/seed and sampler, the uncached run at --reference-steps (100) is that sampler's reference; every
sampler runs at each of --steps uncached and under each cache from the same noise and the same encoded prompt.
PSNR is on the decoded 8-bit images (as bench and benchmarks/auto_cache.py compare). Time is the pipeline's
denoise seconds; on a shared machine read the ratio to euler at the same steps, measured in the same run
(the runs of one step count follow each other, sampler by sampler). Prints Markdown tables and a recommendation
derived from them; --plot draws PSNR vs passes per sampler, --json keeps the raw figures.

    python benchmarks/samplers.py [--prompts 5] [--mid-size 128] [--mid-seeds 20260812] [--plot docs/samplers.png]
    python benchmarks/samplers.py --from-json RUN.json [--plot FILE]   # the tables again, nothing measured

The demo model's prompts are eval-demo's set (prompt_set seed 7, noise seeds 1000 + i), nothing tuned on them
here. The mid random model is made by `anima-rknn make-tiny --preset mid` into --mid when it is not there.
A quick check: --samplers euler --steps 4 --reference-steps 8 --prompts 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from anima_rknn.bench.metrics import psnr
from anima_rknn.demo.dataset import IMAGE_SIZE
from anima_rknn.demo.evaluate import adherence, judge, prompt_set
from anima_rknn.generation.params import GenerationParams
from anima_rknn.generation.pipeline import AnimaPipeline
from anima_rknn.model.model_set import demo_model_dir, from_model_dir
from anima_rknn.sampling.samplers import SAMPLER_NAMES
from anima_rknn.vae import load_vae

CACHES = ("spectrum", "spectrum-plus", "reuse", "auto")
MID_PROMPT = "a cute anime girl standing in a flower field, masterpiece, best quality"
CAP_DB = 100.0  # identical images (PSNR inf) count as this in means
TARGETS_DB = (30.0, 35.0, 40.0, 45.0)


@dataclasses.dataclass
class Case:
    prompt: str
    seed: int
    spec: object = None  # the demo model's ShapeSpec (for the adherence reader); None on the mid model


def model_cases(args: argparse.Namespace) -> dict[str, tuple[Path, int, list[Case]]]:
    specs = prompt_set(args.prompts, args.prompt_seed)
    models = {"demo": (demo_model_dir(), IMAGE_SIZE,
                       [Case(s.caption, args.seed + i, s) for i, s in enumerate(specs)])}
    if args.mid_seeds:
        models["mid"] = (args.mid, args.mid_size, [Case(MID_PROMPT, int(s)) for s in args.mid_seeds.split(",")])
    return models


class Runner:
    """One model set: the DiT kept, the VAE loaded once, each prompt encoded once."""

    def __init__(self, model_dir: Path, size: int, cfg: float) -> None:
        self.pipeline = AnimaPipeline(from_model_dir(model_dir), keep_dit=True)
        self.vae = load_vae(self.pipeline.files.vae)
        self.size, self.cfg = size, cfg
        self.conditioning = {}
        # The pipeline's gc.collect() after every denoise walks every live object (the loaded modules): ~0.4 s a
        # run, outside denoise_s but most of the wall time of a demo-model run. Frozen, it skips what is loaded.
        gc.freeze()

    def run(self, case: Case, sampler: str, steps: int, cache: str) -> dict:
        params = GenerationParams(prompt=case.prompt, width=self.size, height=self.size, steps=steps, cfg=self.cfg,
                                  seed=case.seed, sampler=sampler, cache=cache)
        if case.prompt not in self.conditioning:
            self.conditioning[case.prompt] = self.pipeline.encode(params.prompt, params.negative, params.dtype)
        blank = np.zeros((self.size, self.size, 3), np.uint8)
        cpu = time.process_time()
        try:
            denoised = self.pipeline.denoise(self.conditioning[case.prompt], params)
        except Exception as error:  # noqa: BLE001 - a failing combination is a finding, reported in the tables
            return {"error": f"{type(error).__name__}: {error}", "image": blank, "passes": 0, "denoise_s": 0.0,
                    "cpu_s": 0.0, "finite": False}
        cpu = time.process_time() - cpu  # the process's CPU time: steadier than wall time on a shared machine
        image = blank
        finite = bool(denoised.sample.finite)
        if finite:
            with torch.no_grad():
                pixels = self.vae.decode(torch.from_numpy(denoised.sample.latent))
            finite = bool(torch.isfinite(pixels).all())
            # as AnimaPipeline.decode makes its image
            image = (pixels[0].permute(1, 2, 0).clamp(0, 1).numpy() * 255).round().astype(np.uint8)
        return {"error": None, "image": image, "passes": int(denoised.transformer_passes),
                "denoise_s": float(denoised.denoise_s), "cpu_s": cpu, "finite": finite}


def code_state() -> dict:
    """The commit measured, and the package files that differed from it (a shared working tree moves)."""
    def git(*command: str) -> str:
        done = subprocess.run(["git", *command], check=False, capture_output=True, text=True,
                              cwd=Path(__file__).parent)
        return done.stdout.strip()
    return {"commit": git("rev-parse", "HEAD"), "modified": git("status", "--porcelain", "--", "../anima_rknn")}


def measure(args: argparse.Namespace) -> dict:
    models = model_cases(args)
    samplers, steps_list = args.samplers, args.steps
    per_case = len(samplers) * (1 + len(steps_list) * (1 + len(CACHES)))
    total = sum(len(cases) for _, _, cases in models.values()) * per_case
    runs: dict[str, dict[tuple, dict]] = {}
    began = time.perf_counter()
    with tqdm(total=total, desc="runs", unit="run", file=sys.stderr, dynamic_ncols=True) as bar:
        for name, (model_dir, size, cases) in models.items():
            runner = Runner(model_dir, size, args.cfg)
            runs[name] = {}
            for c, case in enumerate(cases):
                jobs = [(s, args.reference_steps, "none") for s in samplers]
                jobs += [(s, n, cache) for n in steps_list for s in samplers for cache in ("none", *CACHES)]
                for sampler, steps, cache in jobs:
                    bar.set_postfix_str(f"{name} {c + 1}/{len(cases)} {sampler} {steps} {cache}")
                    runs[name][(c, sampler, steps, cache)] = runner.run(case, sampler, steps, cache)
                    bar.update()
            del runner
    report = {"settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                           if k not in ("plot", "json", "from_json")},
              "code": code_state(),
              "runtime_s": time.perf_counter() - began, "models": {}}
    for name, (model_dir, size, cases) in models.items():
        report["models"][name] = summarise(runs[name], cases, samplers, steps_list, args.reference_steps, size)
    report["cpu_s"] = time.process_time()
    return report


def _capped_mean(values: list[float]) -> float:
    return float(np.mean([min(v, CAP_DB) for v in values])) if values else float("nan")


def summarise(runs: dict[tuple, dict], cases: list[Case], samplers: list[str], steps_list: list[int],
              reference_steps: int, size: int) -> dict:
    specs = [case.spec for case in cases]
    demo = specs[0] is not None
    rows = {}
    for steps in (reference_steps, *steps_list):
        for sampler in samplers:
            for cache in ("none",) if steps == reference_steps else ("none", *CACHES):
                mine = [runs[(c, sampler, steps, cache)] for c in range(len(cases))]
                errors = sorted({r["error"] for r in mine if r["error"]})
                row = {"sampler": sampler, "steps": steps, "cache": cache,
                       "passes": [r["passes"] for r in mine], "denoise_s": [r["denoise_s"] for r in mine],
                       "cpu_s": [r["cpu_s"] for r in mine],
                       "non_finite": sum(not r["finite"] for r in mine), "errors": errors}
                if steps != reference_steps:
                    own = [psnr(runs[(c, sampler, reference_steps, "none")]["image"], r["image"])
                           for c, r in enumerate(mine)]
                    row["psnr_own"] = own
                    if "euler" in samplers:
                        row["psnr_euler"] = [psnr(runs[(c, "euler", reference_steps, "none")]["image"], r["image"])
                                             for c, r in enumerate(mine)]
                    if cache != "none":
                        row["psnr_uncached"] = [psnr(runs[(c, sampler, steps, "none")]["image"], r["image"])
                                                for c, r in enumerate(mine)]
                if demo:
                    row["adherence"] = adherence(judge(specs, [r["image"] for r in mine]))["all"]
                rows[f"{sampler}/{steps}/{cache}"] = row
    for row in rows.values():  # time against euler's, same steps and cache, summed over the cases
        base = rows.get(f"euler/{row['steps']}/{row['cache']}")
        if base is not None and sum(base["denoise_s"]) > 0:
            row["time_vs_euler"] = sum(row["denoise_s"]) / sum(base["denoise_s"])
            row["cpu_vs_euler"] = sum(row["cpu_s"]) / sum(base["cpu_s"])
    return {"size": size, "cases": [{"prompt": c.prompt, "seed": c.seed} for c in cases], "demo": demo,
            "reference_steps": reference_steps, "steps": steps_list, "samplers": samplers, "rows": rows}


# ---- Markdown ---------------------------------------------------------------------------------------------------

def _db(values: list[float]) -> str:
    if all(math.isinf(v) for v in values):
        return "identical"
    return f"{_capped_mean(values):.1f} / {min(values):.1f}"


def _flags(row: dict) -> str:
    notes = []
    if row["non_finite"]:
        notes.append(f"**non-finite {row['non_finite']}/{len(row['passes'])}**")
    notes += [f"**failed: {e}**" for e in row["errors"]]
    return " ".join(notes)


def sampler_table(name: str, m: dict) -> str:
    demo = m["demo"]
    head = ["sampler", "steps", "passes", "denoise s", "time / euler's: wall, CPU",
            f"PSNR vs own {m['reference_steps']}-step mean / worst (dB)",
            f"PSNR vs euler's {m['reference_steps']}-step mean"]
    if demo:
        head.append("adherence")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for steps in (*m["steps"], m["reference_steps"]):
        for sampler in m["samplers"]:
            row = m["rows"][f"{sampler}/{steps}/none"]
            ref = steps == m["reference_steps"]
            cells = [sampler, str(steps), f"{np.mean(row['passes']):.0f}", f"{np.mean(row['denoise_s']):.2f}",
                     f"{row.get('time_vs_euler', float('nan')):.2f}, {row.get('cpu_vs_euler', float('nan')):.2f}",
                     "reference" if ref else _db(row["psnr_own"]),
                     "" if ref or "psnr_euler" not in row else f"{_capped_mean(row['psnr_euler']):.1f}"]
            if demo:
                cells.append(f"{row['adherence']:.0%}")
            flags = _flags(row)
            if flags:
                cells[-1] += " " + flags
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cache_table(name: str, m: dict) -> str:
    head = ["sampler", "steps", "uncached passes", *CACHES]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for steps in m["steps"]:
        for sampler in m["samplers"]:
            base = m["rows"][f"{sampler}/{steps}/none"]
            cells = [sampler, str(steps), f"{np.mean(base['passes']):.0f}"]
            for cache in CACHES:
                row = m["rows"][f"{sampler}/{steps}/{cache}"]
                cell = f"{np.mean(row['passes']):.1f} · {_db(row['psnr_uncached'])}"
                if m["demo"]:
                    cell += f" · {row['adherence']:.0%}"
                flags = _flags(row)
                cells.append(cell + (" " + flags if flags else ""))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _mean_worst(values: list[float]) -> str:
    return f"{_capped_mean(values):.1f}" + (f" ({min(values):.1f})" if len(values) > 1 else "")


def _sound(row: dict) -> bool:
    return not row["non_finite"] and not row["errors"]


def recommend(report: dict) -> str:
    """For each PSNR target: the fewest mean passes among the runs that reach it (mean PSNR vs the sampler's own
    100-step image) on every model, with the demo model's adherence at least euler's at 20 steps uncached;
    once among uncached runs, once among all."""
    models = report["models"]
    demo = models["demo"]
    euler20 = demo["rows"].get("euler/20/none")
    bar = euler20["adherence"] if euler20 else 0.0
    keys = [k for k in demo["rows"] if int(k.split("/")[1]) != demo["reference_steps"]]
    head = [f"target (mean PSNR vs own 100-step, every model; demo adherence >= {bar:.0%} = euler 20 uncached)",
            "pick", "passes " + " / ".join(models), "PSNR mean (worst), dB: " + " / ".join(models),
            "demo adherence"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for target in TARGETS_DB:
        for label, allowed in (("no cache", lambda k: k.endswith("/none")), ("any cache", lambda k: True)):
            chosen = []
            for key in filter(allowed, keys):
                rows = [m["rows"][key] for m in models.values()]
                if not all(_sound(r) for r in rows) or demo["rows"][key]["adherence"] < bar:
                    continue
                if all(_capped_mean(r["psnr_own"]) >= target for r in rows):
                    passes = float(np.mean([np.mean(r["passes"]) for r in rows]))
                    chosen.append((passes, -_capped_mean(demo["rows"][key]["psnr_own"]), key))
            if not chosen:
                lines.append(f"| >= {target:g} dB, {label} | none reaches it | | | |")
                continue
            _, _, key = min(chosen)
            rows = [m["rows"][key] for m in models.values()]
            sampler, steps, cache = key.split("/")
            lines.append(f"| >= {target:g} dB, {label} | {sampler}, {steps} steps, cache {cache} | "
                         + " / ".join(f"{np.mean(r['passes']):.1f}" for r in rows) + " | "
                         + " / ".join(_mean_worst(r["psnr_own"]) for r in rows) + " | "
                         + f"{demo['rows'][key]['adherence']:.0%} |")
    return "\n".join(lines)


def markdown(report: dict) -> str:
    out = []
    for name, m in report["models"].items():
        what = (f"{len(m['cases'])} prompts of eval-demo's set, noise seeds "
                f"{m['cases'][0]['seed']}..{m['cases'][-1]['seed']}" if m["demo"]
                else f"prompt \"{m['cases'][0]['prompt']}\", seeds {', '.join(str(c['seed']) for c in m['cases'])}")
        cfg = report["settings"]["cfg"]
        out += [f"#### {name} model, {m['size']}x{m['size']}, {what}, CFG {cfg:g}", "",
                (f"Uncached, each sampler against its own uncached image at {m['reference_steps']} steps (same "
                 "seed); time: mean denoise seconds per image, and the ratio to euler's at the same steps in this "
                 "run:"), "", sampler_table(name, m), "",
                "Each cache against the same sampler and steps uncached: mean passes · PSNR mean / worst (dB)"
                + (" · adherence" if m["demo"] else "") + ":", "", cache_table(name, m), ""]
    out += ["#### Which to pick", "", recommend(report), "",
            f"(measured in {report['runtime_s'] / 60:.1f} min"
            + (f", {report['cpu_s'] / 60:.1f} min of process CPU time" if "cpu_s" in report else "")
            + f"; identical images count as {CAP_DB:g} dB in means)"]
    return "\n".join(out)


def plot(report: dict, path: Path) -> None:
    from matplotlib.figure import Figure  # no pyplot: no display backend needed

    models = report["models"]
    figure = Figure(figsize=(6.5 * len(models), 4.8), dpi=110)
    markers = {"spectrum": "^", "spectrum-plus": "v", "reuse": "s", "auto": "D"}
    for n, (name, m) in enumerate(models.items()):
        axes = figure.add_subplot(1, len(models), n + 1)
        for i, sampler in enumerate(m["samplers"]):
            colour, line = (f"C{i}", "-") if i < 10 else ("black", "--")
            points = [(np.mean(m["rows"][f"{sampler}/{s}/none"]["passes"]),
                       _capped_mean(m["rows"][f"{sampler}/{s}/none"]["psnr_own"])) for s in m["steps"]]
            axes.plot(*zip(*points), "o" + line, color=colour, label=sampler)
            for cache, marker in markers.items():
                cached = [(np.mean(m["rows"][f"{sampler}/{s}/{cache}"]["passes"]),
                           _capped_mean(m["rows"][f"{sampler}/{s}/{cache}"]["psnr_own"])) for s in m["steps"]]
                axes.plot(*zip(*cached), marker, color=colour, alpha=0.45, mfc="none", ms=5)
        for marker_cache, marker in markers.items():
            axes.plot([], [], marker, color="grey", mfc="none", label=marker_cache)
        axes.axhline(30, color="grey", lw=0.6, ls=":")
        axes.set_xlabel("transformer passes per image (mean)")
        axes.set_ylabel(f"PSNR vs own {m['reference_steps']}-step image (dB, mean)")
        axes.set_title(f"{name} model, {m['size']}x{m['size']}, steps {', '.join(map(str, m['steps']))}")
        axes.grid(alpha=0.3)
        axes.legend(fontsize=6.5, ncol=2, loc="lower right")
    figure.tight_layout()
    figure.savefig(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samplers", default=",".join(SAMPLER_NAMES), help="comma list (default: all)")
    parser.add_argument("--steps", default="10,20,30", help="comma list of step counts")
    parser.add_argument("--reference-steps", type=int, default=100)
    parser.add_argument("--prompts", type=int, default=5, help="demo model: the first N of eval-demo's prompt set")
    parser.add_argument("--prompt-seed", type=int, default=7, help="prompt_set's seed (7: eval-demo's)")
    parser.add_argument("--seed", type=int, default=1000, help="demo model: noise seed of the first prompt")
    parser.add_argument("--mid", type=Path, default=Path("/tmp/anima-mid"), help="the mid random model set")
    parser.add_argument("--mid-size", type=int, default=128, help="mid model: width = height")
    parser.add_argument("--mid-seeds", default="20260812", help="mid model: comma list of seeds ('' skips it)")
    parser.add_argument("--cfg", type=float, default=4.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--plot", type=Path, default=None, help="write PSNR vs passes per sampler here (PNG)")
    parser.add_argument("--json", type=Path, default=None, help="write the raw figures here")
    parser.add_argument("--from-json", type=Path, default=None,
                        help="measure nothing: print the tables (and --plot) of an earlier run's --json file")
    args = parser.parse_args()
    if args.from_json is not None:
        report = json.loads(args.from_json.read_text())
        print(markdown(report))
        if args.plot is not None:
            plot(report, args.plot)
        return
    args.samplers = args.samplers.split(",")
    args.steps = [int(s) for s in args.steps.split(",")]
    torch.set_num_threads(args.threads)
    if args.mid_seeds and not (args.mid / "split_files").is_dir():
        cli = str(Path(sys.executable).with_name("anima-rknn"))
        subprocess.run([cli, "make-tiny", "--preset", "mid", "--out", str(args.mid)], check=True)
    report = measure(args)
    print(markdown(report))
    if args.plot is not None:
        plot(report, args.plot)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
