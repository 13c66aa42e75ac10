"""Text (and an image) -> image, one stage at a time: each model is loaded only while its stage runs.

encode (Qwen3, then the LLM adapter) -> [encode the init image (Wan VAE encoder)] -> denoise, one pass or two
with the hires fix (sampler -> engine -> backend) -> decode (Wan VAE) -> [paste back into the init image].
Every front end drives this object through the generation layer (params -> pipeline -> result); nothing here
prints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from PIL import Image

from ..checks import shown
from ..core.files import cached_sha256
from ..core.memory import return_freed_memory
from ..core.tensorfile import fingerprint, read_shapes
from ..core.threads import use_threads
from ..engine import FirstBlockProbe, RknnOptions, make_engine, subgraph_manifest
from ..engine.backends.rknn import check_runtime
from ..engine.vae_plan import DecodePlan, plan_decode, plan_encode, vae_tiles
from ..engine.vae_tiles import open_tile_decoder, open_tile_encoder, vae_set_manifest
from ..errors import AnimaError
from ..export.manifest import MANIFEST
from ..model.io import load_dit, load_llm_adapter, read_dit_config
from ..model.lora import Lora, LoraRef, lora_fingerprints, open_loras
from ..model.model_set import ModelFiles
from ..sampling.auto_cache import fit_refusal
from ..sampling.cache_fit import CacheFit, fit_of_model
from ..sampling.cache_seam import CachePolicy, ChecksForecasts
from ..sampling.caches import restore_cache, verifies
from ..sampling.inpaint import Inpaint
from ..sampling.rerun import sample_verified
from ..sampling.sample import StepCallback, StepEvent
from ..sampling.samplers import SAMPLERS, call_sigmas
from ..text import PromptTokenizer, load_text_encoder, qwen3_config_from_shapes
from ..vae import decode_tiled, load_vae, read_vae_config
from ..vae.tiling import encode_tiled
from .image_to_image import (
    Source,
    finish,
    noised,
    prepare_source,
    start_latent,
    upscale_image,
    upscale_latent,
)
from .images import image_to_tensor
from .params import DTYPES, MAX_PROMPT_TOKENS, DenoisePass, GenerationParams
from .prompt_schedule import CallConditioning, distinct_texts, pass_cache
from .result import Conditioning, Denoised, GenerationResult, passes_per_call
from .resume import Interrupted
from .run_plan import PassPlan, RunPlan

if TYPE_CHECKING:
    from .resume import Checkpoints, ResumeState


def initial_noise(seed: int, width: int, height: int, channels: int = 16) -> np.ndarray:
    """The same noise on every machine: torch's CPU generator, float32."""
    return noise_draws(seed, [(width, height)], channels)[0]


def noise_draws(seed: int, sizes: list[tuple[int, int]], channels: int = 16) -> list[np.ndarray]:
    """Latent noises for width x height images drawn one after another from one generator of `seed`: the first
    is initial_noise's; the next ones are an inpainting's latent-noise fill or the hires pass's noise (A1111 also
    draws its hires noise next from the run's generator)."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    return [torch.randn((1, channels, height // 8, width // 8), generator=generator).numpy()
            for width, height in sizes]


def pass_seed(seed: int, stream: int) -> int:
    """The sampler noise's key of a pass: the seed for the first, apart from it (above every seed) for the
    hires pass, so the two passes never draw the same noise at the same step."""
    return seed | (stream << 64)


@contextlib.contextmanager
def threads_kept_if_refused() -> Iterator[None]:
    """Torch's threads put back as they were when the block raises: a run refused before it starts (a bad
    setting, a resume state of another run) leaves the caller's process as it found it."""
    before = torch.get_num_threads()
    try:
        yield
    except BaseException:
        use_threads(before)
        raise


@dataclasses.dataclass
class PassStart:
    """Where one denoising pass starts: its latent (None: taken from the resume state) and, inpainting, the
    part it keeps."""

    index: int
    denoise_pass: DenoisePass
    latent: np.ndarray | None
    inpaint: Inpaint | None = None


