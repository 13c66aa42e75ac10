"""Options shared by the commands that take a model set or generation settings."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import click

from ..core.cpu_speed import AUTO, slow_dtype_warning
from ..engine.backends.rknn import CORE_MASKS, RUNTIMES, RknnOptions
from ..engine.memory_plan import parse_size
from ..engine.vae_tiles import VAE_BACKENDS
from ..generation.pipeline import DEFAULT_NEGATIVE, DTYPES, GenerationParams
from ..model.io import trained_image_size
from ..model.lora import LoraRef, parse_lora_option, prompt_loras
from ..model.model_set import ModelFiles
from ..sampling.auto_cache import AUTO_OPTIONS
from ..sampling.caches import CACHE_NAMES, OPTION_TYPES, parse_cache_options

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
        dtype_option(),
        click.option("--backend", default="torch", show_default=True, help="torch | onnx | rknn."),
        click.option("--subgraphs", type=click.Path(file_okay=False), default=None,
                     help="Exported subgraph folder (onnx / rknn backends)."),
    ]):
        f = option(f)
    return f


def _warn_if_slow(ctx: click.Context, param: click.Parameter, value: str) -> str:
    warning = slow_dtype_warning(value)
    if warning:
        click.echo(warning, err=True)
    return value


def dtype_option() -> Callable[[F], F]:
    """--dtype auto|fp32|bf16|fp16; an explicit one this CPU runs much slower than fp32 gets a warning line."""
    return click.option("--dtype", type=click.Choice([AUTO, *DTYPES]), default=AUTO, show_default=True,
                        callback=_warn_if_slow,
                        help="Attention/MLP body precision (residual stream, norms and AdaLN stay fp32); auto: "
                             "the fastest on this CPU, measured once (bf16 only with native bf16).")


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


def vae_backend_options(f: F) -> F:
    """--vae-backend / --vae-subgraphs: GenerationParams' vae_backend and vae_subgraphs."""
    f = click.option("--vae-subgraphs", type=click.Path(file_okay=False, path_type=Path), default=None,
                     help="VAE decoder set written by export-vae (onnx), converted by convert-rknn (rknn).")(f)
    return click.option("--vae-backend", type=click.Choice(VAE_BACKENDS), default=GenerationParams.vae_backend,
                        show_default=True,
                        help="Where the VAE decoder runs: onnx / rknn run the fixed-shape tiles of --vae-subgraphs "
                             "(its tile size must be --vae-tile-size), blended on the host; auto: torch or onnx, "
                             "whichever this CPU decodes the image faster with (measured once; onnx exports its "
                             "set once into the cache folder).")(f)


def lora_file_options(f: F) -> F:
    """--lora FILE[:SCALE] (repeatable) / --lora-ignore-unmatched."""
    f = click.option("--lora-ignore-unmatched", is_flag=True,
                     help="Skip LoRA keys that name no layer of this model instead of refusing the file.")(f)
    return click.option("--lora", "lora", multiple=True, metavar="FILE[:SCALE]",
                        help="A LoRA .safetensors (ComfyUI, kohya or diffusers layout) and its scale (default 1); "
                             "repeat to stack several.")(f)


def lora_dir_option(f: F) -> F:
    return click.option("--lora-dir", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
                        help="Folder of LoRAs that <lora:NAME:SCALE> tags in the prompt pick by name.")(f)


def lora_options(f: F) -> F:
    """--lora / --lora-ignore-unmatched / --lora-dir; the command passes them to lora_settings(...)."""
    return lora_file_options(lora_dir_option(f))


def ray_options(f: F) -> F:
    """--ray / --ray-resources / --ray-workers: run the jobs on a Ray cluster (batch.ray_runner)."""
    for option in reversed([
        click.option("--ray", "ray_address", default=None, metavar="auto|ADDRESS|local",
                     help="Spread the jobs over a Ray cluster: auto = the one `ray start` runs here, ADDRESS = its "
                          "head (host:6379), local = a private cluster on this machine for this run."),
        click.option("--ray-resources", default=None, metavar="JSON",
                     help='What each Ray worker asks of its node, e.g. \'{"npu": 1}\' for one worker per board '
                          'that advertises an NPU. Default: {"CPU": 1}.'),
        click.option("--ray-workers", type=click.IntRange(min=1), default=None,
                     help="At most this many Ray workers. Default: as many as the cluster's resources hold."),
    ]):
        f = option(f)
    return f


