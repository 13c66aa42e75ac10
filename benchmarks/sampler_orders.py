"""The deterministic samplers' order of convergence to the probability-flow ODE, on the Gaussian-mixture test bed.

Error (RMS over 32 rows, at sigma 0.02) of euler, heun, dpmpp_2m, res_multistep, sa_solver and sa_solver_pece
(eta 0) against scipy's DOP853 at rtol 1e-11, against the step count, from pure noise (sigma 1) and from the exact
ODE state at sigma 0.9, at shift 1 and 3: the set-up of tests/sampling/test_sampler_convergence.py, whose
functions this uses. Prints the slopes fitted over 32..256 steps and draws a log-log plot with reference slopes
n^-1, n^-2, n^-3.

    python benchmarks/sampler_orders.py [--plot docs/sampler_orders.png] [--steps 8 16 32 64 128 256 512]

From sigma 1, sa_solver stops converging at about 2.4e-4: sigma 1 counts as 1 - 1e-4 in its lambdas (ComfyUI's
offset_first_sigma_for_snr); from sigma 0.9 it shows its order.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

# The test bed and its ODE reference live with the tests that pin these numbers.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "sampling"))
from test_sampler_convergence import ORDERS, SIGMA_END, fitted_order, ode_errors  # noqa: E402

STARTS = (1.0, 0.9)
SHIFTS = (1.0, 3.0)
FIT_STEPS = (32, 64, 128, 256)


def measure(step_counts: list[int]) -> dict:
    errors = {}
    for start in STARTS:
        for shift in SHIFTS:
            for name in ORDERS:
                errors[(start, shift, name)] = ode_errors(name, shift, start, step_counts)
    return errors


def slopes(step_counts: list[int], errors: dict) -> dict:
    chosen = [i for i, n in enumerate(step_counts) if n in FIT_STEPS]
    return {key: fitted_order([step_counts[i] for i in chosen], [values[i] for i in chosen])
            for key, values in errors.items()}


def table(fits: dict) -> str:
    lines = ["| sampler | order | " + " | ".join(f"from sigma {start:g}, shift {shift:g}" for start in STARTS
                                                 for shift in SHIFTS) + " |",
             "|---|---|" + "---|" * (len(STARTS) * len(SHIFTS))]
    for name, order in ORDERS.items():
        cells = [f"{fits[(start, shift, name)]:.2f}" for start in STARTS for shift in SHIFTS]
        lines.append(f"| {name} | {order:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(step_counts: list[int], errors: dict, path: Path) -> None:
    from matplotlib.figure import Figure  # no pyplot: no display backend needed

    figure = Figure(figsize=(10, 8), dpi=110)
    steps = np.array(step_counts, dtype=float)
    for panel, (start, shift) in enumerate((start, shift) for start in STARTS for shift in SHIFTS):
        axes = figure.add_subplot(2, 2, panel + 1)
        for colour, name in enumerate(ORDERS):
            axes.loglog(steps, errors[(start, shift, name)], "o-", ms=3, color=f"C{colour}", label=name)
        anchor = max(errors[(start, shift, name)][0] for name in ORDERS)
        for order in (1, 2, 3):
            axes.loglog(steps, anchor * (steps / steps[0]) ** -order, ":", color="grey", lw=0.8)
            axes.annotate(f"n^-{order}", (steps[-1], anchor * (steps[-1] / steps[0]) ** -order), fontsize=7,
                          color="grey", ha="right", va="bottom")
        axes.set_title(f"from sigma {start:g} to {SIGMA_END:g}, shift {shift:g}", fontsize=9)
        axes.set_xlabel("steps")
        axes.set_ylabel("RMS error vs exact ODE")
        axes.grid(alpha=0.3, which="both")
        if panel == 0:
            axes.legend(fontsize=7)
    figure.suptitle("Deterministic samplers on the Gaussian-mixture test bed (eta 0)", fontsize=10)
    figure.tight_layout()
    figure.savefig(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[8, 16, 32, 64, 128, 256, 512])
    parser.add_argument("--plot", type=Path, default=None, help="write the log-log plot here (PNG)")
    args = parser.parse_args()
    if not set(FIT_STEPS) <= set(args.steps):
        parser.error(f"--steps must include the fitted range {FIT_STEPS}")
    errors = measure(args.steps)
    print(f"Fitted slopes of log error vs log steps over {FIT_STEPS[0]}..{FIT_STEPS[-1]} steps:\n")
    print(table(slopes(args.steps, errors)))
    if args.plot is not None:
        plot(args.steps, errors, args.plot)
        print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main()
