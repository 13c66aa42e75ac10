from __future__ import annotations

import sys
import time
from pathlib import Path

import click
from tqdm import tqdm

from ..bench.calibrate import budgets, calibrate, runs_of, split_prompts
from ..core.files import Unreadable, check_output_file, read_small_file
from ..errors import AnimaError
from ..generation.params import parse_seeds
from ..generation.pipeline import AnimaPipeline
from ..model.model_set import resolve
from ..sampling.cache_fit import fit_path, write_fit
from ..sampling.sample import StepEvent
from .group import cli
from .options import model_options, params_from_cli, setting_options

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
@click.option("--out", "-o", type=click.Path(dir_okay=False), default=None,
              help="Where the fit goes. Default: next to the DiT, where `--cache auto` finds it.")
@click.option("--overwrite", is_flag=True, help="Replace a fit already there.")
def calibrate_cache(model, dit, text_encoder, vae, qwen_tokenizer, t5_tokenizer, prompts_file, held_out, seeds, out,
                    overwrite, **settings) -> None:
    """Fit this model's numbers for `--cache auto` (its budget, check, verify and flag) from uncached runs."""
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
    runs = runs_of(len(prompts), len(seed_list), base.steps)
    click.echo(f"calibrate-cache: {runs} runs of {base.steps} steps at {base.width}x{base.height} "
               f"({len(fit_prompts)} prompts to fit on, {len(check_prompts)} held out, {len(seed_list)} seeds; each "
               f"uncached, then auto at budgets {', '.join(map(str, budgets(base.steps)))}); the estimate of the time "
               "follows the first run", err=True)
    began = time.perf_counter()
    with tqdm(total=runs * base.steps, desc="calibrate", unit="step", file=sys.stderr, dynamic_ncols=True) as bar:
        done = 0

        def on_run(prompt: str, seed: int) -> None:
            nonlocal done
            done += 1
            bar.set_description(f"run {done}/{runs}")
            if done == 2:  # the first run (models loaded, prompt encoded) times the rest
                left = (time.perf_counter() - began) * (runs - 1)
                tqdm.write(f"estimate: about {left / 60:.1f} min for the {runs - 1} runs left", file=sys.stderr)

        def on_step(event: StepEvent) -> None:
            bar.update((done - 1) * base.steps + event.step - bar.n)

        calibration = calibrate(pipeline, base, prompts, seed_list, held_out, on_step, on_run)
    write_fit(target, calibration.fit, overwrite=overwrite)
    errors = calibration.fit.fit_error
    click.echo(f"wrote {target} from {calibration.runs} runs ({calibration.calls} model calls) in "
               f"{time.perf_counter() - began:.0f} s; residual sd (ln) fitted / held out: "
               + ", ".join(f"{name} {errors[name]:.2f} / {errors[name + '_held_out']:.2f}"
                           for name in ("typical_miss", "typical_probe_miss", "plan_growth")))
    if Path(target) != fit_path(files.dit):
        click.echo(f"`--cache auto` reads it from {fit_path(files.dit)}: copy it there", err=True)
