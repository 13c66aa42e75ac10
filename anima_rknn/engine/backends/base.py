"""The small interface every accelerator backend implements.

A subgraph set is the 3 * num_blocks accelerator bodies of one DiT, in execution order:
index i is block i // 3, part export.manifest.SUBGRAPH_KINDS[i % 3]. Inputs and outputs are NumPy arrays
named as in the set's manifest; the host engine does everything else in fp32.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class Backend(Protocol):
    name: str

    def run(self, index: int, inputs: dict[str, np.ndarray]) -> np.ndarray:
        """Run subgraph `index` on named inputs; return its single output."""
        ...

    def close(self) -> None:
        """Release every runtime context and buffer the backend holds."""
        ...
