"""Runs an exported ONNX subgraph set with ONNX Runtime on the CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ...core.threads import session_options
from ...errors import AnimaError
from .base import StageClock


class OnnxBackend:
    """One ONNX Runtime session per subgraph, all created up front so a bad file fails before sampling.

    Inputs are cast to the dtypes the manifest lists (float16 for an fp16 export); the output is returned
    in the set's dtype. Sessions use as many intra-op threads as torch does (the run's --threads), so both
    sides compare fairly, without spinning (core/threads.py).
    """

    name = "onnx"
    stage_source = "CPU (ONNX Runtime): not the board's times"

    def __init__(self, subgraph_dir: Path, manifest: dict[str, Any]) -> None:
        try:
            import onnxruntime
        except ImportError:
            raise AnimaError("the onnx backend needs onnxruntime: pip install 'anima-rknn[onnx]'") from None
        self.stages = StageClock()
        options = session_options(onnxruntime)  # torch's threads (the run's --threads), no spinning
        self._input_dtypes = [{i["name"]: np.dtype(i["dtype"]) for i in entry["inputs"]}
                              for entry in manifest["subgraphs"]]
        self._sessions = [_session(onnxruntime, Path(subgraph_dir) / entry["file"], options)
                          for entry in manifest["subgraphs"]]

    def run(self, index: int, inputs: dict[str, np.ndarray]) -> np.ndarray:
        with self.stages.stage("prepare"):
            feeds = {name: np.ascontiguousarray(inputs[name], dtype=dtype)
                     for name, dtype in self._input_dtypes[index].items()}
        with self.stages.stage("run"):
            return self._sessions[index].run(["y"], feeds)[0]

    def close(self) -> None:
        self._sessions = []


def _session(onnxruntime: Any, path: Path, options: Any) -> Any:
    try:
        return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime's own exception types (Fail, InvalidProtobuf, ...) share no base class
        reason = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
        raise AnimaError(f"cannot load subgraph file {path}: {reason}") from None
