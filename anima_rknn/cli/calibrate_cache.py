from __future__ import annotations

import sys
import time
from pathlib import Path

import click
from tqdm import tqdm

from ..bench.cache_choices import LOW_PSNR, plan_candidates
from ..bench.calibrate import (
    FITS,
    Calibration,
    Progress,
    Work,
    budgets,
    calibrate,
    plan_budgets,
    planned_work,
    split_prompts,
)
from ..core.files import Unreadable, check_output_file, read_small_file
from ..errors import AnimaError
from ..generation.params import parse_seeds
from ..generation.pipeline import AnimaPipeline
from ..model.model_set import resolve
from ..sampling.cache_fit import fit_path, write_fit
from ..sampling.sample import StepEvent
from .group import cli
from .options import FiniteFloat, model_options, params_from_cli, setting_options

MAX_PROMPTS_BYTES, MAX_SEEDS = 1 << 20, 16


@cli.command("calibrate-cache")
@model_options
@setting_options("negative", "width", "height", "steps", "cfg", "shift", "scheduler", "sampler", "dtype", "threads",
                 "backend", "subgraphs", "rknn")
@click.option("--prompts", "prompts_file", required=True, type=click.Path(dir_okay=False),
              help="Text file of prompts, one a line: the last --held-out are kept to check the fit on.")
@click.option("--held-out", type=click.IntRange(1), default=2, show_default=True,
              help="Prompts (the file's last) the fit is checked on, never fitted on.")
@click.option("--seeds", default="1", show_default=True, help=f"Seeds of each prompt, e.g. 1-3 (at most {MAX_SEEDS}).")
@click.option("--fit", "fit", type=click.Choice(FITS), default="all", show_default=True,
              help="all: every number, the plan's and the flag's choices by image quality too (1.3-1.8x the "
                   "model calls, each run's image decoded); curves: the three regressions, the choices kept as "
                   "made on the demo model.")
@click.option("--flag-psnr", type=FiniteFloat(1, 99), default=LOW_PSNR, show_default=True,
              help="With --fit all: a cached image under this PSNR (dB) against its uncached one is one the flag "
                   "should catch.")
@click.option("--out", "-o", type=click.Path(dir_okay=False), default=None,
              help="Where the fit goes. Default: next to the DiT, where `--cache auto` finds it.")
@click.option("--overwrite", is_flag=True, help="Replace a fit already there.")
def calibrate_cache(model, dit, text_encoder, vae, qwen_tokenizer, t5_tokenizer, prompts_file, held_out, seeds, fit,
                    flag_psnr, out, overwrite, **settings) -> None:
    """Fit this model's numbers for `--cache auto` (its budget, check, verify and flag) from uncached and cached
    runs on your prompts, checked on prompts it did not fit on."""
    files = resolve(model, dit=dit, text_encoder=text_encoder, vae=vae, qwen_tokenizer=qwen_tokenizer,
                    t5_tokenizer=t5_tokenizer)
    target = check_output_file(out or fit_path(files.dit), overwrite=overwrite, suffixes=(".json",))
    try:
        text = read_small_file(prompts_file, MAX_PROMPTS_BYTES).decode("utf-8")
    except (Unreadable, OSError, UnicodeDecodeError) as e:
        raise AnimaError(f"cannot read the prompts in {prompts_file}: {e}") from None
    prompts = [line.strip() for line in text.splitlines() if line.strip()]
    fit_prompts, check_prompts = split_prompts(prompts, held_out)
    seed_list = parse_seeds(seeds, MAX_SEEDS)
    base = params_from_cli(files, {**settings, "prompt": prompts[0], "seed": seed_list[0], "cache": "none"})
    pipeline = AnimaPipeline(files, keep_dit=True)
    choices = fit == "all"
    work = planned_work(base, len(fit_prompts) * len(seed_list), len(check_prompts) * len(seed_list), choices)
    sweep = (f"under each of {len(plan_candidates())} plans at budgets "
             f"{', '.join(map(str, plan_budgets(base.steps)))} (plans placing the calls alike run once), "
             if choices else "")
    click.echo(f"calibrate-cache: about {work.runs} runs ({work.calls} model calls) of {base.steps} steps at "
               f"{base.width}x{base.height} ({len(fit_prompts)} prompts to fit on, {len(check_prompts)} held out, "
               f"{len(seed_list)} seeds; each uncached, then auto {sweep}at budgets "
               f"{', '.join(map(str, budgets(base.steps)))}); the estimate of the time follows the first run",
               err=True)
    with tqdm(total=work.runs * base.steps, desc="calibrate", unit="step", file=sys.stderr,
              dynamic_ncols=True) as bar:
        calibration = calibrate(pipeline, base, prompts, seed_list, held_out, _Progress(bar, base.steps, work).hooks(),
                                fit, flag_psnr)
    write_fit(target, calibration.fit, overwrite=overwrite)
    _report(target, calibration)
    if Path(target) != fit_path(files.dit):
        click.echo(f"`--cache auto` reads it from {fit_path(files.dit)}: copy it there", err=True)


