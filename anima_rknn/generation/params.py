"""The settings of one generation, as one table every front end derives from.

GenerationParams is that table: each field carries its default and an `Option` (help text, type, range, how the
CLI spells it, which request field sets it, whether it makes the picture). The CLI's flags (cli/options.py), the
HTTP APIs' request fields (server/), batch's JSONL keys and bench's options are all built from it, and so is the
README's table of settings (`settings_markdown`): a new setting is added here, once.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..checks import check_bool, check_choice, check_int, check_number, shown
from ..core.cpu_speed import AUTO, resolve_dtype
from ..core.threads import AUTO_THREADS, MAX_THREADS, resolve_threads
from ..engine import BACKENDS
from ..engine.backends.rknn import RknnOptions
from ..engine.vae_plan import vae_tiles
from ..engine.vae_tiles import DEFAULT_VAE_OVERLAP, DEFAULT_VAE_TILE, VAE_BACKENDS
from ..errors import AnimaError
from ..model.lora import MAX_LORAS, LoraRef, lora_refs, prompt_loras
from ..model.quantize import weight_type_given_as_dtype
from ..sampling.auto_cache import check_refusal
from ..sampling.caches import CACHE_NAMES, make_cache
from ..sampling.samplers import SAMPLER_NAMES, SAMPLERS, call_sigmas, sampler_and_scheduler, sampler_name
from ..sampling.schedule import SCHEDULES, flow_sigmas, schedule_name, strength_start
from ..text.prompt import parse_prompt_weights
from ..vae.tiling import TILING_MODES
from .images import INPAINT_AREAS, MASKED_CONTENT, RESIZE_MODES, ImageInput
from .prompt_schedule import CallTexts, EditPass, call_texts, check_edits

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}  # the bodies' dtypes, by name
DEFAULT_NEGATIVE = "worst quality, low quality, score_1, score_2, score_3, blurry, jpeg artifacts, sepia"
MAX_SIDE = 4096  # pixels; a 16-megapixel image, 4x what Anima was trained for
MAX_STEPS = 1000
MAX_PROMPT_CHARS = 20_000
MAX_PROMPT_TOKENS = 4096  # Qwen3 tokens; its attention over a prompt grows with the square of this
MAX_CFG, MAX_SHIFT = 100.0, 100.0
MAX_S_NOISE = 10.0
MAX_MASK_BLUR = 256  # pixels
MAX_HIRES_SCALE = 8.0
SAME_CACHE = "same"  # hires_cache: the second pass caches as the first
# The hires fix's upscalers: the latent interpolated (torch's modes; "latent" is bilinear, as A1111's "Latent"), or
# the image decoded, resized with Lanczos and encoded again.
HIRES_UPSCALERS = ("latent", "latent-bicubic", "latent-nearest-exact", "lanczos")
_HIRES_LABELS = {"latent (bilinear)": "latent", "latent (bicubic)": "latent-bicubic",
                 "latent (nearest-exact)": "latent-nearest-exact"}
RANDOM_SEED = -1  # as in WebUI: draw a seed; the one drawn is what params, JSON and PNG report
MAX_SEED = 2**64 - 1
MAX_SEEDS = 10_000  # one --seeds list
DEFAULT_SIZE = 512  # pixels, when the model does not say what it was trained at (the real Anima does not)


@dataclasses.dataclass(frozen=True)
class Option:
    """How one setting meets the user.

    `kind` is what a value is: int, number, text, choice, path, bool, or a structured one (cache_options, loras,
    rknn, image: an ImageInput, outpaint: four pixel counts) whose front ends each have their own spelling.
    `request` is the field an HTTP request sets it with (None: the server's own setting, chosen when it starts).
    `picture`: the setting changes the picture, so a resume state and a batch job id hold it, and a JSONL job may
    set it."""

    help: str
    kind: str
    flags: tuple[str, ...] = ()  # the CLI's spellings; () = --name-with-dashes
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    request: str | None = None
    picture: bool = True
    # A front end's default where its convention differs from the Python API's (None: the same), with the reason
    # beside it.
    cli_default: Any = None
    request_default: Any = None
    # Other spellings a front end may send, made ours by build() (A1111's schedule labels: "Karras" -> karras).
    parse: Callable[[Any], Any] | None = None
    # batch's help where batch takes less than the rest (None: `help`), so that its --help offers only what it takes.
    batch_help: str | None = None


def _setting(default: Any, option: Option, factory: Any = None) -> Any:
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata={"option": option})
    return dataclasses.field(default=default, metadata={"option": option})


@dataclasses.dataclass
class GenerationParams:
    prompt: str = dataclasses.field(metadata={"option": Option(
        "Prompt; (word:1.2) weights as in ComfyUI, A1111's [word] and prompt editing ([from:to:when], [a|b]), "
        "<lora:NAME:SCALE> tags pick LoRAs from the LoRA folder.",
        "text", ("--prompt", "-p"), request="prompt")})
    negative: str = _setting(DEFAULT_NEGATIVE, Option("Negative prompt.", "text",
                                                       ("--negative", "-n", "--negative-prompt"),
                                                       request="negative_prompt"))
    width: int = _setting(DEFAULT_SIZE, Option(
        "Image width in pixels, a multiple of 16. Default: the size a small trained model was made for (64 for the "
        "demo model), else 512.", "int", ("--width", "-W"), 16, MAX_SIDE, request="width"))
    height: int = _setting(DEFAULT_SIZE, Option("Image height; default as width.", "int", ("--height", "-H"), 16,
                                                MAX_SIDE, request="height"))
    steps: int = _setting(20, Option("Sampling steps.", "int", low=1, high=MAX_STEPS, request="steps"))
    cfg: float = _setting(4.0, Option("Classifier-free guidance scale (1: the conditional model alone).", "number",
                                      ("--cfg", "--cfg-scale"), low=0.0, high=MAX_CFG, request="cfg_scale"))
    seed: int = _setting(20260812, Option(
        f"0 to 2^64-1; {RANDOM_SEED} draws a random seed (the one used is reported).", "int", ("--seed", "-s"),
        low=RANDOM_SEED, high=MAX_SEED, request="seed",
        request_default=RANDOM_SEED,  # WebUI clients leave the seed out (or send -1) to get a new picture
        batch_help="Seed of the jobs that name none (without --seeds), 0 to 2^64-1: fixed, so that a batch run "
                   "again finds its jobs done."))
    shift: float = _setting(3.0, Option("Flow-matching sigma shift.", "number", ("--shift", "--flow-shift"),
                                        low=1e-3, high=MAX_SHIFT, request="shift"))
    scheduler: str = _setting("simple", Option(
        "Sigma schedule, as ComfyUI computes it for a flow model (the shift applies to each); A1111's Schedule type "
        "names are taken too.", "choice", choices=SCHEDULES, request="scheduler", parse=schedule_name))
    sampler: str = _setting("euler", Option(
        "Sampler, as ComfyUI names it (A1111's display names such as \"Euler a\" or \"DPM++ 2M SDE\" are taken too); "
        "heun, dpmpp_sde and sa_solver_pece call the model twice a step.", "choice", ("--sampler", "--sampling-method"),
        choices=SAMPLER_NAMES, request="sampler_name", parse=sampler_name))
    eta: float | None = _setting(None, Option(
        "Share of each step that is stochastic, for the samplers that have it (euler_ancestral, dpmpp_2m_sde, "
        "dpmpp_sde, sa_solver*); default 1, 0 makes them deterministic.", "number", low=0.0, high=1.0,
        request="eta"))
    s_noise: float | None = _setting(None, Option(
        "Scale of the noise a stochastic sampler adds back (default 1: the exact noise level).", "number", low=0.0,
        high=MAX_S_NOISE, request="s_noise"))
    dtype: str = _setting("fp32", Option(
        "Attention/MLP body precision (residual stream, norms and AdaLN stay fp32); auto: the fastest on this CPU, "
        "measured once (bf16 only with native bf16).", "choice", choices=(AUTO, *DTYPES),
        cli_default=AUTO))  # a script's numbers should not depend on the machine; a user wants the fast path
    threads: int | None = _setting(None, Option(
        "CPU threads of torch and ONNX Runtime together (the picture's last bits depend on them, so the PNG, the "
        "record and a batch job's id name them); 0: auto, one per physical core, only the big cores of a "
        "big.LITTLE CPU. Python API default: as torch is set when the run starts.", "int", ("--threads", "-t"),
        low=AUTO_THREADS, high=MAX_THREADS,
        cli_default=AUTO_THREADS))  # a program that sized torch's threads keeps them
    cache: str = _setting("none", Option("Step cache: none = every step computed (the exact baseline).", "choice",
                                         ("--cache", "--cache-mode"), choices=CACHE_NAMES, request="cache",
                                         parse=lambda text: cache_name(text)))
    cache_options: dict[str, float | str] = _setting(None, Option(
        'Cache options, stable-diffusion.cpp style: "w=0.4,m=3,lam=1.0,window=2,flex=0.5,warmup=4,stop=0.9".',
        "cache_options", ("--cache-option",), request="cache_options"), factory=dict)
    backend: str = _setting("torch", Option("Where the DiT's attention and MLP bodies run.", "choice",
                                            choices=BACKENDS))
    subgraphs: Path | None = _setting(None, Option("Exported subgraph folder (onnx / rknn backends).", "path",
                                                   picture=False))
    rknn: RknnOptions = _setting(None, Option(
        "rknn backend: runtime (lite on the board, simulator on x86), memory budget, NPU cores.", "rknn",
        ("--rknn-runtime", "--rknn-budget", "--rknn-core-mask"), picture=False), factory=RknnOptions)
    vae_tiling: str = _setting("auto", Option(
        "Decode in overlapping tiles (on: less memory) or never (off); auto: tile only when decoding in one piece "
        "would not fit the free memory.", "choice", ("--vae-tiling/--no-vae-tiling",), choices=TILING_MODES,
        request="vae_tiling"))
    # None: the VAE set's (--vae-subgraphs), else the engine's default, filled in by prepare() (engine.vae_plan);
    # the CLI shows that default and passes None when the flag is not given.
    vae_tile: int | None = _setting(None, Option("VAE tile size in pixels, a multiple of 8.", "int",
                                                 ("--vae-tile-size",), 64, MAX_SIDE, request="vae_tile",
                                                 cli_default=DEFAULT_VAE_TILE))
    vae_overlap: int | None = _setting(None, Option("VAE tile overlap in pixels, a multiple of 8, at most half a tile.",
                                                    "int", ("--vae-tile-overlap",), 0, MAX_SIDE // 2,
                                                    request="vae_overlap", cli_default=DEFAULT_VAE_OVERLAP))
    vae_backend: str = _setting(AUTO, Option(
        "Where the VAE decoder runs: onnx / rknn run the fixed-shape tiles of the VAE set (its tile size must be the "
        "VAE tile size), blended on the host; auto: torch or onnx, whichever this CPU decodes the image faster with "
        "(measured once; onnx exports its set once into the cache folder).", "choice", choices=VAE_BACKENDS,
        picture=False))
    vae_subgraphs: Path | None = _setting(None, Option(
        "VAE decoder set written by export-vae (onnx), converted by convert-rknn (rknn).", "path", picture=False))
    loras: list[LoraRef] = _setting(None, Option(
        "LoRA .safetensors files (ComfyUI, kohya or diffusers layout) with scales, merged into the DiT and its "
        "adapter, in order.", "loras", ("--lora",), request="loras"), factory=list)
    lora_ignore_unmatched: bool = _setting(False, Option(
        "Skip LoRA keys that name no layer of this model instead of refusing the file.", "bool",
        request="lora_ignore_unmatched"))
    # ---- image to image: an init image (img2img), a mask (inpainting), a grown canvas (outpainting), hires fix
    init_image: ImageInput | None = _setting(None, Option(
        "Image to start from (img2img): resized to width x height by --resize-mode; the width and height default "
        "to its size (grown by --outpaint), in multiples of 16.", "image", ("--init-img", "-i"),
        request="init_image"))
    strength: float = _setting(0.75, Option(
        "Denoising strength of img2img, inpainting and the hires fix's second pass: the share of the steps run "
        "(steps x strength rounded up, as diffusers), from the sigma the image is noised to; 1: from pure noise.",
        "number", low=0.0, high=1.0, request="denoising_strength"))
    resize_mode: str = _setting("just_resize", Option(
        "How the init image meets width x height (A1111's resize modes): stretch, scale to cover and crop, or "
        "scale to fit and fill the bands with its edges.", "choice", choices=RESIZE_MODES, request="resize_mode"))
    mask: ImageInput | None = _setting(None, Option(
        "Inpainting mask, the init image's size: white = repaint, black = keep (grey: a partial repaint).",
        "image", request="mask"))
    mask_blur: int = _setting(4, Option("Gaussian blur of the mask's edge, in pixels.", "int", low=0,
                                        high=MAX_MASK_BLUR, request="mask_blur"))
    invert_mask: bool = _setting(False, Option("Repaint where the mask is black instead.", "bool",
                                               request="inpainting_mask_invert"))
    masked_content: str = _setting("original", Option(
        "What the masked area starts from (A1111's inpainting_fill): the original, its surroundings' colours "
        "(fill), latent noise, or an empty latent.", "choice", choices=MASKED_CONTENT, request="inpainting_fill"))
    inpaint_area: str = _setting("whole", Option(
        "Inpaint the whole picture, or only the masked area: cropped with --inpaint-padding, worked at width x "
        "height, pasted back (the output keeps the init image's size).", "choice", choices=INPAINT_AREAS,
        request="inpaint_area"))
    inpaint_padding: int = _setting(32, Option("Pixels around the mask kept in an only-masked crop.", "int",
                                               low=0, high=MAX_SIDE, request="inpaint_full_res_padding"))
    outpaint: tuple[int, int, int, int] | None = _setting(None, Option(
        "Outpaint: grow the init image's canvas by LEFT,TOP,RIGHT,BOTTOM pixels (the new area inpainted).",
        "outpaint", request="outpaint"))
    hires: bool = _setting(False, Option(
        "Hires fix: render at width x height, upscale, then refine at the hires size as img2img with --strength.",
        "bool", request="enable_hr"))
    hires_scale: float = _setting(2.0, Option("Hires size as a multiple of width x height.", "number", low=1.0,
                                              high=MAX_HIRES_SCALE, request="hr_scale"))
    hires_width: int = _setting(0, Option(
        "Hires width in pixels instead of the scale (0: by the scale, or from hires-height by the aspect ratio).",
        "int", low=0, high=MAX_SIDE, request="hr_resize_x"))
    hires_height: int = _setting(0, Option("Hires height; as hires-width.", "int", low=0, high=MAX_SIDE,
                                           request="hr_resize_y"))
    hires_steps: int = _setting(0, Option("Steps of the hires pass's schedule (0: as --steps).", "int", low=0,
                                          high=MAX_STEPS, request="hr_second_pass_steps"))
    hires_upscaler: str = _setting("latent", Option(
        "How the first pass is upscaled: its latent interpolated, or its image decoded, Lanczos-resized and "
        "encoded again (A1111's \"Latent\", \"Latent (bicubic)\", \"Latent (nearest-exact)\", \"Lanczos\").",
        "choice", choices=HIRES_UPSCALERS, request="hr_upscaler", parse=lambda text: hires_upscaler_name(text)))
    hires_subgraphs: Path | None = _setting(None, Option(
        "Subgraph set exported at the hires size, for the hires pass on the onnx / rknn backends.", "path",
        picture=False))
    hires_cache: str = _setting(SAME_CACHE, Option(
        "Step cache of the hires pass (same: --cache with its options).", "choice",
        choices=(SAME_CACHE, *CACHE_NAMES), request="hr_cache"))

    def __post_init__(self) -> None:
        self.seed = resolve_seed(self.seed)
        self.dtype = resolve_dtype(self.dtype)  # "auto": what this CPU runs fastest (cpu_speed); reported as chosen
        self.threads = resolve_threads(self.threads)  # 0 (auto): this CPU's count; None: filled in by prepare()
        if isinstance(self.loras, (list, tuple)):  # from JSON (resume states, requests): paths and scales
            self.loras = lora_refs(self.loras)
        for name in IMAGE_SETTINGS:  # from JSON (resume states, records): the fingerprint alone
            if isinstance(getattr(self, name), dict):
                setattr(self, name, ImageInput.from_json(getattr(self, name)))
        if isinstance(self.outpaint, list):
            self.outpaint = tuple(self.outpaint)

    def validate(self) -> None:
        """Every setting checked before any model loads: one AnimaError line for the first problem."""
        for name, text in (("prompt", self.prompt), ("negative prompt", self.negative)):
            check_text(name, text)
            parse_prompt_weights(text)  # refuses nesting beyond its bound now, not after the models load
        # Without a VAE set the tiles left unset are the defaults, checked now; a set's are its own (prepare()).
        tiles = ({"vae_tile": self.vae_tile, "vae_overlap": self.vae_overlap} if self.vae_subgraphs is not None
                 else dict(zip(("vae_tile", "vae_overlap"), vae_tiles(self))))
        for name, option in options():
            value = tiles.get(name, getattr(self, name))
            if option.kind == "int" and not (value is None and default(name) is None):  # None: prepare() fills it
                low = 0 if name == "seed" else option.low  # a drawn seed was resolved in __post_init__
                high = (tiles["vae_tile"] // 2 if name == "vae_overlap" and tiles["vae_tile"] is not None
                        else option.high)
                check_int(LABELS.get(name, name), value, low, high)
            elif option.kind == "number" and not (value is None and default(name) is None):
                check_number(name, value, option.low, option.high)
            elif option.kind == "choice":
                explained = weight_type_given_as_dtype(name, value, option.choices) if name == "dtype" else None
                if explained:  # a stable-diffusion.cpp user's --type q8_0 in a jobs file or a request
                    raise AnimaError(explained)
                check_choice(LABELS.get(name, name), value, option.choices)
            elif option.kind == "bool":
                check_bool(name, value)
        if self.width % 16 or self.height % 16:
            raise AnimaError(f"width and height must be positive multiples of 16, got {self.width}x{self.height}")
        if any(value is not None and value % 8 for value in tiles.values()):
            raise AnimaError(f"VAE tile size and overlap must be multiples of 8 pixels, "
                             f"got {tiles['vae_tile']} and {tiles['vae_overlap']}")
        if self.vae_backend in ("torch", AUTO) and self.vae_subgraphs is not None:
            raise AnimaError(f"a VAE set (--vae-subgraphs) runs on --vae-backend onnx or rknn, not {self.vae_backend}"
                             + (" (which exports and caches its own)" if self.vae_backend == AUTO else ""))
        if self.vae_backend in ("onnx", "rknn") and self.vae_tiling == "off":
            raise AnimaError(f"the {self.vae_backend} VAE backend always decodes in its set's tiles: "
                             "drop --no-vae-tiling")
        sampler = SAMPLERS[self.sampler]
        for name, takes in (("eta", sampler.takes_eta), ("s_noise", sampler.takes_s_noise)):
            if getattr(self, name) is not None and not takes:
                having = [s.name for s in SAMPLERS.values() if getattr(s, f"takes_{name}")]
                raise AnimaError(f"sampler {self.sampler} has no {name}; these do: {', '.join(having)}")
        if not isinstance(self.cache_options, dict):
            raise AnimaError("cache options must be a dict of option names to values")
        flow_sigmas(self.steps, self.shift, self.scheduler)  # a schedule that cannot make these steps, now
        self._validate_image_to_image()
        check_edits(self.call_texts())  # prompt editing's syntax and steps, and the texts it makes
        sampler = SAMPLERS[self.sampler]
        for denoise_pass in self.passes():  # bad cache options fail now too, and those the sampler rules out
            if denoise_pass.cache == "auto" and denoise_pass.cache_options.get("check"):
                refusal = check_refusal(self.sampler)
                if refusal is not None:
                    raise AnimaError(refusal)
            cache = make_cache(denoise_pass.cache, self.model_calls(denoise_pass.sigmas), denoise_pass.cache_options)
            cache.set_sigmas(np.array([*call_sigmas(sampler, denoise_pass.sigmas), denoise_pass.sigmas[-1]]),
                             fresh_noise=sampler.adds_noise(self.eta_value, self.s_noise_value))
        if not isinstance(self.loras, list) or len(self.loras) > MAX_LORAS:
            raise AnimaError(f"loras must be a list of at most {MAX_LORAS} LoRA files with scales")
        for ref in self.loras:
            ref.check()

    def _validate_image_to_image(self) -> None:
        for name in IMAGE_SETTINGS:
            if not isinstance(getattr(self, name), (ImageInput, type(None))):
                raise AnimaError(f"{name} must be an image (anima_rknn.ImageInput), got "
                                 f"{type(getattr(self, name)).__name__}")
        if self.outpaint is not None:
            if not (isinstance(self.outpaint, tuple) and len(self.outpaint) == 4):
                raise AnimaError("outpaint takes four pixel counts: left, top, right, bottom")
            for side, value in zip(("left", "top", "right", "bottom"), self.outpaint):
                check_int(f"outpaint {side}", value, 0, MAX_SIDE)
            if not any(self.outpaint):
                raise AnimaError("outpaint grows no side: give at least one of left, top, right, bottom above 0")
        if self.init_image is None:
            for name in ("mask", "outpaint"):
                if getattr(self, name) is not None:
                    raise AnimaError(f"{LABELS.get(name, name)} needs an init image (--init-img)")
        elif self.hires:
            raise AnimaError("the hires fix refines a text-to-image render: it takes no init image")
        if self.mask is not None and self.outpaint is not None:
            raise AnimaError("outpainting makes its own mask of the new area: give --mask or --outpaint, not both")
        if self.hires:
            width, height = self.hires_size()
            for side, value in (("width", width), ("height", height)):
                if not 16 <= value <= MAX_SIDE:
                    raise AnimaError(f"the hires {side} would be {value} px; it must be from 16 to {MAX_SIDE}")
        for denoise_pass in self.passes():
            if len(denoise_pass.sigmas) < 2:
                raise AnimaError(f"strength {self.strength} runs no step of {denoise_pass.steps}: give a strength "
                                 "above 0 (it is the share of the steps run)")

    def sigmas(self) -> np.ndarray:
        """The whole schedule of the first pass (a txt2img run's, or the one an img2img run starts into)."""
        return flow_sigmas(self.steps, self.shift, self.scheduler)

    def hires_size(self) -> tuple[int, int]:
        """The hires pass's width and height: hires_width x hires_height, one of them with the other from the
        aspect ratio, or width x height times hires_scale; rounded down to multiples of 16."""
        width, height = self.hires_width, self.hires_height
        if not width and not height:
            width, height = self.width * self.hires_scale, self.height * self.hires_scale
        elif not height:
            height = width * self.height / self.width
        elif not width:
            width = height * self.width / self.height
        return int(width) // 16 * 16, int(height) // 16 * 16

    def steps_run(self) -> int:
        """The steps the run makes over all its passes (an img2img pass's truncated schedule), as its step events
        count them."""
        return sum(denoise_pass.steps_run for denoise_pass in self.passes())

    def passes(self) -> list[DenoisePass]:
        """The denoising passes this run makes: one (txt2img; img2img over the last steps x strength steps,
        rounded up), or with the hires fix a txt2img pass and an img2img one at the hires size."""
        start = strength_start(self.steps, self.strength) if self.init_image is not None else 0
        first = DenoisePass(self.width, self.height, self.sigmas()[start:], self.steps, start, self.cache,
                            self.cache_options, 0)
        if not self.hires:
            return [first]
        steps = self.hires_steps or self.steps
        cache = self.cache if self.hires_cache == SAME_CACHE else self.hires_cache
        width, height = self.hires_size()
        return [first, DenoisePass(width, height, flow_sigmas(steps, self.shift, self.scheduler)[
            strength_start(steps, self.strength):], steps, strength_start(steps, self.strength), cache,
            self.cache_options if self.hires_cache in (SAME_CACHE, self.cache) else {}, 1)]

    def model_calls(self, sigmas: np.ndarray | None = None) -> int:
        """The model calls the sampler makes over `sigmas` (a step cache's steps): the steps, or more for heun
        and the like. Default: over the last pass, the one that makes the picture."""
        return len(call_sigmas(SAMPLERS[self.sampler], self.passes()[-1].sigmas if sigmas is None else sigmas))

    def edit_passes(self) -> list[EditPass]:
        """The passes as prompt editing counts them: over the steps each runs (as WebUI's hires pass, which runs
        all its steps), in WebUI's units: steps times the model calls a step makes."""
        passes = self.passes()
        per_step = len(SAMPLERS[self.sampler].calls(passes[0].sigmas, 0))
        return [EditPass(p.steps_run * per_step, self.model_calls(p.sigmas),
                         passes[0].steps_run * per_step if index else None) for index, p in enumerate(passes)]

    def call_texts(self) -> CallTexts | None:
        """The text of each model call of each pass, both prompts (None: neither prompt edits); AnimaError for bad
        editing. prompt_schedule.call_texts over edit_passes()."""
        return call_texts(self.prompt, self.negative, self.edit_passes())

    @property
    def eta_value(self) -> float:
        return 1.0 if self.eta is None else float(self.eta)

    @property
    def s_noise_value(self) -> float:
        return 1.0 if self.s_noise is None else float(self.s_noise)


@dataclasses.dataclass(frozen=True)
class DenoisePass:
    """One run of the sampler: at width x height over `sigmas`, the last len(sigmas) - 1 of a `steps`-step
    schedule (from step `start`), with its step cache. `stream` keys its noise apart from another pass's."""

    width: int
    height: int
    sigmas: np.ndarray
    steps: int
    start: int
    cache: str
    cache_options: dict[str, float | str]
    stream: int

    @property
    def steps_run(self) -> int:
        return len(self.sigmas) - 1


# How validate() names a setting where its field name would read oddly in a message.
LABELS = {"vae_tile": "VAE tile size", "vae_overlap": "VAE tile overlap", "vae_tiling": "VAE tiling mode",
          "vae_backend": "VAE backend", "mask": "a mask", "outpaint": "outpainting", "init_image": "init image"}
IMAGE_SETTINGS = ("init_image", "mask")


_FIELDS = {field.name: field for field in dataclasses.fields(GenerationParams)}


def options() -> Iterator[tuple[str, Option]]:
    """Every setting's field name and Option, in the table's order."""
    for name, field in _FIELDS.items():
        yield name, field.metadata["option"]


def option(name: str) -> Option:
    return _FIELDS[name].metadata["option"]


def default(name: str, front: str | None = None) -> Any:
    """The setting's default: the Python API's, or a front end's ("cli", "request") where the table gives one."""
    found = _FIELDS[name]
    special = getattr(found.metadata["option"], f"{front}_default") if front else None
    if special is not None:
        return special
    if found.default_factory is not dataclasses.MISSING:
        return found.default_factory()
    return found.default


# Settings that change the picture: a resume state is refused when any differs, a batch job's id hashes them,
# a JSONL job may set them. (The subgraph set, the RKNN options and the VAE backend only change how it is made.)
SETTINGS = tuple(name for name, opt in options() if opt.picture)
# Picture settings added after resume states were first written, with the value that earlier versions made (and
# so meant) without naming it: a state without them still resumes.
_IMAGE_TO_IMAGE = ("init_image", "strength", "resize_mode", "mask", "mask_blur", "invert_mask", "masked_content",
                   "inpaint_area", "inpaint_padding", "outpaint", "hires", "hires_scale", "hires_width",
                   "hires_height", "hires_steps", "hires_upscaler", "hires_cache")
# A state from before the threads setting runs at this machine's auto threads (which were not recorded).
LATER_SETTINGS = {"loras": [], "lora_ignore_unmatched": False, "scheduler": "simple", "sampler": "euler",
                  "eta": None, "s_noise": None, "threads": AUTO_THREADS}
LATER_SETTINGS |= {name: default(name) for name in _IMAGE_TO_IMAGE}
# Those added after batch job ids were first made: an id leaves them out at that value, so a batch made before
# them is still found done.
LATER_THAN_JOB_IDS = ("scheduler", "sampler", "eta", "s_noise", *_IMAGE_TO_IMAGE)
REQUEST_FIELDS = {opt.request: name for name, opt in options() if opt.request}  # request field -> setting
SERVER_SETTINGS = tuple(name for name, opt in options() if opt.request is None)  # chosen when `serve` starts


def uncached(params: GenerationParams) -> GenerationParams:
    """`params` with no step cache in any pass: its baseline (bench's, the server's compare)."""
    return dataclasses.replace(params, cache="none", cache_options={}, hires_cache=SAME_CACHE)


# stable-diffusion.cpp's --cache-mode values: its spectrum is ours (the same w, m, lam, window, flex, warmup, stop
# options); its other caches have none here.
SDCPP_CACHES = {"spectrum": "spectrum", "disabled": "none"}
SDCPP_CACHES_REFUSED = ("easycache", "ucache", "dbcache", "taylorseer", "cache-dit")


def cache_name(text: object) -> str:
    """A step cache as ours: our names, or stable-diffusion.cpp's --cache-mode ones where we have that cache (its
    others are refused saying what to use)."""
    folded = text.strip().casefold() if isinstance(text, str) else None
    if folded in SDCPP_CACHES_REFUSED:
        raise AnimaError(f"stable-diffusion.cpp's cache {shown(text)} is not implemented here: use --cache "
                         "spectrum (the same forecast as its spectrum mode), auto or reuse")
    name = SDCPP_CACHES.get(folded, folded)
    if name not in CACHE_NAMES:
        raise AnimaError(f"cache must be one of {', '.join(CACHE_NAMES)}, got {shown(text)}")
    return name


def hires_upscaler_name(text: object) -> str:
    """An upscaler as ours: our names, or A1111's labels ("Latent", "Latent (bicubic)", "Lanczos"), any case."""
    if isinstance(text, str):
        folded = text.strip().casefold()
        name = _HIRES_LABELS.get(folded, folded.replace("latent (", "latent-").rstrip(")").replace(" ", "-"))
        if name in HIRES_UPSCALERS:
            return name
    raise AnimaError(f"unknown hires upscaler {shown(text)}; choose one of {', '.join(HIRES_UPSCALERS)} "
                     "(or A1111's Latent, Latent (bicubic), Latent (nearest-exact), Lanczos)")


# How far a side may be from the size a model was trained at before a run is warned: a small model made for 64 px
# draws a flat field at the 512 px every A1111 client asks for by default.
SIZE_WARNING_FACTOR = 2.0


def size_warning(params: GenerationParams, native: int | None) -> str | None:
    """A warning for a picture (or its hires pass) far from the size the model records it was trained at (None:
    near it, or the model does not say, as the real Anima does not)."""
    sides = (params.width, params.height, *(params.hires_size() if params.hires else ()))
    if native is None or all(native / SIZE_WARNING_FACTOR <= side <= native * SIZE_WARNING_FACTOR for side in sides):
        return None
    return (f"{params.width}x{params.height} is far from the {native}x{native} this model was trained at; expect a "
            f"poor or flat picture (give --width/--height near {native})")


def resolve_seed(seed: int) -> int:
    """RANDOM_SEED becomes a freshly drawn 64-bit seed; any other value is kept (and checked by validate)."""
    return secrets.randbits(64) if seed == RANDOM_SEED and not isinstance(seed, bool) else seed


def check_text(name: str, value: object) -> None:
    """Prompts are str, valid UTF-8 (command-line bytes that are not arrive as lone surrogates), bounded."""
    if not isinstance(value, str):
        raise AnimaError(f"the {name} must be text, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise AnimaError(f"the {name} is not valid UTF-8 text") from None
    if len(value) > MAX_PROMPT_CHARS:
        raise AnimaError(f"the {name} has {len(value)} characters; at most {MAX_PROMPT_CHARS} are accepted")


def settings_of(params: GenerationParams) -> dict[str, Any]:
    """The settings that make the picture, as JSON values: what a resume state and a batch record hold."""
    settings = {name: getattr(params, name) for name in SETTINGS} | {"loras": [r.as_json() for r in params.loras]}
    for name in IMAGE_SETTINGS:
        if settings[name] is not None:
            settings[name] = settings[name].as_json()
    if params.outpaint is not None:
        settings["outpaint"] = list(params.outpaint)
    return settings


def canonical_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """settings_of()'s dict without the settings newer than job ids that are at the value earlier versions meant:
    what a batch job id hashes and a finished job's record is compared by."""
    canonical = {name: value for name, value in settings.items()
                 if not (name in LATER_THAN_JOB_IDS and value == LATER_SETTINGS[name])}
    for name in IMAGE_SETTINGS:  # an image is the same job from any path: its bytes make the picture
        if isinstance(canonical.get(name), dict):
            canonical[name] = canonical[name].get("sha256")
    return canonical


def build(values: Mapping[str, Any], *, base: GenerationParams | None = None, native_size: int | None = None,
          lora_dir: Path | None = None) -> GenerationParams:
    """GenerationParams from a front end's values by setting name (a value of None: not given, the default).

    Over `base` when given (batch's defaults for its jobs), else over the defaults; width and height not given
    (and not in `base`) are an init image's size (grown by the outpainting), else `native_size`, the size the
    model was trained at, when it says. The prompt's
    <lora:NAME:SCALE> tags are taken out and their LoRAs (from `lora_dir`) follow the listed ones.
    Not validated yet: a resumed run fills in its state's settings first."""
    unknown = sorted(set(values) - set(_FIELDS))
    if unknown:
        raise AnimaError(f"unknown setting {shown(unknown[0])}")
    given = {name: value for name, value in values.items() if value is not None}
    if "sampler" in given:  # A1111's "DPM++ 2M Karras" names a schedule too, where none is given
        given["sampler"], scheduler = sampler_and_scheduler(given["sampler"], given.get("scheduler"))
        if scheduler is not None:
            given["scheduler"] = scheduler
    for name, value in given.items():
        parse = option(name).parse
        if parse is not None:
            given[name] = parse(value)
    if base is None:
        sizes = _init_image_size(given)
        for index, side in enumerate(("width", "height")):
            given.setdefault(side, sizes[index] if sizes else native_size or DEFAULT_SIZE)
        params = GenerationParams(**({"prompt": ""} | given))
    else:
        params = dataclasses.replace(base, **given)
    if isinstance(params.prompt, str):  # (a prompt that is no text is refused by validate)
        prompt, tagged = prompt_loras(params.prompt, lora_dir)
        params = dataclasses.replace(params, prompt=prompt, loras=[*params.loras, *tagged])
    return params


def _init_image_size(given: Mapping[str, Any]) -> tuple[int, int] | None:
    """An init image's size grown by the outpainting, in multiples of 16 (at least 16): an img2img run's default
    width and height. None without an init image to read."""
    image = given.get("init_image")
    if not isinstance(image, ImageInput) or image.data is None:
        return None
    width, height = image.size()
    grow = given.get("outpaint")
    if isinstance(grow, (list, tuple)) and len(grow) == 4 and all(isinstance(v, int) for v in grow):
        width, height = width + grow[0] + grow[2], height + grow[1] + grow[3]
    return max(16, width // 16 * 16), max(16, height // 16 * 16)


def parse_seeds(text: str, most: int = MAX_SEEDS) -> list[int]:
    """"1-8" or "1,5,9-12": seeds in the order given, each at most once (batch's and bench's --seeds)."""
    seeds: list[int] = []
    for item in text.split(","):
        low, dash, high = item.strip().partition("-")
        try:
            first, last = int(low), int(high if dash else low)
        except ValueError:
            raise AnimaError(f"--seeds takes seeds and ranges such as 1-8 or 1,5,9-12, got {text!r}") from None
        if not 0 <= first <= last <= MAX_SEED:
            raise AnimaError(f"--seeds: {item.strip()!r} is not a seed or a rising range of seeds from 0 to {MAX_SEED}")
        if len(seeds) + last - first + 1 > most:
            raise AnimaError(f"--seeds names more than {most} seeds")
        seeds.extend(range(first, last + 1))
    if len(set(seeds)) != len(seeds):
        raise AnimaError(f"--seeds names a seed twice: {text!r}")
    return seeds


def cli_flags(name: str) -> tuple[str, ...]:
    return option(name).flags or (f"--{name.replace('_', '-')}",)


def _range(opt: Option) -> str:
    if opt.kind == "choice":
        return " \\| ".join(opt.choices)
    if opt.low is None:
        return ""
    high = "2^64-1" if opt.high == MAX_SEED else f"{opt.high:g}"
    return f"{opt.low:g} .. {high}" if not math.isinf(opt.high) else f">= {opt.low:g}"


def settings_markdown() -> str:
    """The README's table of settings, made from the table itself (tests/generation/test_params.py checks it)."""
    rows = ["| setting | CLI | request field | JSONL key | default | range |", "|---|---|---|---|---|---|"]
    for name, opt in options():
        value = default(name, "cli")
        shown_default = {"": '""', DEFAULT_NEGATIVE: "WebUI-style quality tags"}.get(value, value) \
            if isinstance(value, str) else value
        if name in ("width", "height"):
            shown_default = "model's size, else 512"
        elif name == "prompt":
            shown_default = "(required)"
        elif name == "threads":
            shown_default = "0 (auto: the physical / big cores)"
        elif opt.kind == "number" and value is None:
            shown_default = "the sampler's (1)"
        elif isinstance(value, (dict, list)) or value is None or isinstance(value, RknnOptions):
            shown_default = "none"
        request = f"`{opt.request}`" if opt.request else "(server's)"
        if opt.request_default is not None:
            request += f" (default {opt.request_default})"
        rows.append(f"| {name} | `{cli_flags(name)[0]}` | {request} | {'`' + name + '`' if opt.picture else '-'} | "
                    f"{shown_default} | {_range(opt)} |")
    return "\n".join(rows)
