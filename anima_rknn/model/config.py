"""Sizes of the Anima DiT and its LLM adapter, and how to read them off a checkpoint's tensor shapes."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence

from ..errors import AnimaError

CONTEXT_TOKENS = 512  # the adapter output is zero-padded / cut to this many rows


@dataclasses.dataclass(frozen=True)
class DiTConfig:
    hidden: int = 2048
    heads: int = 16
    blocks: int = 28
    mlp: int = 8192
    adaln_lora: int = 256
    in_channels: int = 16
    patch: int = 2
    context_dim: int = 1024  # adapter output width = DiT cross-attention input width
    adapter_source_dim: int = 1024  # Qwen3 hidden size
    adapter_blocks: int = 6
    adapter_heads: int = 16
    adapter_mlp: int = 4096
    t5_vocab: int = 32128
    context_tokens: int = CONTEXT_TOKENS

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def adapter_head_dim(self) -> int:
        return self.context_dim // self.adapter_heads

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


PRESETS: dict[str, DiTConfig] = {
    "full": DiTConfig(),
    # Big enough that a transformer pass dominates a step; small enough for a CPU benchmark.
    "mid": DiTConfig(hidden=512, heads=4, blocks=8, mlp=2048, adaln_lora=128, context_dim=256,
                     adapter_source_dim=256, adapter_blocks=2, adapter_heads=4, adapter_mlp=1024),
    "tiny": DiTConfig(hidden=128, heads=2, blocks=2, mlp=512, adaln_lora=32, context_dim=64,
                      adapter_source_dim=64, adapter_blocks=2, adapter_heads=2, adapter_mlp=256, t5_vocab=512),
}


def _require(shapes: Mapping[str, Sequence[int]], key: str) -> Sequence[int]:
    if key not in shapes:
        raise AnimaError(f"not an Anima DiT checkpoint: missing tensor {key}")
    return shapes[key]


def infer_dit_config(shapes: Mapping[str, Sequence[int]], context_tokens: int = CONTEXT_TOKENS) -> DiTConfig:
    """Read the model sizes from unprefixed tensor names -> shapes (the same code serves every size)."""
    hidden, patch_features = _require(shapes, "x_embedder.proj.1.weight")
    block_ids = {int(m.group(1)) for k in shapes if (m := re.match(r"blocks\.(\d+)\.", k))}
    if not block_ids:
        raise AnimaError("not an Anima DiT checkpoint: no blocks.N.* tensors")
    head_dim = _require(shapes, "blocks.0.self_attn.q_norm.weight")[0]
    embed_rows, context_dim = _require(shapes, "llm_adapter.embed.weight")
    adapter_block_ids = {int(m.group(1)) for k in shapes if (m := re.match(r"llm_adapter\.blocks\.(\d+)\.", k))}
    adapter_head_dim = _require(shapes, "llm_adapter.blocks.0.self_attn.q_norm.weight")[0]
    in_channels = patch_features // 4 - 1  # patch 2x2 over latent channels + the padding-mask channel
    if patch_features != (in_channels + 1) * 4 or hidden % head_dim:
        raise AnimaError(f"unexpected x_embedder.proj.1.weight shape {list(shapes['x_embedder.proj.1.weight'])}")
    return DiTConfig(
        hidden=hidden,
        heads=hidden // head_dim,
        blocks=max(block_ids) + 1,
        mlp=_require(shapes, "blocks.0.mlp.layer1.weight")[0],
        adaln_lora=_require(shapes, "blocks.0.adaln_modulation_self_attn.1.weight")[0],
        in_channels=in_channels,
        patch=2,
        context_dim=context_dim,
        adapter_source_dim=_require(shapes, "llm_adapter.blocks.0.cross_attn.k_proj.weight")[1],
        adapter_blocks=max(adapter_block_ids) + 1 if adapter_block_ids else 0,
        adapter_heads=context_dim // adapter_head_dim,
        adapter_mlp=_require(shapes, "llm_adapter.blocks.0.mlp.0.weight")[0],
        t5_vocab=embed_rows,
        context_tokens=context_tokens,
    )
