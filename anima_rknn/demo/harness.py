"""The training harness that train-demo and train-demo-lora share: config values checked like user input, the
caption bank, the latent pool, rectified-flow noising, the learning-rate schedule, and the stage loop that
checkpoints as it goes and resumes (a resumed run must be the run that was started).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Protocol, TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..checks import is_integer, is_number, require
from ..errors import AnimaError
from ..generation.params import DEFAULT_NEGATIVE
from ..model.dit import AnimaDiT
from ..model.model_set import ModelFiles
from ..sampling.schedule import shift_sigma
from ..text import PromptTokenizer, load_text_encoder
from ..vae import WanVAE
from . import dataset
from . import state as train_state
from .state import StageState

CHECKPOINT_EVERY_S = 60.0
LOG_WINDOW = 50  # steps averaged for the loss shown and logged

Config = TypeVar("Config")


class ResumableConfig(Protocol):
    """A run's config as check_resume reads it: a frozen dataclass with a time budget, readable from JSON."""

    minutes: float

    @classmethod
    def from_dict(cls, raw: object) -> ResumableConfig: ...


# ---- configs ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Range:
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
        ok = ((is_integer(value) if self.kind is int else is_number(value))
              and (value > self.low if self.open_low else value >= self.low)
              and (value < self.high if self.open_high or self.high == math.inf else value <= self.high))
        require(ok, f"{name} must be {self.describe()}, got {brief_repr(value)}")

    def describe(self) -> str:
        kind = "an integer" if self.kind is int else "a finite number"
        if self.high == math.inf:
            bound = f"{'>' if self.open_low else '>='} {self.low}"
        else:
            bound = f"in {'(' if self.open_low else '['}{self.low}, {self.high}{')' if self.open_high else ']'}"
        return f"{kind} {bound}" + (" or null" if self.optional else "")


def brief_repr(value: object) -> str:
    """A value as a one-line message shows it (an int too long to print is described)."""
    if isinstance(value, int) and value.bit_length() > 128:
        return f"an integer of {value.bit_length()} bits"
    return f"{value!r:.40}"


SIZE = Range(int, 1)  # every count and size a config's rules do not list
POSITIVE = Range(float, 0, open_low=True)


def build_config(cls: type[Config], raw: object, where: str, nested: Mapping[str, type] | None = None) -> Config:
    """`cls` from a JSON object with exactly its fields, those in `nested` built as their config classes in
    turn; values not yet checked."""
    if not isinstance(raw, dict):
        raise AnimaError(f"{where} must be a JSON object")
    names = {field.name for field in dataclasses.fields(cls)}
    if set(raw) != names:
        problems = [f"{label} {', '.join(sorted(keys))}"[:100]
                    for label, keys in (("missing", names - set(raw)), ("unknown", set(raw) - names)) if keys]
        raise AnimaError(f"{where} does not have this version's fields: {'; '.join(problems)}")
    nested = nested or {}
    return cls(**{k: build_config(nested[k], v, f"{where}.{k}") if k in nested else v for k, v in raw.items()})


def check_resume(work: Path, config: ResumableConfig, holder: Path, **folder: tuple[str, ...] | str) -> None:
    """A resumed run must be the run that was started (only the time budget may change); its files must all
    be the command's own (`folder`: check_work_folder's stages, pools and command), in their formats. `config`
    is a DemoConfig or a config class like it. Nothing is written before this passes."""
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


# ---- the stage loop --------------------------------------------------------------------------------------


@dataclasses.dataclass
class StageResult:
    steps: int
    seconds: float
    first_loss: float  # mean of the first LOG_WINDOW steps
    last_loss: float  # mean of the last LOG_WINDOW steps


def learning_rate(base: float, step: int, progress: float, warmup: int) -> float:
    """Linear warm-up, then cosine down to a tenth over the stage's progress (time or steps)."""
    ramp = min(1.0, (step + 1) / warmup)
    return base * ramp * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


class NonFiniteLoss(Exception):
    """A step's loss was NaN or infinite: its update was not applied (Stage.run ends the stage on it)."""

    def __init__(self, loss: float) -> None:
        super().__init__(f"loss {loss}")
        self.loss = loss


def optimizer_step(loss: torch.Tensor, optimizer: torch.optim.Optimizer, params: Iterable[torch.Tensor]) -> None:
    """Backward, clip the gradient norm to 1, step; a non-finite loss is NonFiniteLoss, before anything changes
    (its gradients would make every weight NaN)."""
    if not torch.isfinite(loss.detach()).all():
        raise NonFiniteLoss(float(loss.detach()))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()


class Stage:
    """The loop every training stage runs: time or step budget, progress bar with loss and ETA, checkpoints.

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
                try:
                    loss = train_step(s.step, self.progress())
                except NonFiniteLoss as e:  # the state is still the last good step's: kept, to look at or resume
                    self.save()
                    raise AnimaError(f"{self.name} step {s.step + 1}: the loss is {e.loss}; training stopped, the "
                                     f"state after step {s.step} is kept in {self.checkpoint}") from None
                s.losses.append(loss)
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


# ---- what the DiT learns from ----------------------------------------------------------------------------


def images_to_tensor(images: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255.0


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
            parts.append(vae.encode(images_to_tensor(images)))
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
