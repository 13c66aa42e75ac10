"""RKNN backend on rknn-toolkit2's x86 simulator (in .venv-rknn), and the board checks (everywhere)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from anima_rknn.engine.backends.base import SUBGRAPH_KINDS
from anima_rknn.engine.backends.rknn import RknnBackend, board_platform, check_board
from anima_rknn.engine.memory_plan import plan_memory
from anima_rknn.errors import AnimaError

sys.path.insert(0, str(Path(__file__).parents[1]))  # the shared test-only subgraph exporter
from rknn_tiny_subgraphs import TinyDims, export_tiny_subgraphs, sample_inputs, torch_reference  # noqa: E402

DIMS = TinyDims()
COUNT = 3 * DIMS.blocks
# fp16 has a unit roundoff of 2**-11 ~ 4.9e-4. Inputs, weights, each matmul output and the softmax are rounded
# to fp16, so the error relative to the output's scale is a few roundoffs (measured 5e-4 .. 1.5e-3). 4e-3
# (~8 roundoffs) leaves room for that and still catches any real mistake (a wrong layout gives ~1).
MAX_REL_ERROR = 4e-3
MIN_COSINE = 0.9999


@pytest.fixture(scope="module")
def tiny_set(tmp_path_factory):
    pytest.importorskip("rknn.api")
    from anima_rknn.export.rknn import convert_subgraphs

    onnx_dir = tmp_path_factory.mktemp("onnx")
    _, modules = export_tiny_subgraphs(onnx_dir, DIMS)
    rknn_dir = convert_subgraphs(onnx_dir, tmp_path_factory.mktemp("rknn"), progress=False).parent
    return rknn_dir, modules


def inputs_for(index: int, seed: int = 0) -> dict[str, np.ndarray]:
    return sample_inputs(SUBGRAPH_KINDS[index % 3], DIMS, seed=100 * seed + index)


def run_passes(backend: RknnBackend, passes: int, bound: int | None) -> None:
    for step in range(passes):
        for index in range(COUNT):
            backend.run(index, inputs_for(index, step))
            assert backend.live_contexts <= (bound or COUNT)


def test_simulator_matches_fp32_torch_per_subgraph(tiny_set):
    rknn_dir, modules = tiny_set
    backend = RknnBackend(rknn_dir, runtime="simulator")
    try:
        for index in range(COUNT):
            inputs = inputs_for(index)
            got = backend.run(index, inputs)
            want = torch_reference(modules[index], inputs)
            assert got.dtype == np.float32 and got.shape == want.shape
            g, w = got.ravel().astype(np.float64), want.ravel().astype(np.float64)
            cosine = g @ w / np.linalg.norm(g) / np.linalg.norm(w)
            rel_error = np.abs(g - w).max() / np.abs(w).max()
            print(f"{index} {SUBGRAPH_KINDS[index % 3]:<10} cosine {cosine:.7f} max rel error {rel_error:.2e}")
            assert cosine > MIN_COSINE and rel_error < MAX_REL_ERROR
    finally:
        backend.close()


def test_resident_bound_holds_over_full_passes_and_close_releases_all(tiny_set):
    rknn_dir, _ = tiny_set
    backend = RknnBackend(rknn_dir, runtime="simulator", max_resident=2)
    run_passes(backend, passes=2, bound=2)
    assert backend.peak_live_contexts == 2
    assert backend.loads == 2 * COUNT  # LRU over a cycle longer than the bound reloads every subgraph
    assert backend.releases == backend.loads - 2
    backend.close()
    assert backend.live_contexts == 0 and backend.releases == backend.loads


def test_unbounded_backend_loads_each_context_once(tiny_set):
    rknn_dir, _ = tiny_set
    backend = RknnBackend(rknn_dir, runtime="simulator")
    run_passes(backend, passes=2, bound=None)
    assert backend.loads == COUNT and backend.releases == 0 and backend.peak_live_contexts == COUNT
    backend.close()
    assert backend.live_contexts == 0 and backend.releases == COUNT


def test_backend_counters_follow_the_memory_plan(tiny_set):
    rknn_dir, _ = tiny_set
    manifest = json.loads((rknn_dir / "manifest.json").read_text())
    everything = plan_memory(manifest, None)
    totals = [c.total_bytes for c in everything.contexts]
    two = max(totals[i] + totals[(i + 1) % COUNT] for i in range(COUNT))  # costliest pair an LRU can hold
    plan = plan_memory(manifest, everything.host_bytes + two + 1)  # room for two contexts, not three
    assert plan.max_resident == 2
    backend = RknnBackend(rknn_dir, runtime="simulator", max_resident=plan.max_resident)
    run_passes(backend, passes=1, bound=plan.max_resident)
    first_pass = backend.loads
    run_passes(backend, passes=1, bound=plan.max_resident)
    assert backend.loads - first_pass == plan.loads_per_pass
    backend.close()


def test_corrupted_rknn_is_refused_by_name_before_loading(tiny_set, tmp_path):
    rknn_dir, _ = tiny_set
    copy = tmp_path / "rknn"
    shutil.copytree(rknn_dir, copy)
    data = bytearray((copy / "b01_mlp.rknn").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / "b01_mlp.rknn").write_bytes(data)
    backend = RknnBackend(copy, runtime="simulator")
    backend.run(0, inputs_for(0))  # intact files still load
    with pytest.raises(AnimaError, match=r"b01_mlp\.rknn does not match its manifest"):
        backend.run(5, inputs_for(5))
    assert backend.live_contexts == 1
    backend.close()


def test_wrong_inputs_and_unconverted_sets_are_refused(tiny_set):
    rknn_dir, _ = tiny_set
    backend = RknnBackend(rknn_dir, runtime="simulator")
    with pytest.raises(ValueError, match="rope_sin"):
        backend.run(0, {k: v for k, v in inputs_for(0).items() if k != "rope_sin"})
    with pytest.raises(ValueError, match="shape"):
        backend.run(2, {"x": np.zeros((1, 3, DIMS.hidden), np.float32)})
    assert backend.loads == 0  # refused before any context was opened
    source_dir = json.loads((rknn_dir / "manifest.json").read_text())["rknn"]["source_dir"]
    with pytest.raises(AnimaError, match="convert them first"):
        RknnBackend(source_dir, runtime="simulator")


# Board checks: plain files stand in for /usr/lib/librknnrt.so and /proc/device-tree/compatible.


def write_runtime(folder: Path, version: str | None) -> Path:
    banner = f"librknnrt version: {version} (0123abcd@2025-01-01T00:00:00)".encode() if version else b""
    path = folder / "librknnrt.so"
    path.write_bytes(b"\x7fELF" + b"\0" * 64 + banner + b"\0" * 64)
    return path


def write_compatible(folder: Path, *entries: str) -> Path:
    path = folder / "compatible"
    path.write_bytes(b"".join(entry.encode() + b"\0" for entry in entries))
    return path


def test_board_platform_reads_the_device_tree(tmp_path):
    assert board_platform(write_compatible(tmp_path, "radxa,rock-5c", "rockchip,rk3588s")) == "rk3588"
    assert board_platform(tmp_path / "absent") is None


def test_board_check_accepts_a_matching_board(tmp_path):
    compatible = write_compatible(tmp_path, "radxa,rock-5c", "rockchip,rk3588s")
    for version in ("2.5.0", "2.10.1"):
        check_board("2.5.0", "rk3588", (write_runtime(tmp_path, version),), compatible)
    check_board("2.5.0", "rk3588", (write_runtime(tmp_path, "2.5.0"),), tmp_path / "no-device-tree")


@pytest.mark.parametrize(
    ("version", "platform", "message"),
    [
        (None, "rk3588s", "cannot tell the version"),
        ("2.3.0", "rk3588s", "version 2.3.0, older than rknn-toolkit2 2.5.0"),
        ("2.5.0", "rk3576", "converted for rk3588 but this board is rk3576"),
    ],
)
def test_board_check_refuses_mismatches_in_one_line(tmp_path, version, platform, message):
    compatible = write_compatible(tmp_path, f"rockchip,{platform}")
    with pytest.raises(AnimaError, match=message) as raised:
        check_board("2.5.0", "rk3588", (write_runtime(tmp_path, version),), compatible)
    assert "\n" not in str(raised.value)


def test_board_check_refuses_a_missing_runtime(tmp_path):
    with pytest.raises(AnimaError, match="librknnrt.so not found"):
        check_board("2.5.0", "rk3588", (tmp_path / "librknnrt.so",), tmp_path / "compatible")
