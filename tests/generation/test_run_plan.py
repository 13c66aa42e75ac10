"""A run is planned once: whatever starts it, its settings are validated once and pipeline.prepare() makes its
plan (generation/run_plan.py) once, which generate() then takes; each denoise pass takes the validated settings (a
hires run's two passes too: render() calls denoise() per pass, and denoise() validates nothing). The server's
count is in tests/server/test_server.py (its running server)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from click.testing import CliRunner, Result

from anima_rknn.cli.group import cli
from anima_rknn.demo import demo_model_dir
from anima_rknn.errors import AnimaError
from anima_rknn.generation.params import GenerationParams
from anima_rknn.generation.pipeline import AnimaPipeline
from anima_rknn.model.model_set import from_model_dir

FAST = ("--steps", "2", "--dtype", "fp32", "--backend", "torch", "--vae-backend", "torch", "--threads", "1")


def _cli(*args: object) -> Result:
    done = CliRunner().invoke(cli, [*map(str, args)], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    return done


def test_generate_validates_and_prepares_once(run_counts):
    torch.set_num_threads(1)
    params = GenerationParams(prompt="a red circle", steps=3, dtype="fp32", backend="torch", vae_backend="torch",
                              cache="auto")
    result = AnimaPipeline(from_model_dir(demo_model_dir())).generate(params)
    assert result.image is not None
    assert run_counts == {"validate": 1, "prepare": 1}


@pytest.mark.parametrize("hires", [(), ("--hires", "--hires-steps", "1", "--hires-upscaler", "lanczos")],
                         ids=["one-pass", "hires-lanczos"])
def test_the_generate_command_validates_and_prepares_once(run_counts, tmp_path, one_thread, hires):
    """Lanczos decodes the first pass's picture and encodes it at the hires size: both VAE plans are the plan's."""
    done = _cli("generate", "-p", "a red circle", "--model", demo_model_dir(), *FAST, *hires, "--json",
                "-o", tmp_path / "x.png")
    assert json.loads(done.stdout)["image_size"] == ([128, 128] if hires else [64, 64])
    assert run_counts == {"validate": 1, "prepare": 1}


def test_a_batch_job_is_validated_and_prepared_once(run_counts, tmp_path, one_thread):
    (tmp_path / "jobs.txt").write_text("a red circle\n")
    _cli("batch", tmp_path / "jobs.txt", "--model", demo_model_dir(), *FAST, "--seed", "3", "-o", tmp_path / "out")
    assert len(list((tmp_path / "out").glob("*.png"))) == 1
    assert run_counts == {"validate": 1, "prepare": 1}


def test_a_plan_serves_other_seeds_only_and_its_own_model():
    pipeline = AnimaPipeline(from_model_dir(demo_model_dir()))
    params = GenerationParams(prompt="a red circle", steps=2, vae_backend="torch")
    plan = pipeline.prepare(params)
    assert (plan.params.vae_tile, plan.params.vae_overlap, plan.params.threads) == (512, 64, torch.get_num_threads())
    assert plan.params == params and plan.params is not params  # filled in both; the plan's own copy
    assert [(each.denoise_pass.steps_run, each.subgraphs) for each in plan.passes] == [(2, None)]
    other = plan.for_settings(GenerationParams(prompt="a red circle", steps=2, vae_backend="torch", seed=9))
    assert other.params.seed == 9 and other.params.vae_tile == 512 and plan.params.seed == params.seed
    with pytest.raises(AnimaError, match="differ from its own in the seed"):
        plan.for_settings(dataclasses.replace(params, steps=3))
    with pytest.raises(AnimaError, match="prepared for anima-demo.safetensors"):
        plan.check_files(dataclasses.replace(plan.files, dit=plan.files.dit.with_name("other.safetensors")))
