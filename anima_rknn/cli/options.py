"""The command-line face of the settings table (generation/params.py) and the options commands share.

Every generation setting's flag, type, default and help come from GenerationParams' table: `setting_options`
turns it into click options, `params_from_cli` turns their values back into GenerationParams. The structured
settings have their usual spellings: --rknn-runtime/--rknn-budget/--rknn-core-mask, --cache-option plus one
--spectrum-KEY flag per numeric cache option (as stable-diffusion.cpp's), --lora FILE[:SCALE] repeated, an image
(--init-img, --mask) as a file path, read and checked here (the CLI is local and trusted; a server never opens a
path), --outpaint as LEFT,TOP,RIGHT,BOTTOM or one number for every side.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from ..checks import check_int
from ..core.cpu_speed import slow_dtype_warning
from ..core.threads import AUTO_THREADS, MAX_THREADS, resolve_threads, use_threads
from ..engine.backends.rknn import CORE_MASKS, RUNTIMES, RknnOptions
from ..engine.memory_plan import parse_size
from ..errors import AnimaError
from ..generation.images import ImageInput
from ..generation.params import (
    GenerationParams,
    build,
    cli_flags,
    default,
    option,
    options,
)
from ..model.io import trained_image_size
from ..model.lora import parse_lora_option
from ..model.model_set import ModelFiles, resolve
from ..model.quantize import weight_type_given_as_dtype
from ..sampling.auto_cache import AUTO_OPTIONS
from ..sampling.caches import OPTION_TYPES, parse_cache_options

F = Callable[..., object]


class FiniteFloat(click.ParamType):
    """A float that is a number: click's FLOAT (and FloatRange) let "nan" and "inf" through."""

    name = "number"

    def __init__(self, low: float = -math.inf, high: float = math.inf) -> None:
        self.low, self.high = low, high

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            number = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        if not self.low <= number <= self.high:
            self.fail(f"{number:g} is not in the range {self.low:g} to {self.high:g}", param, ctx)
        return number


FINITE = FiniteFloat()
# The numeric cache options also have flags of their own, as stable-diffusion.cpp's --spectrum-* do; auto's tol,
# budget and guard only through --cache-option (they are no Spectrum settings; warmup is both).
SPECTRUM_FLAGS = {key: FINITE if kind is float else kind for key, kind in OPTION_TYPES.items()
                  if kind in (int, float) and (key not in AUTO_OPTIONS or key == "warmup")}
TILING = {None: None, True: "on", False: "off"}  # --vae-tiling / --no-vae-tiling / neither (the default, auto)


def model_options(f: F) -> F:
    for decorate in reversed([
        click.option("--model", "-m", "model", default=None,
                     help="Model directory in the Hugging Face layout (split_files/..., tokenizers/...), "
                          "or circlestone-labs/Anima to download it; a file: the diffusion model, as "
                          "stable-diffusion.cpp's -m. Default: the shipped demo model."),
        click.option("--dit", "--diffusion-model", "dit", type=click.Path(dir_okay=False),
                     help="DiT + LLM adapter .safetensors, or .gguf (its quantized layers stay quantized)."),
        click.option("--text-encoder", "--llm", "text_encoder", type=click.Path(dir_okay=False),
                     help="Qwen3 text encoder .safetensors or .gguf."),
        click.option("--vae", type=click.Path(dir_okay=False), help="Wan / Qwen-Image VAE .safetensors or .gguf."),
        click.option("--qwen-tokenizer", type=click.Path(file_okay=False),
                     help="Folder with Qwen3 tokenizer.json. Default: the model's, else the shipped one."),
        click.option("--t5-tokenizer", type=click.Path(file_okay=False),
                     help="Folder with T5 tokenizer.json. Default: the model's, else the shipped one."),
    ]):
        f = decorate(f)
    return f


