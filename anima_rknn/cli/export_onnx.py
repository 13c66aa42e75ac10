"""`anima-rknn export-onnx`: write the static-shape ONNX subgraph set for one resolution."""

from __future__ import annotations

from pathlib import Path

import click

from ..export.onnx import export_subgraphs
from ..model.lora import lora_tag, parse_lora_option
from ..model.model_set import part_file
from .group import cli
from .options import DtypeChoice, apply_threads, dit_image_size, lora_file_options, threads_option

EXPORT_DTYPES = {"fp32": "float32", "fp16": "float16"}


@cli.command("export-onnx")
@click.option("--model", "model_dir", type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="Model directory in the Hugging Face layout (DiT: split_files/diffusion_models/*.safetensors). "
                   "Default: the shipped demo model.")
@click.option("--dit", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="DiT .safetensors or .gguf file (a GGUF is dequantized for the export).")
@click.option("--width", "-W", type=int, default=None,
              help="Image width (multiple of 16). Default 512, or the size a small trained model was made for "
                   "(64 for the demo model).")
@click.option("--height", "-H", type=int, default=None, help="Image height (multiple of 16). Default as --width.")
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder for the set.")
@click.option("--dtype", type=DtypeChoice(list(EXPORT_DTYPES), "and are dequantized to this --dtype for the set"),
              default="fp32", show_default=True, help="Precision of the subgraphs (the host side always stays fp32).")
@click.option("--overwrite", is_flag=True, help="Replace what is already in --out.")
@lora_file_options
@threads_option
def export_onnx(model_dir: Path | None, dit: Path | None, width: int | None, height: int | None, out: Path,
                dtype: str, overwrite: bool, lora: tuple[str, ...], lora_ignore_unmatched: bool, threads: int) -> None:
    """Export the DiT's attention and MLP bodies (3 per block) as ONNX subgraphs for one image size.
    --lora bakes LoRAs into them (generate with the same --lora options to use the set)."""
    apply_threads(threads)
    dit_path = part_file(model_dir, dit, "dit")
    width, height = dit_image_size(dit_path, width, height)
    loras = [parse_lora_option(text) for text in lora]
    manifest = export_subgraphs(dit_path, width, height, out, EXPORT_DTYPES[dtype], overwrite=overwrite,
                                loras=loras, lora_ignore_unmatched=lora_ignore_unmatched)
    baked = f" with LoRAs {', '.join(lora_tag(ref) for ref in loras)} baked in" if loras else ""
    click.echo(f"wrote {width}x{height} {dtype} subgraphs{baked} and {manifest.name} to {out}")
