"""What a generation gives back, and the one publisher of it.

Every front end ends a run with `publish`: it refuses a result that is not finite (nothing is decoded or written
then), writes the PNG with its `parameters` text to a path (atomically) or to bytes (a remote worker sends them
back), and returns the run's record, the dict `generate --json` prints, a server job and a batch line report.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from ..core.files import cached_sha256, png_bytes, save_png
from ..errors import AnimaError
from ..export.manifest import read_manifest
from ..model.lora import lora_tag
from ..sampling.sample import SampleResult
from ..sampling.samplers import SAMPLERS
from ..sampling.schedule import SCHEDULE_LABELS
from .params import DenoisePass, GenerationParams


@dataclasses.dataclass
class Conditioning:
    """Both prompts as DiT context rows [1, context_tokens, context_dim]."""

    positive: torch.Tensor
    negative: torch.Tensor
    encode_s: float
    # prompt editing: every text its schedule makes, encoded (positive / negative are the first call's); empty
    # for a run of one conditioning
    by_text: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Denoised:
    sample: SampleResult
    transformer_passes: int
    subgraph_runs: int
    denoise_s: float
    pass_index: int = 0  # which of the run's passes (GenerationParams.passes()) this is
    partial_passes: int = 0  # the first block alone (auto's check): 1 / blocks of a pass each, in subgraph_runs
    stage_times: dict[str, Any] | None = None  # where the passes' time went (SplitEngine.stage_record)


@dataclasses.dataclass
class GenerationResult:
    image: Image.Image | None  # None when the latent is not finite
    latent: np.ndarray
    params: GenerationParams
    conditioning: Conditioning
    denoised: Denoised
    decode_s: float
    vae_backend: str | None = None  # the VAE backend that decoded (DecodePlan.backend); None: params.vae_backend
    model: str = "anima"  # the DiT file's name, as the PNG's `parameters` names the model
    first_pass: Denoised | None = None  # the hires fix's first pass; `denoised` is the pass that made the picture
    vae_encode_s: float = 0.0  # the init image's VAE encode (and a Lanczos hires fix's)
    interrupted_at: int | None = None  # interrupted after this step of the whole run: the picture as far as it got

    @property
    def finite(self) -> bool:
        return self.denoised.sample.finite

    def timings(self) -> dict[str, float]:
        denoise_s = sum(d.denoise_s for d in self.denoised_passes())
        return {"encode_s": self.conditioning.encode_s, "vae_encode_s": self.vae_encode_s, "denoise_s": denoise_s,
                "decode_s": self.decode_s, "total_s": self.vae_encode_s + denoise_s + self.decode_s}

    def denoised_passes(self) -> list[Denoised]:
        return [self.denoised] if self.first_pass is None else [self.first_pass, self.denoised]

    def summary(self, image: str | None) -> dict[str, Any]:
        """The one result record: `generate --json` prints it, a server job and a batch result line report it.
        `image` says where the picture is (None: not written). computed/skipped/recomputed_steps number the
        sampler's model calls (`model_calls` of them): the steps, for every sampler that calls the model once a
        step."""
        sample, params = self.denoised.sample, self.params
        return {
            "image": image,
            "width": params.width, "height": params.height, "steps": params.steps, "cfg": params.cfg,
            "seed": params.seed, "sampler": params.sampler, "scheduler": params.scheduler,
            "model_calls": params.model_calls(),
            "backend": params.backend, "dtype": dtype_ran(params), "threads": params.threads, "cache": params.cache,
            "vae_backend": self.vae_backend or params.vae_backend,
            "cache_options": params.cache_options,
            "loras": [{"name": ref.name, **ref.as_json()} for ref in params.loras],
            # "stages": where the picture's pass's time went (SplitEngine.stage_record; not the board's off it)
            "timings": {k: round(v, 4) for k, v in self.timings().items()} | {"stages": self.denoised.stage_times},
            "transformer_passes": sum(d.transformer_passes for d in self.denoised_passes()),
            # transformer passes of each computed model call: 1 at CFG 1 (the conditional pass alone), else 2
            "passes_per_model_call": passes_per_call(params.cfg),
            "subgraph_runs": sum(d.subgraph_runs for d in self.denoised_passes()),
            "partial_passes": sum(d.partial_passes for d in self.denoised_passes()),
            "computed_steps": sample.computed_steps, "skipped_steps": sample.skipped_steps,
            "recomputed_steps": sample.recomputed_steps,
            "cache_error_estimate": sample.error_estimate,  # None: the cache does not measure itself
            "cache_may_differ": sample.may_differ,  # the cache's flag (None: the cache does not check itself)
            "cache_rerun_from": sample.rerun_from,  # verify re-ran the steps after this one uncached (None: not)
            "finite": self.finite,
            # The step (of all passes') whose latent turned NaN/Inf, where the run ended; None: it did not.
            "nonfinite_step": (None if sample.nonfinite_at is None else sample.nonfinite_at + sum(
                p.steps_run for p in params.passes()[:self.denoised.pass_index])),
            "image_size": list(self.image.size) if self.image is not None else None,
            # Interrupted (A1111's /interrupt): the steps done of all passes', the picture that step's x0.
            "interrupted": (None if self.interrupted_at is None
                            else {"step": self.interrupted_at, "total": params.steps_run()}),
            "passes": [self._pass_record(params.passes()[d.pass_index], d) for d in self.denoised_passes()],
        } | image_to_image_record(params)

    @staticmethod
    def _pass_record(denoise_pass: DenoisePass, denoised: Denoised) -> dict[str, Any]:
        """One denoising pass as the record lists it: its size, schedule and steps run, and what its cache did
        (no time: a record's timings are under "timings", apart from what makes the picture)."""
        return {"width": denoise_pass.width, "height": denoise_pass.height, "steps": denoise_pass.steps,
                "start": denoise_pass.start, "steps_run": denoise_pass.steps_run, "cache": denoise_pass.cache,
                "transformer_passes": denoised.transformer_passes,
                "computed_steps": denoised.sample.computed_steps, "skipped_steps": denoised.sample.skipped_steps}


def image_to_image_record(params: GenerationParams) -> dict[str, Any]:
    """The image-to-image settings a record names (generate's, a server job's, bench's report), where the run used
    them: the init image and strength, the mask's settings, the hires pass."""
    record: dict[str, Any] = {}
    if params.init_image is not None:
        record |= {"init_image": params.init_image.as_json(), "strength": params.strength,
                   "resize_mode": params.resize_mode}
    if params.mask is not None or params.outpaint is not None:
        record |= {"mask": params.mask.as_json() if params.mask else None, "mask_blur": params.mask_blur,
                   "invert_mask": params.invert_mask, "masked_content": params.masked_content,
                   "inpaint_area": params.inpaint_area, "inpaint_padding": params.inpaint_padding,
                   "outpaint": list(params.outpaint) if params.outpaint else None}
    if params.hires:
        width, height = params.hires_size()
        record |= {"hires": {"width": width, "height": height, "steps": params.passes()[-1].steps,
                             "upscaler": params.hires_upscaler, "strength": params.strength,
                             "cache": params.passes()[-1].cache}}
    return record


def passes_per_call(cfg: float) -> int:
    """Transformer passes per model call: CFG 1 is the conditional model alone, any other scale adds the
    unconditional pass (the pipeline's denoise skips it at 1)."""
    return 1 if cfg == 1.0 else 2


def stage_text(stage_times: dict[str, Any]) -> str:
    """One line of where a pass's time went (the steady state's), and what the times are."""
    per_pass = stage_times["per_pass_s"]
    if per_pass is None:
        return "stage times: no transformer pass ran"
    stages = ", ".join(f"{stage} {seconds:.3f}s" for stage, seconds in per_pass.items())
    label = "" if stage_times["board_times"] else f"; {stage_times['source']}"
    return (f"stage times per pass: {stages}; {stage_times['loads_per_pass']:g} context loads per pass "
            f"(first pass {stage_times['first_pass_loads']}){label}")


SET_DTYPES = {"float32": "fp32", "float16": "fp16"}  # an exported set's dtype (its manifest's), by our names


def dtype_ran(params: GenerationParams) -> str:
    """The dtype the DiT's bodies ran in: --dtype on torch, the subgraph set's own on onnx (as exported), fp16 on
    the NPU (rknn converts every set to fp16)."""
    if params.backend == "rknn":
        return "fp16"
    if params.backend == "onnx":
        return SET_DTYPES[read_manifest(params.subgraphs)["dtype"]]
    return params.dtype


def call_noun(model_calls: int, steps: int) -> str:
    """What a cache's computed / skipped numbers count, in words: "steps", or "model calls" for a sampler that
    calls the model more than once a step (a cache's steps are model calls)."""
    return "steps" if model_calls == steps else "model calls"


def png_parameters(params: GenerationParams, model_name: str, result: GenerationResult | None = None) -> str:
    """The A1111/ComfyUI-style `parameters` text that image tools read back."""
    fields = [f"Steps: {params.steps}", f"Sampler: {SAMPLERS[params.sampler].label}",
              f"Schedule type: {SCHEDULE_LABELS[params.scheduler]}", f"CFG scale: {params.cfg}",
              f"Seed: {params.seed}", f"Size: {params.width}x{params.height}", f"Model: {model_name}"]
    # As A1111 writes them: only a value other than the sampler's default of 1, under A1111's own keys.
    if params.eta is not None and params.eta != 1.0:
        fields.append(f"Eta: {params.eta}")
    if params.s_noise is not None and params.s_noise != 1.0:
        fields.append(f"Sigma noise: {params.s_noise}")
    fields += _image_to_image_fields(params)
    fields += [f"Shift: {params.shift}", f"Dtype: {dtype_ran(params)}", f"Threads: {params.threads}",
               f"Backend: {params.backend}", f"Cache: {params.cache}"]
    if params.cache_options:
        fields.append("Cache options: " + ",".join(f"{k}={v}" for k, v in params.cache_options.items()))
    if result is not None and params.cache != "none":
        computed, calls = len(result.denoised.sample.computed_steps), params.model_calls()
        fields.append(f"Computed {call_noun(calls, params.passes()[-1].steps_run)}: {computed}/{calls}")
        if result.denoised.sample.error_estimate is not None:
            fields.append(f"Cache error estimate: {result.denoised.sample.error_estimate:.4g}")
        if result.denoised.sample.may_differ is not None:
            fields.append(f"Cache may differ: {'yes' if result.denoised.sample.may_differ else 'no'}")
        if result.denoised.sample.rerun_from is not None:
            fields.append(f"Cache re-run from step: {result.denoised.sample.rerun_from}")
    if result is not None and result.interrupted_at is not None:
        fields.append(f"Interrupted: step {result.interrupted_at}/{params.steps_run()}")
    vae_backend = (result.vae_backend if result is not None else None) or params.vae_backend
    fields.append(f"VAE backend: {vae_backend}")  # without a result, auto is what was asked (not what decoded)
    prompt = params.prompt
    if params.loras:  # as WebUI writes them: tags in the prompt, short hashes in a field
        prompt = " ".join([prompt, *(lora_tag(ref) for ref in params.loras)])
        hashes = ", ".join(f"{ref.name}: {cached_sha256(ref.path)[:12]}" for ref in params.loras)
        fields.append(f'Lora hashes: "{hashes}"')
    return f"{prompt}\nNegative prompt: {params.negative}\n" + ", ".join(fields)


_MASKED_CONTENT_LABELS = {"fill": "fill", "original": "original", "latent_noise": "latent noise",
                          "latent_nothing": "latent nothing"}
_UPSCALER_LABELS = {"latent": "Latent", "latent-bicubic": "Latent (bicubic)",
                    "latent-nearest-exact": "Latent (nearest-exact)", "lanczos": "Lanczos"}
_RESIZE_LABELS = {"just_resize": "Just resize", "crop_and_resize": "Crop and resize",
                  "resize_and_fill": "Resize and fill"}


def _image_to_image_fields(params: GenerationParams) -> list[str]:
    """The img2img, inpainting and hires fields under A1111's keys (ours where A1111 has none: Outpaint, Hires
    cache), each only where the run used it, as A1111 writes them."""
    fields = []
    if params.init_image is not None or params.hires:
        fields.append(f"Denoising strength: {params.strength}")
    if params.init_image is not None and params.resize_mode != "just_resize":
        fields.append(f"Resize mode: {_RESIZE_LABELS[params.resize_mode]}")
    if params.mask is not None or params.outpaint is not None:
        fields += [f"Mask blur: {params.mask_blur}", f"Masked content: {_MASKED_CONTENT_LABELS[params.masked_content]}"]
        if params.invert_mask:
            fields.append("Mask mode: Inpaint not masked")
        if params.inpaint_area == "masked":
            fields += ["Inpaint area: Only masked", f"Masked area padding: {params.inpaint_padding}"]
        if params.outpaint is not None:
            fields.append("Outpaint: " + ",".join(str(side) for side in params.outpaint))
    if params.hires:
        width, height = params.hires_size()
        fields.append(f"Hires resize: {width}x{height}" if params.hires_width or params.hires_height
                      else f"Hires upscale: {params.hires_scale}")
        if params.hires_steps:
            fields.append(f"Hires steps: {params.hires_steps}")
        fields.append(f"Hires upscaler: {_UPSCALER_LABELS[params.hires_upscaler]}")
        if params.passes()[-1].cache != params.cache:
            fields.append(f"Hires cache: {params.passes()[-1].cache}")
    return fields


class NotFinite(AnimaError):
    """The final latent has NaN/Inf in it: nothing was decoded or written. `record` is the run's record all the
    same (image None, finite false), for a front end that reports it."""

    def __init__(self, record: dict[str, Any]) -> None:
        step, total = record.get("nonfinite_step"), sum(p["steps_run"] for p in record.get("passes", []))
        super().__init__("the final latent is not finite (NaN/Inf); no image was written" if step is None else
                         f"the latent turned non-finite (NaN/Inf) at step {step} of {total}, where the run "
                         "stopped; no image was written")
        self.record = record


@dataclasses.dataclass
class Published:
    record: dict[str, Any]  # GenerationResult.summary(): what was made, how, how fast
    png: bytes | None = None  # the PNG file's bytes when it was published to bytes


def publish(result: GenerationResult, to: Path | None = None, *, image: str | None = None,
            overwrite: bool = False) -> Published:
    """Publish `result`: its PNG (with the `parameters` text) written to `to` (atomically; an existing file only
    with `overwrite`), or made as bytes when `to` is None; and its record, whose "image" says where the picture
    is (`image`, default the path). A result that is not finite raises NotFinite and writes nothing."""
    where = image if image is not None else (str(to) if to is not None else None)
    if not result.finite:
        raise NotFinite(result.summary(None))
    parameters = png_parameters(result.params, result.model, result)
    if to is None:
        return Published(result.summary(where), png_bytes(result.image, parameters))
    save_png(result.image, to, overwrite=overwrite, parameters=parameters)
    return Published(result.summary(where))
