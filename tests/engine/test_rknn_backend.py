"""RKNN backend on rknn-toolkit2's x86 simulator (in .venv-rknn), and the board checks (everywhere).

The subgraphs are the real exporter's, from the tiny model set, converted by the real converter.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from anima_rknn.engine import RknnOptions, SplitEngine, make_engine
from anima_rknn.engine.backends.rknn import RknnBackend, board_platform, check_board
from anima_rknn.engine.memory_plan import plan_memory
from anima_rknn.errors import AnimaError
from anima_rknn.export.manifest import read_manifest
from anima_rknn.generation.params import GenerationParams
from anima_rknn.generation.pipeline import AnimaPipeline, initial_noise
from anima_rknn.model.io import load_dit

WIDTH = HEIGHT = 64  # 16 tokens
COUNT = 6  # the tiny DiT has 2 blocks, 3 subgraphs each
SIGMAS = (1.0, 0.5)  # one pass per sigma: a first step and a mid-schedule one


@pytest.fixture(scope="module")
def converted(tiny_rknn_set) -> Path:
    return tiny_rknn_set


@pytest.fixture(scope="module")
def dit(tiny_set):
    return load_dit(tiny_set.dit, torch.float32)


@pytest.fixture(scope="module")
def context(tiny_set) -> torch.Tensor:
    return AnimaPipeline(tiny_set).encode("1girl, long hair, smile, flowers", "").positive


class BoundWatcher:
    """Runs the real backend and checks, after every subgraph, how many contexts it holds open."""

    name = "watched-rknn"

    def __init__(self, backend: RknnBackend, bound: int) -> None:
        self.backend, self.bound = backend, bound
        self.stages, self.stage_source = backend.stages, backend.stage_source

    def run(self, index: int, inputs: dict[str, np.ndarray]) -> np.ndarray:
        output = self.backend.run(index, inputs)
        assert 1 <= self.backend.live_contexts <= self.bound
        return output

    def close(self) -> None:
        self.backend.close()


def run_pass(engine: SplitEngine, context: torch.Tensor, sigma: float, seed: int = 0) -> torch.Tensor:
    return engine.velocity(torch.from_numpy(initial_noise(seed, WIDTH, HEIGHT)), sigma, context)


def test_full_pass_matches_the_fp32_torch_split(converted, dit, context, tiny_set):
    torch_engine = make_engine(dit, "torch", width=WIDTH, height=HEIGHT)
    rknn_engine = make_engine(dit, "rknn", width=WIDTH, height=HEIGHT, subgraphs=converted, dit_path=tiny_set.dit,
                              rknn=RknnOptions(runtime="simulator"))
    try:
        for sigma in SIGMAS:
            want = run_pass(torch_engine, context, sigma).double()
            got = run_pass(rknn_engine, context, sigma).double()
            assert got.shape == want.shape and torch.isfinite(got).all()
            rel_error = ((got - want).abs().max() / want.abs().max()).item()
            cosine = torch.nn.functional.cosine_similarity(got.ravel(), want.ravel(), dim=0).item()
            print(f"sigma {sigma}: velocity max rel error {rel_error:.2e}, cosine {cosine:.8f}")
            # fp16 has a unit roundoff of 2**-11 ~ 4.9e-4. Each body rounds its input, weights, every matmul
            # output and the softmax to fp16: a few roundoffs relative to the body's own output scale, which is
            # at most that of the fp32 residual stream it is added into. 6 bodies of errors that do not all
            # line up, then the fp32 final layer: 4e-3 (~8 roundoffs) holds that (measured 3-4e-4) and sits
            # far below what a real mistake gives (a wrong layout or input order: errors of order 1).
            assert rel_error < 4e-3 and cosine > 0.9999
    finally:
        rknn_engine.close()
    assert rknn_engine.backend.live_contexts == 0


@pytest.mark.parametrize(("bound", "second_pass_loads"), [(1, 6), (4, 3), (None, 0)])
def test_pinned_contexts_stay_open_and_the_rest_take_turns(converted, dit, context, bound, second_pass_loads):
    # with k resident, k-1 stay pinned and the other 3*blocks-(k-1) reload once per pass: 6-4+1 = 3
    backend = RknnBackend(converted, runtime="simulator", max_resident=bound)
    engine = SplitEngine(dit, BoundWatcher(backend, bound or COUNT))
    run_pass(engine, context, SIGMAS[0])
    assert backend.loads == COUNT  # a first pass opens each context once
    run_pass(engine, context, SIGMAS[1])
    assert backend.loads - COUNT == second_pass_loads
    assert backend.peak_live_contexts == (bound or COUNT)
    assert backend.releases == backend.loads - backend.live_contexts
    engine.close()
    assert backend.live_contexts == 0 and backend.releases == backend.loads


def test_memory_budget_sets_the_bound_and_the_plan_counts_the_loads(converted, dit, context):
    manifest = json.loads((converted / "manifest.json").read_text())
    everything = plan_memory(manifest, None)
    totals = [c.total_bytes for c in everything.contexts]
    # room for 3 pinned contexts plus the costliest of the other 3: a bound of 4
    budget = everything.host_bytes + sum(totals[:3]) + max(totals[3:])
    plan = plan_memory(manifest, budget)
    assert (plan.max_resident, plan.loads_per_pass, plan.releases_per_pass) == (4, 3, 3)
    assert plan.peak_bytes == budget
    engine = make_engine(dit, "rknn", width=WIDTH, height=HEIGHT, subgraphs=converted,
                         rknn=RknnOptions(runtime="simulator", budget_bytes=budget))
    backend = engine.backend
    assert backend.max_resident == 4
    run_pass(engine, context, SIGMAS[0])
    first = backend.loads
    run_pass(engine, context, SIGMAS[1])
    assert backend.loads - first == plan.loads_per_pass and backend.peak_live_contexts == 4
    engine.close()
    assert backend.live_contexts == 0


def test_corrupted_rknn_is_refused_by_name_before_loading(converted, dit, context, tmp_path):
    copy = tmp_path / "rknn"
    shutil.copytree(converted, copy)
    data = bytearray((copy / "b01_mlp.rknn").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / "b01_mlp.rknn").write_bytes(data)
    backend = RknnBackend(copy, runtime="simulator")
    engine = SplitEngine(dit, backend)
    with pytest.raises(AnimaError, match=r"b01_mlp\.rknn is corrupt"):
        run_pass(engine, context, SIGMAS[0])
    assert backend.loads == COUNT - 1  # intact files still loaded, the corrupted one never was
    engine.close()
    assert backend.live_contexts == 0


def test_wrong_inputs_wrong_sets_and_unconverted_sets_are_refused(converted, tiny_onnx_set, dit):
    backend = RknnBackend(converted, runtime="simulator")
    with pytest.raises(ValueError, match="rope_sin"):
        backend.run(0, {"x": np.zeros((1, 16, 128), np.float32), "rope_cos": np.zeros((1, 1, 16, 64), np.float32)})
    with pytest.raises(ValueError, match="shape"):
        backend.run(2, {"x": np.zeros((1, 3, 128), np.float32)})
    assert backend.loads == 0  # refused before any context was opened
    with pytest.raises(AnimaError, match="exported for 64x64, asked for 128x128"):
        make_engine(dit, "rknn", width=128, height=128, subgraphs=converted, rknn=RknnOptions(runtime="simulator"))
    with pytest.raises(AnimaError, match="convert them with `anima-rknn convert-rknn` first"):
        RknnBackend(tiny_onnx_set, runtime="simulator")


def test_only_the_simulator_needs_the_onnx_files(converted, dit, context, tmp_path):
    """A set copied to the board without its .onnx files opens and plans; only the simulator asks for them."""
    board_copy = tmp_path / "rknn"
    shutil.copytree(converted, board_copy, ignore=shutil.ignore_patterns("*.onnx"))
    engine = make_engine(dit, "rknn", width=WIDTH, height=HEIGHT, subgraphs=board_copy,
                         rknn=RknnOptions(runtime="simulator"))
    assert plan_memory(read_manifest(board_copy), None).max_resident == COUNT
    with pytest.raises(AnimaError, match=r"b00_self_attn\.onnx is missing: the simulator builds each context from "
                                         r"the ONNX file beside its \.rknn"):
        run_pass(engine, context, SIGMAS[0])
    assert engine.backend.loads == 0
    engine.close()


def test_a_planted_pickle_is_refused_by_the_toolkit_and_never_unpickled(converted, dit, context, tmp_path):
    class Unpickled:
        def __reduce__(self):
            return open, (str(tmp_path / "unpickled"), "w")

    planted = pickle.dumps(Unpickled())
    copy = tmp_path / "rknn"
    shutil.copytree(converted, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    for entry, record in zip(manifest["subgraphs"], manifest["rknn"]["subgraphs"]):
        for name in (entry["file"], record["rknn_file"]):
            (copy / name).write_bytes(planted)
        entry["sha256"] = record["rknn_sha256"] = hashlib.sha256(planted).hexdigest()
    (copy / "manifest.json").write_text(json.dumps(manifest))
    engine = make_engine(dit, "rknn", width=WIDTH, height=HEIGHT, subgraphs=copy, rknn=RknnOptions(runtime="simulator"))
    with pytest.raises(AnimaError, match="rknn-toolkit2 load_onnx failed for b00_self_attn.onnx") as raised:
        run_pass(engine, context, SIGMAS[0])
    assert "\n" not in str(raised.value) and not (tmp_path / "unpickled").exists()
    engine.close()


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


LITE_MISSING = "rknn-toolkit-lite2 is not installed: pip install rknn-toolkit-lite2 on the board"


# prepare() refuses a set whose runtime is missing before any model loads: on the board the full DiT takes
# minutes to load, and the VAE decodes only after the whole denoising. This venv has rknn-toolkit2 but not
# rknn-toolkit-lite2, so runtime "lite" is the board's runtime missing; scripts/board-check.sh runs the other half
# in an arm64 root (rknn-toolkit-lite2 installed, no librknnrt.so).
def test_a_dit_set_without_its_runtime_is_refused_before_the_models_load(tiny_set, converted):
    pipeline = AnimaPipeline(tiny_set)
    with pytest.raises(AnimaError) as raised:
        pipeline.prepare(GenerationParams("a red circle", width=WIDTH, height=HEIGHT, backend="rknn",
                                          subgraphs=converted, rknn=RknnOptions(runtime="lite")))
    assert str(raised.value) == LITE_MISSING
    pipeline.prepare(GenerationParams("a red circle", width=WIDTH, height=HEIGHT, backend="rknn", subgraphs=converted,
                                      rknn=RknnOptions(runtime="simulator")))  # the same set, where it can run


@pytest.mark.skipif(importlib.util.find_spec("rknn") is None,
                    reason="converting needs rknn-toolkit2 (.venv-rknn); skipped before the VAE set is exported")
def test_a_vae_set_without_its_runtime_is_refused_before_the_denoising(tiny_set, tiny_vae_rknn_set):
    params = GenerationParams("a red circle", width=WIDTH, height=HEIGHT, vae_backend="rknn",
                              vae_subgraphs=tiny_vae_rknn_set, vae_tile=64, vae_overlap=16,
                              rknn=RknnOptions(runtime="lite"))
    with pytest.raises(AnimaError) as raised:
        AnimaPipeline(tiny_set).prepare(params)
    assert str(raised.value) == LITE_MISSING


def test_cfgpp_ud10_ab_runs_on_the_simulator_near_the_fp32_torch_run(converted, tiny_set):
    """The guided sampler's x0 pair comes through the rknn engine's two CFG passes as through torch's: 3 steps at
    CFG 2 end within the fp16 bodies' rounding of the fp32 torch run (as one pass does above)."""
    params = GenerationParams("a red circle", width=WIDTH, height=HEIGHT, steps=3, cfg=2.0, sampler="cfgpp_ud10_ab",
                              seed=3, dtype="fp32")
    pipeline = AnimaPipeline(tiny_set)
    want = pipeline.generate(params).latent.astype(np.float64)
    got = pipeline.generate(dataclasses.replace(params, backend="rknn", subgraphs=converted,
                                                rknn=RknnOptions(runtime="simulator"))).latent.astype(np.float64)
    rel_error = np.abs(got - want).max() / np.abs(want).max()
    print(f"cfgpp_ud10_ab, 3 steps: latent max rel error {rel_error:.2e}")
    assert np.isfinite(got).all() and rel_error < 4e-3