def lora_settings(prompt: str | None, lora: tuple[str, ...], lora_dir: Path | None) -> tuple[str | None, list[LoraRef]]:
    """The prompt without its <lora:...> tags, and the LoRAs of --lora followed by those the tags name."""
    refs = [parse_lora_option(text) for text in lora]
    if prompt is None:
        return None, refs
    text, tagged = prompt_loras(prompt, lora_dir)
    return text, refs + tagged


def vae_tiling(flag: bool | None) -> str:
    return {None: "auto", True: "on", False: "off"}[flag]


# The numeric cache options also have flags of their own, as stable-diffusion.cpp's --spectrum-* do; auto's tol,
# budget and guard only through --cache-option (they are no Spectrum settings; warmup is both).
SPECTRUM_FLAGS = {key: FINITE if kind is float else kind for key, kind in OPTION_TYPES.items()
                  if kind in (int, float) and (key not in AUTO_OPTIONS or key == "warmup")}


def cache_options(text: str | None, spectrum: dict[str, float | None]) -> dict[str, float | str]:
    options = parse_cache_options(text) if text else {}
    options.update({k: v for k, v in spectrum.items() if v is not None})
    return options


def spectrum_options(f: F) -> F:
    for key, kind in reversed(SPECTRUM_FLAGS.items()):
        f = click.option(f"--spectrum-{key}", f"spectrum_{key}", type=kind, default=None,
                         help=f"Spectrum {key} (overrides --cache-option).")(f)
    return f


def step_cache_options(f: F) -> F:
    """--cache, --cache-option and the --spectrum-* flags; the command takes cache_options(...) of them."""
    f = spectrum_options(f)
    f = click.option("--cache-option", "cache_option", default=None,
                     help='stable-diffusion.cpp style, e.g. "w=0.4,m=3,lam=1.0,window=2,flex=0.5,warmup=4,stop=0.9".')(f)
    return click.option("--cache", type=click.Choice(CACHE_NAMES), default="none", show_default=True,
                        help="Step cache: none = every step computed (the exact baseline).")(f)


def generation_options(f: F) -> F:
    """Every option that makes the picture, as generate takes them: generation_params(files, ...) reads them."""
    for decorate in reversed([model_options, sampling_options, rknn_options, step_cache_options, vae_options,
                              vae_backend_options, lora_options]):
        f = decorate(f)
    return f


def generation_params(files: ModelFiles, *, prompt: str | None, negative: str, width: int | None,
                      height: int | None, steps: int, cfg: float, seed: int, shift: float, dtype: str, backend: str,
                      subgraphs: str | None, rknn_runtime: str, rknn_budget: str | None, rknn_core_mask: str,
                      cache: str, cache_option: str | None, tiling: bool | None, vae_tile_size: int,
                      vae_tile_overlap: int, vae_backend: str, vae_subgraphs: Path | None, lora: tuple[str, ...],
                      lora_dir: Path | None, lora_ignore_unmatched: bool, **spectrum: float | None,
                      ) -> GenerationParams:
    """The settings of generation_options (the prompt's <lora:...> tags taken out and applied); not validated
    yet (a resumed run fills in its state's settings first)."""
    width, height = image_size(files, width, height)
    prompt, loras = lora_settings(prompt, lora, lora_dir)
    return GenerationParams(
        prompt=prompt, negative=negative, width=width, height=height, steps=steps, cfg=cfg, seed=seed,
        shift=shift, dtype=dtype, cache=cache,
        cache_options=cache_options(cache_option, {k.removeprefix("spectrum_"): v for k, v in spectrum.items()}),
        backend=backend, subgraphs=Path(subgraphs) if subgraphs else None,
        rknn=rknn_settings(rknn_runtime, rknn_budget, rknn_core_mask),
        vae_tiling=vae_tiling(tiling), vae_tile=vae_tile_size, vae_overlap=vae_tile_overlap,
        vae_backend=vae_backend, vae_subgraphs=vae_subgraphs, loras=loras, lora_ignore_unmatched=lora_ignore_unmatched,
    )


def image_size(files: ModelFiles, width: int | None, height: int | None) -> tuple[int, int]:
    return dit_image_size(files.dit, width, height)


def dit_image_size(dit: Path, width: int | None, height: int | None) -> tuple[int, int]:
    """--width/--height, by default 512 or the size a small trained model was made for (64 for the demo)."""
    native = trained_image_size(dit) or 512
    return (native if width is None else width), (native if height is None else height)
