"""Train the demo model set: a small Wan VAE first, then a small DiT + LLM adapter on its latents.

Everything is the project's own model code and file formats; the Qwen3 text encoder is frozen random (the
adapter learns to read it). The DiT learns rectified flow (x_t = (1-s) x0 + s eps, target v = eps - x0) with
caption dropout for CFG and an EMA copy, which is what gets shipped. Samples and noise are functions of
(seed, step), and a checkpoint is written every minute, so an interrupted run resumes where it stopped
(`state` keeps it, as safetensors and JSON).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..core.files import output_folder, write_json
from ..core.tensorfile import load_tensors, read_metadata, save_tensors
from ..errors import AnimaError
from ..generation.pipeline import DEFAULT_NEGATIVE
from ..model.config import DiTConfig
from ..model.dit import AnimaDiT
from ..model.io import save_dit
from ..model.model_set import LAYOUT, ModelFiles, from_model_dir
from ..sampling.schedule import shift_sigma
from ..text import PromptTokenizer, build_word_tokenizers, load_text_encoder, write_random_text_encoder
from ..vae import WanVAE, WanVAEConfig, save_vae
from ..vae.preview import store_projection
from . import dataset
from . import state as train_state
from .state import StageState
from .tiny_set import WORDS

CHECKPOINT_EVERY_S = 60.0
LOG_WINDOW = 50  # steps averaged for the loss shown and logged
DIT_FILE = "anima-demo.safetensors"
TEXT_ENCODER_FILE = "qwen3-demo-random.safetensors"
VAE_FILE = "wan-vae-demo.safetensors"
META_PREFIX = "anima_rknn.demo."
PREVIEW_FIT_IMAGES = 64


@dataclasses.dataclass(frozen=True)
class TextEncoderSize:
    hidden: int = 128  # = the DiT config's adapter_source_dim
    layers: int = 2
    heads: int = 2
    kv_heads: int = 1
    head_dim: int = 64
    intermediate: int = 256


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    seed: int = 0
    minutes: float = 35.0  # whole budget, VAE and DiT together
    vae_share: float = 0.4  # of `minutes`: the autoencoder limits the picture quality most
    vae_steps: int | None = None  # a fixed step count instead of the time budget (tests)
    dit_steps: int | None = None
    vae_batch: int = 16
    vae_lr: float = 1e-3
    kl_weight: float = 1e-4  # keeps the latent smooth for the DiT without costing much sharpness
    dit_batch: int = 64
    dit_lr: float = 8e-4
    latent_pool: int = 8192  # images encoded once: encoding on the fly would double a DiT step's cost
    warmup_steps: int = 50
    caption_dropout: float = 0.1  # half to "", half to the default negative prompt: both act as "unconditional"
    ema_decay: float = 0.995
    flow_shift: float = 3.0  # training sigmas follow the sampler's shifted schedule
    vae_dim: int = 16
    vae_res_blocks: int = 1
    text_encoder: TextEncoderSize = TextEncoderSize()
    # Captions are at most 11 T5 tokens, so 16 context rows suffice (stored in the DiT file's metadata).
    dit: DiTConfig = DiTConfig(hidden=192, heads=3, blocks=6, mlp=768, adaln_lora=48, context_dim=128,
                               adapter_source_dim=128, adapter_blocks=1, adapter_heads=2, adapter_mlp=256,
                               context_tokens=16)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> DemoConfig:
        try:
            raw = json.loads(text)
        except (ValueError, RecursionError):
            raise AnimaError("the demo config is not valid JSON") from None
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: object) -> DemoConfig:
        """A config read from a file: exactly the fields of DemoConfig, each checked like user input."""
        config = _build(cls, raw, "the demo config")
        config.validate()
        return config

    def validate(self) -> None:
        if not isinstance(self.text_encoder, TextEncoderSize) or not isinstance(self.dit, DiTConfig):
            raise AnimaError("text_encoder and dit must be a TextEncoderSize and a DiTConfig")
        for prefix, part in (("", self), ("text_encoder.", self.text_encoder), ("dit.", self.dit)):
            for field in dataclasses.fields(part):
                if field.name not in _NESTED:
                    _RULES.get(field.name, _SIZE).check(prefix + field.name, getattr(part, field.name))
        if self.dit.adapter_source_dim != self.text_encoder.hidden:
            raise AnimaError("the DiT's adapter_source_dim must equal the text encoder width")


@dataclasses.dataclass(frozen=True)
class _Range:
    """What a config value may be: an int or a finite number, between bounds (open or closed), or None."""

    kind: type
    low: float
    high: float = math.inf
    open_low: bool = False
    open_high: bool = False
    optional: bool = False

    def check(self, name: str, value: object) -> None:
        if value is None and self.optional:
            return
        kinds = (int,) if self.kind is int else (int, float)
        ok = (isinstance(value, kinds) and not isinstance(value, bool)
              and not (isinstance(value, float) and not math.isfinite(value))
              and (value > self.low if self.open_low else value >= self.low)
              and (value < self.high if self.open_high or self.high == math.inf else value <= self.high))
        if not ok:
            raise AnimaError(f"{name} must be {self.describe()}, got {_brief(value)}")

    def describe(self) -> str:
        kind = "an integer" if self.kind is int else "a finite number"
        if self.high == math.inf:
            bound = f"{'>' if self.open_low else '>='} {self.low}"
        else:
            bound = f"in {'(' if self.open_low else '['}{self.low}, {self.high}{')' if self.open_high else ']'}"
        return f"{kind} {bound}" + (" or null" if self.optional else "")


def _brief(value: object) -> str:
    """A value as a one-line message shows it (an int too long to print is described)."""
    if isinstance(value, int) and value.bit_length() > 128:
        return f"an integer of {value.bit_length()} bits"
    return f"{value!r:.40}"


_SIZE = _Range(int, 1)  # every count and size not listed in _RULES
_POSITIVE = _Range(float, 0, open_low=True)
_RULES = {
    "seed": _Range(int, 0, 2**63 - 1), "minutes": _POSITIVE, "vae_share": _Range(float, 0, 1, True, True),
    "vae_steps": _Range(int, 1, optional=True), "dit_steps": _Range(int, 1, optional=True),
    "vae_lr": _POSITIVE, "dit_lr": _POSITIVE, "kl_weight": _Range(float, 0),
    "caption_dropout": _Range(float, 0, 1), "ema_decay": _Range(float, 0, 1, open_high=True), "flow_shift": _POSITIVE,
}
_NESTED = {"text_encoder": TextEncoderSize, "dit": DiTConfig}


def _build(cls: type, raw: object, where: str):
    """`cls` from a JSON object with exactly its fields (nested configs included); values not yet checked."""
    if not isinstance(raw, dict):
        raise AnimaError(f"{where} must be a JSON object")
    names = {field.name for field in dataclasses.fields(cls)}
    if set(raw) != names:
        problems = [f"{label} {', '.join(sorted(keys))}"[:100]
                    for label, keys in (("missing", names - set(raw)), ("unknown", set(raw) - names)) if keys]
        raise AnimaError(f"{where} does not have this version's fields: {'; '.join(problems)}")
    return cls(**{k: _build(_NESTED[k], v, f"{where}.{k}") if cls is DemoConfig and k in _NESTED else v
                  for k, v in raw.items()})


@dataclasses.dataclass
class StageResult:
    steps: int
    seconds: float
    first_loss: float  # mean of the first LOG_WINDOW steps
    last_loss: float  # mean of the last LOG_WINDOW steps


# ---- small helpers ---------------------------------------------------------------------------------------


def _images_to_tensor(images: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255.0


def _learning_rate(base: float, step: int, progress: float, warmup: int) -> float:
    """Linear warm-up, then cosine down to a tenth over the stage's progress (time or steps)."""
    ramp = min(1.0, (step + 1) / warmup)
    return base * ramp * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def _add_metadata(path: Path, extra: dict[str, str]) -> None:
    """Rewrite a safetensors file with more metadata (the writers of the other parts take none)."""
    tensors = load_tensors(path, "model")
    save_tensors({k: v.clone() for k, v in tensors.items()}, path, {**read_metadata(path, "model"), **extra})


