"""A DiT with another block count than Anima's 28 (`make-tiny --blocks N`; the community Anima-2.9B has 40) goes
through every command: 40 blocks load, match diffusers' transformer with the same weights, export, plan and generate
on torch and onnx; (in .venv-rknn) 3 blocks convert and generate on the simulator. Converting all 120 subgraphs of
40 blocks takes minutes: benchmarks/rknn_blocks.py runs that once (docs/npu-board.md)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from anima_rknn.demo.tiny_set import write_model_set
from anima_rknn.export.manifest import read_manifest
from anima_rknn.model.config import PRESETS
from anima_rknn.model.io import load_dit, read_dit_config
from anima_rknn.model.model_set import ModelFiles, from_model_dir

BLOCKS = 40  # Anima-2.9B's count: 120 subgraphs
CONVERTED_BLOCKS = 3  # 9 subgraphs, neither the tiny preset's 2 nor Anima's 28: what the simulator test converts
SIZE = ("--width", "64", "--height", "64")
HAS_TOOLKIT = importlib.util.find_spec("rknn") is not None


@pytest.fixture(scope="module")
def forty_blocks(tmp_path_factory) -> ModelFiles:
    return write_model_set(tmp_path_factory.mktemp("forty") / "set", "tiny", blocks=BLOCKS)


@pytest.fixture(scope="module")
def three_blocks(tmp_path_factory) -> ModelFiles:
    return write_model_set(tmp_path_factory.mktemp("three") / "set", "tiny", blocks=CONVERTED_BLOCKS)


def model_dir(files: ModelFiles) -> Path:
    return files.dit.parents[2]


def test_make_tiny_writes_the_blocks_asked_for(run_cli, tmp_path):
    out = tmp_path / "seven"
    result = run_cli("make-tiny", "--out", out, "--blocks", "7")
    assert result.code == 0, result.err
    dit = from_model_dir(out).dit
    assert dit.name == "anima-tiny-7blocks-random.safetensors"
    assert read_dit_config(dit) == dataclasses.replace(PRESETS["tiny"], blocks=7, t5_vocab=read_dit_config(dit).t5_vocab)
    for bad in ("0", "1025", "x"):
        refused = run_cli("make-tiny", "--out", tmp_path / bad, "--blocks", bad)
        assert refused.code == 2 and "--blocks" in refused.err and not (tmp_path / bad).exists()


@pytest.mark.skipif(importlib.util.find_spec("diffusers") is None, reason="diffusers lives in the main environment")
def test_the_dit_matches_diffusers_with_the_same_weights(forty_blocks):
    from diffusers_reference import dit_file_error

    assert len(load_dit(forty_blocks.dit, torch.float32).blocks) == BLOCKS
    assert dit_file_error(forty_blocks.dit) < 1e-4


def generate(run_cli, files: ModelFiles, out: Path, *backend: str | Path) -> dict:
    result = run_cli("generate", "--model", model_dir(files), "-p", "a red circle", *SIZE, "--steps", "3",
                     "--dtype", "fp32", *backend, "-o", out, "--json")
    assert result.code == 0, result.err
    return json.loads(result.out)


@pytest.mark.skipif(HAS_TOOLKIT, reason="the main environment runs it; .venv-rknn's share is the conversion")
def test_export_plan_and_generate_on_onnx(run_cli, forty_blocks, tmp_path):
    pytest.importorskip("onnxruntime")
    onnx = tmp_path / "onnx"
    assert run_cli("export-onnx", "--model", model_dir(forty_blocks), *SIZE, "--out", onnx).code == 0
    manifest = read_manifest(onnx)
    assert len(manifest["subgraphs"]) == 3 * BLOCKS and manifest["model"]["blocks"] == BLOCKS
    assert manifest["subgraphs"][-1]["file"] == f"b{BLOCKS - 1:02d}_mlp.onnx"
    plan = run_cli("plan", "--subgraphs", onnx)
    assert plan.code == 0 and f"RKNN memory plan: {3 * BLOCKS} contexts" in plan.out
    on_torch = generate(run_cli, forty_blocks, tmp_path / "torch.png")
    on_onnx = generate(run_cli, forty_blocks, tmp_path / "onnx.png", "--backend", "onnx", "--subgraphs", onnx)
    assert on_onnx["transformer_passes"] == on_torch["transformer_passes"] == 6
    assert on_onnx["subgraph_runs"] == 6 * 3 * BLOCKS
    images = [np.asarray(Image.open(tmp_path / f"{name}.png"), dtype=np.float64) for name in ("torch", "onnx")]
    assert np.abs(images[0] - images[1]).max() <= 2  # fp32 both sides


def test_plan_predicts_a_preset_with_more_blocks(run_cli):
    result = run_cli("plan", "--preset", "full", "--blocks", "40", "--budget", "8GB")
    assert result.code == 0, result.err
    assert result.out.startswith("RKNN memory plan: 120 contexts, 1024 tokens")
    resident = int(re.search(r"resident contexts (\d+) of 120", result.out).group(1))
    assert f"per transformer pass: {120 - resident + 1} loads" in result.out
    wrong = run_cli("plan", "--subgraphs", ".", "--blocks", "40")
    assert wrong.code == 1 and "--blocks goes with --preset" in wrong.err


@pytest.mark.skipif(not HAS_TOOLKIT, reason="rknn-toolkit2 lives in .venv-rknn")
def test_convert_and_generate_on_the_simulator(run_cli, three_blocks, tmp_path):
    onnx, rknn = tmp_path / "onnx", tmp_path / "rknn"
    assert run_cli("export-onnx", "--model", model_dir(three_blocks), *SIZE, "--out", onnx, "--dtype", "fp16").code == 0
    converted = run_cli("convert-rknn", "--subgraphs", onnx, "--out", rknn)
    assert converted.code == 0 and f"converted {3 * CONVERTED_BLOCKS} subgraphs" in converted.out
    record = generate(run_cli, three_blocks, tmp_path / "npu.png", "--backend", "rknn", "--subgraphs", rknn,
                      "--rknn-runtime", "simulator", "--rknn-budget", "2GiB")
    assert record["subgraph_runs"] == 6 * 3 * CONVERTED_BLOCKS
    assert record["timings"]["stages"]["first_pass_loads"] == 3 * CONVERTED_BLOCKS
    on_torch = generate(run_cli, three_blocks, tmp_path / "torch.png")
    images = [np.asarray(Image.open(tmp_path / f"{name}.png"), dtype=np.float64) for name in ("torch", "npu")]
    assert np.abs(images[0] - images[1]).max() <= 8 and on_torch["finite"]  # fp16 bodies: a few levels
