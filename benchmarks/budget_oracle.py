"""What spending per image could reach (issue 24): `auto` at every budget, per image, against a perfect chooser.

Per image, the PSNR of `auto budget=B` for each B of BUDGETS, and the uncached run (20 calls, the same image).
Three questions, per set:

- **The bound.** A chooser that knew every image's PSNR at every budget picks one budget per image before it runs.
  Printed: the fewest mean passes that hold every image at 30 dB, and under the issue's two caps on the mean passes
  of a batch (20: quality point, 16: speed point) the best mean PSNR that holds every image at 30 dB (quality) or
  22 dB (speed). It reads the held-out truth, so it bounds any per-image scheme; it is never a result.
- **Run again what a flag marks.** benchmarks/late_miss_flag.py's flag (window and threshold chosen on
  `tune-large`, at a recall of 0.8 or 1 there) marks images of a run at `budget=B`; each marked image is run again
  from the warm-up's end, the last state every budget shares, at a larger budget or uncached ("verify"). The
  warm-up computes every step, so that run is the larger budget's run itself, and it costs the steps after the
  warm-up on top of the first. Every (B, recall, second budget) on `tune-large`; verify (uncached, recall 0.8)
  on every set.
- **A batch mean as the cap.** Every image at a budget under the cap, then the images ranked highest run again at
  a larger budget while the batch's steps last. Ranked by their late misses over the batch's own median miss per
  step (no tuning table; budgets and window chosen on `tune-large`), and by the true PSNR: the perfect ranking,
  which bounds every scheme that decides after a first run.

A mean over images counts an image identical to its reference (PSNR infinite) at IDENTICAL_DB.

    OMP_NUM_THREADS=1 python benchmarks/budget_oracle.py --reference-dir REF --runs-dir RUNS [--sets readme,h1,h2,h3]

The runs of a set are kept in RUNS/<set>.json and read back on the next call; `--compute tune-large` (and, at the
same time in a second process, `--compute readme,h1,h2,h3`) fills RUNS on two cores and reports nothing.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from auto_cache import IDENTICAL_DB, SETS, Reference, evaluate, set_names
from late_miss_flag import TUNE, choose, misses, scores

from anima_rknn.demo import demo_model_dir
from anima_rknn.generation.pipeline import AnimaPipeline
from anima_rknn.model.model_set import from_model_dir
from anima_rknn.sampling.auto_cache import AUTO_DEFAULTS

STEPS, CFG = 20, 4.0
BUDGETS = (6, 7, 8, 9, 10, 11, 13, 16)  # computed steps; the chooser's last option is the uncached run (STEPS)
VERIFY_BUDGETS = (8, 9, 10)  # the first run's budget under escalation
ESCALATIONS = (13, 16, STEPS)  # the second run's
RECALLS = (0.8, 1.0)  # the flag's recall on the tuning set's images under 30 dB, which sets its threshold
CAPS = (10, 8)  # a batch's mean computed steps: the quality and speed points (20 and 16 passes)
RANK_STARTS = (6, 9, 12, 15, 17, 19)  # the ranked batch's windows: its late computed steps from these on
# (mean passes cap, floor every image must hold): the quality and speed points
POINTS = ((20, 30.0), (16, 22.0))
CHOICES = np.array([*BUDGETS, STEPS])  # the chooser's options in computed steps: every budget, then uncached


def best_mean(psnrs: np.ndarray, calls: np.ndarray, mean_calls: float, floor: float) -> float | None:
    """The highest mean PSNR of one option per image ([image, option] PSNRs, each option's calls), with the calls'
    mean at most mean_calls and every image at `floor` or above; None where no choice holds the floor."""
    images, total = psnrs.shape[0], int(mean_calls * psnrs.shape[0])
    reach = np.full(total + 1, -np.inf)  # reach[t]: the best sum of PSNRs over the images so far for t calls
    reach[0] = 0.0
    for row in psnrs:
        after = np.full(total + 1, -np.inf)
        for value, cost in zip(row, calls):
            if value >= floor and cost <= total:
                after[cost:] = np.maximum(after[cost:], reach[: total + 1 - cost] + value)
        reach = np.maximum.accumulate(after)  # spending less than the cap is allowed
    return None if not np.isfinite(reach[-1]) else float(reach[-1] / images)


def choice_table(by_budget: dict[int, list[dict]]) -> np.ndarray:
    """[image, option] PSNRs over CHOICES, each at most IDENTICAL_DB (the uncached option: IDENTICAL_DB)."""
    psnrs = np.array([[r["psnr"] for r in by_budget[b]] for b in BUDGETS]).T
    return np.hstack([np.minimum(psnrs, IDENTICAL_DB), np.full((len(psnrs), 1), IDENTICAL_DB)])


def bound(table: np.ndarray) -> dict:
    """The perfect chooser's figures over a choice_table (module docstring)."""
    cheapest = CHOICES[np.argmax(table >= 30.0, axis=1)]  # the uncached option always holds 30 dB
    return {"passes_all_30": float(2 * cheapest.mean()),
            "best": {f"{cap}/{floor:g}": best_mean(table, CHOICES, cap / 2, floor) for cap, floor in POINTS}}


def escalated(runs: dict[int, list[dict]], marked: np.ndarray, budget: int, target: int) -> dict:
    """A set's figures when `auto budget=budget` runs first and every `marked` image is run again from the
    warm-up's end at `budget=target` (STEPS: uncached), which is that budget's run, warm-up and all."""
    psnrs = np.array([r["psnr"] for r in runs[budget]])
    again = np.full(len(psnrs), IDENTICAL_DB) if target == STEPS else np.array([r["psnr"] for r in runs[target]])
    final = np.minimum(np.where(marked, again, psnrs), IDENTICAL_DB)
    calls = budget + marked * (target - AUTO_DEFAULTS["warmup"])
    return {"marked": int(marked.sum()), "caught": int((marked & (psnrs < 30)).sum()), "low": int((psnrs < 30).sum()),
            "passes": float(2 * calls.mean()), "mean": float(final.mean()), "worst": float(final.min()),
            "below_30": int((final < 30).sum())}


def flagged(rows: list[dict], rule: tuple[list[int], np.ndarray, float]) -> np.ndarray:
    """The late-miss flag of late_miss_flag.py: the tuning set's typical misses and threshold."""
    window, typical, threshold = rule
    return scores(rows, window, typical) >= threshold


def late_score(rows: list[dict], start: int) -> np.ndarray:
    """How far each image's late misses (computed steps from `start` on) lie above the set's own median miss at
    each step: a batch's own typical miss, so no tuning table."""
    window = [s for s in sorted(rows[0]["measured"]) if s >= start]
    return scores(rows, window, np.median(misses(rows, window), axis=0))


def within_cap(runs: dict[int, list[dict]], budget: int, target: int, score: np.ndarray, cap: int) -> dict:
    """A batch whose mean computed steps stay at `cap`: every image at `budget`, then the images of the highest
    `score` run again at `target`, as many as the steps left over pay for."""
    count = (cap - budget) * len(score) // (target - AUTO_DEFAULTS["warmup"])
    marked = np.zeros(len(score), dtype=bool)
    marked[np.argsort(-score, kind="stable")[:count]] = True
    return escalated(runs, marked, budget, target)


def ranked_figures(runs: dict[int, list[dict]], option: tuple[int, int, int | None], cap: int) -> dict:
    """within_cap for (budget, second run, window start), ranked by late_score from that start, or with no start by
    the true PSNR (the perfect ranking)."""
    budget, target, start = option
    rows = runs[budget]
    score = -np.array([r["psnr"] for r in rows]) if start is None else late_score(rows, start)
    return within_cap(runs, budget, target, score, cap)


def row(f: dict) -> str:
    return (f"{f['marked']} ({f['caught']} / {f['low']}) | {f['passes']:.1f} | {f['mean']:.1f} / {f['worst']:.1f} | "
            f"{f['below_30']}")


def plot(runs: dict[str, dict[int, list[dict]]], batch: dict[str, list[dict]], verify: dict[str, dict],
         path: Path) -> None:
    """Mean PSNR vs mean passes per set: the perfect chooser holding every image at 30 dB (solid), the plain
    budgets (dotted, their worst image open), the batch means ranked by late misses (stars) and verify at the
    largest first budget (diamonds), each with its worst image open."""
    from matplotlib.figure import Figure  # no pyplot: no display backend needed

    figure = Figure(figsize=(9.5, 4.6), dpi=120)
    axes = figure.add_subplot()
    for n, (name, by_budget) in enumerate(runs.items()):
        colour = f"C{n % 10}"
        table = choice_table(by_budget)
        caps = np.arange(2 * BUDGETS[0], 2 * STEPS + 1)
        best = [best_mean(table, CHOICES, cap / 2, 30.0) for cap in caps]
        axes.plot([c for c, b in zip(caps, best) if b is not None], [b for b in best if b is not None], "-",
                  color=colour, label=f"{name}: perfect chooser, every image >= 30 dB")
        plain = table[:, :-1]
        axes.plot(2 * np.array(BUDGETS), plain.mean(axis=0), "o:", color=colour, ms=3, label=f"{name}: budget, mean")
        axes.plot(2 * np.array(BUDGETS), plain.min(axis=0), "o", color=colour, ms=3, mfc="none", alpha=0.5)
        for marker, points in (("*", batch[name]), ("D", [verify[name]])):
            for f in points:
                axes.plot(f["passes"], f["mean"], marker, color=colour, ms=7)
                axes.plot(f["passes"], f["worst"], marker, color=colour, ms=7, mfc="none", alpha=0.6)
    axes.plot([], [], "*", color="grey", label="batch mean 20 / 16 passes, re-run by late misses")
    axes.plot([], [], "D", color="grey", label=f"verify at budget={VERIFY_BUDGETS[-1]}: flagged re-run uncached")
    axes.axhline(45, color="grey", lw=0.6, ls=":")
    axes.axhline(30, color="grey", lw=0.6, ls=":")
    axes.set_xlabel(f"transformer passes per image (mean; uncached: {2 * STEPS})")
    axes.set_ylabel("PSNR vs uncached image (dB)")
    axes.set_title(f"Demo model, euler, {STEPS} steps, CFG {CFG:g}: spending per image; filled: mean, open: worst")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.tight_layout()
    figure.savefig(path)


def figure(value: float | None) -> str:
    return "none holds it" if value is None else f"{value:.1f}"


def set_runs(pipeline: AnimaPipeline | None, name: str, reference_dir: Path | None,
             runs_dir: Path | None) -> dict[int, list[dict]]:
    """{budget: evaluate()'s rows} of `auto budget=B` over a named set for every B of BUDGETS, read from runs_dir
    where it holds them (the measured misses' step keys back to integers), else run and stored there."""
    path = None if runs_dir is None else runs_dir / f"{name}.json"
    if path is not None and path.exists():
        stored = json.loads(path.read_text())
        return {int(b): [{**row, "measured": {int(s): e for s, e in row["measured"].items()}} for row in rows]
                for b, rows in stored.items()}
    if pipeline is None:
        raise SystemExit(f"{path} is missing: run --compute {name} first")
    reference = Reference(pipeline, *SETS[name], STEPS, CFG, reference_dir)
    runs = {b: evaluate(pipeline, reference, "auto", {"budget": b})["rows"] for b in BUDGETS}
    print(f"{name}: {len(reference.params)} images at budgets {', '.join(map(str, BUDGETS))}", flush=True)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.with_suffix(".part").write_text(json.dumps(runs))
        path.with_suffix(".part").rename(path)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default="readme,h1,h2,h3", help="sets to report besides tune-large, comma list")
    parser.add_argument("--reference-dir", type=Path, default=None, help="keep the uncached runs here")
    parser.add_argument("--runs-dir", type=Path, default=None, help="keep every set's runs here (module docstring)")
    parser.add_argument("--plot", type=Path, default=None, help="write the PSNR-vs-passes plot here (PNG)")
    parser.add_argument("--compute", default=None, help="only run these sets into --runs-dir, comma list")
    args = parser.parse_args()
    torch.set_num_threads(1)
    pipeline = AnimaPipeline(from_model_dir(demo_model_dir()), keep_dit=True)
    if args.compute is not None:
        if args.runs_dir is None:
            parser.error("--compute stores its runs in --runs-dir; name one")
        for name in set_names(parser, args.compute):
            set_runs(pipeline, name, args.reference_dir, args.runs_dir)
        return
    names = [n for n in set_names(parser, args.sets) if n != TUNE]
    runs = {name: set_runs(pipeline, name, args.reference_dir, args.runs_dir) for name in [TUNE, *names]}
    lines = ["| set | perfect chooser: passes to hold every image at 30 dB | its best mean at <= 20 passes, "
             "every image >= 30 dB | at <= 16 passes, every image >= 22 dB |", "|---|---|---|---|"]
    for name, by_budget in runs.items():
        best = bound(choice_table(by_budget))
        lines.append(f"| {name} | {best['passes_all_30']:.1f} | {figure(best['best']['20/30'])} | "
                     f"{figure(best['best']['16/22'])} |")
    rules = {(b, recall): choose(runs[TUNE][b], sorted(runs[TUNE][b][0]["measured"]), recall)
             for b in VERIFY_BUDGETS for recall in RECALLS}
    head = ["| marked (of them / all under 30 dB) | passes | PSNR mean / worst | under 30 dB after |",
            "|---|---|---|---|"]
    lines += ["", f"The late-miss flag (chosen on {TUNE}), every marked image run again; on {TUNE}:", "",
              "| first budget | flag's recall there | second run " + head[0], "|---|---|---" + head[1]]
    lines += [f"| {b} | {recall:g} | {'uncached' if t == STEPS else t} | "
              f"{row(escalated(runs[TUNE], flagged(runs[TUNE][b], rules[b, recall]), b, t))} |"
              for b, recall in rules for t in ESCALATIONS]
    lines += ["", "verify: the flagged images run again uncached (flag at recall 0.8 on the tuning set), every set:",
              "",
              "| set | budget " + head[0], "|---|---" + head[1]]
    verify = {name: {b: escalated(by_budget, flagged(by_budget[b], rules[b, RECALLS[0]]), b, STEPS)
                     for b in VERIFY_BUDGETS} for name, by_budget in runs.items()}
    lines += [f"| {name} | {b} | {row(f)} |" for name, by_b in verify.items() for b, f in by_b.items()]
    batch: dict[str, list[dict]] = {name: [] for name in runs}
    for cap in CAPS:
        pairs = [(b, t) for b in BUDGETS if b < cap for t in (*BUDGETS, STEPS) if t > cap]
        # (budget, second run, window start or None: the perfect ranking, by the true PSNR)
        options = [(b, t, start) for b, t in pairs for start in (*RANK_STARTS, None)]
        tuned = {o: ranked_figures(runs[TUNE], o, cap) for o in options}
        lines += ["", f"A batch mean of {cap} computed steps ({2 * cap} passes): every image at a lower budget, then "
                      "the images ranked highest run again at a larger one while the steps last; ranked by their late "
                      f"misses over the batch's median (the setting chosen on {TUNE}: best worst case, then mean), and "
                      "by the truth (a perfect ranking, the bound of every such scheme):", "",
                  "| set | ranking: budget, second run, window " + head[0], "|---|---" + head[1]]
        for perfect in (False, True):
            setting = max((o for o in options if (o[2] is None) == perfect),
                          key=lambda o: (tuned[o]["worst"], tuned[o]["mean"]))
            for name, by_budget in runs.items():
                f = ranked_figures(by_budget, setting, cap)
                if not perfect:
                    batch[name].append(f)
                label = "perfect" if perfect else f"late misses from step {setting[2]}"
                second = "uncached" if setting[1] == STEPS else setting[1]
                lines.append(f"| {name} | {label}: {setting[0]}, {second} | {row(f)} |")
    print("\n".join(lines))
    if args.plot is not None:
        plot(runs, batch, {name: verify[name][VERIFY_BUDGETS[-1]] for name in runs}, args.plot)


if __name__ == "__main__":
    main()
