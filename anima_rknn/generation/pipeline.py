"""Text -> image, one stage at a time: each model is loaded only while its stage runs.

encode (Qwen3, then the LLM adapter) -> denoise (sampler -> engine -> backend) -> decode (Wan VAE).
The CLI and the bench both drive this object; nothing here prints.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from PIL import Image

from ..core.cpu_speed import AUTO, resolve_dtype
from ..core.files import cached_sha256
from ..core.memory import available_bytes, return_freed_memory
from ..core.tensorfile import fingerprint, read_shapes
from ..engine import BACKENDS, RknnOptions, make_engine, subgraph_manifest
from ..engine.vae_auto import choose_vae_backend
from ..engine.vae_tiles import VAE_BACKENDS, open_tile_decoder, vae_set_manifest
from ..errors import AnimaError
from ..export.manifest import MANIFEST
from ..model.io import load_dit, load_llm_adapter, read_dit_config
from ..model.lora import MAX_LORAS, Lora, LoraRef, lora_fingerprints, lora_refs, lora_tag, open_loras
from ..model.model_set import ModelFiles
from ..sampling.caches import make_cache
from ..sampling.euler import SampleResult, StepCallback, sample_euler
from ..sampling.schedule import flow_sigmas
from ..text import PromptTokenizer, load_text_encoder, qwen3_config_from_shapes
from ..text.prompt import parse_prompt_weights
from ..vae import decode_tiled, load_vae, read_vae_config
from ..vae.tiling import TILING_MODES, plan_tiling

if TYPE_CHECKING:
    from .resume import Checkpoints, ResumeState

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
DEFAULT_NEGATIVE = "worst quality, low quality, score_1, score_2, score_3, blurry, jpeg artifacts, sepia"


MAX_SIDE = 4096  # pixels; a 16-megapixel image, 4x what Anima was trained for
MAX_STEPS = 1000
MAX_PROMPT_CHARS = 20_000
MAX_PROMPT_TOKENS = 4096  # Qwen3 tokens; its attention over a prompt grows with the square of this
MAX_CFG, MAX_SHIFT = 100.0, 100.0
RANDOM_SEED = -1  # as in WebUI: draw a seed; the one drawn is what params, JSON and PNG report
MAX_SEED = 2**64 - 1


def resolve_seed(seed: int) -> int:
    """RANDOM_SEED becomes a freshly drawn 64-bit seed; any other value is kept (and checked by validate)."""
    return secrets.randbits(64) if seed == RANDOM_SEED and not isinstance(seed, bool) else seed


def _check_int(name: str, value: object, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise AnimaError(f"{name} must be an integer from {low} to {high}, got {value!r}")


def _check_number(name: str, value: object, low: float, high: float) -> None:
    if (not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value)
            or not low <= value <= high):
        raise AnimaError(f"{name} must be a finite number from {low:g} to {high:g}, got {value!r}")


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


@dataclasses.dataclass
class GenerationParams:
    prompt: str
    negative: str = DEFAULT_NEGATIVE
    width: int = 512
    height: int = 512
    steps: int = 20
    cfg: float = 4.0
    seed: int = 20260812  # 0 .. 2**64-1, or RANDOM_SEED (-1) to draw one
    shift: float = 3.0
    dtype: str = "fp32"
    cache: str = "none"
    cache_options: dict[str, float | str] = dataclasses.field(default_factory=dict)
    backend: str = "torch"
    subgraphs: Path | None = None
    rknn: RknnOptions = dataclasses.field(default_factory=RknnOptions)  # used by the rknn backend only
    vae_tiling: str = "auto"  # auto: tiles only when decoding in one piece would not fit the free memory
    vae_tile: int = 512  # pixels
    vae_overlap: int = 64
    # onnx / rknn: fixed-shape decoder tiles from an exported VAE set, blended here; auto: torch or onnx, whichever
    # decodes this image faster on this CPU (prepare() resolves it; the result reports the one used)
    vae_backend: str = AUTO
    vae_subgraphs: Path | None = None  # that set (export-vae; convert-rknn for rknn)
    loras: list[LoraRef] = dataclasses.field(default_factory=list)  # merged into the DiT and its adapter
    lora_ignore_unmatched: bool = False  # skip LoRA keys that name no layer of this model

    def __post_init__(self) -> None:
        self.seed = resolve_seed(self.seed)
        self.dtype = resolve_dtype(self.dtype)  # "auto": what this CPU runs fastest (cpu_speed); reported as chosen
        if isinstance(self.loras, (list, tuple)):  # from JSON (resume states, requests): paths and scales
            self.loras = lora_refs(self.loras)

    def validate(self) -> None:
        """Every setting checked before any model loads: one AnimaError line for the first problem."""
        for name, text in (("prompt", self.prompt), ("negative prompt", self.negative)):
            check_text(name, text)
            parse_prompt_weights(text)  # refuses nesting beyond its bound now, not after the models load
        for name in ("width", "height"):
            _check_int(name, getattr(self, name), 16, MAX_SIDE)
        if self.width % 16 or self.height % 16:
            raise AnimaError(f"width and height must be positive multiples of 16, got {self.width}x{self.height}")
        _check_int("steps", self.steps, 1, MAX_STEPS)
        _check_int("seed", self.seed, 0, MAX_SEED)
        _check_number("cfg", self.cfg, 0.0, MAX_CFG)
        _check_number("shift", self.shift, 1e-3, MAX_SHIFT)
        if self.dtype not in DTYPES:
            raise AnimaError(f"unknown dtype {self.dtype!r}; choose from {', '.join(DTYPES)}")
        if self.backend not in BACKENDS:
            raise AnimaError(f"unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")
        if self.vae_tiling not in TILING_MODES:
            raise AnimaError(f"unknown VAE tiling mode {self.vae_tiling!r}; choose one of {', '.join(TILING_MODES)}")
        _check_int("VAE tile size", self.vae_tile, 64, MAX_SIDE)
        _check_int("VAE tile overlap", self.vae_overlap, 0, self.vae_tile // 2)
        if self.vae_tile % 8 or self.vae_overlap % 8:
            raise AnimaError(f"VAE tile size and overlap must be multiples of 8 pixels, "
                             f"got {self.vae_tile} and {self.vae_overlap}")
        if self.vae_backend not in VAE_BACKENDS:
            raise AnimaError(f"unknown VAE backend {self.vae_backend!r}; choose one of {', '.join(VAE_BACKENDS)}")
        if self.vae_backend in ("torch", AUTO) and self.vae_subgraphs is not None:
            raise AnimaError(f"a VAE set (--vae-subgraphs) runs on --vae-backend onnx or rknn, not {self.vae_backend}"
                             + (" (which exports and caches its own)" if self.vae_backend == AUTO else ""))
        if self.vae_backend in ("onnx", "rknn") and self.vae_tiling == "off":
            raise AnimaError(f"the {self.vae_backend} VAE backend always decodes in its set's tiles: "
                             "drop --no-vae-tiling")
        if not isinstance(self.cache_options, dict):
            raise AnimaError("cache options must be a dict of option names to values")
        make_cache(self.cache, self.steps, self.cache_options)  # bad cache options fail before any model loads
        if not isinstance(self.loras, list) or len(self.loras) > MAX_LORAS:
            raise AnimaError(f"loras must be a list of at most {MAX_LORAS} LoRA files with scales")
        for ref in self.loras:
            ref.check()
        if not isinstance(self.lora_ignore_unmatched, bool):
            raise AnimaError("lora_ignore_unmatched must be true or false")


@dataclasses.dataclass
class Conditioning:
    """Both prompts as DiT context rows [1, context_tokens, context_dim]."""

    positive: torch.Tensor
    negative: torch.Tensor
    encode_s: float


@dataclasses.dataclass
class Denoised:
    sample: SampleResult
    transformer_passes: int
    subgraph_runs: int
    denoise_s: float


@dataclasses.dataclass(frozen=True)
class DecodePlan:
    """How a run's latent becomes its image, fixed by prepare() before any denoising: in one piece (tile None)
    or in `tile`-px tiles overlapping by `overlap`, on `backend` (torch, or onnx / rknn running the VAE set in
    `subgraphs`); never auto, which prepare() resolves."""

    tile: int | None = None
    overlap: int = 64
    backend: str = "torch"
    subgraphs: Path | None = None


@dataclasses.dataclass
class GenerationResult:
    image: Image.Image | None  # None when the latent is not finite
    latent: np.ndarray
    params: GenerationParams
    conditioning: Conditioning
    denoised: Denoised
    decode_s: float
    vae_backend: str | None = None  # the VAE backend that decoded (DecodePlan.backend); None: params.vae_backend

    @property
    def finite(self) -> bool:
        return self.denoised.sample.finite

    def timings(self) -> dict[str, float]:
        denoise_s = self.denoised.denoise_s
        return {"encode_s": self.conditioning.encode_s, "denoise_s": denoise_s, "decode_s": self.decode_s,
                "total_s": denoise_s + self.decode_s}

    def summary(self, image: str | None) -> dict[str, Any]:
        """The one result record: `generate --json` prints it, a server job and a batch result line report it.
        `image` says where the picture is (None: not written)."""
        sample, params = self.denoised.sample, self.params
        return {
            "image": image,
            "width": params.width, "height": params.height, "steps": params.steps, "cfg": params.cfg,
            "seed": params.seed, "backend": params.backend, "dtype": params.dtype, "cache": params.cache,
            "vae_backend": self.vae_backend or params.vae_backend,
            "cache_options": params.cache_options,
            "loras": [{"name": ref.name, **ref.as_json()} for ref in params.loras],
            "timings": {k: round(v, 4) for k, v in self.timings().items()},
            "transformer_passes": self.denoised.transformer_passes, "subgraph_runs": self.denoised.subgraph_runs,
            "computed_steps": sample.computed_steps, "skipped_steps": sample.skipped_steps,
            "recomputed_steps": sample.recomputed_steps,
            "cache_error_estimate": sample.error_estimate,  # None: the cache does not measure itself
            "finite": self.finite,
        }


def initial_noise(seed: int, width: int, height: int, channels: int = 16) -> np.ndarray:
    """The same noise on every machine: torch's CPU generator, float32."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn((1, channels, height // 8, width // 8), generator=generator).numpy()