class _Progress:
    """The bar (steps of runs) and the estimate: seconds per model call, timed on the runs made so far (the first
    alone loads the models, so the estimate is given after it and made again when the work is counted again)."""

    def __init__(self, bar: tqdm, steps: int, work: Work) -> None:
        self.bar, self.steps, self.work = bar, steps, work
        self.began, self.runs, self.calls, self.current = time.perf_counter(), 0, 0, 0

    def hooks(self) -> Progress:
        return Progress(self.on_step, self.on_run, self.on_work)

    def _estimate(self, what: str, runs: int, calls: int) -> None:
        """Say the time left, `runs` runs of `calls` model calls having finished."""
        if calls:
            left = (time.perf_counter() - self.began) / calls * max(0, self.work.calls - calls)
            shown = f"{left / 60:.1f} min" if left >= 60 else f"{left:.0f} s"
            tqdm.write(f"estimate{what}: about {shown} for the {max(0, self.work.runs - runs)} runs "
                       f"({max(0, self.work.calls - calls)} model calls) left", file=sys.stderr)

    def on_run(self, calls: int) -> None:
        self.runs, self.calls, self.current = self.runs + 1, self.calls + self.current, calls
        self.bar.set_description(f"run {self.runs}/{self.work.runs}")
        if self.runs == 2:
            self._estimate("", 1, self.calls)

    def on_step(self, event: StepEvent) -> None:
        self.bar.update((self.runs - 1) * self.steps + event.step - self.bar.n)

    def on_work(self, work: Work) -> None:
        if work != self.work:
            self.work = work
            self.bar.total = work.runs * self.steps
            self.bar.refresh()
            self._estimate(" (counted again with this model's fit)", self.runs, self.calls + self.current)


def _report(target: Path, calibration: Calibration) -> None:
    fit, errors = calibration.fit, calibration.fit.fit_error
    click.echo(f"wrote {target} from {calibration.runs} runs ({calibration.calls} model calls); residual sd (ln) "
               "fitted / held out: " + ", ".join(f"{name} {errors[name]:.2f} / {errors[name + '_held_out']:.2f}"
                                                  for name in ("typical_miss", "typical_probe_miss", "plan_growth")))
    if calibration.plan is not None:
        click.echo(f"chosen: {calibration.plan.describe()}; flag_sigma {fit.flag_sigma:g}, flag_score "
                   f"{fit.flag_score:g} (on the fit runs: {calibration.flag.counts.describe()})")
        if not calibration.flag_fitted:
            click.echo("no fit run fell under --flag-psnr: the flag is set to flag none of them; more prompts or "
                       "lower budgets would give it runs to learn from", err=True)
    click.echo(f"held out: {calibration.held_out.describe()}")
