"""Options shared by the commands that take a model set or generation settings."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import math

import click

from ..engine.backends.rknn import CORE_MASKS, RUNTIMES, RknnOptions
from ..engine.memory_plan import parse_size
from ..model.io import trained_image_size
from ..model_set import ModelFiles
from ..pipeline import DEFAULT_NEGATIVE, DTYPES

F = Callable[..., object]


class FiniteFloat(click.ParamType):
    """A float that is a number: click's FLOAT (and FloatRange) let "nan" and "inf" through."""

    name = "number"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            number = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


FINITE = FiniteFloat()


def model_options(f: F) -> F:
    for option in reversed([
        click.option("--model", "model", default=None,
                     help="Model directory in the Hugging Face layout (split_files/..., tokenizers/...), "
                          "or circlestone-labs/Anima to download it. Default: the shipped demo model."),
        click.option("--dit", type=click.Path(dir_okay=False), help="DiT + LLM adapter .safetensors."),
        click.option("--text-encoder", type=click.Path(dir_okay=False), help="Qwen3 text encoder .safetensors."),
        click.option("--vae", type=click.Path(dir_okay=False), help="Wan / Qwen-Image VAE .safetensors."),
        click.option("--qwen-tokenizer", type=click.Path(file_okay=False), help="Folder with Qwen3 tokenizer.json."),
        click.option("--t5-tokenizer", type=click.Path(file_okay=False), help="Folder with T5 tokenizer.json."),
    ]):
        f = option(f)
    return f


def sampling_options(f: F) -> F:
    for option in reversed([
        click.option("--prompt", "-p", default=None, help="Prompt (required); (word:1.2) weights as in ComfyUI."),
        click.option("--negative", "-n", default=DEFAULT_NEGATIVE, show_default=True, help="Negative prompt."),
        click.option("--width", "-W", type=int, default=None,
                     help="Default 512, or the size a small trained model was made for (64 for the demo model)."),
        click.option("--height", "-H", type=int, default=None, help="Default as --width."),
        click.option("--steps", type=int, default=20, show_default=True),
        click.option("--cfg", type=FINITE, default=4.0, show_default=True, help="Classifier-free guidance scale."),
        click.option("--seed", type=int, default=20260812, show_default=True,
                     help="0 to 2^64-1; -1 draws a random seed (the one used is reported)."),
        click.option("--shift", type=FINITE, default=3.0, show_default=True, help="Flow-matching sigma shift."),
        click.option("--dtype", type=click.Choice(list(DTYPES)), default="fp32", show_default=True,
                     help="Attention/MLP body precision (residual stream, norms and AdaLN stay fp32)."),
        click.option("--backend", default="torch", show_default=True, help="torch | onnx | rknn."),
        click.option("--subgraphs", type=click.Path(file_okay=False), default=None,
                     help="Exported subgraph folder (onnx / rknn backends)."),
    ]):
        f = option(f)
    return f


def rknn_options(f: F) -> F:
    """--rknn-runtime / --rknn-budget / --rknn-core-mask; the command turns them into rknn_settings(...)."""
    for option in reversed([
        click.option("--rknn-runtime", type=click.Choice(RUNTIMES), default="auto", show_default=True,
                     help="rknn backend: lite = RKNNLite on the board, simulator = rknn-toolkit2 on x86."),
        click.option("--rknn-budget", default=None,
                     help="rknn backend: memory budget (e.g. 6GB); bounds the resident contexts "
                          "(see `anima-rknn plan`). Default: keep every context open."),
        click.option("--rknn-core-mask", type=click.Choice(list(CORE_MASKS)), default="auto", show_default=True,
                     help="rknn backend on the board: NPU cores to run on."),
    ]):
        f = option(f)
    return f


def rknn_settings(rknn_runtime: str, rknn_budget: str | None, rknn_core_mask: str) -> RknnOptions:
    budget = None if rknn_budget is None else parse_size(rknn_budget)
    return RknnOptions(runtime=rknn_runtime, budget_bytes=budget, core_mask=rknn_core_mask)


def vae_options(f: F) -> F:
    """--vae-tiling/--no-vae-tiling / --vae-tile-size / --vae-tile-overlap; GenerationParams takes vae_tiling(...)."""
    for option in reversed([
        click.option("--vae-tiling/--no-vae-tiling", "tiling", default=None,
                     help="Decode in overlapping tiles (less memory), or never. Default: tile only when decoding "
                          "in one piece would not fit the free memory."),
        click.option("--vae-tile-size", type=int, default=512, show_default=True, help="Tile size in pixels."),
        click.option("--vae-tile-overlap", type=int, default=64, show_default=True, help="Tile overlap in pixels."),
    ]):
        f = option(f)
    return f


def vae_tiling(flag: bool | None) -> str:
    return {None: "auto", True: "on", False: "off"}[flag]


def image_size(files: ModelFiles, width: int | None, height: int | None) -> tuple[int, int]:
    return dit_image_size(files.dit, width, height)


def dit_image_size(dit: Path, width: int | None, height: int | None) -> tuple[int, int]:
    """--width/--height, by default 512 or the size a small trained model was made for (64 for the demo)."""
    native = trained_image_size(dit) or 512
    return (native if width is None else width), (native if height is None else height)
