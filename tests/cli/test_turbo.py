"""Turbo-style checkpoints (anima-turbo: a full distilled DiT of the same architecture, run at CFG 1 for 8-12 steps):
one as such releases ship it (ComfyUI's `model.diffusion_model.` prefix, bf16, none of our metadata) loads, exports
and (in .venv-rknn) converts and runs on the simulator; CFG 1 runs one transformer pass a step and the record says
so, any other scale two."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from safetensors import safe_open
from safetensors.torch import save_file

from anima_rknn.export.manifest import read_manifest

SIZE = ("--width", "64", "--height", "64")
HAS_TOOLKIT = importlib.util.find_spec("rknn") is not None


@pytest.fixture(scope="module")
def turbo_dit(tiny_set, tmp_path_factory) -> Path:
    """The tiny DiT re-saved the way distilled releases are: another prefix, no anima_rknn metadata."""
    with safe_open(tiny_set.dit, "pt") as f:
        state = {"model.diffusion_model." + k.removeprefix("net."): f.get_tensor(k) for k in f.keys()}
    path = tmp_path_factory.mktemp("turbo") / "anima-turbo-style.safetensors"
    save_file(state, path)
    return path


def generate(run_cli, model_dir, dit: Path, out: Path, *args: str | Path) -> tuple[dict, str]:
    result = run_cli("generate", "--model", model_dir, "--dit", dit, "-p", "a red circle", *SIZE, *args,
                     "-o", out, "--json")
    assert result.code == 0, result.err
    return json.loads(result.out), result.err


@pytest.mark.parametrize("cfg, per_call", [("1", 1), ("1.0", 1), ("4", 2), ("1.5", 2)])
def test_cfg_1_runs_one_pass_a_step_and_the_record_says_so(run_cli, model_dir, turbo_dit, tmp_path, cfg, per_call):
    record, err = generate(run_cli, model_dir, turbo_dit, tmp_path / "a.png", "--steps", "4", "--cfg", cfg)
    assert record["passes_per_model_call"] == per_call and record["model_calls"] == 4
    assert record["transformer_passes"] == 4 * per_call and record["subgraph_runs"] == 4 * per_call * 6
    assert f"{4 * per_call} transformer passes ({per_call} per model call)" in err


def test_a_turbo_recipe_with_a_cache_skips_passes_of_its_8(run_cli, model_dir, turbo_dit, tmp_path):
    record, _ = generate(run_cli, model_dir, turbo_dit, tmp_path / "a.png", "--steps", "8", "--cfg", "1",
                         "--cache", "spectrum")
    assert record["passes_per_model_call"] == 1
    assert record["transformer_passes"] == len(record["computed_steps"]) < 8


def test_a_turbo_checkpoint_exports(run_cli, turbo_dit, tmp_path):
    pytest.importorskip("onnx")
    result = run_cli("export-onnx", "--dit", turbo_dit, *SIZE, "--out", tmp_path / "onnx")
    assert result.code == 0, result.err
    assert len(read_manifest(tmp_path / "onnx")["subgraphs"]) == 6


@pytest.mark.skipif(not HAS_TOOLKIT, reason="rknn-toolkit2 lives in .venv-rknn")
def test_a_turbo_checkpoint_converts_and_runs_one_pass_a_step_on_the_simulator(run_cli, model_dir, turbo_dit,
                                                                                tmp_path):
    assert run_cli("export-onnx", "--dit", turbo_dit, *SIZE, "--dtype", "fp16", "--out", tmp_path / "onnx").code == 0
    assert run_cli("convert-rknn", "--subgraphs", tmp_path / "onnx", "--out", tmp_path / "rknn").code == 0
    record, _ = generate(run_cli, model_dir, turbo_dit, tmp_path / "a.png", "--steps", "2", "--cfg", "1",
                         "--backend", "rknn", "--subgraphs", tmp_path / "rknn", "--rknn-runtime", "simulator")
    assert record["transformer_passes"] == record["timings"]["stages"]["passes"] == 2
    assert record["passes_per_model_call"] == 1 and record["subgraph_runs"] == 12
