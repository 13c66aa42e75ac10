"""Train the demo LoRA: it teaches the frozen demo model "large" shapes, a word its training never showed.

The DiT and its LLM adapter stay frozen; rank-r pairs (down [r, in], up [out, r]) on every attention and MLP
linear layer of the DiT blocks and of the adapter learn with train-demo's rectified-flow loss. Each batch is
part large shapes (dataset split "large"), part ordinary training pictures, so the base ability is kept. The
pairs are written in kohya layout (alpha = rank, so `--lora FILE:1` adds up @ down: what was trained). Like
train-demo it checkpoints every minute into a work folder beside the output (FILE.train/), resumes from it,
and removes it once the LoRA file is written.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn.utils import parametrize

from ..checks import check_int
from ..core.files import check_output_file, write_json
from ..core.tensorfile import save_tensors
from ..core.threads import AUTO_THREADS, MAX_THREADS, resolve_threads, use_threads
from ..errors import AnimaError
from ..model.io import load_dit
from ..model.lora import kohya_tensors, linear_shapes
from ..model.model_set import ModelFiles, from_model_dir
from ..vae import load_vae
from . import dataset, demo_model_dir
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
    latent_pool,
    learning_rate,
    optimizer_step,
    training_caption,
    training_captions,
)

# Attention and MLP linears of the DiT blocks and of the adapter's blocks (not AdaLN, embedders, final layer).
TARGETS = re.compile(r"(llm_adapter\.)?blocks\.\d+\.(self_attn|cross_attn|mlp)\..+")
META_KEY = "anima_rknn.demo.lora"
WORK_SUFFIX = ".train"
_FOLDER = dict(stages=(train_state.LORA_STATE,), pools=(train_state.LATENTS, train_state.CONCEPT_LATENTS),
               command="train-demo-lora", staging=None)


@dataclasses.dataclass(frozen=True)
class LoraTrainConfig:
    seed: int = 0
    minutes: float = 12.0
    steps: int | None = None  # a fixed step count instead of the time budget
    rank: int = 8
    batch: int = 32
    concept_share: float = 0.5  # of each batch: large shapes; the rest ordinary pictures
    lr: float = 2e-3
    warmup_steps: int = 20
    latent_pool: int = 1024  # of each kind of picture
    caption_dropout: float = 0.1  # as in train-demo: CFG's unconditional prediction stays trained
    flow_shift: float = 3.0

    @classmethod
    def from_dict(cls, raw: object) -> LoraTrainConfig:
        config = build_config(cls, raw, "the LoRA training config")
        config.validate()
        return config

    def validate(self) -> None:
        for field in dataclasses.fields(self):
            _RULES.get(field.name, SIZE).check(field.name, getattr(self, field.name))
        if not 1 <= round(self.batch * self.concept_share) < self.batch:
            raise AnimaError(f"batch {self.batch} with concept_share {self.concept_share} leaves no picture of "
                             "one kind; use a larger batch or a share further from 0 and 1")


_RULES = {"seed": Range(int, 0, 2**63 - 1), "minutes": POSITIVE, "steps": Range(int, 1, optional=True),
          "rank": Range(int, 1, 64), "concept_share": Range(float, 0, 1, True, True), "lr": POSITIVE,
          "caption_dropout": Range(float, 0, 1), "flow_shift": POSITIVE}


class LowRankDelta(nn.Module):
    """weight -> weight + up @ down: what lora.py's merge adds at scale 1 and alpha = rank, applied in training.

    up starts at zero, so training starts from the base model exactly."""

    def __init__(self, out_features: int, in_features: int, rank: int, generator: torch.Generator) -> None:
        super().__init__()
        self.down = nn.Parameter(torch.randn(rank, in_features, generator=generator) / math.sqrt(in_features))
        self.up = nn.Parameter(torch.zeros(out_features, rank))

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight + self.up @ self.down


def target_modules(model: nn.Module) -> list[str]:
    """The linear layers the demo LoRA adapts, in a fixed order."""
    return sorted(name for name in linear_shapes(model.config) if TARGETS.fullmatch(name))


def add_lora(model: nn.Module, rank: int, seed: int) -> dict[str, LowRankDelta]:
    """Frozen `model` with a trainable LowRankDelta on each target layer's weight: module name -> its pair."""
    model.requires_grad_(False)
    generator = torch.Generator().manual_seed(seed)
    pairs = {}
    for name in target_modules(model):
        linear = model.get_submodule(name)
        pairs[name] = LowRankDelta(linear.out_features, linear.in_features, rank, generator)
        parametrize.register_parametrization(linear, "weight", pairs[name])
    return pairs


