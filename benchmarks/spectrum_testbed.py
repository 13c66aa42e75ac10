"""Step-cache error on the closed-form Gaussian-mixture test bed.

Runs Euler + CFG with the exact denoiser, uncached and with each cache from the same noise, and prints
the median (over seeds) relative L2 error of the final sample as a Markdown table, or JSON with --json.
`auto` runs with a budget of the fixed schedules' computed steps, so every column spends the same passes.

    python benchmarks/spectrum_testbed.py [--seeds 100] [--steps 20 30 50] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from anima_rknn.sampling.spectrum import SpectrumSchedule

# The closed-form test bed lives with the tests that pin its numbers: it is a reference, not part of the product.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "sampling"))
from mixture import make_testbed, relative_errors  # noqa: E402

CACHES = ("reuse", "spectrum", "spectrum-plus", "auto")
# (label, CFG scale, component std, components): the spec's four configurations plus a strong-CFG one.
MIXTURES = (
    ("CFG 4, std 0.35, 8 comp.", 4.0, 0.35, 8),
    ("CFG 4, std 1.0, 8 comp.", 4.0, 1.0, 8),
    ("CFG 1, std 1.0, 8 comp.", 1.0, 1.0, 8),
    ("CFG 1, std 0.1, 64 comp.", 1.0, 0.1, 64),
    ("CFG 7, std 0.5, 16 comp.", 7.0, 0.5, 16),
)


def computed_step_count(steps: int) -> int:
    """The three fixed caches share the default Spectrum schedule, which does not depend on the values."""
    schedule = SpectrumSchedule(steps)
    for _ in range(steps):
        if schedule.should_skip():
            schedule.mark_skipped()
        else:
            schedule.mark_computed()
    return len(schedule.computed_steps)


def measure(steps_list: list[int], num_seeds: int, dim: int, testbed_seed: int) -> list[dict]:
    rows = []
    for label, cfg_scale, std, components in MIXTURES:
        cond, uncond = make_testbed(dim, components, std, seed=testbed_seed)
        for steps in steps_list:
            computed, auto_calls = computed_step_count(steps), []
            errors = {name: float(np.median(relative_errors(
                name, cond, uncond, cfg_scale, steps, range(num_seeds),
                {"budget": computed} if name == "auto" else None, calls=auto_calls if name == "auto" else None)))
                for name in CACHES}
            rows.append({"mixture": label, "steps": steps, "computed": computed, "auto_computed_mean":
                         float(np.mean(auto_calls)), "median_relative_error": errors})
    return rows


def markdown(rows: list[dict], num_seeds: int, dim: int) -> str:
    lines = [f"Median relative L2 error of the final sample vs the uncached run ({dim} dims, {num_seeds} seeds; "
             "cache none = 0 by definition)", "",
             "| mixture | steps | computed | " + " | ".join(CACHES) + " |",
             "|---|---|---|" + "---|" * len(CACHES)]
    for row in rows:
        errors = row["median_relative_error"]
        best = min(errors.values())
        cells = [f"**{errors[n]:.4f}**" if errors[n] == best else f"{errors[n]:.4f}" for n in CACHES]
        computed = f"{row['computed']} (auto {row['auto_computed_mean']:.1f})"
        lines.append(f"| {row['mixture']} | {row['steps']} | {computed} | "
                     + " | ".join(cells) + " |")
    wins = sum(r["median_relative_error"]["auto"] < r["median_relative_error"]["spectrum-plus"] for r in rows)
    lines += ["", f"auto below spectrum-plus in {wins} of {len(rows)} cells"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=100, help="noise seeds per cell (median over them)")
    parser.add_argument("--steps", type=int, nargs="+", default=[20, 30, 50])
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--testbed-seed", type=int, default=0, help="seed of the mixtures' means and weights")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a Markdown table")
    args = parser.parse_args()
    rows = measure(args.steps, args.seeds, args.dim, args.testbed_seed)
    print(json.dumps(rows, indent=2) if args.json else markdown(rows, args.seeds, args.dim))


if __name__ == "__main__":
    main()
