"""Accuracy of a converted DiT subgraph set against fp32 torch, on the inputs of a real denoising step.

One fp32 torch split pass records what it really feeds each subgraph (and what each returns); every .rknn
context then runs on those same inputs, one at a time, so each subgraph is measured alone, never on the error
its predecessors passed on. The caller brings the latent and the prompt's context: encoding a prompt is the
pipeline's work, above the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..export.calibration import agreement
from ..export.manifest import read_manifest
from ..export.rknn import read_converted_manifest
from ..model.dit import AnimaDiT
from ..model.io import load_dit
from .backends.rknn import RknnBackend
from .backends.torch import TorchBackend
from .split import SplitEngine

# fp16 bodies score above 0.9999 on real inputs; a context built from the wrong weights falls far below
DEFAULT_MIN_COSINE = 0.999


@dataclass(frozen=True)
class SubgraphAccuracy:
    index: int
    file: str
    cosine: float
    max_rel_error: float  # max |rknn - torch| over max |torch|: relative to the output's scale
    precision: str = "float16"  # as converted: float16, w8a8 or hybrid (the manifest's, checked against the file)
    held_out_cosine: float | None = None  # the conversion's worst held-out cosine for that precision, if measured


class RecordingBackend:
    """Passes each subgraph run through to `inner` and keeps its inputs and output."""

    name = "recording"

    def __init__(self, inner: TorchBackend) -> None:
        self.inner = inner
        self.stages, self.stage_source = inner.stages, inner.stage_source
        self.records: dict[int, tuple[dict[str, np.ndarray], np.ndarray]] = {}

    def run(self, index: int, inputs: dict[str, np.ndarray]) -> np.ndarray:
        output = self.inner.run(index, inputs)
        self.records[index] = ({name: array.copy() for name, array in inputs.items()}, output.copy())
        return output

    def close(self) -> None:
        self.inner.close()


def capture_pass(dit: AnimaDiT, latent: torch.Tensor, sigma: float, context: torch.Tensor) -> RecordingBackend:
    """One fp32 torch split pass; every subgraph's real inputs and fp32 output, by index."""
    recorder = RecordingBackend(TorchBackend(dit, torch.float32))
    engine = SplitEngine(dit, recorder)
    engine.velocity(latent, sigma, context)
    engine.close()
    return recorder


def verify_subgraphs(rknn_dir: Path, recorder: RecordingBackend, runtime: str = "auto") -> list[SubgraphAccuracy]:
    """Run every converted subgraph on its recorded inputs, one context at a time, against fp32 torch."""
    backend = RknnBackend(rknn_dir, runtime=runtime, max_resident=1)
    records = {record["index"]: record for record in backend.conversion["subgraphs"]}
    results = []
    try:
        for index, (inputs, want) in sorted(recorder.records.items()):
            record = records[index]
            precision = record.get("precision", "float16")
            results.append(SubgraphAccuracy(index, record["rknn_file"], *agreement(backend.run(index, inputs), want),
                                            precision, record.get("held_out_cosine", {}).get(precision)))
    finally:
        backend.close()
    return results


def converted_size(set_dir: Path, dit_path: Path) -> tuple[int, int]:
    """(width, height) of a converted DiT set, after checking it was converted from `dit_path`: the caller
    needs them for the latent, and a wrong set is refused before the prompt's text encoder loads."""
    stored = read_manifest(set_dir)
    width, height = stored["width"], stored["height"]
    read_converted_manifest(set_dir, dit_path=dit_path, width=width, height=height)
    return width, height


def verify_dit_set(set_dir: Path, dit_path: Path, latent: torch.Tensor, sigma: float, context: torch.Tensor,
                   runtime: str = "auto") -> list[SubgraphAccuracy]:
    """Every subgraph of the set at `set_dir` against the fp32 DiT at `dit_path`, fed what one torch pass on
    `latent` at `sigma` with `context` feeds it."""
    return verify_subgraphs(set_dir, capture_pass(load_dit(dit_path, torch.float32), latent, sigma, context), runtime)


def flagged(results: list[SubgraphAccuracy], min_cosine: float) -> list[str]:
    """The files of the subgraphs below `min_cosine`."""
    return [r.file for r in results if not r.cosine >= min_cosine]  # NaN (an fp16 overflow) is flagged too


def accuracy_table(results: list[SubgraphAccuracy], min_cosine: float) -> str:
    """One row per subgraph, those below `min_cosine` marked BELOW."""
    lines = [f"{'#':>3}  {'subgraph':<22}{'precision':>10}{'held out':>11}{'cosine':>12}{'max rel err':>13}"]
    for r in results:
        flag = f"  BELOW {min_cosine}" if not r.cosine >= min_cosine else ""
        held = "-" if r.held_out_cosine is None else f"{r.held_out_cosine:.7f}"
        lines.append(f"{r.index:>3}  {r.file:<22}{r.precision:>10}{held:>11}{r.cosine:>12.7f}"
                     f"{r.max_rel_error:>13.2e}{flag}")
    return "\n".join(lines)
