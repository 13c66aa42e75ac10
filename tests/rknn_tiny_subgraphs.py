"""Test-only: a tiny DiT-shaped accelerator subgraph set in the exporter's manifest format.

Stands in for anima_rknn.export.onnx until the real exporter is wired into these tests. The three bodies
follow the spec's block (per-head RMSNorm on q/k, split-half RoPE from fed-in tables, cross-attention on a
fixed context, GELU MLP), only narrow, so conversion and simulation stay fast on a small machine.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from anima_rknn.engine.backends.base import SUBGRAPH_KINDS, subgraph_name
from anima_rknn.files import sha256_file


@dataclass(frozen=True)
class TinyDims:
    blocks: int = 2
    hidden: int = 128
    heads: int = 2
    head_dim: int = 64
    context_dim: int = 96
    mlp: int = 256
    tokens: int = 64
    context_tokens: int = 32


class HeadNorm(nn.Module):
    """RMSNorm over head_dim, as q_norm / k_norm."""

    def __init__(self, head_dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Attention(nn.Module):
    def __init__(self, dims: TinyDims, kv_dim: int, rope: bool) -> None:
        super().__init__()
        inner = dims.heads * dims.head_dim
        self.heads, self.head_dim, self.rope = dims.heads, dims.head_dim, rope
        self.q = nn.Linear(dims.hidden, inner, bias=False)
        self.k = nn.Linear(kv_dim, inner, bias=False)
        self.v = nn.Linear(kv_dim, inner, bias=False)
        self.q_norm, self.k_norm = HeadNorm(dims.head_dim), HeadNorm(dims.head_dim)
        self.out = nn.Linear(inner, dims.hidden, bias=False)

    def split_heads(self, t: torch.Tensor) -> torch.Tensor:
        return t.reshape(1, -1, self.heads, self.head_dim).transpose(1, 2)

    def rotate(self, t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = self.head_dim // 2
        rotated = torch.cat([-t[..., half:], t[..., :half]], dim=-1)
        return t * cos + rotated * sin

    def attend(self, x: torch.Tensor, kv: torch.Tensor, cos=None, sin=None) -> torch.Tensor:
        q = self.q_norm(self.split_heads(self.q(x)))
        k = self.k_norm(self.split_heads(self.k(kv)))
        v = self.split_heads(self.v(kv))
        if self.rope:
            q, k = self.rotate(q, cos, sin), self.rotate(k, cos, sin)
        weights = torch.softmax(q @ k.transpose(-1, -2) / self.head_dim**0.5, dim=-1)
        return self.out((weights @ v).transpose(1, 2).reshape(1, -1, self.heads * self.head_dim))


class SelfAttn(Attention):
    def __init__(self, dims: TinyDims) -> None:
        super().__init__(dims, dims.hidden, rope=True)

    def forward(self, x, rope_cos, rope_sin):
        return self.attend(x, x, rope_cos, rope_sin)


class CrossAttn(Attention):
    def __init__(self, dims: TinyDims) -> None:
        super().__init__(dims, dims.context_dim, rope=False)

    def forward(self, x, context):
        return self.attend(x, context)


class Mlp(nn.Module):
    def __init__(self, dims: TinyDims) -> None:
        super().__init__()
        self.layer1 = nn.Linear(dims.hidden, dims.mlp, bias=False)
        self.layer2 = nn.Linear(dims.mlp, dims.hidden, bias=False)

    def forward(self, x):
        return self.layer2(nn.functional.gelu(self.layer1(x)))


def input_specs(kind: str, dims: TinyDims) -> dict[str, list[int]]:
    x = [1, dims.tokens, dims.hidden]
    if kind == "self_attn":
        rope = [1, 1, dims.tokens, dims.head_dim]
        return {"x": x, "rope_cos": rope, "rope_sin": rope}
    if kind == "cross_attn":
        return {"x": x, "context": [1, dims.context_tokens, dims.context_dim]}
    return {"x": x}


def sample_inputs(kind: str, dims: TinyDims, seed: int) -> dict[str, np.ndarray]:
    """Inputs in the ranges the engine feeds: modulated LN output, real RoPE angles, adapter-like context."""
    rng = np.random.default_rng(seed)
    inputs = {}
    for name, shape in input_specs(kind, dims).items():
        if name.startswith("rope"):
            angles = np.outer(np.arange(dims.tokens), 10000.0 ** -(np.arange(dims.head_dim // 2) * 2 / dims.head_dim))
            angles = np.concatenate([angles, angles], axis=-1).reshape(shape)
            inputs[name] = (np.cos(angles) if name == "rope_cos" else np.sin(angles)).astype(np.float32)
        else:
            inputs[name] = rng.standard_normal(shape).astype(np.float32)
    return inputs


def make_module(kind: str, dims: TinyDims) -> nn.Module:
    return {"self_attn": SelfAttn, "cross_attn": CrossAttn, "mlp": Mlp}[kind](dims).eval()


def export_tiny_subgraphs(out_dir: Path, dims: TinyDims = TinyDims(), seed: int = 0) -> tuple[Path, list[nn.Module]]:
    """Write DIR/bNN_<kind>.onnx + manifest.json; return the manifest path and the fp32 torch modules."""
    torch.manual_seed(seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    modules, entries = [], []
    for index in range(3 * dims.blocks):
        kind = SUBGRAPH_KINDS[index % 3]
        module = make_module(kind, dims)
        specs = input_specs(kind, dims)
        path = out_dir / f"{subgraph_name(index)}.onnx"
        example = tuple(torch.from_numpy(a) for a in sample_inputs(kind, dims, 0).values())
        with warnings.catch_warnings():  # the TorchScript exporter: no onnxscript needed in .venv-rknn
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.onnx.export(module, example, path, input_names=list(specs), output_names=["y"],
                              opset_version=17, dynamo=False)
        modules.append(module)
        entries.append({
            "index": index, "block": index // 3, "kind": kind, "file": path.name, "sha256": sha256_file(path),
            "inputs": [{"name": n, "shape": s, "dtype": "float32"} for n, s in specs.items()],
            "outputs": [{"name": "y", "shape": [1, dims.tokens, dims.hidden], "dtype": "float32"}],
        })
    manifest = {
        "format": "anima-rknn-subgraphs/1",
        "model": {"file": "tiny-test-dit", "sha256": "0" * 64, "blocks": dims.blocks, "hidden": dims.hidden,
                  "heads": dims.heads, "head_dim": dims.head_dim, "context_dim": dims.context_dim},
        "width": 128, "height": 128, "tokens": dims.tokens, "context_tokens": dims.context_tokens,
        "dtype": "float32", "opset": 17, "subgraphs": entries,
    }
    manifest_path = out_dir / "manifest.json"
    manifest_path.write_text(json.dumps(manifest, indent=1))
    return manifest_path, modules


def torch_reference(module: nn.Module, inputs: dict[str, np.ndarray]) -> np.ndarray:
    with torch.no_grad():
        return module(*(torch.from_numpy(a) for a in inputs.values())).numpy()
