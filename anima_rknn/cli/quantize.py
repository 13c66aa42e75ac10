"""`anima-rknn quantize`: write a checkpoint as a quantized GGUF file (stable-diffusion.cpp's convert mode)."""

from __future__ import annotations

from pathlib import Path

import click

from ..model.quantize import QUANTIZE_TYPES, quantize_checkpoint
from .group import cli
from .options import apply_threads, threads_option


@cli.command("quantize")
@click.argument("source", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The GGUF file to write (.gguf).")
@click.option("--type", "qtype", type=click.Choice(QUANTIZE_TYPES, case_sensitive=False), default="q8_0",
              show_default=True, help="GGML type of the linear weights; biases, norms, embedders and the final "
                                      "layer keep their type, as stable-diffusion.cpp does.")
@click.option("--overwrite", is_flag=True, help="Replace --out if it exists.")
@threads_option
def quantize(source: Path, out: Path, qtype: str, overwrite: bool, threads: int) -> None:
    """Write SOURCE (a DiT, text encoder or VAE; safetensors or GGUF) as a quantized GGUF file."""
    apply_threads(threads)
    counts = quantize_checkpoint(source, out, qtype, overwrite=overwrite)
    summary = ", ".join(f"{n} {dtype}" for dtype, n in sorted(counts.items()))
    click.echo(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB): {summary}")