def work_folder(out: Path) -> Path:
    return out.with_name(out.name.removesuffix(".safetensors") + WORK_SUFFIX)


def concept_captions() -> list[str]:
    return [s.caption for s in dataset.combinations(dataset.LARGE)]


def train_demo_lora(out: str | Path, config: LoraTrainConfig = LoraTrainConfig(), model: str | Path | None = None,
                    overwrite: bool = False, threads: int = 1) -> StageResult:
    """Train (or resume) the demo LoRA into `out` (.safetensors, kohya layout) for the model set `model`
    (default: the shipped demo model). `threads`: torch's, as --threads (0: auto); by default one, as the demo
    LoRA was made: the machines it is made on are shared."""
    config.validate()
    check_int("threads", threads, AUTO_THREADS, MAX_THREADS)
    out = check_output_file(out, overwrite=overwrite, suffixes=(".safetensors",))
    files = from_model_dir(Path(model) if model is not None else demo_model_dir())
    work = work_folder(out)
    check_resume(work, config, work, **_FOLDER)
    work.mkdir(exist_ok=True)
    write_json(work / train_state.CONFIG_FILE, dataclasses.asdict(config), overwrite=True)
    use_threads(resolve_threads(threads))
    pairs, result = _train(config, files, work)
    metadata = {"ss_network_module": "networks.lora", "ss_network_dim": str(config.rank),
                "ss_network_alpha": str(config.rank), META_KEY: json.dumps(dataclasses.asdict(config)),
                META_KEY + ".training": json.dumps(dataclasses.asdict(result)),
                META_KEY + ".concept": dataset.LARGE}
    tensors = kohya_tensors({name: (p.down.detach(), p.up.detach()) for name, p in pairs.items()}, config.rank)
    save_tensors(tensors, out, metadata, overwrite=overwrite)
    shutil.rmtree(work)  # only train-demo-lora's own files (checked above); the run is complete
    return result


def _train(config: LoraTrainConfig, files: ModelFiles, work: Path) -> tuple[dict[str, LowRankDelta], StageResult]:
    dit = load_dit(files.dit, torch.float32)
    pairs = add_lora(dit, config.rank, config.seed)
    params = [p for pair in pairs.values() for p in pair.parameters()]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
    # the checkpoint is checked before the pools: a bad one fails before the encoding
    stage = Stage("lora", work / train_state.LORA_STATE, config.steps, 60 * config.minutes,
                  {"lora": nn.ModuleList(pairs.values())}, optimizer)
    vae = load_vae(files.vae, decode_only=False)
    data_seed = config.seed + 3
    pools = {split: latent_pool(vae, data_seed, config.latent_pool, work / name, split)
             for split, name in (("train", train_state.LATENTS), (dataset.LARGE, train_state.CONCEPT_LATENTS))}
    bank = CaptionBank(files, training_captions() + concept_captions())
    counts = {dataset.LARGE: round(config.batch * config.concept_share)}
    counts["train"] = config.batch - counts[dataset.LARGE]

    def train_step(step: int, progress: float) -> float:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(config.lr, step, progress, config.warmup_steps)
        rng = np.random.default_rng((config.seed, 3, step))
        picked = {split: rng.integers(config.latent_pool, size=n) for split, n in counts.items()}
        x0 = torch.cat([pools[split][torch.from_numpy(i)] for split, i in picked.items()])
        noised = Noised.draw(x0, rng, step, config.flow_shift)
        captions = [training_caption(dataset.sample(data_seed, int(i), split), rng, config.caption_dropout)
                    for split, indices in picked.items() for i in indices]
        loss = noised.loss(dit, bank, captions)
        optimizer_step(loss, optimizer, params)
        return loss.item()

    return pairs, stage.run(train_step)


__all__ = ["LoraTrainConfig", "LowRankDelta", "add_lora", "target_modules", "train_demo_lora", "work_folder"]
