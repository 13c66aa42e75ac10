"""`train-demo`: train the small demo model set (VAE, then DiT + LLM adapter) on the procedural dataset;
`train-demo-lora`: train the demo LoRA for it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from ..demo.train import DemoConfig, train_demo
from ..demo.train_lora import LoraTrainConfig, train_demo_lora
from .group import cli
from .options import FINITE, threads_option


@cli.command("train-demo")
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False),
              help="Folder for the model set: new or empty; a run interrupted there resumes from its last checkpoint.")
@click.option("--minutes", type=FINITE, default=DemoConfig.minutes, show_default=True,
              help="Wall-clock budget for both stages together.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--vae-steps", type=int, default=None, help="Train the VAE this many steps instead of by time.")
@click.option("--dit-steps", type=int, default=None, help="Train the DiT this many steps instead of by time.")
@threads_option
@click.option("--overwrite", is_flag=True,
              help="Train into a folder holding other files (e.g. a make-tiny model set), replacing its model files.")
def train_demo_command(out: str, minutes: float, seed: int, vae_steps: int | None, dit_steps: int | None,
                       threads: int, overwrite: bool) -> None:
    """Train the demo model set (about 35 minutes on 2 cores)."""
    config = dataclasses.replace(DemoConfig(), seed=seed, minutes=minutes, vae_steps=vae_steps, dit_steps=dit_steps)
    results = train_demo(Path(out), config, threads=threads, overwrite=overwrite)
    for name, r in results.items():
        click.echo(f"{name}: {r.steps} steps in {r.seconds / 60:.1f} min, loss {r.first_loss:.4f} -> {r.last_loss:.4f}")
    click.echo(f"wrote the demo model set to {out}")


@cli.command("train-demo-lora")
@click.option("--out", "-o", required=True, type=click.Path(dir_okay=False),
              help="The LoRA .safetensors to write (kohya layout); an interrupted run resumes from its work folder "
                   "beside it (FILE.train/).")
@click.option("--model", type=click.Path(file_okay=False), default=None,
              help="Model directory the LoRA is for (default: the shipped demo model).")
@click.option("--minutes", type=FINITE, default=LoraTrainConfig.minutes, show_default=True,
              help="Wall-clock training budget.")
@click.option("--steps", type=int, default=None, help="Train this many steps instead of by time.")
@click.option("--rank", type=int, default=LoraTrainConfig.rank, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@threads_option
@click.option("--overwrite", is_flag=True, help="Replace --out if it exists.")
def train_demo_lora_command(out: str, model: str | None, minutes: float, steps: int | None, rank: int, seed: int,
                            threads: int, overwrite: bool) -> None:
    """Train the demo LoRA: "large" shapes, a word the demo model never learned."""
    config = dataclasses.replace(LoraTrainConfig(), seed=seed, minutes=minutes, steps=steps, rank=rank)
    r = train_demo_lora(Path(out), config, model=model, overwrite=overwrite, threads=threads)
    click.echo(f"lora: {r.steps} steps in {r.seconds / 60:.1f} min, loss {r.first_loss:.4f} -> {r.last_loss:.4f}")
    click.echo(f"wrote the LoRA to {out}")
