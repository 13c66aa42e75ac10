"""The one publisher of a run (generation/result.publish): a finite result becomes a PNG with its `parameters`
text, at a path (atomically, never over an existing file unless asked) or as bytes, plus the run's record; a
result that is not finite is refused and nothing is written."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import math

import pytest
import torch
from lora_files import comfy, random_pairs, write_lora
from PIL import Image

from anima_rknn.core.tensorfile import load_tensors, save_tensors
from anima_rknn.errors import AnimaError
from anima_rknn.generation.params import GenerationParams
from anima_rknn.generation.pipeline import AnimaPipeline
from anima_rknn.generation.result import NotFinite, Published, png_parameters, publish
from anima_rknn.model.io import read_dit_config
from anima_rknn.model.lora import LoraRef

PARAMS = GenerationParams(prompt="a red circle", negative="blurry", width=64, height=64, steps=3, seed=7)


@pytest.fixture(scope="module")
def pipeline(tiny_set):
    return AnimaPipeline(tiny_set, keep_dit=True)


@pytest.fixture(scope="module")
def result(pipeline, one_thread):
    """One real run on the tiny set: 64x64, 3 steps, no cache."""
    result = pipeline.generate(PARAMS)
    assert result.finite
    return result


@pytest.fixture(scope="module")
def not_finite(tiny_set, tmp_path_factory, one_thread):
    """A real run whose final latent is not finite: the tiny DiT with an infinite final layer."""
    tensors = load_tensors(tiny_set.dit, "DiT")
    tensors["net.final_layer.linear.weight"] = torch.full_like(tensors["net.final_layer.linear.weight"], math.inf)
    broken = tmp_path_factory.mktemp("broken") / "inf.safetensors"
    save_tensors(tensors, broken)
    result = AnimaPipeline(dataclasses.replace(tiny_set, dit=broken)).generate(PARAMS)
    assert not result.finite and result.image is None
    return result


def read_png(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


# ---- to a path -----------------------------------------------------------------------------------------------

def test_a_path_gets_the_png_with_its_parameters_text_and_the_record_says_where(result, tmp_path):
    path = tmp_path / "x.png"
    published = publish(result, path)
    png = read_png(path.read_bytes())
    assert png.format == "PNG" and png.text["parameters"] == png_parameters(PARAMS, result.model, result)
    assert (png.mode, png.size) == (result.image.mode, result.image.size)
    assert png.tobytes() == result.image.tobytes()
    assert published.png is None
    assert published.record == result.summary(str(path)) and published.record["finite"] is True
    assert published.record["image"] == str(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.png"]  # no temporary left beside it


def test_image_overrides_where_the_record_says_the_picture_is(result, tmp_path):
    published = publish(result, tmp_path / "x.png", image="/api/jobs/1/image")
    assert published.record == result.summary("/api/jobs/1/image")
    assert (tmp_path / "x.png").is_file()


def test_an_existing_file_is_refused_unless_overwrite(result, tmp_path):
    path = tmp_path / "x.png"
    path.write_bytes(b"an earlier picture")
    with pytest.raises(AnimaError, match="exists; pass --overwrite to replace it"):
        publish(result, path)
    assert path.read_bytes() == b"an earlier picture"
    publish(result, path, overwrite=True)
    assert read_png(path.read_bytes()).tobytes() == result.image.tobytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.png"]


# ---- to bytes ------------------------------------------------------------------------------------------------

def test_bytes_are_the_file_a_path_would_get_and_nothing_is_written(result, tmp_path, monkeypatch):
    folder = tmp_path / "cwd"
    folder.mkdir()
    monkeypatch.chdir(folder)
    published = publish(result)
    assert isinstance(published, Published) and list(folder.iterdir()) == []
    publish(result, tmp_path / "x.png")
    assert published.png == (tmp_path / "x.png").read_bytes()
    assert published.record == result.summary(None) and published.record["image"] is None
    assert publish(result, image="job-1.png").record["image"] == "job-1.png"


# ---- not finite ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("to_path", [True, False], ids=["path", "bytes"])
def test_a_result_that_is_not_finite_is_refused_and_nothing_is_written(not_finite, tmp_path, to_path):
    path = tmp_path / "x.png"
    with pytest.raises(NotFinite) as refused:
        publish(not_finite, path if to_path else None, image="where.png")
    assert isinstance(refused.value, AnimaError)
    total = sum(p.steps_run for p in PARAMS.passes())
    assert str(refused.value) == (f"the latent turned non-finite (NaN/Inf) at step 1 of {total}, where the run "
                                  "stopped; no image was written")
    record = refused.value.record
    assert record == not_finite.summary(None) and record["image"] is None and record["finite"] is False
    assert record["nonfinite_step"] == 1 and not_finite.denoised.transformer_passes == 2  # no step after it
    assert not path.exists() and list(tmp_path.iterdir()) == []  # not even a temporary


# ---- the `parameters` text -----------------------------------------------------------------------------------

def fields(text: str) -> list[str]:
    prompt, negative, settings = text.split("\n")
    return settings.split(", ")


def test_parameters_text_names_the_settings_and_the_model(result, tiny_set):
    text = png_parameters(PARAMS, result.model, result)
    assert text.split("\n")[:2] == ["a red circle", "Negative prompt: blurry"]
    assert result.model == tiny_set.dit.name
    assert {"Steps: 3", "Sampler: Euler", "Seed: 7", "Size: 64x64", f"Model: {tiny_set.dit.name}",
            "CFG scale: 4.0", "Cache: none"} <= set(fields(text))
    assert "Computed steps" not in text  # no cache
    # What ran, always: the bodies' dtype, the threads (filled in from torch's, the API's default), both backends.
    assert {"Dtype: fp32", f"Threads: {result.params.threads}", "Backend: torch", "VAE backend: torch"} <= set(
        fields(text))
    assert result.params.threads == 1 and result.summary(None)["threads"] == 1  # under one_thread


def test_the_same_seed_at_other_threads_is_reported_with_its_threads(pipeline, result, one_thread):
    """The reproducibility rule: a picture's bits are those of its threads (here the tiny model's agree at 1 and
    2; the demo model's did too, benchmarks/threads.py), so the PNG and the record say which ran."""
    two = pipeline.generate(dataclasses.replace(PARAMS, threads=2))
    assert torch.get_num_threads() == 2  # the run set torch's threads to its own
    torch.set_num_threads(1)  # back to the module's one thread
    assert two.summary(None)["threads"] == 2 and "Threads: 2" in fields(png_parameters(two.params, two.model, two))
    assert result.summary(None)["threads"] == 1
    assert two.summary(None) | {"threads": 1, "timings": None} == result.summary(None) | {"timings": None}


