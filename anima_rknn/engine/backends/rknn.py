"""Runs a converted (.rknn) subgraph set on the RK3588 NPU, or on rknn-toolkit2's x86 simulator.

One runtime context per subgraph, opened on first use. 84 contexts of the full model do not fit the board's
memory, so `max_resident` bounds how many stay open: the first max_resident-1 subgraphs stay open (pinned)
and the others take turns in the last slot (engine.memory_plan.pinned_contexts has the rule and why).

The simulator cannot run a .rknn file (rknn-toolkit2 refuses `init_runtime(target=None)` after
`load_rknn`), so in simulator mode each context is compiled again from the subgraph's ONNX source, which
convert-rknn places beside its .rknn in the set's folder; the .rknn files are still verified, since they are
what the board would load. On the board (runtime lite) the .onnx files are never looked at.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import AnimaError
from ...export.manifest import check_file, read_manifest
from ...export.rknn import TOOLKIT_MISSING, check_precision, simulator_model, toolkit_call, toolkit_output
from ..memory_plan import pinned_contexts
from .base import StageClock

RUNTIMES = ("auto", "simulator", "lite")
# What a run's stage times measure, by runtime: only the board's own runtime times the board.
STAGE_SOURCES = {"lite": "board", "simulator": "x86 simulator (rknn-toolkit2): meaningless for the board"}
CORE_MASKS = {
    "auto": "NPU_CORE_AUTO", "0": "NPU_CORE_0", "1": "NPU_CORE_1", "2": "NPU_CORE_2",
    "0_1": "NPU_CORE_0_1", "0_1_2": "NPU_CORE_0_1_2",
}
LIBRKNNRT_PATHS = (
    Path("/usr/lib/librknnrt.so"), Path("/usr/lib64/librknnrt.so"),
    Path("/usr/lib/aarch64-linux-gnu/librknnrt.so"), Path("/usr/local/lib/librknnrt.so"),
)
DEVICE_TREE_COMPATIBLE = Path("/proc/device-tree/compatible")
_RUNTIME_VERSION = re.compile(rb"librknnrt version: (\d+\.\d+\.\d+)")


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def librknnrt_version(path: Path) -> str | None:
    """The version librknnrt.so carries in its banner string, if it has one."""
    match = _RUNTIME_VERSION.search(path.read_bytes())
    return match.group(1).decode() if match else None


def board_platform(compatible: Path = DEVICE_TREE_COMPATIBLE) -> str | None:
    """'rk3588' etc. from the device tree; the S variants share the target of their full chip."""
    try:
        entries = compatible.read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    for entry in entries:
        if entry.startswith("rockchip,rk"):
            return entry.removeprefix("rockchip,").rstrip("s")
    return None


def check_board(
    toolkit_version: str,
    target: str,
    library_paths: tuple[Path, ...] = LIBRKNNRT_PATHS,
    compatible: Path = DEVICE_TREE_COMPATIBLE,
) -> None:
    """Refuse, in one line each, the board mismatches that otherwise crash inside librknnrt."""
    library = next((path for path in library_paths if path.is_file()), None)
    if library is None:
        raise AnimaError(f"librknnrt.so not found (looked in {', '.join(str(p.parent) for p in library_paths)}): "
                         "install the RKNPU2 runtime of your board image")
    runtime_version = librknnrt_version(library)
    if runtime_version is None:
        raise AnimaError(f"cannot tell the version of {library}: install librknnrt {toolkit_version} or newer")
    if version_tuple(runtime_version) < version_tuple(toolkit_version):
        raise AnimaError(f"{library} is version {runtime_version}, older than rknn-toolkit2 {toolkit_version} "
                         "that converted these subgraphs: update librknnrt")
    platform = board_platform(compatible)
    if platform is not None and platform != target:
        raise AnimaError(f"these subgraphs were converted for {target} but this board is {platform}")


def resolve_runtime(runtime: str) -> str:
    if runtime not in RUNTIMES:
        raise AnimaError(f"unknown RKNN runtime {runtime!r}: choose one of {', '.join(RUNTIMES)}")
    has_lite = importlib.util.find_spec("rknnlite") is not None
    has_toolkit = importlib.util.find_spec("rknn") is not None
    if runtime == "lite" or (runtime == "auto" and has_lite):
        if not has_lite:
            raise AnimaError("rknn-toolkit-lite2 is not installed: pip install rknn-toolkit-lite2 on the board")
        return "lite"
    if not has_toolkit:
        raise AnimaError(TOOLKIT_MISSING)
    return "simulator"


def check_runtime(conversion: dict[str, Any], runtime: str) -> str:
    """The runtime that runs a converted set here (`resolve_runtime`), with the board checked against the set's
    conversion record (its "rknn" manifest entry) when that is the NPU. Cheap: the pipeline calls it before any
    model loads, so a board without the NPU runtime is told in one line, not after minutes of loading."""
    chosen = resolve_runtime(runtime)
    if chosen == "lite":
        check_board(conversion["toolkit_version"], conversion["target"])
    return chosen


@dataclass(frozen=True)
class RknnOptions:
    """How generate / bench run a converted set: which runtime, how much memory, which NPU cores."""

    runtime: str = "auto"
    budget_bytes: int | None = None  # None: every context stays open (fine for small models, not the full one)
    core_mask: str = "auto"


class RknnBackend:
    """Backend protocol over RKNN runtime contexts: at most `max_resident` open at once, the first
    max_resident-1 pinned for the whole run and the others taking turns in the last slot."""

    name = "rknn"
    # Stages: load (open / close a context, its hash checked the first time), prepare (the inputs' cast and
    # shape check), run (inference), output (to fp32 in the manifest's shape).

    def __init__(
        self,
        subgraph_dir: str | os.PathLike,
        *,
        runtime: str = "auto",
        max_resident: int | None = None,
        core_mask: str = "auto",
    ) -> None:
        self.subgraph_dir = Path(subgraph_dir)
        manifest = read_manifest(self.subgraph_dir, kind=None)  # DiT subgraphs or the VAE decoder
        if "rknn" not in manifest:
            raise AnimaError(f"{self.subgraph_dir} holds ONNX subgraphs, not .rknn ones: convert them with "
                             "`anima-rknn convert-rknn` first")
        if max_resident is not None and max_resident < 1:
            raise AnimaError(f"max_resident must be at least 1, not {max_resident}")
        if core_mask not in CORE_MASKS:
            raise AnimaError(f"unknown NPU core mask {core_mask!r}: choose one of {', '.join(CORE_MASKS)}")
        self.max_resident = max_resident
        self.core_mask = core_mask
        self.subgraphs = manifest["subgraphs"]
        self.conversion = manifest["rknn"]
        self.rknn_files = {record["index"]: record for record in self.conversion["subgraphs"]}
        self.runtime = check_runtime(self.conversion, runtime)
        self.stages = StageClock()
        self.stage_source = STAGE_SOURCES[self.runtime]
        self.pinned_count = pinned_contexts(len(self.subgraphs), max_resident)
        self.contexts: OrderedDict[int, Any] = OrderedDict()  # least recently used first
        self.verified: set[int] = set()
        self.peak_live_contexts = 0
        self.releases = 0

    @property
    def loads(self) -> int:
        return self.stages.loads

    @property
    def live_contexts(self) -> int:
        return len(self.contexts)

    def run(self, index: int, inputs: dict[str, np.ndarray]) -> np.ndarray:
        entry = self.subgraphs[index]
        with self.stages.stage("prepare"):
            ordered = [self._prepare(entry, spec, inputs) for spec in entry["inputs"]]
        with self.stages.stage("load"):
            context = self._context(index)
        with toolkit_output() as log, self.stages.stage("run"):
            # 'nchw': take arrays as laid out in the ONNX graph (4-D inputs default to NHWC otherwise)
            outputs = toolkit_call("inference", Path(self.rknn_files[index]["rknn_file"]), log, context.inference,
                                   inputs=ordered, data_format=["nchw"] * len(ordered))
        with self.stages.stage("output"):
            return np.asarray(outputs[0], dtype=np.float32).reshape(entry["outputs"][0]["shape"])

    def close(self) -> None:
        with self.stages.stage("load"):
            while self.contexts:
                self._release(next(iter(self.contexts)))

    def _prepare(self, entry: dict[str, Any], spec: dict[str, Any], inputs: dict[str, np.ndarray]) -> np.ndarray:
        name = spec["name"]
        if name not in inputs:
            raise ValueError(f"subgraph {entry['file']} needs input {name!r}")
        array = np.ascontiguousarray(inputs[name], dtype=np.dtype(spec["dtype"]))
        if list(array.shape) != spec["shape"]:
            raise ValueError(f"input {name!r} of {entry['file']} has shape {list(array.shape)}, "
                             f"expected {spec['shape']}")
        return array

    def _context(self, index: int) -> Any:
        if index in self.contexts:
            self.contexts.move_to_end(index)
            return self.contexts[index]
        while self.max_resident is not None and len(self.contexts) >= self.max_resident:
            self._release(next(i for i in self.contexts if i >= self.pinned_count))
        context = self._load(index)
        self.contexts[index] = context
        self.stages.loads += 1
        self.peak_live_contexts = max(self.peak_live_contexts, len(self.contexts))
        return context

    def _release(self, index: int) -> None:
        self.contexts.pop(index).release()
        self.releases += 1

    def _load(self, index: int) -> Any:
        rknn_path = self.subgraph_dir / self.rknn_files[index]["rknn_file"]
        if index not in self.verified:  # once per backend: re-hashing GBs on every reload would cost seconds
            check_file(rknn_path, self.rknn_files[index]["rknn_sha256"])
            check_precision(rknn_path, self.rknn_files[index])
            self.verified.add(index)
        with toolkit_output() as log:
            if self.runtime == "simulator":
                # built again from the set's sources (checked there): the ONNX file, or an int8 one's step-1 files
                context = simulator_model(self.subgraph_dir, self.subgraphs[index], self.rknn_files[index],
                                          self.conversion["target"], log)
                steps = {"init_runtime": lambda: context.init_runtime(target=None)}
            else:
                from rknnlite.api import RKNNLite

                context = RKNNLite(verbose=False)
                core_mask = getattr(RKNNLite, CORE_MASKS[self.core_mask])
                steps = {"load_rknn": lambda: context.load_rknn(str(rknn_path)),
                         "init_runtime": lambda: context.init_runtime(core_mask=core_mask)}
            try:
                for step, call in steps.items():
                    toolkit_call(step, rknn_path, log, call)
            except AnimaError:
                context.release()
                raise
        return context