class Stage:
    """The loop shared by both stages: time or step budget, progress bar with loss and ETA, checkpoints.

    `modules` (named, e.g. model and EMA) and `optimizer` are restored from `checkpoint` if it exists."""

    def __init__(self, name: str, checkpoint: Path, steps: int | None, seconds: float,
                 modules: Mapping[str, torch.nn.Module], optimizer: torch.optim.Optimizer) -> None:
        self.name, self.checkpoint = name, checkpoint
        self.steps, self.seconds = steps, seconds
        self.modules, self.optimizer = modules, optimizer
        self.state = train_state.load_stage(checkpoint, modules, optimizer) if checkpoint.is_file() else StageState()

    def progress(self) -> float:
        s = self.state
        return s.step / self.steps if self.steps is not None else s.elapsed / self.seconds

    def run(self, train_step: Callable[[int, float], float]) -> StageResult:
        """Call train_step(step, progress) -> loss until the budget is spent; checkpoint as it goes."""
        s = self.state
        total = self.steps if self.steps is not None else self.seconds
        bar_format = "{desc} {percentage:3.0f}%|{bar}| {elapsed}<{remaining}"
        with tqdm(total=total, initial=min(s.step if self.steps is not None else s.elapsed, total),
                  desc=self.name, file=sys.stderr, bar_format=bar_format, dynamic_ncols=True) as bar:
            last_save = time.monotonic()
            while not s.done and self.progress() < 1.0:
                started = time.monotonic()
                s.losses.append(train_step(s.step, self.progress()))
                s.step += 1
                took = time.monotonic() - started
                s.elapsed += took
                bar.update(1 if self.steps is not None else took)
                bar.set_description_str(f"{self.name} step {s.step} loss {np.mean(s.losses[-LOG_WINDOW:]):.4f}")
                if time.monotonic() - last_save > CHECKPOINT_EVERY_S:
                    self.save()
                    last_save = time.monotonic()
        if not s.done:  # a stage finished before is left as it was
            s.done = True
            self.save()
        window = min(LOG_WINDOW, max(1, len(s.losses) // 2))
        return StageResult(s.step, s.elapsed, float(np.mean(s.losses[:window])), float(np.mean(s.losses[-window:])))

    def save(self) -> None:
        train_state.save_stage(self.checkpoint, self.state, self.modules, self.optimizer)


# ---- stage 1: the VAE ------------------------------------------------------------------------------------


def _vae_loss(vae: WanVAE, images: torch.Tensor, generator: torch.Generator, kl_weight: float) -> torch.Tensor:
    """Pixel MSE in [-1, 1] of a sampled posterior, plus a small KL to N(0, 1); no clamp, so edges get gradient."""
    x = images * 2 - 1
    mu, logvar = vae.conv1(vae.encoder(x)).chunk(2, dim=1)
    logvar = logvar.clamp(-30.0, 20.0)
    z = mu + torch.exp(0.5 * logvar) * torch.randn(mu.shape, generator=generator)
    recon = vae.decoder(vae.conv2(z))
    kl = 0.5 * (mu.pow(2) + logvar.exp() - 1 - logvar).mean()
    return F.mse_loss(recon, x) + kl_weight * kl


def _latent_statistics(vae: WanVAE, seed: int, count: int = 512) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of the posterior means, so the DiT sees unit-scale latents."""
    images, _ = dataset.batch(seed, 0, count)
    with torch.no_grad():
        z = vae.encode(_images_to_tensor(images))  # identity statistics: the raw posterior mean
    mean, std = z.mean(dim=(0, 2, 3)), z.std(dim=(0, 2, 3))
    return tuple(round(float(v), 5) for v in mean), tuple(round(float(v), 5) for v in std)


def train_vae(config: DemoConfig, work: Path) -> tuple[WanVAE, StageResult]:
    identity = (0.0,) * 16, (1.0,) * 16
    vae_config = WanVAEConfig(dim=config.vae_dim, z_dim=16, num_res_blocks=config.vae_res_blocks,
                              latents_mean=identity[0], latents_std=identity[1])
    torch.manual_seed(config.seed)
    vae = WanVAE(vae_config)
    optimizer = torch.optim.Adam(vae.parameters(), lr=config.vae_lr)
    stage = Stage("vae", work / train_state.VAE_STATE, config.vae_steps, 60 * config.minutes * config.vae_share,
                  {"model": vae}, optimizer)
    vae.train()

    def train_step(step: int, progress: float) -> float:
        for group in optimizer.param_groups:
            group["lr"] = _learning_rate(config.vae_lr, step, progress, config.warmup_steps)
        images, _ = dataset.batch(config.seed, step * config.vae_batch, config.vae_batch)
        loss = _vae_loss(vae, _images_to_tensor(images), torch.Generator().manual_seed(step), config.kl_weight)
        optimizer_step(loss, optimizer, vae.parameters())
        return loss.item()

    result = stage.run(train_step)
    vae.eval().requires_grad_(False)
    mean, std = _latent_statistics(vae, config.seed + 1)
    trained = WanVAE(dataclasses.replace(vae_config, latents_mean=mean, latents_std=std))
    trained.load_state_dict(vae.state_dict())
    return trained.eval().requires_grad_(False), result


# ---- stage 2: the DiT ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class EncodedCaption:
    qwen_states: torch.Tensor  # [1, S, source_dim], frozen
    t5_ids: torch.Tensor  # [1, L]
    t5_weights: torch.Tensor  # [1, L]


class CaptionBank:
    """Qwen3 states of every caption, computed once (the encoder is frozen); the adapter runs per batch."""

    def __init__(self, files: ModelFiles, captions: list[str]) -> None:
        tokenizer = PromptTokenizer.from_dirs(files.qwen_tokenizer, files.t5_tokenizer)
        encoder = load_text_encoder(files.text_encoder)
        self.captions: dict[str, EncodedCaption] = {}
        for caption in captions:
            tokens = tokenizer.encode(caption)
            # clone: the encoder's inference-mode tensors cannot take part in autograd
            self.captions[caption] = EncodedCaption(encoder.encode(tokens.qwen_ids).clone(), torch.tensor([tokens.t5_ids]),
                                                    torch.tensor([tokens.t5_weights]))

    def context(self, adapter: torch.nn.Module, captions: list[str]) -> torch.Tensor:
        """[B, context_tokens, context_dim], each row exactly what the pipeline computes for one prompt.

        Captions of equal token lengths share one adapter call; no padding, so no masks are needed."""
        groups: dict[tuple[int, int], list[int]] = {}
        for i, caption in enumerate(captions):
            encoded = self.captions[caption]
            groups.setdefault((encoded.qwen_states.shape[1], encoded.t5_ids.shape[1]), []).append(i)
        rows: list[torch.Tensor | None] = [None] * len(captions)
        for members in groups.values():
            picked = [self.captions[captions[i]] for i in members]
            out = adapter.condition(torch.cat([p.qwen_states for p in picked]), torch.cat([p.t5_ids for p in picked]),
                                    torch.cat([p.t5_weights for p in picked]))
            for i, row in zip(members, out):
                rows[i] = row
        return torch.stack(rows)


def _new_dit(config: DiTConfig, seed: int) -> AnimaDiT:
    """PyTorch default init, with adaLN-Zero: every block starts as the identity and the output as zero."""
    torch.manual_seed(seed)
    dit = AnimaDiT(config)
    with torch.no_grad():
        for name, param in dit.named_parameters():
            if ".adaln_modulation" in name and name.endswith(".2.weight") or name in (
                    "t_embedder.1.linear_2.weight", "final_layer.linear.weight"):
                param.zero_()
    return dit


def training_captions() -> list[str]:
    """Every caption the DiT trains on, the two "unconditional" ones of caption dropout included."""
    return [s.caption for s in dataset.combinations("train")] + ["", DEFAULT_NEGATIVE]


def training_caption(spec: dataset.ShapeSpec, rng: np.random.Generator, dropout: float) -> str:
    if rng.random() >= dropout:
        return spec.caption
    return "" if rng.random() < 0.5 else DEFAULT_NEGATIVE


def latent_pool(vae: WanVAE, seed: int, count: int, path: Path, split: str = "train", chunk: int = 128) -> torch.Tensor:
    """Normalised latents of dataset samples 0..count-1 of `seed` (and `split`), cached in `path` for a resumed run."""
    side = dataset.IMAGE_SIZE // vae.scale_factor
    if path.is_file():
        return train_state.load_latents(path, (count, vae.config.z_dim, side, side))
    parts = []
    with torch.no_grad():
        for start in tqdm(range(0, count, chunk), desc="encode latents", file=sys.stderr, dynamic_ncols=True):
            images, _ = dataset.batch(seed, start, min(chunk, count - start), split)
            parts.append(vae.encode(_images_to_tensor(images)))
    pool = torch.cat(parts)
    train_state.save_latents(path, pool)
    return pool


@dataclasses.dataclass(frozen=True)
class Noised:
    """A rectified-flow training batch: x_t = (1 - s) x0 + s eps at shifted sigmas s, target v = eps - x0."""

    x_t: torch.Tensor
    sigma: torch.Tensor
    target: torch.Tensor

    @classmethod
    def draw(cls, x0: torch.Tensor, rng: np.random.Generator, step: int, flow_shift: float) -> Noised:
        """Noise from the step number, sigmas from `rng` (so a resumed run draws what it would have)."""
        eps = torch.randn(x0.shape, generator=torch.Generator().manual_seed(step))
        sigma = torch.from_numpy(shift_sigma(rng.random(len(x0)), flow_shift)).float()
        x_t = (1 - sigma.view(-1, 1, 1, 1)) * x0 + sigma.view(-1, 1, 1, 1) * eps
        return cls(x_t, sigma, eps - x0)

    def loss(self, dit: AnimaDiT, bank: CaptionBank, captions: list[str]) -> torch.Tensor:
        velocity = dit(self.x_t, self.sigma, bank.context(dit.llm_adapter, captions))
        return F.mse_loss(velocity, self.target)


def optimizer_step(loss: torch.Tensor, optimizer: torch.optim.Optimizer, params) -> None:
    """Backward, clip the gradient norm to 1, step."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()


def train_dit(config: DemoConfig, work: Path, vae: WanVAE, bank: CaptionBank) -> tuple[AnimaDiT, StageResult]:
    data_seed = config.seed + 2
    dit = _new_dit(config.dit, config.seed + 2)
    ema = copy.deepcopy(dit).requires_grad_(False)
    optimizer = torch.optim.AdamW(dit.parameters(), lr=config.dit_lr, weight_decay=0.0)
    # the checkpoint is checked before the pool: a bad one fails before minutes of encoding
    seconds = 60 * config.minutes * (1 - config.vae_share)
    stage = Stage("dit", work / train_state.DIT_STATE, config.dit_steps, seconds, {"model": dit, "ema": ema}, optimizer)
    pool = latent_pool(vae, data_seed, config.latent_pool, work / train_state.LATENTS)
    dit.train()

    def train_step(step: int, progress: float) -> float:
        for group in optimizer.param_groups:
            group["lr"] = _learning_rate(config.dit_lr, step, progress, config.warmup_steps)
        rng = np.random.default_rng((config.seed, 2, step))
        picked = rng.integers(config.latent_pool, size=config.dit_batch)
        noised = Noised.draw(pool[torch.from_numpy(picked)], rng, step, config.flow_shift)
        captions = [training_caption(dataset.sample(data_seed, int(i)), rng, config.caption_dropout) for i in picked]
        loss = noised.loss(dit, bank, captions)
        optimizer_step(loss, optimizer, dit.parameters())
        decay = min(config.ema_decay, (1 + step) / (10 + step))  # early on, follow the model closely
        with torch.no_grad():
            for e, p in zip(ema.parameters(), dit.parameters()):
                e.lerp_(p, 1 - decay)
        return loss.item()

    result = stage.run(train_step)
    return ema.eval(), result


# ---- the whole run ---------------------------------------------------------------------------------------


def store_preview_projection(vae_path: Path, config: DemoConfig) -> Path:
    """The live preview's projection of the trained VAE, fitted on the DiT's training pictures (what the set
    draws), stored beside the VAE file."""
    images, _ = dataset.batch(config.seed + 2, 0, PREVIEW_FIT_IMAGES)  # train_dit's data seed
    return store_projection(vae_path, _images_to_tensor(images))


def check_resume(work: Path, config, holder: Path, **folder) -> None:
    """A resumed run must be the run that was started (only the time budget may change); its files must all
    be the command's own (`folder`: check_work_folder's stages, pools and command), in their formats. `config`
    is a DemoConfig or a config class like it (from_dict, minutes). Nothing is written before this passes."""
    saved = work / train_state.CONFIG_FILE
    train_state.check_work_folder(work, **folder)
    if saved.is_file():
        raw = train_state.read_json(saved)
        try:
            before = type(config).from_dict(raw)
        except AnimaError as e:
            raise AnimaError(f"{saved}: {e}") from None
        if dataclasses.replace(before, minutes=config.minutes) != config:
            raise AnimaError(f"{holder} holds a training run with another configuration; use a new --out")


def _stage_metadata(config: DemoConfig, result: StageResult) -> dict[str, str]:
    return {META_PREFIX + "config": config.to_json(), META_PREFIX + "seed": str(config.seed),
            META_PREFIX + "training": json.dumps(dataclasses.asdict(result)),
            META_PREFIX + "image_size": str(dataset.IMAGE_SIZE)}


def _write_text_side(out: Path, config: DemoConfig) -> ModelFiles:
    """Both word tokenizers and the frozen random Qwen3 (deterministic, so rewriting on resume is harmless)."""
    qwen_dir, t5_dir = out / LAYOUT["qwen_tokenizer"], out / LAYOUT["t5_tokenizer"]
    # The sample words of make-tiny too, so that the default negative prompt is made of known words.
    build_word_tokenizers(dataset.vocabulary() + list(WORDS), qwen_dir, t5_dir)
    tokenizer = PromptTokenizer.from_dirs(qwen_dir, t5_dir)
    for key in ("dit", "text_encoder", "vae"):
        (out / LAYOUT[key]).mkdir(parents=True, exist_ok=True)
    encoder_path = out / LAYOUT["text_encoder"] / TEXT_ENCODER_FILE
    write_random_text_encoder(encoder_path, vocab=tokenizer.qwen.get_vocab_size(), seed=config.seed + 1,
                              **dataclasses.asdict(config.text_encoder))
    _add_metadata(encoder_path, {META_PREFIX + "config": config.to_json(), META_PREFIX + "seed": str(config.seed)})
    return ModelFiles(dit=out / LAYOUT["dit"] / DIT_FILE, text_encoder=encoder_path,
                      vae=out / LAYOUT["vae"] / VAE_FILE, qwen_tokenizer=qwen_dir, t5_tokenizer=t5_dir)


def train_demo(out: str | Path, config: DemoConfig = DemoConfig(), threads: int = 2,
               overwrite: bool = False) -> dict[str, StageResult]:
    """Train (or resume) the demo model set into `out` (model-directory layout; work files in out/.train).

    `out` must be new, empty, or hold this run's own interrupted work; `overwrite` allows a folder that holds
    anything else (its model files are then replaced).

    On a machine shared with other jobs, threads=1 can be several times faster than 2 (no waiting on a
    descheduled partner thread)."""
    config.validate()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise AnimaError(f"threads must be an integer >= 1, got {_brief(threads)}")
    out = Path(out)
    holds = "a model set" if (out / "split_files").exists() else "other files"
    work = out / train_state.WORK_FOLDER
    output_folder(out, overwrite=overwrite, holds=holds, resumable=str(Path(work.name) / train_state.CONFIG_FILE))
    check_resume(work, config, out)
    work.mkdir(exist_ok=True)
    write_json(work / train_state.CONFIG_FILE, dataclasses.asdict(config), overwrite=True)
    torch.set_num_threads(threads)
    files = _write_text_side(out, config)
    t5_vocab = PromptTokenizer.from_dirs(files.qwen_tokenizer, files.t5_tokenizer).t5.get_vocab_size()
    config = dataclasses.replace(config, dit=dataclasses.replace(config.dit, t5_vocab=t5_vocab))

    vae, vae_result = train_vae(config, work)
    save_vae(vae, files.vae)
    _add_metadata(files.vae, _stage_metadata(config, vae_result))
    store_preview_projection(files.vae, config)

    bank = CaptionBank(files, training_captions())
    dit, dit_result = train_dit(config, work, vae, bank)
    save_dit(dit, files.dit, metadata=_stage_metadata(config, dit_result))
    from_model_dir(out)  # the set loads like any other
    return {"vae": vae_result, "dit": dit_result}