class AnimaPipeline:
    def __init__(self, files: ModelFiles, keep_dit: bool = False) -> None:
        if not isinstance(files, ModelFiles):
            raise AnimaError("AnimaPipeline takes the ModelFiles of anima_rknn.resolve_model(...)")
        self.files = files
        # Header-only checks of all three files, so a bad file fails now and not after minutes of work.
        self.dit_config = read_dit_config(files.dit)
        qwen3_config_from_shapes(read_shapes(files.text_encoder, "text encoder"))
        self.vae_config = read_vae_config(files.vae)
        self.tokenizer = PromptTokenizer.from_dirs(files.qwen_tokenizer, files.t5_tokenizer)
        self.keep_dit = keep_dit  # the bench runs several denoise passes on one loaded DiT
        self._dit = None
        self._dit_key: tuple | None = None
        self._loras: tuple[tuple, list[Lora]] | None = None
        self._conditioning: tuple[tuple, Conditioning] | None = None  # kept with the DiT: a seed sweep encodes once

    def open_loras(self, refs: list[LoraRef], ignore_unmatched: bool = False) -> list[Lora]:
        """The LoRA files checked against this DiT (headers, key names, shapes); the last set is kept, so a run's
        stages read the headers once."""
        key = (tuple(refs), ignore_unmatched, tuple(ref.path.stat()[6:9] for ref in refs))  # a replaced file is new
        if self._loras is None or self._loras[0] != key:
            self._loras = key, open_loras(refs, self.dit_config, ignore_unmatched=ignore_unmatched)
        return self._loras[1]

    def _load_dit(self, dtype: str, loras: list[Lora]):
        key = (dtype, tuple(lora.ref for lora in loras))
        if self._dit is not None and self._dit_key == key:
            return self._dit
        self._dit = None  # a kept DiT with other settings goes before the next one loads
        # Kept for several runs it is loaded whole; otherwise just what denoising needs, in the least memory.
        dit = load_dit(self.files.dit, DTYPES[dtype], denoise_only=not self.keep_dit, loras=loras, just_in_time=True)
        if self.keep_dit:
            self._dit, self._dit_key = dit, key
        return dit

    def encode(self, prompt: str, negative: str, dtype: str = "fp32", loras: list[LoraRef] = (),
               lora_ignore_unmatched: bool = False) -> Conditioning:
        """Qwen3 hidden states for both prompts (encoder freed afterwards), then the adapter from the DiT file
        with `loras` merged.

        `dtype` names the bodies' dtype of a kept DiT, whose adapter is then used; otherwise the adapter is
        loaded alone and freed."""
        start = time.perf_counter()
        tokens = [self.tokenizer.encode(p) for p in (prompt, negative)]
        for name, t in zip(("prompt", "negative prompt"), tokens):
            if len(t.qwen_ids) > MAX_PROMPT_TOKENS:
                raise AnimaError(f"the {name} is {len(t.qwen_ids)} tokens long; "
                                 f"at most {MAX_PROMPT_TOKENS} are accepted")
        encoder = load_text_encoder(self.files.text_encoder)
        with torch.no_grad():
            states = [encoder.encode(t.qwen_ids) for t in tokens]
        del encoder  # freed here, before the adapter loads (passing it to a helper could not free it)
        return_freed_memory()
        opened = self.open_loras(list(loras), lora_ignore_unmatched)
        adapter = (self._load_dit(dtype, opened).llm_adapter if self.keep_dit
                   else load_llm_adapter(self.files.dit, opened))
        with torch.no_grad():
            contexts = [adapter.condition(s, torch.tensor([t.t5_ids]), torch.tensor([t.t5_weights]))
                        for s, t in zip(states, tokens)]
        del adapter
        return_freed_memory()
        if not all(bool(torch.isfinite(c).all()) for c in contexts):
            raise AnimaError("the prompt conditioning is not finite (NaN/Inf): check the prompt weights and the "
                             "text encoder and DiT files; no image was written")
        return Conditioning(contexts[0], contexts[1], time.perf_counter() - start)

    def _encode_once(self, params: GenerationParams) -> Conditioning:
        """encode(), or with a kept DiT the last run's conditioning when its prompts, dtype and LoRA files are the
        same (a batch's or a request's seeds of one prompt): the same tensors, reported with encode_s 0."""
        key = (params.prompt, params.negative, params.dtype, tuple(params.loras), params.lora_ignore_unmatched,
               tuple(ref.path.stat()[6:9] for ref in params.loras))
        if self._conditioning is not None and self._conditioning[0] == key:
            return dataclasses.replace(self._conditioning[1], encode_s=0.0)
        conditioning = self.encode(params.prompt, params.negative, params.dtype, params.loras,
                                   params.lora_ignore_unmatched)
        if self.keep_dit:
            self._conditioning = key, conditioning
        return conditioning

    def denoise(self, conditioning: Conditioning, params: GenerationParams, *, on_step: StepCallback | None = None,
                resume: ResumeState | None = None) -> Denoised:
        """The sampler loop on the split engine; `resume` continues a stopped run from its state."""
        params.validate()
        cache = make_cache(params.cache, params.steps, params.cache_options)
        if resume is None:
            first, x, recomputed = 0, initial_noise(params.seed, params.width, params.height), []
        else:
            cache.restore(resume.cache_state)
            first, x, recomputed = resume.step, resume.latent, resume.recomputed
        dit = self._load_dit(params.dtype, self.open_loras(params.loras, params.lora_ignore_unmatched))
        engine = make_engine(dit, params.backend, subgraphs=params.subgraphs, width=params.width,
                             height=params.height, dit_path=self.files.dit, rknn=params.rknn)
        cfg = params.cfg

        def denoise(x: np.ndarray, sigma: float, step: int) -> np.ndarray:
            latent = torch.from_numpy(x)
            with torch.no_grad():
                v = engine.velocity(latent, sigma, conditioning.positive)
                if cfg != 1.0:  # CFG 1 is the conditional model alone: skip the wasted pass
                    v_uncond = engine.velocity(latent, sigma, conditioning.negative)
                    v = v_uncond + cfg * (v - v_uncond)
            return (latent - sigma * v).numpy()

        sigmas = flow_sigmas(params.steps, params.shift)
        start = time.perf_counter()
        try:
            if not self.keep_dit:  # a one-off run: its sigmas and prompts are fixed, free what only they need
                engine.fix_run(list(sigmas[first:-1]),
                               [conditioning.positive, conditioning.negative][: 1 + (cfg != 1.0)])
                return_freed_memory()
            sample = sample_euler(denoise, x, sigmas, cache, callback=on_step, start=first, recomputed=recomputed)
        finally:
            engine.close()
        elapsed = time.perf_counter() - start + (resume.denoise_s if resume is not None else 0.0)
        passes, subgraph_runs = engine.passes, engine.subgraph_runs
        del dit, engine, denoise  # the step function holds the engine too
        return_freed_memory()
        return Denoised(sample, passes, subgraph_runs, elapsed)

    def decode(self, latent: np.ndarray, plan: DecodePlan = DecodePlan(),
               rknn: RknnOptions = RknnOptions()) -> tuple[Image.Image, float]:
        """The latent as an image, as `plan` says (prepare()'s, or in one piece on torch); on onnx / rknn the
        tiles run from the exported VAE set (one tile shape: the latent is cut and blended here, as for torch)."""
        start = time.perf_counter()
        z = torch.from_numpy(latent)
        if plan.backend == "torch":
            decoder = load_vae(self.files.vae)
        else:
            height, width = (side * self.vae_config.scale_factor for side in z.shape[-2:])
            manifest = vae_set_manifest(plan.backend, plan.subgraphs, self.files.vae, width, height)
            decoder = open_tile_decoder(plan.backend, plan.subgraphs, manifest, rknn)
        try:
            with torch.no_grad():
                pixels = decoder.decode(z) if plan.tile is None else decode_tiled(decoder, z, plan.tile, plan.overlap)
        finally:
            if plan.backend != "torch":
                decoder.close()
        del decoder
        return_freed_memory()
        if not bool(torch.isfinite(pixels).all()):
            raise AnimaError(f"the VAE decoded non-finite pixels (NaN/Inf): check {self.files.vae.name}; "
                             "no image was written")
        array = (pixels[0].permute(1, 2, 0).clamp(0, 1).numpy() * 255).round().astype(np.uint8)
        return Image.fromarray(array), time.perf_counter() - start

    def prepare(self, params: GenerationParams) -> DecodePlan:
        """Everything about a run that can be checked before the models load: the settings, the subgraph set
        (fits this DiT and resolution), and the VAE decode's memory. Returns how the run decodes: the VAE tile
        size (None: one piece), chosen from a memory estimate against the free memory (what cannot fit is refused
        here), and the VAE backend.
        The LoRAs are matched to this DiT, and an exported set must have been baked with the same ones.
        --vae-backend auto is decided here (probed, and its ONNX set exported, before any denoising)."""
        params.validate()
        loras = self.open_loras(params.loras, params.lora_ignore_unmatched)
        subgraph_manifest(self.dit_config, params.subgraphs, params.backend, self.files.dit, params.width,
                          params.height, loras=[lora.identity() for lora in loras])
        if params.vae_backend == AUTO:
            torch_tile = plan_tiling(self.vae_config, params.width, params.height, params.vae_tiling,
                                     params.vae_tile, available_bytes())
            backend, subgraphs = choose_vae_backend(self.files.vae, params.width, params.height, params.vae_tile,
                                                    params.vae_overlap, tiling=params.vae_tiling != "off",
                                                    torch_tile=torch_tile)
            # onnx runs its set's tiles (an image of one tile is one tile): less memory than torch's plan.
            return DecodePlan(torch_tile if backend == "torch" else params.vae_tile, params.vae_overlap, backend,
                              subgraphs)
        vae_set = vae_set_manifest(params.vae_backend, params.vae_subgraphs, self.files.vae, params.width,
                                   params.height)
        if vae_set is not None and vae_set["tile"] != params.vae_tile:
            raise AnimaError(f"the VAE set in {params.vae_subgraphs} decodes {vae_set['tile']}-px tiles, asked for "
                             f"{params.vae_tile}: pass --vae-tile-size {vae_set['tile']} or export another set")
        tile = plan_tiling(self.vae_config, params.width, params.height,
                           "on" if vae_set is not None else params.vae_tiling, params.vae_tile, available_bytes())
        return DecodePlan(tile, params.vae_overlap, params.vae_backend, params.vae_subgraphs)

    def fingerprints(self, params: GenerationParams) -> dict[str, str | None]:
        """What a resume state remembers of the model: the three checkpoint files (checkpoint.fingerprint) and
        the subgraph set, by its manifest, which holds the sha256 of every file in it (checked by prepare())."""
        prints: dict[str, str | None] = {"dit": fingerprint(self.files.dit, "DiT"),
                                         "text_encoder": fingerprint(self.files.text_encoder, "text encoder"),
                                         "vae": fingerprint(self.files.vae, "VAE"), "subgraphs": None,
                                         "loras": lora_fingerprints(params.loras)}
        if params.backend != "torch":
            prints["subgraphs"] = cached_sha256(Path(params.subgraphs) / MANIFEST)
        return prints

    def generate(self, params: GenerationParams, on_step: StepCallback | None = None, *,
                 checkpoints: Checkpoints | None = None, resume: ResumeState | None = None) -> GenerationResult:
        """encode -> denoise -> decode. `checkpoints` writes resume states as the run goes (and ends it with
        Interrupted when its stop() turns true); `resume` continues a stopped run, refused unless it was made
        with these settings and model files."""
        if not isinstance(params, GenerationParams):
            raise AnimaError("generate takes a GenerationParams")
        plan = self.prepare(params)
        fingerprints = self.fingerprints(params) if checkpoints is not None or resume is not None else None
        if resume is not None:
            resume.check_settings(params)
            resume.check_model(fingerprints, (1, self.dit_config.context_tokens, self.dit_config.context_dim))
            conditioning = resume.conditioning
        else:
            conditioning = self._encode_once(params)
        if checkpoints is not None:
            checkpoints.stop_before_denoising(params.steps)
            on_step = checkpoints.listener(params, fingerprints, conditioning, on_step, resume)
        denoised = self.denoise(conditioning, params, on_step=on_step, resume=resume)
        image, decode_s = None, 0.0
        if denoised.sample.finite:  # never decode (and never save) a latent with NaN/Inf in it
            image, decode_s = self.decode(denoised.sample.latent, plan, params.rknn)
        return GenerationResult(image, denoised.sample.latent, params, conditioning, denoised, decode_s, plan.backend)


