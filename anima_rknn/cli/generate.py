from __future__ import annotations

import sys
from pathlib import Path

import click
from tqdm import tqdm

from ..errors import AnimaError
from ..files import check_output_file, json_text, save_png
from ..model_set import resolve
from ..pipeline import AnimaPipeline, GenerationParams, GenerationResult, png_parameters
from ..sampling.caches import CACHE_NAMES, OPTION_TYPES, parse_cache_options
from . import cli
from .options import FINITE, image_size, model_options, rknn_options, rknn_settings, sampling_options, vae_options, vae_tiling

# The numeric cache options also have flags of their own, as stable-diffusion.cpp's --spectrum-* do.
SPECTRUM_FLAGS = {key: FINITE if kind is float else kind for key, kind in OPTION_TYPES.items() if kind in (int, float)}


def cache_options(text: str | None, spectrum: dict[str, float | None]) -> dict[str, float | str]:
    options = parse_cache_options(text) if text else {}
    options.update({k: v for k, v in spectrum.items() if v is not None})
    return options


def summary(result: GenerationResult, out: Path | None) -> dict:
    sample = result.denoised.sample
    return {
        "image": str(out) if out is not None else None,
        "width": result.params.width, "height": result.params.height, "steps": result.params.steps,
        "cfg": result.params.cfg, "seed": result.params.seed, "backend": result.params.backend,
        "dtype": result.params.dtype, "cache": result.params.cache,
        "cache_options": result.params.cache_options,
        "timings": {k: round(v, 4) for k, v in result.timings().items()},
        "transformer_passes": result.denoised.transformer_passes,
        "subgraph_runs": result.denoised.subgraph_runs,
        "computed_steps": sample.computed_steps, "skipped_steps": sample.skipped_steps,
        "recomputed_steps": sample.recomputed_steps,
        "finite": result.finite,
    }


def spectrum_options(f):
    for key, kind in reversed(SPECTRUM_FLAGS.items()):
        f = click.option(f"--spectrum-{key}", f"spectrum_{key}", type=kind, default=None,
                         help=f"Spectrum {key} (overrides --cache-option).")(f)
    return f


@cli.command("generate")
@model_options
@sampling_options
@rknn_options
@click.option("--cache", type=click.Choice(CACHE_NAMES), default="none", show_default=True,
              help="Step cache: none = every step computed (the exact baseline).")
@click.option("--cache-option", "cache_option", default=None,
              help='stable-diffusion.cpp style, e.g. "w=0.4,m=3,lam=1.0,window=2,flex=0.5,warmup=4,stop=0.9".')
@spectrum_options
@vae_options
@click.option("--out", "-o", default="out.png", show_default=True, type=click.Path(dir_okay=False))
@click.option("--overwrite", is_flag=True, help="Replace --out if it exists.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the results on stdout.")
def generate(model, dit, text_encoder, vae, qwen_tokenizer, t5_tokenizer, prompt, negative, width, height, steps,
             cfg, seed, shift, dtype, backend, subgraphs, rknn_runtime, rknn_budget, rknn_core_mask, cache,
             cache_option, tiling, vae_tile_size, vae_tile_overlap, out, overwrite, as_json, **spectrum) -> None:
    """Generate one image."""
    out_path = Path(out)
    files = resolve(model, dit=dit, text_encoder=text_encoder, vae=vae, qwen_tokenizer=qwen_tokenizer,
                    t5_tokenizer=t5_tokenizer)
    width, height = image_size(files, width, height)
    params = GenerationParams(
        prompt=prompt, negative=negative, width=width, height=height, steps=steps, cfg=cfg, seed=seed,
        shift=shift, dtype=dtype, cache=cache,
        cache_options=cache_options(cache_option, {k.removeprefix("spectrum_"): v for k, v in spectrum.items()}),
        backend=backend, subgraphs=Path(subgraphs) if subgraphs else None,
        rknn=rknn_settings(rknn_runtime, rknn_budget, rknn_core_mask),
        vae_tiling=vae_tiling(tiling), vae_tile=vae_tile_size, vae_overlap=vae_tile_overlap,
    )
    params.validate()
    check_output_file(out_path, overwrite=overwrite, suffixes=(".png",))  # before minutes of work
    pipeline = AnimaPipeline(files)

    bars: list[tqdm] = []  # opened at the first step, so that an error before it prints no empty bar

    def on_step(step: int, total: int, skipped: bool) -> None:
        if not bars:
            bars.append(tqdm(total=total, desc="denoise", unit="step", file=sys.stderr, dynamic_ncols=True))
        bars[0].set_postfix_str("forecast" if skipped else "model")
        bars[0].update(1)

    try:
        result = pipeline.generate(params, on_step=on_step)
    finally:
        for bar in bars:
            bar.close()

    if result.finite:
        save_png(result.image, out_path, overwrite=overwrite,
                 parameters=png_parameters(result.params, files.dit.name, result))
    report = summary(result, out_path if result.finite else None)
    if as_json:
        click.echo(json_text(report))
    echo = (lambda s: click.echo(s, err=True)) if as_json else click.echo
    t = report["timings"]
    echo(f"{'wrote ' + str(out_path) if result.finite else 'NO IMAGE WRITTEN'}: {width}x{height}, {steps} steps, "
         f"cache {cache}: computed {len(report['computed_steps'])}/{steps} steps, "
         f"{report['transformer_passes']} transformer passes, {report['subgraph_runs']} subgraph runs; "
         f"encode {t['encode_s']:.2f}s, denoise {t['denoise_s']:.2f}s, decode {t['decode_s']:.2f}s, "
         f"total {t['total_s']:.2f}s (excl. encode)")
    if report["recomputed_steps"]:
        echo(f"numerical guard: non-finite forecast, recomputed steps {report['recomputed_steps']}")
    if not result.finite:
        raise AnimaError("the final latent is not finite (NaN/Inf); no image was written")
