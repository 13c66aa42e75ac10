"""Small building blocks shared by the DiT and the LLM adapter."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """RMSNorm whose statistics are always taken in fp32 (fp16 squares overflow)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * self.weight.float()).to(x.dtype)


def timestep_sinusoid(sigma: torch.Tensor, dim: int) -> torch.Tensor:
    """[B] sigma in [0, 1] -> [B, dim] fp32 embedding, cos half first (the model is fed sigma, not sigma*1000)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)
    angles = sigma.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)


def rope_axis_dims(head_dim: int) -> tuple[int, int, int]:
    """Split of head_dim over (t, h, w): 44/42/42 for head_dim 128."""
    hw = head_dim // 6 * 2
    return head_dim - 2 * hw, hw, hw


def _axis_freqs(dim: int, ntk_ratio: float) -> torch.Tensor:
    theta = 10000.0 * ntk_ratio ** (dim / (dim - 2))
    return 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float32)[: dim // 2] / dim)


def rope_tables(head_dim: int, grid_h: int, grid_w: int) -> tuple[torch.Tensor, torch.Tensor]:
    """3-D RoPE cos/sin, each [grid_h*grid_w, head_dim] fp32, tokens row-major, t = 0 (one frame).

    Angles per token are [t, h, w] (half of head_dim), repeated for the split-half rotation.
    """
    dim_t, dim_h, dim_w = rope_axis_dims(head_dim)
    rows = torch.arange(grid_h, dtype=torch.float32)
    cols = torch.arange(grid_w, dtype=torch.float32)
    ang_t = torch.zeros(grid_h, grid_w, dim_t // 2)
    ang_h = (rows[:, None] * _axis_freqs(dim_h, 4.0)[None]).unsqueeze(1).expand(grid_h, grid_w, -1)
    ang_w = (cols[:, None] * _axis_freqs(dim_w, 4.0)[None]).unsqueeze(0).expand(grid_h, grid_w, -1)
    angles = torch.cat([ang_t, ang_h, ang_w], dim=-1).reshape(grid_h * grid_w, head_dim // 2)
    angles = torch.cat([angles, angles], dim=-1)
    return torch.cos(angles), torch.sin(angles)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, N, head_dim]; cos/sin broadcastable to it."""
    return x * cos + rotate_half(x) * sin


QUERY_CHUNK = 256  # query rows per score tile: [heads, 256, keys] bf16 stays in the L3 cache


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """[B, heads, N, d] -> [B, N, heads*d]; softmax(qk^T/sqrt(d)) v, unmasked."""
    if q.dtype == torch.bfloat16 and q.device.type == "cpu":
        return _attention_bf16_cpu(q, k, v)
    out = F.scaled_dot_product_attention(q, k, v)
    return out.transpose(1, 2).flatten(2)


def _attention_bf16_cpu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Batched-over-heads bf16 GEMMs on query chunks.

    PyTorch's CPU flash attention runs bf16 at about a third of bf16 GEMM speed on CPUs without AMX; plain
    bf16 GEMMs on score tiles run at GEMM speed. The scores are the GEMM's bf16 output (fp32 accumulation);
    softmax takes bf16 in and out but computes in fp32.
    """
    batch, heads, tokens, head_dim = q.shape
    k, v = k.contiguous(), v.contiguous()  # strided K/V make every batched GEMM copy them first
    out = q.new_empty(batch, tokens, heads, head_dim)  # written in place in the output layout: no final copy
    for b in range(batch):
        keys_t = k[b].transpose(1, 2)
        for start in range(0, tokens, QUERY_CHUNK):
            rows = slice(start, start + QUERY_CHUNK)
            scores = torch.baddbmm(q.new_empty(()), q[b, :, rows], keys_t, beta=0, alpha=head_dim**-0.5)
            torch.bmm(torch.softmax(scores, -1), v[b], out=out[b, rows].transpose(0, 1))
    return out.flatten(2)