def png_parameters(params: GenerationParams, model_name: str, result: GenerationResult | None = None) -> str:
    """The A1111/ComfyUI-style `parameters` text that image tools read back."""
    fields = [f"Steps: {params.steps}", "Sampler: Euler", "Schedule type: Simple", f"CFG scale: {params.cfg}",
              f"Seed: {params.seed}", f"Size: {params.width}x{params.height}", f"Model: {model_name}",
              f"Shift: {params.shift}", f"Dtype: {params.dtype}", f"Backend: {params.backend}",
              f"Cache: {params.cache}"]
    if params.cache_options:
        fields.append("Cache options: " + ",".join(f"{k}={v}" for k, v in params.cache_options.items()))
    if result is not None and params.cache != "none":
        fields.append(f"Computed steps: {len(result.denoised.sample.computed_steps)}/{params.steps}")
        if result.denoised.sample.error_estimate is not None:
            fields.append(f"Cache error estimate: {result.denoised.sample.error_estimate:.4g}")
    vae_backend = (result.vae_backend if result is not None else None) or params.vae_backend
    if vae_backend not in ("torch", AUTO):  # auto without a result is what was asked, not what decoded
        fields.append(f"VAE backend: {vae_backend}")
    prompt = params.prompt
    if params.loras:  # as WebUI writes them: tags in the prompt, short hashes in a field
        prompt = " ".join([prompt, *(lora_tag(ref) for ref in params.loras)])
        hashes = ", ".join(f"{ref.name}: {cached_sha256(ref.path)[:12]}" for ref in params.loras)
        fields.append(f'Lora hashes: "{hashes}"')
    return f"{prompt}\nNegative prompt: {params.negative}\n" + ", ".join(fields)
