"""Capture a calibration set from real fp32 torch runs of the DiT a subgraph set was exported from.

Each run is a whole Euler sampling of one prompt and seed with CFG, as generate runs it (its velocity at every
step, both branches); at a few steps spread over the schedule every subgraph's inputs and output are kept, for
the cond and the uncond pass. The last run's prompt and seed are held out: the calibration never sees them, and
each quantized subgraph is checked on them (export.rknn). The caller brings each prompt's encoded contexts:
encoding is the pipeline's work, above the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from ..errors import AnimaError
from ..export.calibration import Calibration, CalibrationWriter, Sample, read_calibration
from ..model.dit import AnimaDiT
from ..sampling.schedule import flow_sigmas
from .backends.torch import TorchBackend
from .split import SplitEngine
from .accuracy import RecordingBackend

DEFAULT_STEPS = 20
DEFAULT_CAPTURED_STEPS = 5
DEFAULT_CFG = 4.0


def captured_steps(steps: int, count: int) -> list[int]:
    """`count` step indices spread evenly over a `steps`-step schedule, first and last included."""
    if not 1 <= count <= steps:
        raise AnimaError(f"captured steps must be 1 to {steps}, got {count}")
    return sorted({round(i * (steps - 1) / max(count - 1, 1)) for i in range(count)})


@dataclass(frozen=True)
class CalibrationRun:
    """One sampling run to capture: its prompt and seed (recorded), initial noise and encoded contexts."""

    prompt: str
    seed: int
    noise: np.ndarray  # [1, 16, h, w] float32
    positive: torch.Tensor
    negative: torch.Tensor


class _GatedRecorder(RecordingBackend):
    """Records only while `on`: the other steps of a run pass straight through."""

    def __init__(self, inner: TorchBackend) -> None:
        super().__init__(inner)
        self.on = False
        self.pass_ = (0, "cond")  # the step and branch of the pass being recorded

    def run(self, index: int, inputs: dict[str, np.ndarray]) -> np.ndarray:
        return super().run(index, inputs) if self.on else self.inner.run(index, inputs)


@torch.inference_mode()
def euler_cfg(engine: SplitEngine, run: CalibrationRun, sigmas: np.ndarray, cfg: float,
              before_pass: Callable[[int, str], None] = lambda step, branch: None) -> np.ndarray:
    """A whole Euler sampling of `run` with CFG on `engine` (generate's default sampler); `before_pass(step,
    branch)` is told of each pass before it runs. The final latent."""
    x = torch.from_numpy(np.ascontiguousarray(run.noise, dtype=np.float32))
    for step in range(len(sigmas) - 1):
        sigma = float(sigmas[step])
        velocities = []
        for branch, context in (("cond", run.positive), ("uncond", run.negative)):
            before_pass(step, branch)
            velocities.append(engine.velocity(x, sigma, context))
        v = velocities[1] + cfg * (velocities[0] - velocities[1])
        x = x + (float(sigmas[step + 1]) - sigma) * v
    return x.numpy()


@torch.inference_mode()
def capture_calibration(dit: AnimaDiT, source: dict[str, Any], out: Path, runs: Sequence[CalibrationRun], *,
                        steps: int = DEFAULT_STEPS, captured: int = DEFAULT_CAPTURED_STEPS, cfg: float = DEFAULT_CFG,
                        shift: float = 3.0, overwrite: bool = False, progress: bool = True) -> Calibration:
    """Sample each run in fp32 torch (Euler, CFG `cfg`); write the inputs and outputs of every subgraph of the ONNX
    set `source` at the `captured` steps, both branches, into `out`. The last run is held out."""
    if len(runs) < 2:
        raise AnimaError("calibration needs at least two prompts: the last one is held out for the check")
    if cfg == 1.0:
        raise AnimaError("calibrate with a CFG other than 1: the uncond branch's inputs are part of the set")
    sigmas = flow_sigmas(steps, shift)
    keep = set(captured_steps(steps, captured))
    recorder = _GatedRecorder(TorchBackend(dit, torch.float32))
    engine = SplitEngine(dit, recorder)
    writer = CalibrationWriter(out, source, overwrite=overwrite)
    bar = tqdm(total=len(runs) * steps, desc="calibrate", unit="step", disable=not progress)

    def record(number: int, run: CalibrationRun, step: int, branch: str) -> None:
        """Before each pass: keep the last one's records if it was captured; capture this one at a kept step."""
        if recorder.on:  # the pass before this one was captured
            done_step, done_branch = recorder.pass_
            writer.add(Sample(number, run.prompt, run.seed, done_step, float(sigmas[done_step]), done_branch,
                              held_out=number == len(runs) - 1), recorder.records)
        recorder.on, recorder.records, recorder.pass_ = step in keep, {}, (step, branch)
        if branch == "cond" and step:
            bar.update()

    try:
        for number, run in enumerate(runs):
            euler_cfg(engine, run, sigmas, cfg, lambda step, branch: record(number, run, step, branch))
            record(number, run, steps, "cond")  # the last pass's samples
    finally:
        bar.close()
        engine.close()
    return read_calibration(writer.finish(), source)
