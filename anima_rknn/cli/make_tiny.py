from __future__ import annotations

from pathlib import Path

import click

from ..demo.tiny_set import write_model_set
from ..model.config import MAX_BLOCKS
from .group import cli


@cli.command("make-tiny")
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False), help="Folder for the model set.")
@click.option("--preset", type=click.Choice(["tiny", "mid", "full"]), default="tiny", show_default=True,
              help="Model sizes; full = real Anima sizes (a few GB, for memory and speed measurements).")
@click.option("--tokenizers", type=click.Path(file_okay=False), default=None,
              help="Folder with the real qwen3/ and t5/ tokenizers to copy in (default: small built ones).")
@click.option("--blocks", type=click.IntRange(1, MAX_BLOCKS), default=None,
              help="DiT blocks instead of the preset's (3 subgraphs each; --preset full --blocks 40 is the shape of "
                   "the community Anima-2.9B).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--overwrite", is_flag=True, help="Replace a model set already in --out.")
def make_tiny(out: str, preset: str, tokenizers: str | None, blocks: int | None, seed: int, overwrite: bool) -> None:
    """Write a random-weight model set in the real file formats and the Hugging Face layout."""
    files = write_model_set(Path(out), preset, Path(tokenizers) if tokenizers else None, seed, overwrite, blocks)
    click.echo(f"wrote {preset} model set to {out}: {files.dit.name}, {files.text_encoder.name}, {files.vae.name}")
