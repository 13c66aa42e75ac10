"""Qwen3 text encoder: transformers' Qwen3Model with its config read off the checkpoint's tensor shapes."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

import torch
from transformers import Qwen3Config, Qwen3Model

from ..core.tensorfile import load_tensors, read_shapes, save_tensors
from ..errors import AnimaError

FILE_PREFIX = "model."  # Qwen3ForCausalLM layout, as in text_encoders/qwen_3_06b_base.safetensors
IGNORED_PREFIX = "lm_head."  # tied to the embedding; not needed for hidden states
ROPE_THETA = 1e6
RMS_EPS = 1e-6
_LAYER_INDEX = re.compile(r"^layers\.([0-9]{1,9})\.")
MAX_LAYERS = 1024  # Qwen3-0.6B has 28; layers are counted from names, so a header must not ask for millions


def _qwen3_config(
    *, vocab: int, hidden: int, layers: int, heads: int, kv_heads: int, head_dim: int, intermediate: int
) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate,
        rope_theta=ROPE_THETA,
        rms_norm_eps=RMS_EPS,
        tie_word_embeddings=True,
    )


def _shape(shapes: Mapping[str, Sequence[int]], name: str, rank: int) -> tuple[int, ...]:
    if name not in shapes:
        raise AnimaError(f"text encoder file lacks tensor {FILE_PREFIX}{name}")
    shape = tuple(shapes[name])
    if len(shape) != rank or not all(shape):
        raise AnimaError(f"text encoder tensor {FILE_PREFIX}{name} has shape {list(shape)}, "
                         f"expected {rank} non-zero sizes")
    return shape


def qwen3_config_from_shapes(shapes: Mapping[str, Sequence[int]]) -> Qwen3Config:
    """Infer the Qwen3 config from tensor names and shapes (names with or without the "model." prefix, or
    llama.cpp's)."""
    shapes = {_hf_name(name): shape for name, shape in shapes.items()}
    layer_indices = [int(m.group(1)) for name in shapes if (m := _LAYER_INDEX.match(name))]
    if not layer_indices:
        raise AnimaError("text encoder file has no model.layers.N.* tensors; is it a Qwen3 checkpoint?")
    if max(layer_indices) >= MAX_LAYERS:
        raise AnimaError(f"text encoder file names {FILE_PREFIX}layers.{max(layer_indices)}.*, "
                         f"but at most {MAX_LAYERS} layers are read")
    vocab, hidden = _shape(shapes, "embed_tokens.weight", 2)
    (head_dim,) = _shape(shapes, "layers.0.self_attn.q_norm.weight", 1)
    q_rows = _shape(shapes, "layers.0.self_attn.q_proj.weight", 2)[0]
    kv_rows = _shape(shapes, "layers.0.self_attn.k_proj.weight", 2)[0]
    # RoPE rotates head halves; grouped-query attention shares each k/v head among whole groups of q heads.
    if head_dim % 2 or q_rows % head_dim or kv_rows % head_dim or (q_rows // head_dim) % (kv_rows // head_dim):
        raise AnimaError(f"text encoder q/k projections ({q_rows}, {kv_rows} rows) are not whole groups of "
                         f"heads of an even head_dim {head_dim}")
    intermediate = _shape(shapes, "layers.0.mlp.gate_proj.weight", 2)[0]
    return _qwen3_config(
        vocab=vocab,
        hidden=hidden,
        layers=1 + max(layer_indices),
        heads=q_rows // head_dim,
        kv_heads=kv_rows // head_dim,
        head_dim=head_dim,
        intermediate=intermediate,
    )


class TextEncoder:
    """Prompt token ids -> Qwen3 last hidden state (after the final norm), no mask, no padding."""

    def __init__(self, model: Qwen3Model) -> None:
        self.model = model.eval()

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    @torch.inference_mode()
    def encode(self, ids: list[int]) -> torch.Tensor:
        if not ids:
            raise AnimaError("the text encoder needs at least one token id")
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise AnimaError(f"token id {bad[0]} is outside the text encoder vocabulary (size {self.vocab_size})")
        out = self.model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
        return out.last_hidden_state.float()


def _unloaded_model(config: Qwen3Config, shapes: Mapping[str, Sequence[int]]) -> Qwen3Model:
    """The model on the meta device (no random init computed), once `shapes` are exactly its tensors'."""
    with torch.device("meta"):
        model = Qwen3Model(config)
    expected = model.state_dict()
    for name, param in expected.items():
        if name not in shapes:
            raise AnimaError(f"text encoder file lacks tensor {FILE_PREFIX}{name}")
        if tuple(shapes[name]) != tuple(param.shape):
            raise AnimaError(
                f"text encoder tensor {FILE_PREFIX}{name} has shape {list(shapes[name])}, expected {list(param.shape)}"
            )
    unknown = sorted(set(shapes) - set(expected))
    if unknown:
        raise AnimaError(f"text encoder file has unexpected tensor {FILE_PREFIX}{unknown[0]} ({len(unknown)} in all)")
    return model


# llama.cpp's names (a GGUF of Qwen3 from llama.cpp or ComfyUI-GGUF) -> Hugging Face's, as stable-diffusion.cpp maps
# them; Qwen3's q/k rows are not permuted by llama.cpp's converter (only LLaMA's are).
_LLAMA_CPP_TOP = {"token_embd.": "embed_tokens.", "output_norm.": "norm.", "output.": "lm_head."}
_LLAMA_CPP_LAYER = {".attn_q_norm.": ".self_attn.q_norm.", ".attn_k_norm.": ".self_attn.k_norm.",
                    ".attn_q.": ".self_attn.q_proj.", ".attn_k.": ".self_attn.k_proj.", ".attn_v.": ".self_attn.v_proj.",
                    ".attn_output.": ".self_attn.o_proj.", ".attn_norm.": ".input_layernorm.",
                    ".ffn_norm.": ".post_attention_layernorm.", ".ffn_gate.": ".mlp.gate_proj.",
                    ".ffn_up.": ".mlp.up_proj.", ".ffn_down.": ".mlp.down_proj."}  # fmt: skip


def _hf_name(name: str) -> str:
    """A tensor name without the "model." prefix, in Hugging Face's naming."""
    name = name.removeprefix(FILE_PREFIX)
    if name.startswith("blk."):
        name = "layers." + name.removeprefix("blk.")
        for old, new in _LLAMA_CPP_LAYER.items():
            name = name.replace(old, new)
        return name
    top = next((old for old in _LLAMA_CPP_TOP if name.startswith(old)), None)
    return name if top is None else _LLAMA_CPP_TOP[top] + name.removeprefix(top)


def load_text_encoder(path: str | os.PathLike, dtype: torch.dtype = torch.float32) -> TextEncoder:
    """Load a Qwen3 text encoder file ("model." prefix or none, or llama.cpp's GGUF names; lm_head.* ignored),
    config from its shapes."""
    shapes = {_hf_name(name): shape for name, shape in read_shapes(path, "text encoder").items()}
    shapes = {name: shape for name, shape in shapes.items() if not name.startswith(IGNORED_PREFIX)}
    try:
        config = qwen3_config_from_shapes(shapes)
        model = _unloaded_model(config, shapes)
    except AnimaError as e:  # name the file: the same checks serve shapes from anywhere
        raise AnimaError(f"{path}: {e}") from None
    # One memory map per tensor: converting then never holds the file and the copy together.
    tensors = {_hf_name(name): t for name, t in load_tensors(path, "text encoder", strip=(FILE_PREFIX,),
                                                               skip=(IGNORED_PREFIX, "output."), convert=dtype).items()}
    if {name: tuple(t.shape) for name, t in tensors.items()} != shapes:
        raise AnimaError(f"{path} changed while it was being read")
    model.load_state_dict(tensors, assign=True, strict=True)
    # The RoPE inverse frequencies are a non-persistent buffer, still on meta: compute them, in fp32.
    model.rotary_emb = type(model.rotary_emb)(config=config)
    return TextEncoder(model)


def write_random_text_encoder(
    path: str | os.PathLike,
    *,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 2,
    kv_heads: int = 1,
    head_dim: int = 32,
    intermediate: int = 128,
    vocab: int = 512,
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
) -> None:
    """Write a randomly initialised Qwen3 text encoder in the real file layout ("model." prefix, no lm_head)."""
    config = _qwen3_config(
        vocab=vocab, hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads, head_dim=head_dim, intermediate=intermediate
    )
    with torch.random.fork_rng(devices=[]):  # seed transformers' own init without disturbing the caller's RNG
        torch.manual_seed(seed)
        model = Qwen3Model(config)
    tensors = {FILE_PREFIX + name: t.detach().to(dtype).contiguous() for name, t in model.state_dict().items()}
    save_tensors(tensors, path, {"format": "pt"})
