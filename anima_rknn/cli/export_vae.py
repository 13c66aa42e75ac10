"""`anima-rknn export-vae`: write the VAE decoder (and, with --encoder, the encoder) for one fixed tile size as an
ONNX set."""

from __future__ import annotations

from pathlib import Path

import click

from ..export.vae import DEFAULT_OVERLAP, DEFAULT_TILE, export_vae_decoder
from ..model.io import trained_image_size
from ..model.model_set import part_file
from .group import cli
from .options import Respelled, apply_threads, threads_option


@cli.command("export-vae")
@click.option("--model", "model_dir", type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="Model directory in the Hugging Face layout (VAE: split_files/vae/*.safetensors). "
                   "Default: the shipped demo model.")
@click.option("--vae", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="VAE .safetensors or .gguf file.")
@click.option("--vae-tile-size", "--tile", "tile", cls=Respelled, old=("--tile",), type=int, default=None,
              help="Tile size in pixels (a multiple of the VAE's scale, 8): generate decodes with this tile, "
                   "so images must be at least this large. Default: the size the model was trained at (64 for "
                   f"the demo model), at most {DEFAULT_TILE}; {DEFAULT_TILE} with --vae FILE.")
@click.option("--vae-tile-overlap", "--overlap", "overlap", cls=Respelled, old=("--overlap",), type=int,
              default=None,
              help="Tile overlap in pixels that verify-rknn and generate blend with (generate takes it from the "
                   f"set). Default: a quarter tile, at most {DEFAULT_OVERLAP}.")
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder for the set.")
@click.option("--encoder", is_flag=True, help="also export the VAE encoder (for image-to-image on onnx / rknn)")
@click.option("--overwrite", is_flag=True, help="Replace what is already in --out.")
@threads_option
def export_vae(model_dir: Path | None, vae: Path | None, tile: int | None, overlap: int | None, out: Path,
               encoder: bool, overwrite: bool, threads: int) -> None:
    """Export the VAE decoder (and encoder) for one tile size (latent de-normalisation included) as an ONNX set."""
    apply_threads(threads)
    if tile is None:  # a set's tiles must fit the images: a 64-px model's images are 64 px
        trained = trained_image_size(part_file(model_dir, None, "dit")) if vae is None else None
        tile = min(trained or DEFAULT_TILE, DEFAULT_TILE)
    overlap = min(DEFAULT_OVERLAP, tile // 4) if overlap is None else overlap
    manifest = export_vae_decoder(part_file(model_dir, vae, "vae"), out, tile, overlap, overwrite=overwrite,
                                  encoder=encoder)
    what = "decoder and encoder" if encoder else "decoder"
    click.echo(f"wrote the VAE {what} for {tile}x{tile} tiles and {manifest.name} to {out}")
