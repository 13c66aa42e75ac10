"""The Anima DiT (Cosmos-Predict2 "MiniTrainDIT") with its LLM adapter.

Module names follow the checkpoint keys (`blocks.N.self_attn.q_proj`, ...), so a state dict loads as is.
Precision policy: the residual stream, LayerNorm, AdaLN and gates are fp32 on the host side; the three
bodies per block (self-attention, cross-attention, MLP) may hold fp16/bf16 weights (`set_body_dtype`).
Host linear layers compute in fp32 whatever their weights are stored in, so a loader may leave them in the
file's bf16 (used in place from the memory map) without changing the arithmetic. Bodies compute in the dtype of
their input: weights stored narrower (bf16 from the file, fp32 compute) are cast just in time, one body at a
time, and the copies dropped after it (`cast_weights`, what ComfyUI calls manual cast).
The pass is written as prologue -> per block (modulate, body, gate) x 3 -> epilogue so that the split
engine can run the very same pieces with the bodies on an accelerator.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from .adapter import LLMAdapter
from .config import DiTConfig
from .layers import RMSNorm, apply_rope, attention, rope_tables, timestep_sinusoid

CastBuffers = dict  # (body kind, parameter name, shape, dtype) -> a reused tensor


@contextlib.contextmanager
def cast_weights(module: nn.Module, dtype: torch.dtype, buffers: CastBuffers | None = None) -> Iterator[None]:
    """Within the block, every parameter of `module` not in `dtype` is a `dtype` copy; the stored weights (maybe
    a file's memory map) are put back on leaving. No-op when all are in `dtype` already.

    With `buffers`, the copies go into tensors kept there for the next body of the same kind, since a fresh
    64 MB allocation per weight per pass would be page-faulted and zeroed every time (one body runs at a time)."""
    swapped = []
    for path, owner in module.named_modules():
        for name, weight in owner._parameters.items():
            if weight is None or weight.dtype == dtype:
                continue
            if buffers is None:
                copy = weight.to(dtype)
            else:
                key = (type(module).__name__, f"{path}.{name}", tuple(weight.shape), dtype)
                copy = buffers.get(key)
                if copy is None:
                    copy = buffers[key] = torch.empty(weight.shape, dtype=dtype)
                copy.copy_(weight)
            swapped.append((owner, name, weight))
            owner._parameters[name] = copy  # a plain tensor: nn.Module's setattr would refuse it
    try:
        yield
    finally:
        for owner, name, weight in swapped:
            owner._parameters[name] = weight


class SelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        head_dim = hidden // heads
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.k_proj = nn.Linear(hidden, hidden, bias=False)
        self.v_proj = nn.Linear(hidden, hidden, bias=False)
        self.q_norm = RMSNorm(head_dim)
        self.k_norm = RMSNorm(head_dim)
        self.output_proj = nn.Linear(hidden, hidden, bias=False)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (self.heads, -1)).transpose(1, 2)

    def forward(self, x: torch.Tensor, rope_cos: torch.Tensor, rope_sin: torch.Tensor) -> torch.Tensor:
        q = self.q_norm(self.split_heads(self.q_proj(x)))
        k = self.k_norm(self.split_heads(self.k_proj(x)))
        v = self.split_heads(self.v_proj(x))
        cos, sin = rope_cos.to(q.dtype), rope_sin.to(q.dtype)
        return self.output_proj(attention(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v))


class CrossAttention(SelfAttention):
    def __init__(self, hidden: int, heads: int, context_dim: int) -> None:
        super().__init__(hidden, heads)
        self.k_proj = nn.Linear(context_dim, hidden, bias=False)
        self.v_proj = nn.Linear(context_dim, hidden, bias=False)

    def key_value(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V depend only on the prompt: callers may compute them once per prompt (kept contiguous for reuse)."""
        k = self.k_norm(self.split_heads(self.k_proj(context)))
        return k.contiguous(), self.split_heads(self.v_proj(context)).contiguous()

    def attend(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q = self.q_norm(self.split_heads(self.q_proj(x)))
        return self.output_proj(attention(q, k, v))

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return self.attend(x, *self.key_value(context))


class MLP(nn.Module):
    def __init__(self, hidden: int, mlp: int) -> None:
        super().__init__()
        self.layer1 = nn.Linear(hidden, mlp, bias=False)
        self.layer2 = nn.Linear(mlp, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer2(F.gelu(self.layer1(x)))


class HostLinear(nn.Linear):
    """A bias-free host-side linear layer that computes in fp32 whatever dtype its weight is stored in."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__(in_features, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.float(), self.weight.float())


def adaln_projection(hidden: int, lora: int, outputs: int) -> nn.Sequential:
    """SiLU -> Linear(hidden, lora) -> Linear(lora, outputs*hidden); indices 1 and 2 match the checkpoint."""
    return nn.Sequential(nn.SiLU(), HostLinear(hidden, lora), HostLinear(lora, outputs * hidden))


def layer_norm_modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """LN(x) * (1 + scale) + shift, in fp32 (the residual stream overflows fp16)."""
    return torch.addcmul(shift, F.layer_norm(x.float(), x.shape[-1:], eps=1e-6), 1 + scale)


class Block(nn.Module):
    PARTS = ("self_attn", "cross_attn", "mlp")

    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        d = config.hidden
        self.self_attn = SelfAttention(d, config.heads)
        self.cross_attn = CrossAttention(d, config.heads, config.context_dim)
        self.mlp = MLP(d, config.mlp)
        self.adaln_modulation_self_attn = adaln_projection(d, config.adaln_lora, 3)
        self.adaln_modulation_cross_attn = adaln_projection(d, config.adaln_lora, 3)
        self.adaln_modulation_mlp = adaln_projection(d, config.adaln_lora, 3)
        self.cast_buffers: CastBuffers = {}  # AnimaDiT gives all its blocks one

    def modulation(self, emb: torch.Tensor, adaln_lora: torch.Tensor) -> torch.Tensor:
        """[B, D] time embedding -> [3 parts, 3 (shift, scale, gate), B, 1, D] fp32; depends on sigma only."""
        mods = [getattr(self, f"adaln_modulation_{part}")(emb) + adaln_lora for part in self.PARTS]
        return torch.stack([m.unflatten(-1, (3, -1)).transpose(0, 1) for m in mods]).unsqueeze(-2)

    def body(self, part: int, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
             context_kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """The accelerator-side computation of one part, in the dtype of `x` (the bodies' dtype)."""
        with cast_weights(getattr(self, self.PARTS[part]), x.dtype, self.cast_buffers):
            if part == 0:
                return self.self_attn(x, *rope)
            if part == 1:
                return self.cross_attn.attend(x, *context_kv)
            return self.mlp(x)


class FinalLayer(nn.Module):
    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        self.adaln_modulation = adaln_projection(config.hidden, config.adaln_lora, 2)
        self.linear = HostLinear(config.hidden, config.patch * config.patch * config.in_channels)

    def forward(self, x: torch.Tensor, emb: torch.Tensor, adaln_lora: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1]
        shift, scale = (self.adaln_modulation(emb) + adaln_lora[:, : 2 * d]).unsqueeze(1).chunk(2, dim=-1)
        return self.linear(layer_norm_modulate(x, shift, scale))


class TimestepMLP(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear_1 = HostLinear(hidden, hidden)
        self.linear_2 = HostLinear(hidden, 3 * hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.silu(self.linear_1(x)))


class PatchEmbed(nn.Module):
    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        features = (config.in_channels + 1) * config.patch * config.patch
        self.proj = nn.Sequential(nn.Identity(), HostLinear(features, config.hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


def patchify(x: torch.Tensor, patch: int) -> torch.Tensor:
    """[B, C, H, W] -> [B, (H/p)(W/p), C*p*p], feature = c*p*p + dy*p + dx."""
    b, c, h, w = x.shape
    x = x.reshape(b, c, h // patch, patch, w // patch, patch)
    return x.permute(0, 2, 4, 1, 3, 5).reshape(b, (h // patch) * (w // patch), c * patch * patch)


def unpatchify(tokens: torch.Tensor, grid_h: int, grid_w: int, patch: int) -> torch.Tensor:
    """[B, N, p*p*C] with feature = dy*p*C + dx*C + c (NOT the patchify layout) -> [B, C, H, W]."""
    b = tokens.shape[0]
    x = tokens.reshape(b, grid_h, grid_w, patch, patch, -1)
    return x.permute(0, 5, 1, 3, 2, 4).reshape(b, -1, grid_h * patch, grid_w * patch)


@dataclasses.dataclass
class PassState:
    """Everything the blocks of one pass need besides the residual stream."""

    tokens: torch.Tensor  # [B, N, D] fp32 residual stream
    emb: torch.Tensor  # [B, D] RMS-normed sinusoid
    adaln_lora: torch.Tensor  # [B, 3D]
    rope: tuple[torch.Tensor, torch.Tensor]  # [N, head_dim] each
    grid: tuple[int, int]
    crop: tuple[int, int]  # latent size before circular padding


class AnimaDiT(nn.Module):
    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        self.config = config
        self.x_embedder = PatchEmbed(config)
        self.t_embedder = nn.Sequential(nn.Identity(), TimestepMLP(config.hidden))
        self.t_embedding_norm = RMSNorm(config.hidden)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.blocks))
        self.final_layer = FinalLayer(config)
        self.llm_adapter: LLMAdapter | None = LLMAdapter(config)  # None in a denoise-only load
        self.body_dtype = torch.float32
        self.cast_buffers: CastBuffers = {}  # shared by the blocks, which run one after another
        for block in self.blocks:
            block.cast_buffers = self.cast_buffers

    def set_body_dtype(self, dtype: torch.dtype) -> AnimaDiT:
        """Cast only the accelerator bodies; AdaLN, norms and the residual stay fp32."""
        for block in self.blocks:
            for part in Block.PARTS:
                getattr(block, part).to(dtype)
        self.body_dtype = dtype
        return self

    def prologue(self, x: torch.Tensor, sigma: torch.Tensor) -> PassState:
        x = x.float()
        b, _, h, w = x.shape
        p = self.config.patch
        x = F.pad(x, (0, (-w) % p, 0, (-h) % p), mode="circular") if (h % p or w % p) else x
        grid = (x.shape[-2] // p, x.shape[-1] // p)
        x = torch.cat([x, torch.zeros_like(x[:, :1])], dim=1)  # the all-zero padding-mask channel
        emb, adaln_lora = self.time_embedding(sigma.reshape(-1).expand(b))
        return PassState(
            tokens=self.x_embedder(patchify(x, p)),
            emb=emb,
            adaln_lora=adaln_lora,
            rope=rope_tables(self.config.head_dim, *grid),
            grid=grid,
            crop=(h, w),
        )

    def time_embedding(self, sigma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[B] sigma -> (RMS-normed sinusoid [B, D], AdaLN-LoRA term [B, 3D])."""
        sinusoid = timestep_sinusoid(sigma, self.config.hidden)
        return self.t_embedding_norm(sinusoid), self.t_embedder(sinusoid)

    def modulations(self, state: PassState) -> list[torch.Tensor]:
        return [block.modulation(state.emb, state.adaln_lora) for block in self.blocks]

    def release_block_adaln(self) -> None:
        """Drop the blocks' AdaLN weights once their outputs for every sigma of a run are known."""
        for block in self.blocks:
            for part in Block.PARTS:
                setattr(block, f"adaln_modulation_{part}", None)

    def release_context_projections(self) -> None:
        """Drop the cross-attention K/V projections once the K/V of every prompt of a run are known."""
        for block in self.blocks:
            block.cross_attn.k_proj = block.cross_attn.v_proj = None

    def context_key_values(self, context: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        context = context.to(self.body_dtype)
        key_values = []
        for block in self.blocks:
            with cast_weights(block.cross_attn, self.body_dtype, self.cast_buffers):
                key_values.append(block.cross_attn.key_value(context))
        return key_values

    def epilogue(self, state: PassState) -> torch.Tensor:
        out = self.final_layer(state.tokens, state.emb, state.adaln_lora)
        out = unpatchify(out, *state.grid, self.config.patch)
        return out[..., : state.crop[0], : state.crop[1]]

    def forward(self, x: torch.Tensor, sigma: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """x [B,16,H,W], sigma [B] in [0,1], context [B,512,context_dim] -> velocity [B,16,H,W] fp32."""
        state = self.prologue(x, sigma)
        context_kv = self.context_key_values(context)
        rope = (state.rope[0].to(self.body_dtype), state.rope[1].to(self.body_dtype))  # once, not per block
        for block, mods, kv in zip(self.blocks, self.modulations(state), context_kv):
            for part in range(3):
                shift, scale, gate = mods[part]
                body_in = layer_norm_modulate(state.tokens, shift, scale).to(self.body_dtype)
                state.tokens = torch.addcmul(state.tokens, gate, block.body(part, body_in, rope, kv))  # fp32
        return self.epilogue(state)
