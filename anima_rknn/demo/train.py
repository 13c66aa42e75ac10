"""Train the demo model set: a small Wan VAE first, then a small DiT + LLM adapter on its latents.

Everything is the project's own model code and file formats; the Qwen3 text encoder is frozen random (the
adapter learns to read it). The DiT learns rectified flow (x_t = (1-s) x0 + s eps, target v = eps - x0) with
caption dropout for CFG and an EMA copy, which is what gets shipped. Samples and noise are functions of
(seed, step), and a checkpoint is written every minute, so an interrupted run resumes where it stopped
(`state` keeps it, as safetensors and JSON). The stage loop, the noising, the caption bank and the config
checks are harness.py's, shared with train-demo-lora.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..checks import check_int
from ..core.files import check_name, check_space, held_folder, move_files, output_folder, parameter_bytes, write_json
from ..core.tensorfile import load_tensors, read_metadata, save_tensors
from ..core.threads import AUTO_THREADS, MAX_THREADS, resolve_threads, use_threads
from ..errors import AnimaError
from ..model.config import DiTConfig
from ..model.dit import AnimaDiT
from ..model.io import save_dit
from ..model.model_set import LAYOUT, ModelFiles, from_model_dir
from ..text import PromptTokenizer, build_word_tokenizers, write_random_text_encoder
from ..vae import WanVAE, WanVAEConfig, save_vae
from ..vae.preview import store_projection
from . import dataset
from . import state as train_state
from .harness import (
    POSITIVE,
    SIZE,
    CaptionBank,
    Noised,
    Range,
    Stage,
    StageResult,
    build_config,
    check_resume,
    images_to_tensor,
    latent_pool,
    learning_rate,
    optimizer_step,
    training_caption,
    training_captions,
)
from .tiny_set import WORDS

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
        config = build_config(cls, raw, "the demo config", _NESTED)
        config.validate()
        return config

    def validate(self) -> None:
        if not isinstance(self.text_encoder, TextEncoderSize) or not isinstance(self.dit, DiTConfig):
            raise AnimaError("text_encoder and dit must be a TextEncoderSize and a DiTConfig")
        for prefix, part in (("", self), ("text_encoder.", self.text_encoder), ("dit.", self.dit)):
            for field in dataclasses.fields(part):
                if field.name not in _NESTED:
                    _RULES.get(field.name, SIZE).check(prefix + field.name, getattr(part, field.name))
        if self.dit.adapter_source_dim != self.text_encoder.hidden:
            raise AnimaError("the DiT's adapter_source_dim must equal the text encoder width")


_RULES = {  # every field not listed is a count or size (SIZE)
    "seed": Range(int, 0, 2**63 - 1), "minutes": POSITIVE, "vae_share": Range(float, 0, 1, True, True),
    "vae_steps": Range(int, 1, optional=True), "dit_steps": Range(int, 1, optional=True),
    "vae_lr": POSITIVE, "dit_lr": POSITIVE, "kl_weight": Range(float, 0),
    "caption_dropout": Range(float, 0, 1), "ema_decay": Range(float, 0, 1, open_high=True), "flow_shift": POSITIVE,
}
_NESTED = {"text_encoder": TextEncoderSize, "dit": DiTConfig}


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
        z = vae.encode(images_to_tensor(images))  # identity statistics: the raw posterior mean
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
            group["lr"] = learning_rate(config.vae_lr, step, progress, config.warmup_steps)
        images, _ = dataset.batch(config.seed, step * config.vae_batch, config.vae_batch)
        loss = _vae_loss(vae, images_to_tensor(images), torch.Generator().manual_seed(step), config.kl_weight)
        optimizer_step(loss, optimizer, vae.parameters())
        return loss.item()

    result = stage.run(train_step)
    vae.eval().requires_grad_(False)
    mean, std = _latent_statistics(vae, config.seed + 1)
    trained = WanVAE(dataclasses.replace(vae_config, latents_mean=mean, latents_std=std))
    trained.load_state_dict(vae.state_dict())
    return trained.eval().requires_grad_(False), result


# ---- stage 2: the DiT ------------------------------------------------------------------------------------


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
            group["lr"] = learning_rate(config.dit_lr, step, progress, config.warmup_steps)
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
    return store_projection(vae_path, images_to_tensor(images))


def _publish_with_metadata(written: Path, path: Path, extra: dict[str, str], overwrite: bool) -> None:
    """`written` (a file of the staging folder, this run's alone) published as `path` with more metadata (the
    writers of the other parts take none); `path` replaced only if `overwrite`."""
    tensors = load_tensors(written, "model")
    save_tensors({k: v.clone() for k, v in tensors.items()}, path, {**read_metadata(written, "model"), **extra},
                 overwrite=overwrite)
    written.unlink()


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
    written = out / TEXT_ENCODER_FILE
    write_random_text_encoder(written, vocab=tokenizer.qwen.get_vocab_size(), seed=config.seed + 1,
                              **dataclasses.asdict(config.text_encoder))
    _publish_with_metadata(written, encoder_path, {META_PREFIX + "config": config.to_json(),
                                                   META_PREFIX + "seed": str(config.seed)}, False)
    return ModelFiles(dit=out / LAYOUT["dit"] / DIT_FILE, text_encoder=encoder_path,
                      vae=out / LAYOUT["vae"] / VAE_FILE, qwen_tokenizer=qwen_dir, t5_tokenizer=t5_dir)


def estimated_size(config: DemoConfig) -> int:
    """About the bytes a run writes at its peak: per trained number its checkpoint's float32 weights, EMA copy and
    two Adam moments, twice while a checkpoint replaces the last, and the set's bfloat16 copy; the frozen text
    encoder is small beside them."""
    with torch.device("meta"):
        models = AnimaDiT(config.dit), WanVAE(WanVAEConfig(dim=config.vae_dim, num_res_blocks=config.vae_res_blocks))
    return parameter_bytes(models, 2 * 16 + 2)


def train_demo(out: str | Path, config: DemoConfig = DemoConfig(), threads: int = AUTO_THREADS,
               overwrite: bool = False) -> dict[str, StageResult]:
    """Train (or resume) the demo model set into `out` (model-directory layout; work files in out/.train). The set
    is built in out/.train/set and moved into `out` only once it is whole, so a run stopped before leaves no set.

    `out` must be new, empty, or hold this run's own interrupted work; `overwrite` allows a folder that holds
    anything else (its model files are then replaced).

    `threads`: torch's, as --threads everywhere (0: auto, core/threads.py). On a machine shared with other jobs,
    threads=1 can be several times faster than 2 (no waiting on a descheduled partner thread)."""
    config.validate()
    check_int("threads", threads, AUTO_THREADS, MAX_THREADS)
    out = check_name(out)  # before anything looks at it: a name too long is an OSError there
    check_space(out.parent, estimated_size(config), "train-demo")  # before minutes of training
    holds = "a model set" if (out / "split_files").exists() else "other files"
    work = out / train_state.WORK_FOLDER
    resumable = str(Path(work.name) / train_state.CONFIG_FILE)
    # Held for the whole run (a second one into the folder is refused). The model files there now are this run's
    # own interrupted work (or --overwrite's to replace): one that appears later is not, and stays.
    with held_folder(lambda: output_folder(out, overwrite=overwrite, holds=holds, resumable=resumable)):
        check_resume(work, config, out)
        present = {path for path in out.rglob("*") if path.is_file() and work not in path.parents}
        work.mkdir(exist_ok=True)
        write_json(work / train_state.CONFIG_FILE, dataclasses.asdict(config), overwrite=True)
        staging = work / train_state.SET_STAGING
        shutil.rmtree(staging, ignore_errors=True)  # a killed run's: rebuilt from the checkpoints
        use_threads(resolve_threads(threads))
        try:
            dit, results = _train_set(staging, work, config)
            staged = sorted((path for path in staging.rglob("*") if path.is_file()), key=lambda path: path == dit)
            move_files((path, out / path.relative_to(staging), overwrite or out / path.relative_to(staging) in present)
                       for path in staged)  # the DiT last: a set is whole once it is there
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # a stopped run leaves its checkpoints alone, and no set
        return results


def _train_set(staging: Path, work: Path, config: DemoConfig) -> tuple[Path, dict[str, StageResult]]:
    """Train both stages (resuming from the checkpoints in `work`) and write the whole set into `staging`, checked
    to load; returns its DiT file and the stages' results."""
    files = _write_text_side(staging, config)
    t5_vocab = PromptTokenizer.from_dirs(files.qwen_tokenizer, files.t5_tokenizer).t5.get_vocab_size()
    config = dataclasses.replace(config, dit=dataclasses.replace(config.dit, t5_vocab=t5_vocab))

    vae, vae_result = train_vae(config, work)
    save_vae(vae, staging / VAE_FILE)
    _publish_with_metadata(staging / VAE_FILE, files.vae, _stage_metadata(config, vae_result), False)
    store_preview_projection(files.vae, config)

    bank = CaptionBank(files, training_captions())
    dit, dit_result = train_dit(config, work, vae, bank)
    save_dit(dit, files.dit, metadata=_stage_metadata(config, dit_result), overwrite=False)
    from_model_dir(staging)  # the set loads like any other, before it is published
    return files.dit, {"vae": vae_result, "dit": dit_result}
