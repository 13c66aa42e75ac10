"""Image to image through the pipeline: img2img, inpainting, outpainting and the hires fix on the tiny model set.

The checks are exact where a closed form exists: strength 1 is text-to-image from the same noise, outside the
mask the latent is the encoded original and the pixels are the init image's, a resumed run ends on the
uninterrupted run's bits. (Parity with diffusers' Anima img2img blocks is in test_pipeline_diffusers.py.)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from anima_rknn.errors import AnimaError
from anima_rknn.generation.image_to_image import prepare_source
from anima_rknn.generation.images import ImageInput, latent_mask
from anima_rknn.generation.params import GenerationParams
from anima_rknn.generation.pipeline import AnimaPipeline
from anima_rknn.generation.result import png_parameters
from anima_rknn.generation.resume import Checkpoints, Interrupted, read_state

STEPS = 10
BASE = GenerationParams(prompt="a red circle", width=64, height=64, steps=STEPS, seed=7, vae_backend="torch")


@pytest.fixture(scope="module")
def pipeline(tiny_set):
    return AnimaPipeline(tiny_set)


def _picture(path: Path, size: tuple[int, int] = (64, 64), seed: int = 1) -> ImageInput:
    rng = np.random.default_rng(seed)
    small = np.clip(rng.normal(128, 60, (size[1] // 8, size[0] // 8, 3)), 0, 255).astype(np.uint8)
    Image.fromarray(small).resize(size, Image.Resampling.BICUBIC).save(path)
    return ImageInput.from_path(path)


def _mask(path: Path, size: tuple[int, int], box: tuple[int, int, int, int]) -> ImageInput:
    mask = Image.new("L", size, 0)
    mask.paste(255, box)
    mask.save(path)
    return ImageInput.from_path(path)


@pytest.fixture(scope="module")
def init(tmp_path_factory) -> ImageInput:
    return _picture(tmp_path_factory.mktemp("init") / "init.png")


def test_strength_one_is_text_to_image_from_the_same_noise(pipeline, init, one_thread):
    txt2img = pipeline.generate(BASE)
    img2img = pipeline.generate(dataclasses.replace(BASE, init_image=init, strength=1.0))
    assert np.array_equal(img2img.latent, txt2img.latent)


@pytest.mark.parametrize(("strength", "run"), [(0.3, 3), (0.5, 5), (0.75, 8), (0.95, 10)])
def test_img2img_runs_the_last_steps_of_the_schedule(pipeline, init, one_thread, strength, run):
    events = []
    result = pipeline.generate(dataclasses.replace(BASE, init_image=init, strength=strength), events.append)
    assert [(e.step, e.total) for e in events] == [(k, run) for k in range(1, run + 1)]
    sigmas = BASE.sigmas()
    assert events[0].sigma == sigmas[STEPS - run]
    record = result.summary(None)
    assert record["passes"][0] == {
        "width": 64, "height": 64, "steps": STEPS, "start": STEPS - run, "steps_run": run, "cache": "none",
        "transformer_passes": 2 * run, "computed_steps": list(range(1, run + 1)), "skipped_steps": []}
    assert record["strength"] == strength and record["init_image"] == init.as_json()
    assert record["image_size"] == [64, 64] and result.timings()["vae_encode_s"] > 0


def test_a_lower_strength_stays_nearer_the_init_image(pipeline, init, one_thread):
    # In latents: the tiny set's VAE is random, so its pixels say nothing about nearness (the demo model's
    # figures are in benchmarks/image_to_image.py).
    params = dataclasses.replace(BASE, init_image=init)
    encoded, _ = pipeline.encode_image(prepare_source(params).image, pipeline.prepare(params).decode)
    errors = [np.abs(pipeline.generate(dataclasses.replace(params, strength=s)).latent - encoded).mean()
              for s in (0.2, 0.6, 1.0)]
    assert errors[0] < errors[1] < errors[2]


@pytest.mark.parametrize("sampler", ["euler", "cfgpp_ud10_ab"])  # the second: a guided sampler's x0 pair
def test_inpainting_keeps_the_original_outside_the_mask(pipeline, init, tmp_path, one_thread, sampler):
    mask = _mask(tmp_path / "mask.png", (64, 64), (32, 0, 64, 64))
    params = dataclasses.replace(BASE, init_image=init, mask=mask, strength=0.9, mask_blur=4, sampler=sampler)
    result = pipeline.generate(params)
    source = prepare_source(params)
    encoded, _ = pipeline.encode_image(source.image, pipeline.prepare(params).decode)
    outside = latent_mask(source.mask, 8, 8)[0, 0] == 0
    assert outside.sum() >= 16  # the latent columns no blurred mask pixel reaches (a Gaussian reaches 3 radii)
    assert np.array_equal(result.latent[0][:, outside], encoded[0][:, outside])
    pixels, original = np.asarray(result.image), np.asarray(init.open().convert("RGB"))
    assert np.array_equal(pixels[:, :32 - 3 * 4], original[:, :32 - 3 * 4])  # past the blur's reach: exact
    assert np.abs(pixels[:, 40:].astype(int) - original[:, 40:]).mean() > 5  # repainted inside
    text = png_parameters(params, "tiny", result)
    assert "Denoising strength: 0.9" in text and "Mask blur: 4" in text and "Masked content: original" in text


@pytest.mark.parametrize("content", ["fill", "latent_noise", "latent_nothing"])
def test_every_masked_content_repaints_inside_and_keeps_outside(pipeline, init, tmp_path, one_thread, content):
    mask = _mask(tmp_path / "mask.png", (64, 64), (16, 16, 48, 48))
    params = dataclasses.replace(BASE, init_image=init, mask=mask, strength=0.8, masked_content=content)
    baseline = pipeline.generate(dataclasses.replace(params, masked_content="original"))
    result = pipeline.generate(params)
    pixels, original = np.asarray(result.image), np.asarray(init.open().convert("RGB"))
    assert np.array_equal(pixels[:4], original[:4]) and np.array_equal(pixels[:, -4:], original[:, -4:])
    assert not np.array_equal(result.latent, baseline.latent)


def test_only_masked_inpaints_a_crop_and_keeps_the_init_image_size(pipeline, tmp_path, one_thread):
    init = _picture(tmp_path / "wide.png", (160, 96), seed=4)
    mask = _mask(tmp_path / "mask.png", (160, 96), (120, 60, 140, 80))
    params = dataclasses.replace(BASE, init_image=init, mask=mask, inpaint_area="masked", inpaint_padding=8,
                                 strength=0.9)
    source = prepare_source(params)
    left, top, right, bottom = source.box
    assert (right - left) == (bottom - top) and left <= 112 and right >= 148  # square like 64x64, holds the mask
    result = pipeline.generate(params)
    assert result.image.size == (160, 96) and result.summary(None)["image_size"] == [160, 96]
    pixels, original = np.asarray(result.image), np.asarray(init.open().convert("RGB"))
    assert np.array_equal(pixels[:, :left], original[:, :left])
    assert np.abs(pixels[64:76, 124:136].astype(int) - original[64:76, 124:136]).mean() > 2


def test_outpainting_grows_the_canvas_and_keeps_the_picture(pipeline, init, one_thread):
    params = dataclasses.replace(BASE, init_image=init, outpaint=(16, 0, 16, 0), width=96, strength=1.0)
    result = pipeline.generate(params)
    assert result.image.size == (96, 64)
    pixels, original = np.asarray(result.image), np.asarray(init.open().convert("RGB"))
    assert np.array_equal(pixels[:, 16 + 12: 80 - 12], original[:, 12:52])  # past the blur of the new edges
    assert "Outpaint: 16,0,16,0" in png_parameters(params, "tiny", result)


@pytest.mark.parametrize("upscaler", ["latent", "latent-bicubic", "latent-nearest-exact", "lanczos"])
def test_hires_fix_renders_small_then_refines_at_the_hires_size(pipeline, one_thread, upscaler):
    events = []
    params = dataclasses.replace(BASE, hires=True, hires_scale=2.0, hires_steps=6, strength=0.5,
                                 hires_upscaler=upscaler)
    result = pipeline.generate(params, events.append)
    assert result.image.size == (128, 128) and result.latent.shape == (1, 16, 16, 16)
    assert [(e.step, e.total) for e in events] == [(k, STEPS + 3) for k in range(1, STEPS + 4)]
    assert [e.x.shape[-1] for e in events] == [8] * STEPS + [16] * 3
    record = result.summary(None)
    assert [(p["width"], p["steps"], p["steps_run"]) for p in record["passes"]] == [(64, 10, 10), (128, 6, 3)]
    assert record["transformer_passes"] == 2 * (STEPS + 3)
    assert (result.timings()["vae_encode_s"] > 0) == (upscaler == "lanczos")
    text = png_parameters(params, "tiny", result)
    assert "Hires upscale: 2.0" in text and "Hires steps: 6" in text and "Denoising strength: 0.5" in text


def test_hires_size_from_one_side_keeps_the_aspect_ratio():
    params = dataclasses.replace(BASE, width=96, height=64, hires=True, hires_width=150)
    assert params.hires_size() == (144, 96)  # 150 x 100, rounded down to multiples of 16
    assert dataclasses.replace(params, hires_width=0, hires_height=0, hires_scale=1.5).hires_size() == (144, 96)


def _stop_after(pipeline, params, path, step):
    asked = []
    with pytest.raises(Interrupted) as stopped:
        pipeline.generate(params, lambda e: asked.append(True) if e.step == step else None,
                          checkpoints=Checkpoints(path, stop=lambda: bool(asked)))
    return stopped.value


@pytest.mark.parametrize(("case", "step"), [("img2img", 2), ("inpaint", 3), ("hires", 4), ("hires", 12)])
def test_a_resumed_image_to_image_run_is_bit_identical(pipeline, init, tmp_path, one_thread, case, step):
    params = {
        "img2img": dataclasses.replace(BASE, init_image=init, strength=0.6, cache="spectrum"),
        "inpaint": dataclasses.replace(BASE, init_image=init, strength=0.7, sampler="dpmpp_2m_sde",
                                       mask=_mask(tmp_path / "m.png", (64, 64), (8, 8, 40, 40))),
        "hires": dataclasses.replace(BASE, hires=True, hires_steps=8, strength=0.5),
    }[case]
    reference = pipeline.generate(params)
    stopped = _stop_after(pipeline, params, tmp_path / "x.png.state", step)
    state = read_state(stopped.path)
    assert state.pass_index == (1 if step > STEPS else 0)
    resumed = pipeline.generate(params, resume=state)
    assert np.array_equal(resumed.latent, reference.latent)
    assert resumed.image.tobytes() == reference.image.tobytes()


def test_a_resume_with_another_init_image_is_refused(pipeline, init, tmp_path, one_thread):
    params = dataclasses.replace(BASE, init_image=init, strength=0.6)
    stopped = _stop_after(pipeline, params, tmp_path / "x.png.state", 2)
    state = read_state(stopped.path)
    assert state.params.init_image == init and state.params.init_image.data is None  # kept by fingerprint only
    other = dataclasses.replace(params, init_image=_picture(tmp_path / "other.png", seed=9))
    with pytest.raises(AnimaError, match="the state was made with init_image"):
        pipeline.generate(other, resume=state)


@pytest.mark.parametrize(("change", "message"), [
    ({"mask": "other size"}, "give a mask of the image's size"),
    ({"mask": "empty"}, "the mask is empty"),
    ({"strength": 0.0}, "runs no step of 10"),
    ({"hires": True}, "takes no init image"),
    ({"outpaint": (0, 0, 0, 0)}, "outpaint grows no side"),
])
def test_bad_image_to_image_settings_fail_in_prepare(pipeline, init, tmp_path, change, message):
    if change.get("mask") == "other size":
        change = {"mask": _mask(tmp_path / "m.png", (32, 32), (0, 0, 8, 8))}
    elif change.get("mask") == "empty":
        Image.new("L", (64, 64), 0).save(tmp_path / "empty.png")
        change = {"mask": ImageInput.from_path(tmp_path / "empty.png")}
    with pytest.raises(AnimaError, match=message):
        pipeline.prepare(dataclasses.replace(BASE, init_image=init, **change))


def test_image_settings_without_an_init_image_are_refused(tmp_path):
    mask = _mask(tmp_path / "m.png", (64, 64), (0, 0, 8, 8))
    with pytest.raises(AnimaError, match="a mask needs an init image"):
        dataclasses.replace(BASE, mask=mask).validate()
    with pytest.raises(AnimaError, match="init_image must be an image"):
        dataclasses.replace(BASE, init_image=str(tmp_path / "m.png")).validate()  # never a path


@pytest.mark.parametrize("content", ["latent_noise", "latent_nothing"])
def test_latent_masked_content_only_starts_the_masked_area(tmp_path, content):
    # The fill replaces the rounded mask's latent pixels at the start; what the run keeps outside the mask, a soft
    # edge's share included, is the original's latent (else noise or zeros would show along the edge).
    from anima_rknn.generation.image_to_image import start_latent

    init = _picture(tmp_path / "i.png")
    params = dataclasses.replace(BASE, init_image=init, strength=0.8, masked_content=content, mask_blur=6,
                                 mask=_mask(tmp_path / "m.png", (64, 64), (20, 20, 44, 44)))
    source = prepare_source(params)
    rng = np.random.default_rng(0)
    latent, noise, fill = (rng.standard_normal((1, 16, 8, 8)).astype(np.float32) for _ in range(3))
    x, inpaint = start_latent(latent, noise, 0.9, source, params, fill)
    assert np.array_equal(inpaint.latent, latent)
    filled = np.round(inpaint.mask[0, 0]) > 0
    soft = (inpaint.mask[0, 0] > 0) & (inpaint.mask[0, 0] < 1)
    assert filled.any() and soft.any()
    expected = (fill if content == "latent_noise" else np.zeros_like(latent))[..., filled]
    np.testing.assert_allclose(x[..., filled], 0.1 * expected + 0.9 * noise[..., filled], atol=1e-6)
    np.testing.assert_allclose(x[..., ~filled], 0.1 * latent[..., ~filled] + 0.9 * noise[..., ~filled], atol=1e-6)
