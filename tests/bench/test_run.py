"""run_bench on the tiny model: shared encoding and noise, the spec's step counts, repeats and seeds; image to
image over the truncated schedule and the hires fix's two passes."""

import io
import json

import numpy as np
import pytest
import torch
from PIL import Image

from anima_rknn.bench.figures import write_figures
from anima_rknn.bench.report import build_report, markdown, to_json
from anima_rknn.bench.run import parse_cache_list, run_bench
from anima_rknn.errors import AnimaError
from anima_rknn.generation.images import ImageInput
from anima_rknn.generation.params import GenerationParams
from anima_rknn.generation.pipeline import AnimaPipeline

PARAMS = GenerationParams(prompt="a red circle", width=32, height=32, steps=20, seed=5)


@pytest.fixture(scope="module")
def pipeline(tiny_set):
    return AnimaPipeline(tiny_set, keep_dit=True)


@pytest.fixture(scope="module")
def result(pipeline):
    torch.manual_seed(0)
    return run_bench(pipeline, PARAMS, ["spectrum", "none"])


def test_defaults_at_20_steps_are_40_vs_22_passes(result):
    (seed_result,) = result.seeds
    baseline, spectrum = seed_result.baseline.first, seed_result.cached["spectrum"].first
    assert baseline.denoised.transformer_passes == 40 and spectrum.denoised.transformer_passes == 22
    # The spec's test vector for 20 steps with the defaults.
    assert spectrum.denoised.sample.computed_steps == [1, 2, 3, 4, 6, 8, 11, 14, 18, 19, 20]
    assert spectrum.denoised.sample.skipped_steps == [5, 7, 9, 10, 12, 13, 15, 16, 17]
    # Every pass runs the same subgraphs, so subgraph runs scale with passes.
    assert baseline.denoised.subgraph_runs * 22 == spectrum.denoised.subgraph_runs * 40
    assert baseline.image.size == spectrum.image.size == (32, 32)


def test_both_sides_share_noise_and_conditioning(result):
    seed_result = result.seeds[0]
    base_run, spectrum_run = seed_result.baseline.first, seed_result.cached["spectrum"].first
    base, spectrum = base_run.denoised.sample, spectrum_run.denoised.sample
    # Steps 1-4 are computed on both sides from the same start, so their x0 must agree exactly.
    for step in range(4):
        np.testing.assert_array_equal(base_run.x0_history[step], spectrum_run.x0_history[step])
    assert not np.array_equal(base.latent, spectrum.latent)  # forecasts did change the result
    again = seed_result.cached["none"].first
    np.testing.assert_array_equal(again.denoised.sample.latent, base.latent)
    assert np.array_equal(np.asarray(again.image), np.asarray(seed_result.baseline.first.image))


def test_baseline_equals_a_plain_generate(pipeline, result):
    reference = pipeline.generate(PARAMS)
    np.testing.assert_array_equal(result.seeds[0].baseline.first.denoised.sample.latent, reference.latent)
    assert result.conditioning.encode_s > 0
    assert result.seeds[0].baseline.params.cache == "none"


def test_repeats_and_seeds(pipeline):
    params = GenerationParams(prompt="cat", width=32, height=32, steps=2)
    started = []
    bench = run_bench(pipeline, params, ["reuse"], seeds=[3, 4], repeats=2,
                      on_run=lambda seed, side, repeat: started.append((seed, side, repeat)))
    # Repeats interleave the sides so slow drift hits baseline and cached runs alike.
    assert started == [(3, "baseline", 0), (3, "reuse", 0), (3, "baseline", 1), (3, "reuse", 1),
                       (4, "baseline", 0), (4, "reuse", 0), (4, "baseline", 1), (4, "reuse", 1)]
    latents = []
    for seed_result, seed in zip(bench.seeds, (3, 4)):
        assert seed_result.seed == seed and seed_result.baseline.params.seed == seed
        runs = seed_result.baseline.runs
        assert len(runs) == 2 and len(seed_result.cached["reuse"].runs) == 2
        np.testing.assert_array_equal(runs[0].denoised.sample.latent, runs[1].denoised.sample.latent)
        assert all(run.total_s == pytest.approx(run.denoised.denoise_s + run.decode_s) for run in runs)
        latents.append(runs[0].denoised.sample.latent)
    assert not np.array_equal(*latents)


def test_bad_settings_fail_before_any_work(pipeline):
    with pytest.raises(AnimaError, match="does not apply"):
        run_bench(pipeline, PARAMS, ["spectrum", "reuse"], {"w": 0.5})
    with pytest.raises(AnimaError, match="at least 1"):
        run_bench(pipeline, PARAMS, ["spectrum"], repeats=0)
    with pytest.raises(AnimaError, match="multiples of 16"):
        run_bench(pipeline, GenerationParams(prompt="x", width=60), ["spectrum"])


