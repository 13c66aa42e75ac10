"""The pipeline object the CLI uses: noise, stage order, the non-finite guard, the PNG `parameters` text, an
interrupted run's picture."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from anima_rknn.core.tensorfile import load_tensors, save_tensors
from anima_rknn.generation.params import DenoisePass, GenerationParams
from anima_rknn.generation.pipeline import AnimaPipeline, PassStart, initial_noise
from anima_rknn.engine.vae_plan import DecodePlan
from anima_rknn.generation.result import Conditioning, png_parameters
from anima_rknn.sampling.caches import NoCache
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


class _Recorder(NoCache):
    """Runs every call, keeping what the loop hands the cache: the latent and the x0 of each call."""

    def __init__(self, num_steps: int) -> None:
        super().__init__(num_steps)
        self.seen: list[tuple[np.ndarray, np.ndarray]] = []

    def record(self, x: np.ndarray, x0: np.ndarray) -> None:
        self.seen.append((x, x0))
        super().record(x, x0)


@pytest.mark.parametrize("engine", ["torch", "onnx"])
def test_a_guided_sampler_gets_the_unconditional_x0_of_each_cfg_call(tiny_set, tmp_path, one_thread, engine):
    """CFG++ UD10 AB at CFG 2 on each engine: every call hands it (guided, unconditional) x0, and at each latent the
    unconditional x0 is what the negative prompt's conditional model alone gives there (a CFG 1 run of it, one
    step from that sigma, whose event reports the model's x0), the guided one CFG 2 of the two."""
    pipeline, extra = AnimaPipeline(tiny_set), {}
    if engine == "onnx":
        from anima_rknn.export.onnx import export_subgraphs

        export_subgraphs(tiny_set.dit, 64, 64, tmp_path / "onnx", progress=False)
        extra = {"backend": "onnx", "subgraphs": tmp_path / "onnx"}
    params = GenerationParams(prompt="a red circle", negative="blue", width=64, height=64, steps=3, cfg=2.0,
                              sampler="cfgpp_ud10_ab", seed=3, **extra)
    pipeline.prepare(params)
    conditioning, recorder = pipeline.encode(params.prompt, params.negative), _Recorder(3)
    pipeline.denoise(conditioning, params, policy=recorder)
    alone = dataclasses.replace(params, cfg=1.0, sampler="euler")
    pipeline.prepare(alone)

    def model_x0(context: torch.Tensor, x: np.ndarray, sigma: float) -> np.ndarray:
        events, one_step = [], DenoisePass(64, 64, np.array([sigma, 0.0]), 1, 0, "none", {}, 0)
        pipeline.denoise(Conditioning(context, context, 0.0), alone, on_step=events.append,
                         start=PassStart(0, one_step, x))
        return events[0].x0

    assert len(recorder.seen) == 3
    for (x, pair), sigma in zip(recorder.seen, params.sigmas()):
        assert x.shape == pair.shape == (2, 1, 16, 8, 8) and np.array_equal(x[0], x[1])
        uncond, cond = (model_x0(c, x[0], float(sigma)) for c in (conditioning.negative, conditioning.positive))
        np.testing.assert_array_equal(pair[1], uncond)
        np.testing.assert_allclose(pair[0], uncond + 2.0 * (cond - uncond), rtol=0, atol=1e-5)
