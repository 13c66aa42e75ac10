"""The LLM adapter (`llm_adapter.*`): T5 token embeddings cross-attend to Qwen3 hidden states."""

from __future__ import annotations

import torch
from torch import nn

from .config import DiTConfig
from .layers import RMSNorm, apply_rope, attention


def rope_1d(positions: int, head_dim: int, theta: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """HF-style rotate-half RoPE tables [positions, head_dim]."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.arange(positions, dtype=torch.float32)[:, None] * inv_freq[None]
    angles = torch.cat([angles, angles], dim=-1)
    return torch.cos(angles), torch.sin(angles)


class AdapterAttention(nn.Module):
    def __init__(self, dim: int, source_dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj = nn.Linear(source_dim, dim, bias=False)
        self.v_proj = nn.Linear(source_dim, dim, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)
        self.q_norm = RMSNorm(dim // heads)
        self.k_norm = RMSNorm(dim // heads)

    def forward(self, x: torch.Tensor, source: torch.Tensor,
                rope_q: tuple[torch.Tensor, torch.Tensor], rope_k: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.unflatten(-1, (self.heads, -1)).transpose(1, 2)

        q = apply_rope(self.q_norm(heads(self.q_proj(x))), *rope_q)
        k = apply_rope(self.k_norm(heads(self.k_proj(source))), *rope_k)
        return self.o_proj(attention(q, k, heads(self.v_proj(source))))


class AdapterBlock(nn.Module):
    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        dim = config.context_dim
        self.norm_self_attn = RMSNorm(dim)
        self.self_attn = AdapterAttention(dim, dim, config.adapter_heads)
        self.norm_cross_attn = RMSNorm(dim)
        self.cross_attn = AdapterAttention(dim, config.adapter_source_dim, config.adapter_heads)
        self.norm_mlp = RMSNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, config.adapter_mlp), nn.GELU(), nn.Linear(config.adapter_mlp, dim))

    def forward(self, x: torch.Tensor, source: torch.Tensor,
                rope_target: tuple[torch.Tensor, torch.Tensor],
                rope_source: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        h = self.norm_self_attn(x)
        x = x + self.self_attn(h, h, rope_target, rope_target)
        x = x + self.cross_attn(self.norm_cross_attn(x), source, rope_target, rope_source)
        return x + self.mlp(self.norm_mlp(x))


class LLMAdapter(nn.Module):
    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        self.context_tokens = config.context_tokens
        self.embed = nn.Embedding(config.t5_vocab, config.context_dim)
        self.blocks = nn.ModuleList(AdapterBlock(config) for _ in range(config.adapter_blocks))
        self.out_proj = nn.Linear(config.context_dim, config.context_dim)
        self.norm = RMSNorm(config.context_dim)
        self.head_dim = config.adapter_head_dim

    def forward(self, source: torch.Tensor, t5_ids: torch.Tensor) -> torch.Tensor:
        """Qwen3 states [B,S,source_dim] and T5 ids [B,L] -> [B,L,context_dim] (unpadded)."""
        x = self.embed(t5_ids).float()
        source = source.float()
        rope_target = rope_1d(t5_ids.shape[1], self.head_dim)
        rope_source = rope_1d(source.shape[1], self.head_dim)
        for block in self.blocks:
            x = block(x, source, rope_target, rope_source)
        return self.norm(self.out_proj(x))

    def condition(self, source: torch.Tensor, t5_ids: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
        """The DiT context: adapter rows times prompt weights, zero-padded (or cut) to `context_tokens` rows."""
        rows = self(source, t5_ids)
        if weights is not None:
            rows = rows * weights.float().reshape(rows.shape[0], -1, 1)
        rows = rows[:, : self.context_tokens]
        return torch.nn.functional.pad(rows, (0, 0, 0, self.context_tokens - rows.shape[1]))
