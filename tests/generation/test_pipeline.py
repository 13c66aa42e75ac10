"""The pipeline object the CLI uses: noise, stage order, the non-finite guard, the PNG `parameters` text, an
interrupted run's picture."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from anima_rknn.core.tensorfile import load_tensors, save_tensors
from anima_rknn.generation.params import GenerationParams
from anima_rknn.generation.pipeline import AnimaPipeline, initial_noise
from anima_rknn.engine.vae_plan import DecodePlan
from anima_rknn.generation.result import png_parameters
from anima_rknn.sampling.schedule import flow_sigmas


def test_initial_noise_is_the_cpu_generator_of_torch():
    noise = initial_noise(20260812, 512, 512)
    assert noise.shape == (1, 16, 64, 64) and noise.dtype == np.float32
    expected = torch.randn(1, 16, 64, 64, generator=torch.Generator("cpu").manual_seed(20260812)).numpy()
    assert np.array_equal(noise, expected)
    assert not np.array_equal(noise, initial_noise(20260813, 512, 512))


def test_generate_defaults_are_the_on_device_report_setting():
    params = GenerationParams(prompt="x")
    assert (params.width, params.height, params.steps, params.cfg, params.seed, params.shift) == \
        (512, 512, 20, 4.0, 20260812, 3.0)


def test_decode_passes_tiling_through(tiny_set):
    """Tiling accuracy is tested in tests/vae/test_tiling.py; here: one tile covering all == untiled."""
    pipeline = AnimaPipeline(tiny_set)
    latent = initial_noise(1, 128, 128) * 0.5
    whole, _ = pipeline.decode(latent)
    one_tile, _ = pipeline.decode(latent, DecodePlan(128, 64))
    tiled, _ = pipeline.decode(latent, DecodePlan(64, 32))
    assert np.array_equal(np.asarray(whole), np.asarray(one_tile))
    assert whole.size == tiled.size == (128, 128) and not np.array_equal(np.asarray(whole), np.asarray(tiled))


def test_non_finite_latent_gives_no_image(tiny_set, tmp_path):
    tensors = load_tensors(tiny_set.dit, "DiT")
    tensors["net.final_layer.linear.weight"] = torch.full_like(tensors["net.final_layer.linear.weight"], math.inf)
    broken = tmp_path / "nan.safetensors"
    save_tensors(tensors, broken)
    pipeline = AnimaPipeline(dataclasses.replace(tiny_set, dit=broken))
    events = []
    result = pipeline.generate(GenerationParams(prompt="cat", width=64, height=64, steps=3), on_step=events.append)
    assert result.finite is False and result.image is None
    assert events == [] and result.denoised.transformer_passes == 2  # stopped at the first step: one CFG pair


def test_parameters_text_reads_like_a1111():
    params = GenerationParams(prompt="a cat", negative="blurry", steps=20, cache="spectrum",
                              cache_options={"w": 0.5})
    text = png_parameters(params, "anima.safetensors")
    first, second, third = text.split("\n")
    assert first == "a cat" and second == "Negative prompt: blurry"
    assert "Steps: 20, Sampler: Euler, Schedule type: Simple," in third and "Cache: spectrum" in third
    assert "Cache options: w=0.5" in third
    karras = png_parameters(dataclasses.replace(params, scheduler="sgm_uniform"), "anima.safetensors")
    assert "Schedule type: SGM Uniform," in karras  # A1111's label, which WebUI reads back


@pytest.mark.parametrize("scheduler", ["simple", "karras", "beta"])
def test_the_sampler_steps_through_the_chosen_schedule(tiny_set, scheduler):
    params = GenerationParams(prompt="cat", width=64, height=64, steps=5, shift=2.0, scheduler=scheduler)
    events = []
    AnimaPipeline(tiny_set).generate(params, on_step=events.append)
    assert [(e.sigma, e.sigma_next) for e in events] == list(zip(*[flow_sigmas(5, 2.0, scheduler)[i:] for i in (0, 1)]))


@pytest.mark.parametrize("cfg, passes", [(4.0, 8), (1.0, 4)])
def test_cfg_one_skips_the_unconditional_pass(tiny_set, cfg, passes):
    pipeline = AnimaPipeline(tiny_set)
    result = pipeline.generate(GenerationParams(prompt="cat", width=64, height=64, steps=4, cfg=cfg))
    assert result.denoised.transformer_passes == passes and result.finite


def test_a_kept_pipeline_encodes_a_prompt_once_for_its_seeds(tiny_set, one_thread):
    """Seeds of one prompt on a kept pipeline (batch, serve) reuse the conditioning: same images, no second
    encode; another prompt is encoded again."""
    kept, fresh = AnimaPipeline(tiny_set, keep_dit=True), AnimaPipeline(tiny_set)
    params = GenerationParams(prompt="a red circle", width=32, height=32, steps=2, seed=1)
    first = kept.generate(params)
    second = kept.generate(dataclasses.replace(params, seed=2))
    assert first.conditioning.encode_s > 0 and second.conditioning.encode_s == 0.0
    assert second.image.tobytes() == fresh.generate(dataclasses.replace(params, seed=2)).image.tobytes()
    other = kept.generate(dataclasses.replace(params, prompt="a blue square"))
    assert other.conditioning.encode_s > 0
    assert not torch.equal(other.conditioning.positive, first.conditioning.positive)


def test_an_interrupted_run_is_the_x0_of_its_last_step_decoded(tiny_set, one_thread):
    """WebUI's interrupt: the picture as far as it got, the record and the PNG saying where it stopped."""
    pipeline = AnimaPipeline(tiny_set, keep_dit=True)
    params = GenerationParams(prompt="a red circle", width=64, height=64, steps=6, seed=3)
    events = []
    pipeline.generate(params, on_step=events.append)
    expected, _ = pipeline.decode(events[2].x0)
    seen = []
    result = pipeline.generate(params, on_step=seen.append, interrupt=lambda: len(seen) == 3)
    assert result.image.tobytes() == expected.tobytes() and result.interrupted_at == 3
    record = result.summary("x.png")
    assert record["interrupted"] == {"step": 3, "total": 6} and record["computed_steps"] == [1, 2, 3]
    assert "Interrupted: step 3/6" in png_parameters(params, "tiny", result)
    assert "Interrupted" not in png_parameters(params, "tiny", pipeline.generate(params))


@pytest.mark.parametrize("after, size", [(1, (32, 32)), (2, (32, 32)), (3, (64, 64))])
def test_a_hires_fix_interrupted_in_its_first_pass_gives_the_first_pass_picture(tiny_set, one_thread, after, size):
    params = GenerationParams(prompt="a red circle", width=32, height=32, steps=2, seed=3, hires=True,
                              hires_scale=2.0, strength=1.0)
    seen = []
    result = AnimaPipeline(tiny_set).generate(params, on_step=seen.append, interrupt=lambda: len(seen) >= after)
    total = sum(p.steps_run for p in params.passes())
    assert result.image.size == size and result.summary(None)["interrupted"] == {"step": after, "total": total}
