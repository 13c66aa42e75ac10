"""The bench's pictures: baseline | cached | difference heat map, and per-step wall time and x0 distance."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# No pyplot: no global state, no display backend needed.
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from PIL import Image

from ..core.files import atomic_path
from .metrics import difference_map
from .report import comparison_file, sampler_prefix, samplers_of
from .run import BenchResult


def _save(figure: Figure, path: Path) -> None:
    with atomic_path(path, overwrite=True) as tmp:
        figure.savefig(tmp, format="png", dpi=100)


def side_by_side(baseline: Image.Image, cached: Image.Image, path: Path, cached_label: str,
                 psnr_db: float, ssim: float) -> None:
    """Baseline, cached and their mean absolute RGB difference as a heat map with a colour bar; each panel is
    about as many pixels wide as the images (at least 256)."""
    width, height = baseline.size
    figure = Figure(figsize=(3 * max(width, 256) / 100 + 1.2, max(height, 256) / 100 + 0.8))
    axes = figure.subplots(1, 3)
    difference = difference_map(baseline, cached)
    titles = ("baseline (no cache)", cached_label, f"|difference|: PSNR {psnr_db:.2f} dB, SSIM {ssim:.4f}")
    for ax, title in zip(axes, titles):
        ax.set_axis_off()
        ax.set_title(title, fontsize=9)
    axes[0].imshow(baseline, interpolation="nearest")
    axes[1].imshow(cached, interpolation="nearest")
    # The scale follows the largest difference so small ones are still visible; the colour bar gives it.
    heat = axes[2].imshow(difference, cmap="inferno", vmin=0, vmax=max(float(difference.max()), 1.0),
                          interpolation="nearest")
    figure.colorbar(heat, ax=axes[2], fraction=0.046, pad=0.04, label="mean |RGB difference| (0-255)")
    figure.tight_layout()
    _save(figure, path)


@dataclass
class StepSeries:
    """One run's per-step wall times, and (for a cached run) its x0 distance to the baseline and its skips (the
    steps where a forecast stood in for a model call)."""

    step_times: Sequence[float]
    x0_distance: Sequence[float] | None = None
    skipped_steps: Sequence[int] = ()


def step_plot(baseline_times: Sequence[float], cached: Mapping[str, StepSeries], path: Path, title: str) -> None:
    """Top: wall time per step; bottom: relative L2 distance of each step's x0 to the baseline's. Skipped
    (forecast) steps are marked with an x on both panels."""
    figure = Figure(figsize=(8, 6))
    time_ax, distance_ax = figure.subplots(2, 1, sharex=True)
    steps = range(1, len(baseline_times) + 1)
    time_ax.plot(steps, [t * 1000 for t in baseline_times], "o-", color="black", label="baseline")
    for index, (name, series) in enumerate(cached.items()):
        colour = f"C{index}"
        times_ms = [t * 1000 for t in series.step_times]
        time_ax.plot(steps, times_ms, "o-", color=colour, label=name, markersize=4)
        time_ax.plot(series.skipped_steps, [times_ms[s - 1] for s in series.skipped_steps], "x", color=colour,
                     markersize=9)
        if series.x0_distance is not None:
            distance_ax.plot(steps, series.x0_distance, "o-", color=colour, label=name, markersize=4)
            distance_ax.plot(series.skipped_steps, [series.x0_distance[s - 1] for s in series.skipped_steps], "x",
                             color=colour, markersize=9)
    time_ax.set_ylabel("wall time per step (ms)")
    time_ax.set_title(f"{title}  (x = skipped step, x0 forecast)", fontsize=10)
    time_ax.legend(fontsize=8)
    time_ax.grid(alpha=0.3)
    distance_ax.set_xlabel("step")
    distance_ax.set_ylabel("x0 distance to baseline\n(relative L2)")
    distance_ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    distance_ax.grid(alpha=0.3)
    figure.tight_layout()
    _save(figure, path)


def write_figures(result: BenchResult, report: dict[str, Any], out_dir: Path) -> None:
    """Per seed (and sampler) the step plot and, per policy with both images, the side-by-side comparison."""
    several = len(samplers_of(result)) > 1
    for seed_result, entry in zip(result.seeds, report["seeds"]):
        series = {}
        prefix = sampler_prefix(seed_result.sampler, several)
        for name, policy in seed_result.cached.items():
            side = entry["cached"][name]
            series[name] = StepSeries(side["step_times_s"], side["vs_baseline"]["x0_distance"], side["forecast_steps"])
            image, base_image = policy.first.image, seed_result.baseline.first.image
            if image is not None and base_image is not None:
                comparison = side["vs_baseline"]
                side_by_side(base_image, image, out_dir / comparison_file(name, seed_result.seed, prefix),
                             f"cache {name}", comparison["psnr_db"], comparison["ssim"])
        step_plot(entry["baseline"]["step_times_s"], series, out_dir / entry["steps_plot"],
                  f"seed {seed_result.seed}" + (f", {seed_result.sampler}" if several else ""))
