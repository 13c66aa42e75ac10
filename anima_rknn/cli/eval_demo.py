"""`eval-demo`: generate the fixed demo prompt set and measure prompt adherence automatically."""

from __future__ import annotations

from pathlib import Path

import click

from ..core.files import check_output_file, json_text, save_png
from ..demo import demo_model_dir
from ..demo.dataset import LARGE
from ..demo.evaluate import (
    CONCEPTS,
    PROMPT_KINDS,
    adherence,
    adherence_table,
    contact_sheet,
    generate_images,
    judge,
    prompt_set,
)
from ..generation.params import resolve_seed
from ..model.lora import parse_lora_option
from ..sampling.caches import CACHE_NAMES
from .group import cli
from .options import FINITE, lora_file_options, threads_option


@cli.command("eval-demo")
@click.option("--model", type=click.Path(file_okay=False), default=None,
              help="Model directory (default: the shipped demo model).")
@click.option("--prompts", "count", type=int, default=24, show_default=True,
              help="Prompts in the fixed set; every third one is a held-out colour pair.")
@click.option("--concept", type=click.Choice(CONCEPTS), default="none", show_default=True,
              help="large: every second prompt asks for a large shape, the demo LoRA's concept.")
@lora_file_options
@click.option("--steps", type=int, default=20, show_default=True)
@click.option("--cfg", type=FINITE, default=4.0, show_default=True)
@click.option("--seed", type=int, default=1000, show_default=True,
              help="Prompt i uses seed + i; -1 draws the first at random.")
@click.option("--cache", type=click.Choice(CACHE_NAMES), default="none", show_default=True)
@threads_option
@click.option("--sheet", "-o", type=click.Path(dir_okay=False), default="demo_sheet.png", show_default=True,
              help="Contact sheet PNG with every picture and its prompt.")
@click.option("--overwrite", is_flag=True, help="Replace --sheet if it exists.")
@click.option("--json", "as_json", is_flag=True, help="Also print the scores as one JSON object.")
def eval_demo(model: str | None, count: int, concept: str, lora: tuple[str, ...], lora_ignore_unmatched: bool,
              steps: int, cfg: float, seed: int, cache: str, threads: int, sheet: str, overwrite: bool,
              as_json: bool) -> None:
    """Score how well the demo model follows its prompts (background, shape colour, position, shape, size)."""
    sheet_path = check_output_file(sheet, overwrite=overwrite, suffixes=(".png",))  # before minutes of work
    specs = prompt_set(count, concept=concept)
    loras = [parse_lora_option(text) for text in lora]
    model_dir = Path(model) if model else demo_model_dir()
    images = generate_images(model_dir, specs, steps=steps, cfg=cfg, seed=resolve_seed(seed), cache=cache,
                             loras=loras, lora_ignore_unmatched=lora_ignore_unmatched, threads=threads,
                             progress=True)
    judged = judge(specs, images)
    click.echo(adherence_table(judged))
    save_png(contact_sheet(judged), sheet_path, overwrite=overwrite)
    click.echo(f"wrote contact sheet {sheet_path}")
    if as_json:
        # every kind of prompt, empty where the set has none; "large" only in a set with the LoRA concept
        click.echo(json_text({name.replace("-", "_"): adherence(judged, keep) for name, keep in PROMPT_KINDS.items()
                              if name != LARGE or concept == LARGE}))