def test_parse_cache_list():  # (bench's --seeds is batch's grammar: tests/generation/test_params.py)
    assert parse_cache_list("spectrum, spectrum-plus,reuse") == ["spectrum", "spectrum-plus", "reuse"]
    for bad, message in (("spectrum,fast", "unknown cache"), ("reuse,reuse", "twice"), (",", "at least one")):
        with pytest.raises(AnimaError, match=message):
            parse_cache_list(bad)


# ---- image to image -------------------------------------------------------------------------------------------

def _init_image(width: int = 32, height: int = 32) -> ImageInput:
    pixels = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return ImageInput.from_bytes(buffer.getvalue(), "init.png")


def test_an_img2img_sweep_caches_over_the_truncated_schedule(pipeline):
    params = GenerationParams(prompt="cat", width=32, height=32, steps=20, seed=5, init_image=_init_image(),
                              strength=0.6)
    result = run_bench(pipeline, params, ["spectrum"])
    baseline, spectrum = result.seeds[0].baseline.first, result.seeds[0].cached["spectrum"].first
    assert len(baseline.step_times) == len(baseline.x0_history) == 12  # the last 12 of 20 steps
    assert baseline.denoised.sample.computed_steps == list(range(1, 13))
    sample = spectrum.denoised.sample
    assert sorted(sample.computed_steps + sample.skipped_steps) == list(range(1, 13)) and sample.skipped_steps
    assert spectrum.forecast_steps == sample.skipped_steps
    assert baseline.vae_encode_s > 0
    assert baseline.total_s == pytest.approx(baseline.vae_encode_s + baseline.denoise_s + baseline.decode_s)
    np.testing.assert_array_equal(baseline.denoised.sample.latent, pipeline.generate(params).latent)
    report = build_report(result, "tiny")
    side = report["seeds"][0]["cached"]["spectrum"]
    assert (side["model_calls"], side["steps_run"]) == (12, 12)
    assert report["settings"]["steps_run"] == 12 and report["settings"]["strength"] == 0.6
    assert report["settings"]["init_image"] == params.init_image.as_json()
    text = markdown(report)
    assert "32x32, 12 of 20 steps (strength 0.6), img2img of init.png" in text
    assert "| computed steps | 12/12 |" in text and "| VAE encode |" in text


def test_a_hires_sweep_is_both_passes_of_every_run(pipeline, tmp_path):
    params = GenerationParams(prompt="cat", width=32, height=32, steps=6, seed=5, hires=True, hires_cache="reuse")
    result = run_bench(pipeline, params, ["spectrum"])
    seed_result = result.seeds[0]
    base, cached = seed_result.baseline.first, seed_result.cached["spectrum"].first
    assert [p.cache for p in seed_result.baseline.params.passes()] == ["none", "none"]  # the baseline: no cache
    assert [p.cache for p in seed_result.cached["spectrum"].params.passes()] == ["spectrum", "reuse"]
    assert len(base.denoised_passes) == 2 and base.denoise_s == sum(d.denoise_s for d in base.denoised_passes)
    assert len(base.x0_history) == 6 + 5
    assert base.x0_history[0].shape == (1, 16, 4, 4) and base.x0_history[-1].shape == (1, 16, 8, 8)
    assert base.image.size == cached.image.size == (64, 64)
    report = _strict(to_json(build_report(result, "tiny")))
    entry = report["seeds"][0]
    side = entry["cached"]["spectrum"]
    assert (entry["baseline"]["model_calls"], entry["baseline"]["transformer_passes"]) == (11, 22)
    assert entry["baseline"]["computed_steps"] == list(range(1, 12))  # numbered through both passes
    assert [(p["width"], p["steps_run"], p["cache"]) for p in side["passes"]] == [(32, 6, "spectrum"),
                                                                                  (64, 5, "reuse")]
    assert len(side["vs_baseline"]["x0_distance"]) == 11 == len(side["step_times_s"])
    assert side["transformer_passes"] == sum(p["transformer_passes"] for p in side["passes"])
    assert report["settings"]["hires"]["width"] == 64 and report["settings"]["steps_run"] == 11
    text = markdown(report)
    assert "32x32 -> 64x64 (hires fix), 6 steps + 5 of 6 hires steps (strength 0.75)" in text
    assert "| computed steps | 11/11 |" in text
    write_figures(result, build_report(result, "tiny"), tmp_path)  # the step plot runs over both passes
    assert (tmp_path / "steps_seed5.png").is_file() and (tmp_path / "compare_spectrum_seed5.png").is_file()


def _strict(text: str) -> dict:
    def refuse(constant: str):
        raise ValueError(f"non-standard JSON constant {constant}")

    return json.loads(text, parse_constant=refuse)
