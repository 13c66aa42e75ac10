"""Random LoRAs written in the layouts users have (ComfyUI, kohya), for any DiT config."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from anima_rknn.core.tensorfile import save_tensors
from anima_rknn.model.config import DiTConfig
from anima_rknn.model.lora import linear_shapes

RANK = 4


def random_pairs(config: DiTConfig, seed: int, modules: Iterable[str] | None = None,
                 strength: float = 0.2) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """module -> (down [rank, in], up [out, rank]) for every linear layer (or `modules`): attention, MLP,
    AdaLN, embedders, final layer and the LLM adapter."""
    g = torch.Generator().manual_seed(seed)
    shapes = linear_shapes(config)
    pairs = {}
    for module in modules or shapes:
        out, inp = shapes[module]
        pairs[module] = (torch.randn(RANK, inp, generator=g) / inp**0.5,
                         strength * torch.randn(out, RANK, generator=g) / RANK**0.5)
    return pairs


def comfy(pairs) -> dict[str, torch.Tensor]:
    return {f"diffusion_model.{m}.lora_{ab}.weight": t for m, (down, up) in pairs.items()
            for ab, t in (("A", down), ("B", up))}


def kohya(pairs, alpha: float = float(RANK)) -> dict[str, torch.Tensor]:
    """sd-scripts' names; with alpha != rank the up matrix is rescaled so the delta stays the same."""
    out = {}
    for module, (down, up) in pairs.items():
        name = "lora_unet_" + module.replace(".", "_")
        out |= {f"{name}.lora_down.weight": down, f"{name}.lora_up.weight": up * RANK / alpha,
                f"{name}.alpha": torch.tensor(alpha)}
    return out


def write_lora(path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    save_tensors(tensors, path)
    return path
