"""Runs the bodies from the PyTorch model itself (fp32, fp16 or bf16 weights): no export needed."""

from __future__ import annotations

import numpy as np
import torch

from ...model.dit import AnimaDiT, cast_weights
from .base import StageClock

KeyValues = list[tuple[torch.Tensor, torch.Tensor]]  # per block (k, v)


class TorchBackend:
    """The DiT's own attention/MLP modules behind the Backend interface.

    Cross-attention K/V depend only on the prompt. With `cache_context_kv` they are computed once per
    distinct context (all blocks at once) and found again by exact comparison of the context values, so a
    changed prompt can never reuse stale K/V; the last `max_contexts` contexts are kept (cond + uncond).
    """

    name = "torch"
    stage_source = "CPU (torch): not the board's times"

    def __init__(self, dit: AnimaDiT, dtype: torch.dtype = torch.float32, *, cache_context_kv: bool = True,
                 max_contexts: int = 2) -> None:
        if dit.body_dtype != dtype:
            dit.set_body_dtype(dtype)
        self.dit = dit
        self.dtype = dtype
        self.cache_context_kv = cache_context_kv
        self.max_contexts = max_contexts
        self._key_values: list[tuple[np.ndarray, KeyValues]] = []  # most recently computed first
        self.stages = StageClock()  # all of a body in "run": its casts are part of the module's own work

    def prepare_contexts(self, contexts: list[np.ndarray]) -> None:
        """K/V of every prompt of a run, computed now (the engine then frees the projections)."""
        self.cache_context_kv, self.max_contexts = True, max(self.max_contexts, len(contexts))
        for context in contexts:
            self._context_key_values(context)

    def _context_key_values(self, context: np.ndarray) -> KeyValues:
        for seen, key_values in self._key_values:
            if seen.shape == context.shape and np.array_equal(seen, context):
                return key_values
        if self.dit.blocks[0].cross_attn.k_proj is None:
            raise RuntimeError("cross-attention projections were freed for a fixed run; this prompt was not in it")
        key_values = self.dit.context_key_values(torch.from_numpy(context))
        self._key_values = [(context.copy(), key_values), *self._key_values][: self.max_contexts]
        return key_values

    def run(self, index: int, inputs: dict[str, np.ndarray]) -> np.ndarray:
        with self.stages.stage("run"):
            return self._run(index, inputs)

    @torch.inference_mode()
    def _run(self, index: int, inputs: dict[str, np.ndarray]) -> np.ndarray:
        block = self.dit.blocks[index // 3]
        x = torch.from_numpy(inputs["x"]).to(self.dtype)
        part = index % 3
        if part == 1 and not self.cache_context_kv:
            with cast_weights(block.cross_attn, self.dtype, block.cast_buffers):
                y = block.cross_attn(x, torch.from_numpy(inputs["context"]).to(self.dtype))
        else:
            rope = (torch.from_numpy(inputs["rope_cos"]), torch.from_numpy(inputs["rope_sin"])) if part == 0 else None
            key_values = self._context_key_values(inputs["context"])[index // 3] if part == 1 else None
            y = block.body(part, x, rope, key_values)
        return y.float().numpy()  # NumPy has no bf16

    def close(self) -> None:
        self._key_values = []
