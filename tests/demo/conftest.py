"""One tiny train-demo run, shared by the tests of training and of its saved state (copy before changing)."""

from __future__ import annotations

import pytest
import torch

from anima_rknn.demo.harness import StageResult
from anima_rknn.demo.train import DemoConfig, TextEncoderSize, train_demo
from anima_rknn.model.config import DiTConfig

TINY = DemoConfig(
    seed=5, vae_steps=40, dit_steps=40, vae_batch=4, dit_batch=16, latent_pool=64, vae_dim=8, warmup_steps=5,
    vae_lr=2e-3, dit_lr=2e-3,
    text_encoder=TextEncoderSize(hidden=32, layers=1, heads=2, kv_heads=1, head_dim=16, intermediate=64),
    dit=DiTConfig(hidden=64, heads=2, blocks=2, mlp=128, adaln_lora=16, context_dim=32, adapter_source_dim=32,
                  adapter_blocks=1, adapter_heads=2, adapter_mlp=64, context_tokens=16),
)


@pytest.fixture(scope="session")
def tiny_config() -> DemoConfig:
    return TINY


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory, tiny_config) -> tuple:
    """(output folder, {stage: StageResult}) of a finished tiny run."""
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("demo")
    results: dict[str, StageResult] = train_demo(out, tiny_config, threads=1)
    return out, results
