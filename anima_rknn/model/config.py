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


MAX_BLOCKS = 1024  # Anima has 28; a header naming blocks.99999999 must not make us build that many


def _require(shapes: Mapping[str, Sequence[int]], key: str, rank: int) -> tuple[int, ...]:
    if key not in shapes:
        raise AnimaError(f"not an Anima DiT checkpoint: missing tensor {key}")
    shape = tuple(shapes[key])
    if len(shape) != rank or not all(shape):
        raise AnimaError(f"Anima DiT tensor {key} has shape {list(shape)}, expected {rank} non-zero sizes")
    return shape


def _count_blocks(shapes: Mapping[str, Sequence[int]], prefix: str) -> int:
    ids = {int(m.group(1)) for k in shapes if (m := re.match(rf"{re.escape(prefix)}([0-9]{{1,9}})\.", k))}
    if not ids:
        raise AnimaError(f"not an Anima DiT checkpoint: no {prefix}N.* tensors")
    if max(ids) >= MAX_BLOCKS:
        raise AnimaError(f"Anima DiT tensor names {prefix}{max(ids)}.*, but at most {MAX_BLOCKS} blocks are read")
    return max(ids) + 1


def infer_dit_config(shapes: Mapping[str, Sequence[int]], context_tokens: int = CONTEXT_TOKENS) -> DiTConfig:
    """Read the model sizes from unprefixed tensor names -> shapes (the same code serves every size).

    Every size is the non-zero size of some tensor, whose data the file must hold, so none can exceed what
    the file's real size allows; the block counts are bounded apart, since a block is named, not sized.
    """
    hidden, patch_features = _require(shapes, "x_embedder.proj.1.weight", 2)
    blocks = _count_blocks(shapes, "blocks.")
    (head_dim,) = _require(shapes, "blocks.0.self_attn.q_norm.weight", 1)
    embed_rows, context_dim = _require(shapes, "llm_adapter.embed.weight", 2)
    adapter_blocks = _count_blocks(shapes, "llm_adapter.blocks.")
    (adapter_head_dim,) = _require(shapes, "llm_adapter.blocks.0.self_attn.q_norm.weight", 1)
    in_channels = patch_features // 4 - 1  # patch 2x2 over latent channels + the padding-mask channel
    if in_channels < 1 or patch_features != (in_channels + 1) * 4:
        raise AnimaError(f"unexpected x_embedder.proj.1.weight shape {[hidden, patch_features]}")
    # The 3-D RoPE splits a head over (t, h, w) in even parts of at least 4; the adapter's 1-D RoPE in halves.
    if hidden % head_dim or head_dim % 2 or head_dim < 12:
        raise AnimaError(f"Anima DiT head size {head_dim} (blocks.0.self_attn.q_norm.weight) must be even, "
                         f"at least 12 and divide the width {hidden}")
    if context_dim % adapter_head_dim or adapter_head_dim % 2:
        raise AnimaError(f"Anima DiT LLM adapter head size {adapter_head_dim} must be even and divide "
                         f"its width {context_dim}")
    return DiTConfig(
        hidden=hidden,
        heads=hidden // head_dim,
        blocks=blocks,
        mlp=_require(shapes, "blocks.0.mlp.layer1.weight", 2)[0],
        adaln_lora=_require(shapes, "blocks.0.adaln_modulation_self_attn.1.weight", 2)[0],
        in_channels=in_channels,
        patch=2,
        context_dim=context_dim,
        adapter_source_dim=_require(shapes, "llm_adapter.blocks.0.cross_attn.k_proj.weight", 2)[1],
        adapter_blocks=adapter_blocks,
        adapter_heads=context_dim // adapter_head_dim,
        adapter_mlp=_require(shapes, "llm_adapter.blocks.0.mlp.0.weight", 2)[0],
        t5_vocab=embed_rows,
        context_tokens=context_tokens,
    )