@dataclasses.dataclass
class Rendered:
    """All the passes of a run and its picture (None when the last latent is not finite)."""

    denoised: Denoised  # the last pass run, the one that makes the picture
    first_pass: Denoised | None  # the hires fix's first pass (None: a run of one pass, or resumed in the second)
    image: Image.Image | None
    decode_s: float
    vae_encode_s: float  # the init image's (or the hires fix's Lanczos-upscaled picture's) VAE encode
    interrupted_at: int | None = None  # interrupted after this step of the whole run (None: the run finished)


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
        # The adapter embeds T5 ids in a table of t5_vocab rows: a tokenizer that can make an id past it belongs to
        # another model, and would fail as an index error in the middle of a run.
        top = max(self.tokenizer.t5.get_vocab(with_added_tokens=True).values(), default=0)
        if top >= self.dit_config.t5_vocab:
            raise AnimaError(f"the T5 tokenizer {files.t5_tokenizer / 'tokenizer.json'} makes ids up to {top}, but "
                             f"the LLM adapter of {files.dit.name} embeds {self.dit_config.t5_vocab}: they are not "
                             "parts of one model")
        self.keep_dit = keep_dit  # the bench runs several denoise passes on one loaded DiT
        self._dit = None
        self._dit_key: tuple | None = None
        self._loras: tuple[tuple, list[Lora]] | None = None
        self._conditioning: tuple[tuple, Conditioning] | None = None  # kept with the DiT: a seed sweep encodes once
        self._cache_fit: tuple[str, CacheFit | None] | None = None  # (the DiT's fingerprint, its fit)

    @property
    def cache_fit(self) -> CacheFit | None:
        """The model's cache numbers for `auto` (sampling.cache_fit: the file next to the DiT; None: it has none),
        read again when the DiT file changes."""
        dit = fingerprint(self.files.dit, "DiT")
        if self._cache_fit is None or self._cache_fit[0] != dit:
            self._cache_fit = dit, fit_of_model(self.files.dit, dit)
        return self._cache_fit[1]

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
        contexts = self.encode_texts([prompt, negative], dtype, loras, lora_ignore_unmatched,
                                     ("prompt", "negative prompt"))
        return Conditioning(contexts[0], contexts[1], time.perf_counter() - start)

    def encode_texts(self, texts: list[str], dtype: str = "fp32", loras: list[LoraRef] = (),
                     lora_ignore_unmatched: bool = False, names: tuple[str, ...] = ()) -> list[torch.Tensor]:
        """encode()'s contexts for any number of texts, with one load of the encoder and of the adapter (prompt
        editing encodes every text its schedule makes). `names` name the texts in a refusal."""
        tokens = [self.tokenizer.encode(p) for p in texts]
        for index, t in enumerate(tokens):
            if len(t.qwen_ids) > MAX_PROMPT_TOKENS:
                name = names[index] if index < len(names) else f"prompt {shown(texts[index], 60)}"
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
        return contexts

    def _encode_once(self, params: GenerationParams) -> Conditioning:
        """encode(), or with a kept DiT the last run's conditioning when its prompts, dtype and LoRA files are the
        same (a batch's or a request's seeds of one prompt): the same tensors, reported with encode_s 0. Prompt
        editing encodes every text its schedule makes, each once."""
        per_pass = params.call_texts()
        texts = [params.prompt, params.negative] if per_pass is None else distinct_texts(per_pass)
        key = (tuple(texts), params.dtype, tuple(params.loras), params.lora_ignore_unmatched,
               tuple(ref.path.stat()[6:9] for ref in params.loras))
        if self._conditioning is not None and self._conditioning[0] == key:
            return dataclasses.replace(self._conditioning[1], encode_s=0.0)
        if per_pass is None:
            conditioning = self.encode(params.prompt, params.negative, params.dtype, params.loras,
                                       params.lora_ignore_unmatched)
        else:
            start = time.perf_counter()
            contexts = dict(zip(texts, self.encode_texts(texts, params.dtype, params.loras,
                                                         params.lora_ignore_unmatched)))
            first = per_pass[0][0][0], per_pass[0][1][0]
            conditioning = Conditioning(contexts[first[0]], contexts[first[1]], time.perf_counter() - start, contexts)
        if self.keep_dit:
            self._conditioning = key, conditioning
        return conditioning

    def denoise(self, conditioning: Conditioning, params: GenerationParams, *, on_step: StepCallback | None = None,
                resume: ResumeState | None = None, start: PassStart | None = None,
                interrupt: Callable[[], bool] | None = None, policy: CachePolicy | None = None) -> Denoised:
        """One sampler pass on the split engine: `start`'s (default: a text-to-image run's first, from its
        initial noise); `resume` continues it from a stopped run's state; `interrupt` ends it after the step
        where it turns true, with that step's x0 (sampling.sample). `policy`: a step cache of the caller's (any
        implementation of the seam, sampling.cache_seam) instead of the one the settings name. `params` must have
        been through prepare(), which validated them: a run validates its settings once."""
        if start is None:
            if params.init_image is not None:
                raise AnimaError("an image-to-image pass starts from its encoded image: run it with generate()")
            start = PassStart(0, params.passes()[0], initial_noise(params.seed, params.width, params.height))
        denoise_pass, sampler = start.denoise_pass, SAMPLERS[params.sampler]
        sigmas = denoise_pass.sigmas
        edits = _call_conditioning(conditioning, params, start.index)  # None: one conditioning for every call
        cache = policy or pass_cache(denoise_pass.cache, params.model_calls(sigmas), denoise_pass.cache_options,
                                     self.cache_fit, edits.starts if edits is not None else None)
        if resume is None:
            first, x, sampler_state = 0, start.latent, None
        else:
            cache = restore_cache(cache, resume.cache_state)
            first, x, sampler_state = resume.step, resume.latent, resume.sampler_state
        dit = self._load_dit(params.dtype, self.open_loras(params.loras, params.lora_ignore_unmatched))
        engine = make_engine(dit, params.backend, subgraphs=params.subgraphs if start.index == 0
                             else params.hires_subgraphs, width=denoise_pass.width, height=denoise_pass.height,
                             dit_path=self.files.dit, rknn=params.rknn)
        cfg, probing = params.cfg, isinstance(cache, ChecksForecasts) and cache.check
        if resume is not None:  # counted over the same span as the steps (the cache's, the whole run's)
            engine.passes = len(cache.report().computed_steps) * passes_per_call(cfg)
            engine.subgraph_runs = engine.passes * 3 * len(dit.blocks)
        probe = FirstBlockProbe(engine, conditioning.positive) if probing else None
        if probe is not None:
            cache.attach_probe(probe)

        def on_call(call: int) -> None:  # prompt editing: the call's contexts, for the denoiser and the probe
            edits.at(call)
            if probe is not None:
                probe.context = edits.now()[0]

        def denoise(x: np.ndarray, sigma: float) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
            latent = torch.from_numpy(x)
            positive, negative = (conditioning.positive, conditioning.negative) if edits is None else edits.now()
            with torch.no_grad():
                v = v_uncond = engine.velocity(latent, sigma, positive, keep_first_block=probing)
                if passes_per_call(cfg) == 2:  # CFG 1 is the conditional model alone: skip the wasted pass
                    v_uncond = engine.velocity(latent, sigma, negative)
                    v = v_uncond + cfg * (v - v_uncond)
            x0 = (latent - sigma * v).numpy()
            if not sampler.guided:
                return x0
            # CFG++ renoises with the unconditional x0 (at CFG 1, without that pass, the conditional one)
            return x0, x0 if v_uncond is v else (latent - sigma * v_uncond).numpy()

        began = time.perf_counter()
        try:
            if not self.keep_dit:  # a one-off run: its sigmas and prompts are fixed, free what only they need
                engine.fix_run(list(dict.fromkeys(call_sigmas(sampler, sigmas, first))),
                               [conditioning.positive, conditioning.negative][: passes_per_call(cfg)]
                               if edits is None else edits.contexts(passes_per_call(cfg)))
                return_freed_memory()
            sampled = sample_verified(sampler, denoise, x, sigmas, cache, on_step,
                                      verify=verifies(denoise_pass.cache_options), start=first, state=sampler_state,
                                      seed=pass_seed(params.seed, denoise_pass.stream), eta=params.eta_value,
                                      s_noise=params.s_noise_value, inpaint=start.inpaint, interrupt=interrupt,
                                      on_call=None if edits is None else on_call)
        finally:
            engine.close()
        elapsed = time.perf_counter() - began + (resume.denoise_s if resume is not None else 0.0)
        passes, subgraph_runs, partial_passes = engine.passes, engine.subgraph_runs, engine.partial_passes
        stage_times = engine.stage_record()
        del dit, engine, denoise, probe  # the step function and the probe hold the engine too
        return_freed_memory()
        return Denoised(sampled, passes, subgraph_runs, elapsed, start.index, partial_passes, stage_times)

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

    def encode_image(self, image: Image.Image, plan: DecodePlan,
                     rknn: RknnOptions = RknnOptions()) -> tuple[np.ndarray, float]:
        """An RGB image as the DiT's normalised latent, on the plan's VAE backend: on torch in one piece or in
        `plan.encode_tile` tiles, on onnx / rknn in the tiles of the VAE set's encoder."""
        start = time.perf_counter()
        pixels = image_to_tensor(image)
        if plan.backend == "torch":
            encoder = load_vae(self.files.vae, decode_only=False)
        else:
            manifest = vae_set_manifest(plan.backend, plan.subgraphs, self.files.vae, image.width, image.height,
                                        encoder=True)
            encoder = open_tile_encoder(plan.backend, plan.subgraphs, manifest, rknn)
        try:
            with torch.no_grad():
                z = (encoder.encode(pixels) if plan.encode_tile is None
                     else encode_tiled(encoder, pixels, plan.encode_tile, plan.overlap))
        finally:
            if plan.backend != "torch":
                encoder.close()
        del encoder
        return_freed_memory()
        if not bool(torch.isfinite(z).all()):
            raise AnimaError(f"the VAE encoded the init image to non-finite values (NaN/Inf): check "
                             f"{self.files.vae.name}; no image was written")
        return np.ascontiguousarray(z.numpy(), dtype=np.float32), time.perf_counter() - start

    def prepare(self, params: GenerationParams, *, validated: bool = False) -> RunPlan:
        """The run's plan (run_plan.RunPlan), once per run: everything that can be checked and decided before the
        models load. The settings (validated here unless `validated`: the caller ran params.validate() on them, a
        front end that refuses bad settings before its other checks), the init image and mask (read and checked),
        each pass's schedule, step cache and subgraph set (they fit this DiT and the pass's resolution), the VAE's
        memory: how the run decodes its picture and encodes its image, the VAE tile sizes (None: one piece),
        chosen from memory estimates against the free memory (what cannot fit is refused here), and the VAE
        backend; the model files' fingerprints.
        The LoRAs are matched to this DiT, and an exported set must have been baked with the same ones.
        --vae-backend auto is decided here (probed, and its ONNX set exported, before any denoising).
        Filled in `params` now, so the run's records name them: threads (None, the Python API's default: torch's
        threads now; from here on this thread's torch, and the ONNX Runtime sessions the run opens, use them) and
        the VAE tile and overlap (None: the VAE set's, else the default; engine.vae_plan.vae_tiles)."""
        if not validated:
            params.validate()
        if params.threads is None:
            params.threads = torch.get_num_threads()
        with threads_kept_if_refused():
            use_threads(params.threads)  # now: the VAE probe below runs on them
            return self._prepare(params)

    def _prepare(self, params: GenerationParams) -> RunPlan:
        params.vae_tile, params.vae_overlap = vae_tiles(params)
        loras = [lora.identity() for lora in self.open_loras(params.loras, params.lora_ignore_unmatched)]
        passes = []
        for index, denoise_pass in enumerate(params.passes()):
            refusal = fit_refusal(denoise_pass.cache_options, self.cache_fit) if denoise_pass.cache == "auto" else None
            if refusal is not None:
                raise AnimaError(refusal)
            subgraphs = params.subgraphs if index == 0 else params.hires_subgraphs
            if index and params.backend != "torch" and subgraphs is None:
                raise AnimaError(f"the hires pass on the {params.backend} backend runs a subgraph set made for "
                                 f"{denoise_pass.width}x{denoise_pass.height}: pass it with --hires-subgraphs DIR")
            manifest = subgraph_manifest(self.dit_config, subgraphs, params.backend, self.files.dit,
                                         denoise_pass.width, denoise_pass.height, loras=loras)
            if params.backend == "rknn":
                check_runtime(manifest["rknn"], params.rknn.runtime)
            passes.append(PassPlan(denoise_pass, subgraphs))
        prepare_source(params)
        last = passes[-1].denoise_pass
        lanczos = params.hires and params.hires_upscaler == "lanczos"
        plan = self._vae_plan(params, last.width, last.height)
        encode_size = ((params.width, params.height) if params.init_image is not None
                       else (last.width, last.height) if lanczos else None)
        if encode_size is not None:
            plan = dataclasses.replace(plan, encode_tile=plan_encode(self.files.vae, self.vae_config, params, plan,
                                                                     *encode_size))
        first_decode = self._vae_plan(params, params.width, params.height) if lanczos else None
        # A copy: settings the caller changes after this are not the plan's.
        return RunPlan(self.files, dataclasses.replace(params), tuple(passes), plan, first_decode,
                       self.fingerprints(params))

    def _vae_plan(self, params: GenerationParams, width: int, height: int) -> DecodePlan:
        """How a width x height picture decodes (prepare()'s plan, at that size)."""
        return plan_decode(self.files.vae, self.vae_config, params, width, height)

    def fingerprints(self, params: GenerationParams) -> dict[str, str | None]:
        """What a resume state remembers of the model: the three checkpoint files (checkpoint.fingerprint) and
        the subgraph set, by its manifest, which holds the sha256 of every file in it (checked by prepare())."""
        prints: dict[str, str | None] = {"dit": fingerprint(self.files.dit, "DiT"),
                                         "text_encoder": fingerprint(self.files.text_encoder, "text encoder"),
                                         "vae": fingerprint(self.files.vae, "VAE"), "subgraphs": None,
                                         "loras": lora_fingerprints(params.loras)}
        if params.backend != "torch":
            prints["subgraphs"] = cached_sha256(Path(params.subgraphs) / MANIFEST)
            if params.hires:  # the hires pass's set, made for its size
                prints["hires_subgraphs"] = cached_sha256(Path(params.hires_subgraphs) / MANIFEST)
        return prints

    def generate(self, run: RunPlan | GenerationParams, on_step: StepCallback | None = None, *,
                 checkpoints: Checkpoints | None = None, resume: ResumeState | None = None,
                 interrupt: Callable[[], bool] | None = None) -> GenerationResult:
        """encode -> denoise (every pass) -> decode, as prepare()'s plan says (settings given instead are
        prepared here: the Python API's one call). `checkpoints` writes resume states as the run goes (and ends
        it with Interrupted when its stop() turns true); `resume` continues a stopped run, refused unless it was
        made with these settings, images and model files. `interrupt` ends the run after the step where it turns
        true (one step at least) with the picture as far as it got: that step's x0 decoded (render())."""
        if not isinstance(run, (RunPlan, GenerationParams)):
            raise AnimaError("generate takes a RunPlan (prepare()) or a GenerationParams")
        with threads_kept_if_refused():  # the plan's threads, taken back when the resume state is refused
            plan = self.prepare(run) if isinstance(run, GenerationParams) else run
            plan.check_files(self.files)
            use_threads(plan.params.threads)
            if resume is not None:
                resume.check_settings(plan.params)
                resume.check_model(plan.fingerprints,
                                   (1, self.dit_config.context_tokens, self.dit_config.context_dim))
        params = plan.params
        # A resume state keeps the first call's contexts only: an edited prompt's texts are encoded again.
        conditioning = (resume.conditioning if resume is not None and params.call_texts() is None
                        else self._encode_once(params))
        if checkpoints is not None:
            checkpoints.stop_before_denoising(params.steps)
        rendered = self.render(conditioning, plan, on_step, checkpoints=checkpoints, resume=resume,
                               interrupt=interrupt)
        return GenerationResult(rendered.image, rendered.denoised.sample.latent, params, conditioning,
                                rendered.denoised, rendered.decode_s, plan.decode.backend, self.files.dit.name,
                                first_pass=rendered.first_pass, vae_encode_s=rendered.vae_encode_s,
                                interrupted_at=rendered.interrupted_at)

    def render(self, conditioning: Conditioning, plan: RunPlan, on_step: StepCallback | None = None, *,
               checkpoints: Checkpoints | None = None, resume: ResumeState | None = None,
               interrupt: Callable[[], bool] | None = None) -> Rendered:
        """Every denoising pass of the plan from the encoded prompts, then the picture (pasted back into the
        init image when inpainting). The step events count the steps of all passes together. Interrupted
        (`interrupt`), the picture is the x0 reached, decoded at its pass's size: a hires fix interrupted in (or
        after) its first pass gives a first-pass picture."""
        params = plan.params
        source = prepare_source(params)
        passes = plan.denoise_passes
        first = resume.pass_index if resume is not None else 0
        done: list[Denoised] = []
        latent: np.ndarray | None = None
        vae_encode_s = decode_s = 0.0
        interrupted_at: int | None = None
        for index in range(first, len(passes)):
            before = sum(p.steps_run for p in passes[:index])  # the earlier passes' steps: events count all
            if done and interrupt is not None and interrupt():  # between passes: the first pass's picture
                interrupted_at = before
                break
            resumed = resume if index == first else None
            start, encode_s, first_decode_s = self._pass_start(plan, index, source, latent, resumed)
            vae_encode_s, decode_s = vae_encode_s + encode_s, decode_s + first_decode_s
            listener = _pass_progress(on_step, passes, index)
            if checkpoints is not None:
                listener = checkpoints.listener(params, plan.fingerprints, conditioning, listener, resumed, index)
            try:
                done.append(self.denoise(conditioning, params, on_step=listener, resume=resumed, start=start,
                                         interrupt=interrupt))
            except Interrupted as stopped:  # told in steps of the whole run, as the step events are
                raise Interrupted(stopped.path, before + stopped.step, params.steps_run()) from None
            latent = done[-1].sample.latent
            if done[-1].sample.interrupted_at is not None:
                interrupted_at = before + done[-1].sample.interrupted_at
            if not done[-1].sample.finite or interrupted_at is not None:
                break
        image = None
        last = passes[done[-1].pass_index]
        if done[-1].sample.finite and (len(done) == len(passes) - first or interrupted_at is not None):
            # never decode a latent with NaN/Inf; a pass that is not the last decodes at its own size
            decode_plan = (plan.decode if last is passes[-1]
                           else plan.first_decode or self._vae_plan(params, last.width, last.height))
            image, last_decode_s = self.decode(done[-1].sample.latent, decode_plan, params.rknn)
            image, decode_s = finish(image, source), decode_s + last_decode_s
        return Rendered(done[-1], done[0] if len(done) > 1 else None, image, decode_s, vae_encode_s, interrupted_at)

    def _pass_start(self, plan: RunPlan, index: int, source: Source | None, previous: np.ndarray | None,
                    resumed: ResumeState | None) -> tuple[PassStart, float, float]:
        """Pass `index`'s start and the seconds its VAE encode and decode took: noise (txt2img), the init image
        encoded and noised (img2img, inpainting), or the first pass upscaled and noised (hires; Lanczos decodes
        the first pass's picture and encodes it at the hires size). A resumed pass starts from
        its state's latent; an inpainting one encodes its image again for the part it keeps."""
        params, passes = plan.params, plan.denoise_passes
        denoise_pass = passes[index]
        if index == 0 and source is None:
            return PassStart(0, denoise_pass, None if resumed else initial_noise(params.seed, params.width,
                                                                                  params.height)), 0.0, 0.0
        if resumed is not None and (index > 0 or source.mask is None):
            return PassStart(index, denoise_pass, None), 0.0, 0.0
        sigma = float(denoise_pass.sigmas[0])
        if index == 0:
            latent, encode_s = self.encode_image(source.image, plan.decode, params.rknn)
            noise, content_noise = noise_draws(params.seed, [(denoise_pass.width, denoise_pass.height)] * 2)
            x, inpaint = start_latent(latent, noise, sigma, source, params, content_noise)
            return PassStart(0, denoise_pass, x, inpaint), encode_s, 0.0
        encode_s = decode_s = 0.0
        if params.hires_upscaler == "lanczos":
            image, decode_s = self.decode(previous, plan.first_decode, params.rknn)
            latent, encode_s = self.encode_image(upscale_image(image, denoise_pass.width, denoise_pass.height),
                                                 plan.decode, params.rknn)
        else:
            latent = upscale_latent(previous, denoise_pass.width, denoise_pass.height, params.hires_upscaler)
        noise = noise_draws(params.seed, [(passes[0].width, passes[0].height),
                                          (denoise_pass.width, denoise_pass.height)])[1]
        return PassStart(index, denoise_pass, noised(latent, noise, sigma)), encode_s, decode_s


def _call_conditioning(conditioning: Conditioning, params: GenerationParams, index: int) -> CallConditioning | None:
    """Pass `index`'s contexts per model call under prompt editing (None: a run of one conditioning)."""
    per_pass = params.call_texts() if conditioning.by_text else None
    return None if per_pass is None else CallConditioning(*per_pass[index], conditioning.by_text)


def _pass_progress(on_step: StepCallback | None, passes: list[DenoisePass], index: int) -> StepCallback | None:
    """`on_step` told pass `index`'s events as steps of the whole run: numbered after the earlier passes' steps,
    out of all passes', the ETA with the later passes' steps at this pass's step time scaled by their pixels."""
    if on_step is None or len(passes) == 1:
        return on_step
    before, total = sum(p.steps_run for p in passes[:index]), sum(p.steps_run for p in passes)
    pixels = passes[index].width * passes[index].height
    later = sum(p.steps_run * p.width * p.height for p in passes[index + 1:]) / pixels

    def listen(event: StepEvent) -> None:
        per_step = event.elapsed_s / max(1, event.step)
        on_step(dataclasses.replace(event, step=before + event.step, total=total,
                                    eta_s=event.eta_s + per_step * later))

    return listen
