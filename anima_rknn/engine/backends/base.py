"""The small interface every accelerator backend implements, and the clock its stages are timed on.

A subgraph set is the 3 * num_blocks accelerator bodies of one DiT, in execution order:
index i is block i // 3, part export.manifest.SUBGRAPH_KINDS[i % 3]. Inputs and outputs are NumPy arrays
named as in the set's manifest; the host engine does everything else in fp32.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

import numpy as np

# Where a pass's time goes. A backend times the first four (those it has: torch only runs), the split engine the
# host work between subgraphs (LayerNorm, AdaLN modulation, gates, residual adds, prologue and epilogue).
STAGES = {
    "load": "context load, init and release (rknn: a context opened or closed during the pass)",
    "prepare": "inputs cast and laid out for the backend",
    "run": "the body itself (the NPU's run on the board, the simulator's on x86)",
    "output": "the output converted back to fp32",
    "host": "host work between subgraphs (AdaLN, LayerNorm, gates, residual, prologue, epilogue)",
}


class StageClock:
    """Seconds spent per stage (STAGES), summed over everything timed on it."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(STAGES, 0.0)
        self.loads = 0  # runtime contexts opened (rknn; the others open everything up front)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] += seconds

    def snapshot(self) -> dict[str, float]:
        """The seconds per stage so far, and the loads under "loads"."""
        return {**self.seconds, "loads": self.loads}


class Backend(Protocol):
    name: str
    stages: StageClock  # what run() spent, per stage; the engine adds its own host work to the same clock
    stage_source: str  # what the times measure: "board" (the NPU itself) or a label of what they are instead

    def run(self, index: int, inputs: dict[str, np.ndarray]) -> np.ndarray:
        """Run subgraph `index` on named inputs; return its single output."""
        ...

    def close(self) -> None:
        """Release every runtime context and buffer the backend holds."""
        ...