class Respelled(click.Option):
    """An option whose old spellings (`old`) keep working, unlisted in --help, since one concept has one name
    across the commands now (export-vae --tile is --vae-tile-size, as generate's)."""

    def __init__(self, *args: Any, old: tuple[str, ...] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.old = old

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        opts = self.opts
        self.opts = [opt for opt in opts if opt not in self.old]
        try:
            return super().get_help_record(ctx)
        finally:
            self.opts = opts


def resolve_model(model: str | None, **explicit: str | None) -> ModelFiles:
    """The model files of --model and the file flags; --model FILE (stable-diffusion.cpp's -m) is the diffusion
    model, the other files given beside it."""
    if model is not None and Path(model).is_file():
        if explicit.get("dit") is not None:
            raise AnimaError("-m FILE is the diffusion model: pass it or --diffusion-model (--dit), not both")
        model, explicit = None, explicit | {"dit": model}
    return resolve(model, **explicit)


class DtypeChoice(click.Choice):
    """A --dtype's choices; a GGML weight type given instead is explained in one line (exit 1): quantized
    weights come from a .gguf file. `gguf` says what becomes of them under this --dtype."""

    def __init__(self, choices: Sequence[str], gguf: str = "and stay quantized whatever --dtype is") -> None:
        super().__init__(choices)
        self.gguf = gguf

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        explained = weight_type_given_as_dtype("--dtype", value, list(map(str, self.choices)), self.gguf)
        if explained:
            raise AnimaError(explained)
        return super().convert(value, param, ctx)


def _warn_if_slow(ctx: click.Context, param: click.Parameter, value: str) -> str:
    warning = slow_dtype_warning(value)
    if warning:
        click.echo(warning, err=True)
    return value


def _click_options(name: str, front: str | None = None) -> list[Callable[[F], F]]:
    """The click options of one setting, from its entry in the table (with `front`'s own help where it has one)."""
    opt, flags = option(name), cli_flags(name)
    if front is not None and getattr(opt, f"{front}_help") is not None:
        opt = dataclasses.replace(opt, help=getattr(opt, f"{front}_help"))
    value = default(name, "cli")
    if opt.kind == "rknn":
        return [
            click.option("--rknn-runtime", type=click.Choice(RUNTIMES), default=RknnOptions.runtime,
                         show_default=True,
                         help="rknn backend: lite = RKNNLite on the board, simulator = rknn-toolkit2 on x86."),
            click.option("--rknn-budget", default=None,
                         help="rknn backend: memory budget (e.g. 6GB); bounds the resident contexts "
                              "(see `anima-rknn plan`). Default: keep every context open."),
            click.option("--rknn-core-mask", type=click.Choice(list(CORE_MASKS)), default=RknnOptions.core_mask,
                         show_default=True, help="rknn backend on the board: NPU cores to run on."),
        ]
    if opt.kind == "cache_options":
        spectrum = [click.option(f"--spectrum-{key}", f"spectrum_{key}", type=kind, default=None,
                                 help=f"Spectrum {key} (overrides --cache-option).") for key, kind in
                    SPECTRUM_FLAGS.items()]
        return [click.option(*flags, "cache_option", default=None, help=opt.help), *spectrum]
    if opt.kind == "loras":
        return [click.option(*flags, "lora", multiple=True, metavar="FILE[:SCALE]",
                             help=f"{opt.help} Repeat to stack several; SCALE defaults to 1.")]
    if name == "vae_tiling":  # a flag pair: on, off, or neither (auto)
        return [click.option(*flags, name, default=None, help=opt.help)]
    if opt.kind == "bool":
        return [click.option(*flags, name, is_flag=True, help=opt.help)]
    if opt.kind == "image":  # read and checked by setting_values, so that a bad file is one line and exit 1
        return [click.option(*flags, name, type=click.Path(readable=False), default=None, metavar="FILE",
                             help=opt.help)]
    if opt.kind == "outpaint":
        return [click.option(*flags, name, default=None, metavar="L,T,R,B",
                             help=f"{opt.help} One number grows every side by it.")]
    kinds = {"int": int, "number": FINITE, "text": str, "path": click.Path(file_okay=False, path_type=Path)}
    kind = ((DtypeChoice if name == "dtype" else click.Choice)(opt.choices) if opt.kind == "choice"
            else kinds[opt.kind])
    if opt.parse is not None:  # other spellings are taken too (build() makes them ours, or refuses in one line)
        # None when not given, so that a sampler named with its schedule ("DPM++ 2M Karras") may set the schedule.
        return [click.option(*flags, name, default=None, metavar=f"[{'|'.join(opt.choices)}]",
                             help=f"{opt.help}  [default: {value}]")]
    if name in ("width", "height", "prompt"):  # the model's size; prompt: required where a command takes it
        return [click.option(*flags, name, type=kind, default=None, help=opt.help)]
    return [click.option(*flags, name, type=kind, default=value, show_default=value is not None, help=opt.help,
                         callback=_warn_if_slow if name == "dtype" else None)]


def setting_options(*names: str, skip: tuple[str, ...] = (), front: str | None = None) -> Callable[[F], F]:
    """Click options for the named settings (all of them when none are named, less `skip`), in table order;
    `front`: the command whose own help a setting may have (Option.batch_help)."""
    chosen = [name for name, _ in options() if (not names or name in names) and name not in skip]

    def decorate(f: F) -> F:
        for name in reversed(chosen):
            for add in reversed(_click_options(name, front)):
                f = add(f)
        return f

    return decorate


def threads_option(f: F) -> F:
    """--threads (the table's) for a command that runs a model outside a generation: the export and verify tools;
    the command calls apply_threads with its value before any model runs."""
    return setting_options("threads")(f)


def apply_threads(threads: int) -> int:
    """Torch's and ONNX Runtime's threads for the rest of this command (0: auto); returns the number."""
    check_int("threads", threads, AUTO_THREADS, MAX_THREADS)
    count = resolve_threads(threads)
    use_threads(count)
    return count


def lora_dir_option(f: F) -> F:
    return click.option("--lora-dir", "--lora-model-dir", "lora_dir",
                        type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
                        help="Folder of LoRAs that <lora:NAME:SCALE> tags in the prompt pick by name.")(f)


def generation_options(f: F) -> F:
    """The model options, every setting, and --lora-dir: what generate takes (params_from_cli reads them)."""
    return model_options(setting_options()(lora_dir_option(f)))


def ray_options(f: F) -> F:
    """--ray / --ray-resources / --ray-workers: run the jobs on a Ray cluster (batch.ray_runner)."""
    for decorate in reversed([
        click.option("--ray", "ray_address", default=None, metavar="auto|ADDRESS|local",
                     help="Spread the jobs over a Ray cluster: auto = the one `ray start` runs here, ADDRESS = its "
                          "head (host:6379), local = a private cluster on this machine for this run."),
        click.option("--ray-resources", default=None, metavar="JSON",
                     help='What each Ray worker asks of its node, e.g. \'{"npu": 1}\' for one worker per board '
                          'that advertises an NPU. Default: {"CPU": N} for jobs on --threads N.'),
        click.option("--ray-workers", type=click.IntRange(min=1), default=None,
                     help="At most this many Ray workers. Default: as many as the cluster's resources hold."),
    ]):
        f = decorate(f)
    return f


def cli_names(name: str) -> set[str]:
    """The click parameter names that set one setting (resume tells a setting the command line gave by these)."""
    return {"rknn": {"rknn_runtime", "rknn_budget", "rknn_core_mask"}, "loras": {"lora"},
            "cache_options": {"cache_option", *(f"spectrum_{key}" for key in SPECTRUM_FLAGS)}}.get(name, {name})


def setting_values(values: dict[str, Any]) -> dict[str, Any]:
    """Click's values of setting_options as setting values by setting name (None: not given); the values of other
    options are left out."""
    settings: dict[str, Any] = {}
    for name, opt in options():
        names = cli_names(name)
        if not names & values.keys():
            continue
        if opt.kind == "rknn":
            budget = values.get("rknn_budget")
            settings[name] = RknnOptions(runtime=values["rknn_runtime"], core_mask=values["rknn_core_mask"],
                                         budget_bytes=None if budget is None else parse_size(budget))
        elif opt.kind == "cache_options":
            text = values.get("cache_option")
            parsed = parse_cache_options(text) if text else {}
            parsed.update({key: values[f"spectrum_{key}"] for key in SPECTRUM_FLAGS
                           if values.get(f"spectrum_{key}") is not None})
            settings[name] = parsed
        elif opt.kind == "loras":
            settings[name] = [parse_lora_option(text) for text in values["lora"]]
        elif name == "vae_tiling":
            settings[name] = TILING[values[name]]
        elif opt.kind == "image":
            # Read and checked here (the decoding in prepare()); every message names the file: "image PATH: ...".
            settings[name] = None if values[name] is None else ImageInput.from_path(values[name])
        elif opt.kind == "outpaint":
            settings[name] = None if values[name] is None else parse_outpaint(values[name])
        else:
            settings[name] = values[name]
    return settings


def parse_outpaint(text: str) -> tuple[int, int, int, int]:
    """--outpaint "L,T,R,B" (pixels to grow the left, top, right and bottom sides by), or "N" for all four; the
    range and "grows no side" are validate()'s."""
    parts = [part.strip() for part in str(text).split(",")]
    try:
        sides = [int(part) for part in parts]
    except ValueError:
        sides = []
    if len(sides) not in (1, 4):
        raise AnimaError(f"--outpaint takes LEFT,TOP,RIGHT,BOTTOM pixel counts (such as 64,0,64,0) or one count for "
                         f"every side, got {text!r}")
    return tuple(sides * 4 if len(sides) == 1 else sides)


def params_from_cli(files: ModelFiles, values: dict[str, Any]) -> GenerationParams:
    """GenerationParams of a command's setting options: width and height default to the model's trained size,
    the prompt's <lora:...> tags pick LoRAs from --lora-dir. Not validated yet (a resumed run fills in its state's
    settings first)."""
    settings = setting_values(values)
    context = click.get_current_context(silent=True)
    for name in ("vae_tile", "vae_overlap"):  # left unset: the engine's choice, the VAE set's else its default
        if name in settings and (context is None or context.get_parameter_source(name) in (
                None, click.core.ParameterSource.DEFAULT)):
            settings[name] = None
    return build(settings, native_size=trained_image_size(files.dit), lora_dir=values.get("lora_dir"))


def lora_file_options(f: F) -> F:
    """--lora FILE[:SCALE] (repeatable) / --lora-ignore-unmatched, for commands that take LoRA files alone."""
    return setting_options("loras", "lora_ignore_unmatched")(f)


def dit_image_size(dit: Path, width: int | None, height: int | None) -> tuple[int, int]:
    """--width/--height, by default the size a small trained model was made for (64 for the demo), else 512."""
    native = trained_image_size(dit) or default("width")
    return (native if width is None else width), (native if height is None else height)
