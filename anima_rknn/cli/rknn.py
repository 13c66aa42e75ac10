"""`anima-rknn convert-rknn`, `plan` and `verify-rknn`: the RK3588 NPU side of the project."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
import torch

from ..core.files import json_text
from ..engine.accuracy import (
    DEFAULT_MIN_COSINE,
    accuracy_table,
    converted_size,
    flagged,
    verify_dit_set,
)
from ..engine.backends.rknn import RUNTIMES
from ..engine.calibrate import (
    DEFAULT_CAPTURED_STEPS,
    DEFAULT_CFG,
    DEFAULT_STEPS,
    CalibrationRun,
    capture_calibration,
    captured_steps,
)
from ..engine.memory_plan import parse_size, plan_memory, plan_vae, predict_memory
from ..engine.vae_accuracy import DEFAULT_MIN_PSNR, verify_vae_encoder, verify_vae_set
from ..errors import AnimaError
from ..export.calibration import CALIBRATION_JSON, read_calibration
from ..export.manifest import (
    PRECISIONS,
    VAE_ENCODER_KIND,
    check_source,
    read_manifest,
    set_kind,
    vae_entry,
)
from ..export.onnx import token_count
from ..export.rknn import (
    ALGORITHMS,
    DEFAULT_ALGORITHM,
    DEFAULT_MIN_QUANT_COSINE,
    QUANTIZE_DTYPES,
    Quantization,
    check_quantize_options,
    convert_subgraphs,
)
from ..export.vae import check_image_fits
from ..generation.pipeline import AnimaPipeline, initial_noise
from ..model.config import MAX_BLOCKS, PRESETS
from ..model.io import load_dit
from ..model.model_set import ModelFiles, resolve
from .group import cli
from .options import FINITE, Respelled, apply_threads, model_options, threads_option

VERIFY_PROMPT = "1girl, long hair, smile, looking at viewer, flowers, blue sky"


# Calibration prompts when none are given: varied subjects and lengths; the last one is held out for the check.
CALIBRATION_PROMPTS = (
    "1girl, long hair, smile, looking at viewer, flowers, blue sky",
    "a red circle on a blue background",
    "landscape, mountain, river, forest, sunset, detailed",
    "portrait of a man in a black hat, city at night",
    "a green triangle at the top left on a white background",
)


@cli.command("convert-rknn")
@click.option("--subgraphs", required=True, type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="ONNX subgraph folder written by export-onnx.")
@click.option("--target", default="rk3588", show_default=True, help="NPU platform to compile for.")
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder for the .rknn files, their ONNX sources and manifest (run again to resume).")
@click.option("--overwrite", is_flag=True, help="Replace what is already in --out.")
@click.option("--quantize", default="fp16", show_default=True,
              help=f"Precision: {' or '.join(QUANTIZE_DTYPES)} (int8 weights and activations where the held-out "
                   "check holds, fp16 elsewhere).")
@click.option("--quantized-algorithm", default=DEFAULT_ALGORITHM, show_default=True,
              help=f"w8a8: the toolkit's calibration algorithm, one of {', '.join(ALGORITHMS)}.")
@click.option("--min-cosine", type=FINITE, default=DEFAULT_MIN_QUANT_COSINE, show_default=True,
              help="w8a8: a subgraph whose worst held-out cosine against fp32 is below this goes hybrid, then fp16.")
@click.option("--calibration", type=click.Path(file_okay=False, path_type=Path),
              help="w8a8: calibration folder; captured there from the model's runs when it holds none.")
@click.option("--calibration-prompt", "calibration_prompts", multiple=True,
              help="w8a8, capturing: a prompt to run (repeat; the last is held out). Default: five varied ones.")
@click.option("--calibration-seed", type=int, default=0, show_default=True,
              help="w8a8, capturing: the first run's seed (each next prompt takes the next).")
@click.option("--calibration-steps", type=int, default=DEFAULT_STEPS, show_default=True,
              help="w8a8, capturing: steps of each run (both CFG branches of --calibration-captured of them kept).")
@click.option("--calibration-cfg", type=FINITE, default=DEFAULT_CFG, show_default=True,
              help="w8a8, capturing: the runs' CFG scale.")
@click.option("--calibration-captured", type=int, default=DEFAULT_CAPTURED_STEPS, show_default=True,
              help="w8a8, capturing: steps of each run whose passes are kept, spread from first to last.")
@model_options
@threads_option
def convert_rknn(subgraphs: Path, target: str, out: Path, overwrite: bool, quantize: str, quantized_algorithm: str,
                 min_cosine: float, calibration: Path | None, calibration_prompts: tuple[str, ...],
                 calibration_seed: int, calibration_steps: int, calibration_cfg: float, calibration_captured: int,
                 model: str | None,
                 dit: str | None, text_encoder: str | None, vae: str | None, qwen_tokenizer: str | None,
                 t5_tokenizer: str | None, threads: int) -> None:
    """Compile every ONNX subgraph to fp16 .rknn, or w8a8 where it holds (needs rknn-toolkit2:
    scripts/setup-rknn-env.sh).

    With --quantize w8a8 each subgraph is calibrated on the inputs it received in real fp32 torch runs of the
    model (captured into --calibration, or read from there), then checked in the simulator on a held-out run:
    below --min-cosine its output projection, output and attention core go back to fp16 (hybrid), and if that is
    still below, the whole subgraph.
    """
    check_quantize_options(quantize, quantized_algorithm, min_cosine)
    quantization = None
    if quantize != "fp16":
        if calibration is None:
            raise AnimaError("--quantize w8a8 needs --calibration DIR (a calibration set, or where to capture one)")
        apply_threads(threads)
        source = read_manifest(subgraphs, kind=None)
        if set_kind(source) != "dit":
            raise AnimaError("only a DiT subgraph set can be quantized: convert a VAE set with --quantize fp16")
        if not (calibration / CALIBRATION_JSON).exists():
            files = resolve(model, dit=dit, text_encoder=text_encoder, vae=vae, qwen_tokenizer=qwen_tokenizer,
                            t5_tokenizer=t5_tokenizer)
            capture(source, subgraphs, files, calibration, list(calibration_prompts or CALIBRATION_PROMPTS),
                    calibration_seed, calibration_steps, calibration_cfg, calibration_captured, overwrite)
        quantization = Quantization(quantize, quantized_algorithm, min_cosine, read_calibration(calibration, source))
    manifest = read_manifest(convert_subgraphs(subgraphs, out, target=target, progress=True, overwrite=overwrite,
                                               quantization=quantization).parent, kind=None)
    click.echo(f"converted {len(manifest['subgraphs'])} subgraphs for {target} into {out} "
               f"(rknn-toolkit2 {manifest['rknn']['toolkit_version']})")
    if quantization is not None:
        counts = Counter(r["precision"] for r in manifest["rknn"]["subgraphs"])
        click.echo(", ".join(f"{counts[p]} {p}" for p in PRECISIONS if counts[p])
                   + f" (held-out cosine threshold {min_cosine})")


def capture(source: dict[str, Any], subgraphs: Path, files: ModelFiles, out: Path, prompts: list[str], seed: int,
            steps: int, cfg: float, captured: int, overwrite: bool) -> None:
    """Capture a calibration set for the ONNX set `source` from fp32 torch runs of the model in `files`."""
    check_source(source, files.dit, "DiT", f"subgraphs in {subgraphs} were")
    if len(prompts) < 2:
        raise AnimaError("calibration needs at least two --calibration-prompt: the last one is held out")
    captured_steps(steps, captured)  # refused now, before the text encoder and the DiT load
    pipeline = AnimaPipeline(files)
    runs = []
    for i, prompt in enumerate(prompts):
        conditioning = pipeline.encode(prompt, "")
        runs.append(CalibrationRun(prompt, seed + i, initial_noise(seed + i, source["width"], source["height"]),
                                   conditioning.positive, conditioning.negative))
    capture_calibration(load_dit(files.dit, torch.float32), source, out, runs, steps=steps, cfg=cfg,
                        captured=captured, overwrite=overwrite)


@cli.command("plan")
@click.option("--subgraphs", type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="Plan for this subgraph folder (uses the compiler's own sizes once converted).")
@click.option("--preset", type=click.Choice(list(PRESETS)), help="Or plan from a model preset's dimensions.")
@click.option("--width", "-W", type=int, default=512, show_default=True, help="With --preset: image width.")
@click.option("--height", "-H", type=int, default=512, show_default=True, help="With --preset: image height.")
@click.option("--blocks", type=click.IntRange(1, MAX_BLOCKS), default=None,
              help="With --preset: the DiT's blocks instead of the preset's (40: the community Anima-2.9B).")
@click.option("--rknn-budget", "--budget", "budget", cls=Respelled, old=("--budget",), default=None,
              help="Memory the run may use, e.g. 8GB or 6GiB (default: no limit).")
@click.option("--vae-subgraphs", type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="A converted VAE decoder set: add the decode stage, which runs after the DiT's contexts close.")
def plan(subgraphs: Path | None, preset: str | None, width: int, height: int, blocks: int | None,
         budget: str | None, vae_subgraphs: Path | None) -> None:
    """Predict peak memory and load/release traffic per pass of the rknn backend; refuse a budget that cannot work."""
    if (subgraphs is None) == (preset is None):
        raise AnimaError("pass exactly one of --subgraphs DIR or --preset NAME")
    if blocks is not None and preset is None:
        raise AnimaError("--blocks goes with --preset: a subgraph set has its own")
    budget_bytes = None if budget is None else parse_size(budget)
    if subgraphs is not None:
        manifest = read_manifest(subgraphs)
        width, height = manifest["width"], manifest["height"]
        memory = plan_memory(manifest, budget_bytes)
        if "quantization" in manifest.get("rknn", {}):  # the sizes above are the quantized set's own
            counts = Counter(r["precision"] for r in manifest["rknn"]["subgraphs"])
            click.echo("quantized set: " + ", ".join(f"{counts[p]} {p}" for p in PRECISIONS if counts[p]))
    else:
        config = PRESETS[preset]
        memory = predict_memory(config.hidden, blocks or config.blocks, token_count(width, height), config.mlp,
                                budget_bytes, config.context_dim)
    click.echo(memory.describe())
    if vae_subgraphs is not None:
        vae_set = read_manifest(vae_subgraphs, kind="vae")
        check_image_fits(vae_set, width, height)
        click.echo(plan_vae(vae_set, width, height, budget_bytes).describe(memory))


@cli.command("verify-rknn")
@model_options
@click.option("--subgraphs", required=True, type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="Folder converted by convert-rknn.")
@click.option("--prompt", "-p", default=VERIFY_PROMPT, show_default=True, help="Prompt whose context is fed.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the initial noise.")
@click.option("--rknn-runtime", "--runtime", "runtime", cls=Respelled, old=("--runtime",),
              type=click.Choice(RUNTIMES), default="auto", show_default=True,
              help="simulator (x86) or lite (board).")
@click.option("--min-cosine", type=FINITE, default=DEFAULT_MIN_COSINE, show_default=True,
              help="Flag subgraphs whose cosine similarity to fp32 torch is below this.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as one JSON object on stdout.")
@click.option("--image-size", type=int, default=None,
              help="VAE sets: side in pixels of the pictures decoded (default: one tile; larger ones blend tiles).")
@click.option("--min-psnr", type=FINITE, default=DEFAULT_MIN_PSNR, show_default=True,
              help="VAE sets: flag decoded pictures (and a set's encoder's latents) whose PSNR against fp32 torch "
                   "is below this (dB).")
@threads_option
def verify_rknn(model: str | None, dit: str | None, text_encoder: str | None, vae: str | None,
                qwen_tokenizer: str | None, t5_tokenizer: str | None, subgraphs: Path, prompt: str, seed: int,
                runtime: str, min_cosine: float, as_json: bool, image_size: int | None, min_psnr: float,
                threads: int) -> None:
    """Accuracy of every converted subgraph against fp32 torch, on the inputs of a real first denoising step.

    The inputs are recorded from the torch split engine's pass on the initial noise (sigma 1) with the prompt's
    real context. Exits with status 1 when any subgraph falls below --min-cosine. A VAE decoder set (export-vae)
    decodes the latents of varied pictures, tiled and blended as generate does, against the fp32 torch decoder,
    and exits with status 1 when a picture falls below --min-cosine or --min-psnr; a set with the encoder
    (export-vae --encoder) also encodes the pictures against the fp32 torch encoder, held to the same thresholds
    (the latent's PSNR taking its largest |value| as the peak).
    """
    apply_threads(threads)  # the fp32 torch reference's (the simulator sizes its own)
    if set_kind(read_manifest(subgraphs, kind=None)) == "vae":  # needs the VAE file alone
        vae_path = Path(vae) if vae is not None else resolve(model).vae
        verify_vae(subgraphs, vae_path, image_size, seed, runtime, min_cosine, min_psnr, as_json)
        return
    files = resolve(model, dit=dit, text_encoder=text_encoder, vae=vae, qwen_tokenizer=qwen_tokenizer,
                    t5_tokenizer=t5_tokenizer)
    width, height = converted_size(subgraphs, files.dit)
    context = AnimaPipeline(files).encode(prompt, "").positive
    sigma = 1.0  # the first denoising step, where the latent is the initial noise alone
    latent = torch.from_numpy(initial_noise(seed, width, height))
    results = verify_dit_set(subgraphs, files.dit, latent, sigma, context, runtime)

    below = flagged(results, min_cosine)
    if as_json:
        click.echo(json_text({"subgraphs": [asdict(r) for r in results], "min_cosine": min_cosine, "sigma": sigma,
                               "seed": seed, "prompt": prompt, "flagged": below}))
    else:
        click.echo(accuracy_table(results, min_cosine))
    if below:
        raise AnimaError(f"{len(below)} of {len(results)} subgraphs below cosine {min_cosine}: {', '.join(below)}")
    click.echo(f"all {len(results)} subgraphs at cosine >= {min_cosine}", err=as_json)


def verify_vae(set_dir: Path, vae_path: Path, image_size: int | None, seed: int, runtime: str, min_cosine: float,
               min_psnr: float, as_json: bool) -> None:
    results = verify_vae_set(set_dir, vae_path, side=image_size, seed=seed, runtime=runtime)
    encoded = (verify_vae_encoder(set_dir, vae_path, side=image_size, seed=seed, runtime=runtime)
               if vae_entry(read_manifest(set_dir, kind="vae"), VAE_ENCODER_KIND) is not None else None)
    below = lambda rows: [r.index for r in rows if not (r.cosine >= min_cosine and r.psnr >= min_psnr)]  # noqa: E731
    flagged, flagged_encoded = below(results), below(encoded or [])  # NaN flagged too
    if as_json:  # JSON has no NaN or infinity (PSNR of identical images): null stands for them
        def rows(found):
            return [{key: value if not isinstance(value, float) or math.isfinite(value) else None
                     for key, value in asdict(r).items()} for r in found]

        report = {"pictures": rows(results), "min_cosine": min_cosine, "min_psnr": min_psnr, "seed": seed,
                  "flagged": flagged}
        if encoded is not None:
            report.update(encoded=rows(encoded), flagged_encoded=flagged_encoded)
        click.echo(json_text(report))
    else:
        tables = [("decoded pictures", results, flagged)]
        if encoded is not None:
            tables.append(("encoded pictures (latents)", encoded, flagged_encoded))
        for title, found, marked in tables:
            if encoded is not None:
                click.echo(title)
            click.echo(f"{'#':>3}{'cosine':>12}{'PSNR dB':>10}{'max abs err':>13}")
            for r in found:
                flag = "  BELOW" if r.index in marked else ""
                click.echo(f"{r.index:>3}{r.cosine:>12.7f}{r.psnr:>10.2f}{r.max_abs_error:>13.2e}{flag}")
    failures = [f"{len(flagged)} of {len(results)} decoded pictures"] if flagged else []
    if flagged_encoded:
        failures.append(f"{len(flagged_encoded)} of {len(encoded)} encoded pictures")
    if failures:
        raise AnimaError(f"{' and '.join(failures)} below cosine {min_cosine} or PSNR {min_psnr} dB")
    done = f"all {len(results)} decoded" + ("" if encoded is None else f" and {len(encoded)} encoded")
    click.echo(f"{done} pictures at cosine >= {min_cosine} and PSNR >= {min_psnr} dB", err=as_json)
