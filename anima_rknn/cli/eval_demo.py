"""`eval-demo`: generate the fixed demo prompt set and measure prompt adherence automatically."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from tqdm import tqdm

from ..demo import demo_model_dir
from ..demo.evaluate import adherence, adherence_table, contact_sheet, generate_images, judge, prompt_set
from ..sampling.caches import CACHE_NAMES
from . import cli


@cli.command("eval-demo")
@click.option("--model", type=click.Path(file_okay=False), default=None,
              help="Model directory (default: the shipped demo model).")
@click.option("--prompts", "count", type=int, default=24, show_default=True,
              help="Prompts in the fixed set; every third one is a held-out colour pair.")
@click.option("--steps", type=int, default=20, show_default=True)
@click.option("--cfg", type=float, default=4.0, show_default=True)
@click.option("--seed", type=int, default=1000, show_default=True, help="Prompt i uses seed + i.")
@click.option("--cache", type=click.Choice(CACHE_NAMES), default="none", show_default=True)
@click.option("--sheet", type=click.Path(dir_okay=False), default="demo_sheet.png", show_default=True,
              help="Contact sheet PNG with every picture and its prompt.")
@click.option("--json", "as_json", is_flag=True, help="Also print the scores as one JSON object.")
def eval_demo(model: str | None, count: int, steps: int, cfg: float, seed: int, cache: str, sheet: str,
              as_json: bool) -> None:
    """Score how well the demo model follows its prompts (background, shape colour, position, shape)."""
    model_dir = Path(model) if model else demo_model_dir()
    specs = prompt_set(count)
    with tqdm(total=count, desc="generate", unit="prompt", file=sys.stderr, dynamic_ncols=True) as bar:
        images = generate_images(model_dir, specs, steps=steps, cfg=cfg, seed=seed, cache=cache,
                                 on_image=lambda: bar.update(1))
    judged = judge(specs, images)
    click.echo(adherence_table(judged))
    contact_sheet(judged, sheet)
    click.echo(f"wrote contact sheet {sheet}")
    if as_json:
        click.echo(json.dumps({"train": adherence(judged, lambda j: not j.spec.held_out),
                               "held_out": adherence(judged, lambda j: j.spec.held_out),
                               "all": adherence(judged)}))