@pytest.fixture(scope="module")
def fp16_onnx_set(tiny_set, tmp_path_factory):
    """The real exporter's fp16 subgraph set of the tiny model at 64x64."""
    pytest.importorskip("onnxruntime")
    from anima_rknn.export.onnx import export_subgraphs

    return export_subgraphs(tiny_set.dit, 64, 64, tmp_path_factory.mktemp("fp16") / "set", "float16",
                            progress=False).parent


def test_the_onnx_backend_reports_its_sets_dtype_not_the_dtype_flag(pipeline, fp16_onnx_set, one_thread):
    run = pipeline.generate(dataclasses.replace(PARAMS, backend="onnx", subgraphs=fp16_onnx_set, dtype="bf16"))
    assert run.summary(None)["dtype"] == "fp16" and run.summary(None)["backend"] == "onnx"
    assert {"Dtype: fp16", "Backend: onnx", "VAE backend: torch"} <= set(fields(png_parameters(
        run.params, run.model, run)))


def test_computed_steps_are_named_only_for_a_cached_run(pipeline, one_thread):
    cached = pipeline.generate(dataclasses.replace(PARAMS, cache="reuse"))
    computed = len(cached.denoised.sample.computed_steps)
    assert f"Computed steps: {computed}/3" in fields(png_parameters(cached.params, cached.model, cached))
    assert "Computed steps" not in png_parameters(cached.params, cached.model)  # no result: nothing was run


def test_loras_are_tags_in_the_prompt_and_short_hashes_in_a_field(tiny_set, tmp_path):
    style = write_lora(tmp_path / "style.safetensors", comfy(random_pairs(read_dit_config(tiny_set.dit), seed=1)))
    params = dataclasses.replace(PARAMS, loras=[LoraRef(style, 0.8)])
    text = png_parameters(params, "anima.safetensors")
    assert text.split("\n")[0] == "a red circle <lora:style:0.8>"
    digest = hashlib.sha256(style.read_bytes()).hexdigest()[:12]
    assert text.endswith(f'Lora hashes: "style: {digest}"')
    assert "Lora" not in png_parameters(PARAMS, "anima.safetensors")

