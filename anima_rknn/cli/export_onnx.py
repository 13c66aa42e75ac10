"""`anima-rknn export-onnx`: write the static-shape ONNX subgraph set for one resolution."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import AnimaError
from ..export.onnx import export_subgraphs
from ..model_set import LAYOUT, resolve, single_safetensors
from . import cli
from .options import dit_image_size

EXPORT_DTYPES = {"fp32": "float32", "fp16": "float16"}


def dit_file(model_dir: Path | None, dit: Path | None) -> Path:
    """The DiT of --model or --dit; neither means the shipped demo model, as for generate."""
    if model_dir is not None and dit is not None:
        raise AnimaError("pass one of --model DIR or --dit FILE, not both")
    if dit is not None:
        return dit
    if model_dir is None:
        return resolve(None).dit
    return single_safetensors(model_dir / LAYOUT["dit"], "diffusion model")


@cli.command("export-onnx")
@click.option("--model", "model_dir", type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="Model directory in the Hugging Face layout (DiT: split_files/diffusion_models/*.safetensors). "
                   "Default: the shipped demo model.")
@click.option("--dit", type=click.Path(dir_okay=False, exists=True, path_type=Path), help="DiT .safetensors file.")
@click.option("--width", "-W", type=int, default=None,
              help="Image width (multiple of 16). Default 512, or the size a small trained model was made for "
                   "(64 for the demo model).")
@click.option("--height", "-H", type=int, default=None, help="Image height (multiple of 16). Default as --width.")
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path), help="Folder for the set.")
@click.option("--dtype", type=click.Choice(list(EXPORT_DTYPES)), default="fp32", show_default=True,
              help="Precision of the subgraphs (the host side always stays fp32).")
@click.option("--overwrite", is_flag=True, help="Replace what is already in --out.")
def export_onnx(model_dir: Path | None, dit: Path | None, width: int | None, height: int | None, out: Path,
                dtype: str, overwrite: bool) -> None:
    """Export the DiT's attention and MLP bodies (3 per block) as ONNX subgraphs for one image size."""
    dit_path = dit_file(model_dir, dit)
    width, height = dit_image_size(dit_path, width, height)
    manifest = export_subgraphs(dit_path, width, height, out, EXPORT_DTYPES[dtype], overwrite=overwrite)
    click.echo(f"wrote {width}x{height} {dtype} subgraphs and {manifest.name} to {out}")
