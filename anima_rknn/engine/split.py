"""The split execution engine: the DiT's host parts in fp32 PyTorch, its 3 bodies per block on a backend.

One pass = host prologue -> per block, per part: LayerNorm + AdaLN modulate (fp32) -> backend body ->
gate + fp32 residual add -> host epilogue. Backends see batch-1 NumPy arrays named as in the subgraph
manifest ("x", "rope_cos", "rope_sin", "context" -> "y") and cast them to their own dtype themselves.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import torch

from ..errors import AnimaError
from ..model.dit import AnimaDiT, PassState, layer_norm_modulate
from .backends.base import Backend

T = TypeVar("T")


def rope_inputs(rope: tuple[torch.Tensor, torch.Tensor]) -> dict[str, np.ndarray]:
    """[N, head_dim] tables -> [1, 1, N, head_dim]: 4-D, broadcasting over heads without a Transpose."""
    cos, sin = (np.ascontiguousarray(t.float().numpy()[None, None]) for t in rope)
    return {"rope_cos": cos, "rope_sin": sin}


class SplitEngine:
    """Velocity of the DiT with the bodies on `backend`; counts passes and subgraph runs.

    AdaLN modulations depend only on sigma, so the last sigma's are kept and reused by the next pass at the
    same sigma (the cond and uncond passes of a CFG step); `share_modulations=False` turns that off.

    A partial pass (first_block) runs the first block alone, the cheap look at the model that auto's `check`
    compares with what a forecast assumes; a full pass asked to keep it leaves the same tokens in
    `first_block_tokens` for free.
    """

    def __init__(self, dit: AnimaDiT, backend: Backend, *, latent_size: tuple[int, int] | None = None,
                 share_modulations: bool = True) -> None:
        self.dit = dit
        self.backend = backend
        self.latent_size = latent_size  # (h, w) the backend's static shapes were made for, if any
        self.share_modulations = share_modulations
        self._modulations: tuple[float, list[torch.Tensor]] | None = None
        self._run_modulations: dict[float, list[torch.Tensor]] = {}  # set by fix_run
        self.passes = 0
        self.subgraph_runs = 0
        self.partial_passes = 0
        self.first_block_tokens: torch.Tensor | None = None  # of the last pass run with keep_first_block
        self.pass_stages: list[dict[str, float]] = []  # each full pass's seconds per stage and its loads

    def reset_counters(self) -> None:
        self.passes = 0
        self.subgraph_runs = 0
        self.partial_passes = 0

    @torch.inference_mode()
    def fix_run(self, sigmas: list[float], contexts: list[torch.Tensor]) -> None:
        """For a run whose sigmas and prompts are known up front: compute every AdaLN modulation and, where
        the backend keeps K/V (torch), every prompt's cross-attention K/V now, then free the weights that
        made them (AdaLN 0.35 GB, K/V projections 0.23 GB of the full model in bf16). Results are unchanged."""
        for sigma in sigmas:
            emb, adaln_lora = self.dit.time_embedding(torch.tensor([float(sigma)]))
            self._run_modulations[float(sigma)] = [block.modulation(emb, adaln_lora) for block in self.dit.blocks]
        self.dit.release_block_adaln()
        prepare_contexts = getattr(self.backend, "prepare_contexts", None)
        if prepare_contexts is not None:
            prepare_contexts([c.detach().float().contiguous().numpy() for c in contexts])
            self.dit.release_context_projections()

    def _block_modulations(self, sigma: float, state: PassState) -> list[torch.Tensor]:
        if sigma in self._run_modulations:
            return self._run_modulations[sigma]
        if self.share_modulations and self._modulations is not None and self._modulations[0] == sigma:
            return self._modulations[1]
        mods = self.dit.modulations(state)
        self._modulations = (sigma, mods) if self.share_modulations else None
        return mods

    def _check_inputs(self, x: torch.Tensor, context: torch.Tensor) -> None:
        if x.shape[0] != 1 or context.shape[0] != 1:
            raise ValueError("the split engine runs batch-1 passes (static accelerator shapes); "
                             f"got x {tuple(x.shape)}, context {tuple(context.shape)}")
        if self.latent_size is not None and tuple(x.shape[-2:]) != self.latent_size:
            h, w = self.latent_size
            raise AnimaError(f"engine set up for {w * 8}x{h * 8} images, got a latent for "
                             f"{x.shape[-1] * 8}x{x.shape[-2] * 8}")

    def _run_blocks(self, state: PassState, sigma: float, context: torch.Tensor, blocks: int | None = None,
                    keep_first_block: bool = False) -> None:
        context_np = context.detach().float().contiguous().numpy()
        extra_inputs = (rope_inputs(state.rope), {"context": context_np}, {})
        for b, block_mods in enumerate(self._block_modulations(sigma, state)[:blocks]):
            for part in range(3):
                shift, scale, gate = block_mods[part]
                body_in = layer_norm_modulate(state.tokens, shift, scale)
                y = self.backend.run(3 * b + part, {"x": body_in.numpy(), **extra_inputs[part]})
                state.tokens = state.tokens + gate * torch.from_numpy(y).float()
                self.subgraph_runs += 1
            if b == 0 and keep_first_block:
                self.first_block_tokens = state.tokens

    @torch.inference_mode()
    def velocity(self, x: torch.Tensor, sigma: float, context: torch.Tensor,
                 keep_first_block: bool = False) -> torch.Tensor:
        """x [1,16,h,w], sigma in [0,1], context [1,T,C] -> velocity [1,16,h,w] fp32 (= dit(x, sigma, context)).
        `keep_first_block`: leave the residual stream after the first block in first_block_tokens."""
        self._check_inputs(x, context)
        sigma = float(sigma)
        velocity, spent = self._timed(lambda: self._full_pass(x, sigma, context, keep_first_block))
        self.pass_stages.append(spent)
        self.passes += 1
        return velocity

    def _full_pass(self, x: torch.Tensor, sigma: float, context: torch.Tensor, keep_first_block: bool) -> torch.Tensor:
        state = self.dit.prologue(x, torch.tensor([sigma]))
        self._run_blocks(state, sigma, context, keep_first_block=keep_first_block)
        return self.dit.epilogue(state)

    def _timed(self, work: Callable[[], T]) -> tuple[T, dict[str, float]]:
        """work(), and what it spent per stage: the backend's own stages, and as host work the rest of its wall
        time (added to the backend's clock, so its totals hold every stage)."""
        clock = self.backend.stages
        before, began = clock.snapshot(), time.perf_counter()
        result = work()
        wall = time.perf_counter() - began
        spent = {key: value - before[key] for key, value in clock.snapshot().items()}
        clock.add("host", wall - sum(value for key, value in spent.items() if key != "loads"))
        spent["host"] = clock.seconds["host"] - before["host"]
        return result, spent

    def stage_record(self) -> dict[str, Any]:
        """Where the passes' time went, per stage (backends.base.STAGES) and in context loads: the first full pass
        (on the NPU it opens the contexts that stay open), the mean of the later ones (the steady state), and the
        totals of all the backend ran (partial passes and the closing releases included). `board_times` says
        whether these are the NPU's own times; `source` says what they are."""
        source, passes = self.backend.stage_source, self.pass_stages
        steady = passes[1:] or passes
        mean = {key: sum(p[key] for p in steady) / len(steady) for key in steady[0]} if steady else None
        return {
            "source": source, "board_times": source == "board", "passes": len(passes),
            "first_pass_s": _seconds(passes[0]) if passes else None,
            "per_pass_s": _seconds(mean) if mean else None,
            "total_s": _seconds(self.backend.stages.snapshot()),
            "first_pass_loads": passes[0]["loads"] if passes else None,
            "loads_per_pass": round(mean["loads"], 3) if mean else None,
            "loads": self.backend.stages.loads,
        }

    @torch.inference_mode()
    def first_block(self, x: torch.Tensor, sigma: float, context: torch.Tensor) -> torch.Tensor:
        """The residual stream [1,N,D] after the first block of the pass velocity(x, sigma, context) would run:
        1 / blocks of a pass (its 3 subgraphs), counted in partial_passes and subgraph_runs."""
        self._check_inputs(x, context)
        sigma = float(sigma)

        def first() -> torch.Tensor:
            state = self.dit.prologue(x, torch.tensor([sigma]))
            self._run_blocks(state, sigma, context, blocks=1)
            return state.tokens

        tokens, _ = self._timed(first)
        self.partial_passes += 1
        return tokens

    def close(self) -> None:
        self._modulations = None
        self._run_modulations = {}
        self.backend.close()


def _seconds(spent: dict[str, float]) -> dict[str, float]:
    return {key: round(value, 6) for key, value in spent.items() if key != "loads"}


class FirstBlockProbe:
    """The first block of one prompt's pass, as auto's `check` looks at the model (sampling.auto_cache.Probe): a
    partial pass at a latent, and the same tokens of the last full pass, which velocity() kept for free when the
    denoiser asked it to (keep_first_block)."""

    def __init__(self, engine: SplitEngine, context: torch.Tensor) -> None:
        self.engine, self.context = engine, context

    def __call__(self, x: np.ndarray, sigma: float) -> np.ndarray:
        return self.engine.first_block(torch.from_numpy(np.asarray(x, dtype=np.float32)), sigma, self.context).numpy()

    def last(self) -> np.ndarray:
        if self.engine.first_block_tokens is None:
            raise RuntimeError("no full pass has kept its first block's tokens yet")
        return self.engine.first_block_tokens.numpy()
