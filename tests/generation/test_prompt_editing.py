"""Prompt editing in a whole run on the demo model (a real trained model, 64 px): a "[from:to:when]" generation
equals, step by step, an Euler loop run by hand on the DiT with the two encodings switched at WebUI's step; the
caches compute the call where the conditioning changes and start their history afresh there; a prompt without the
syntax runs exactly as before (its conditioning and its picture); bad editing is one line before any model loads."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from anima_rknn.errors import AnimaError
from anima_rknn.generation.params import DEFAULT_NEGATIVE, GenerationParams
from anima_rknn.generation.pipeline import AnimaPipeline, initial_noise
from anima_rknn.generation.prompt_schedule import call_texts
from anima_rknn.generation.result import png_parameters
from anima_rknn.generation.resume import Checkpoints, Interrupted, read_state
from anima_rknn.model.io import load_dit
from anima_rknn.model.model_set import DEMO_MODEL, from_model_dir
from anima_rknn.sampling.caches import make_cache

FROM, TO = "a red circle on a white background", "a blue square on a white background"
EDITED = "a [red circle:blue square:0.5] on a white background"


@pytest.fixture(scope="module")
def demo():
    return AnimaPipeline(from_model_dir(DEMO_MODEL), keep_dit=True)


def params(prompt: str = EDITED, **changes) -> GenerationParams:
    settings = {"prompt": prompt, "width": 64, "height": 64, "steps": 6, "seed": 5, "cfg": 4.0} | changes
    return GenerationParams(**settings)


def test_an_edit_equals_a_hand_loop_switching_the_encodings(demo, one_thread):
    """6 steps, "when" 0.5: WebUI's step 3, and its denoiser counter (0 at the first call) takes `from` while it is
    at most 3: steps 1-4 `from`, steps 5-6 `to`."""
    run = params()
    events = []
    result = demo.generate(run, on_step=events.append)
    assert set(result.conditioning.by_text) == {FROM, TO, DEFAULT_NEGATIVE}
    contexts = demo.encode_texts([FROM, TO, DEFAULT_NEGATIVE])
    dit = load_dit(demo.files.dit, torch.float32)
    sigmas = run.sigmas()
    x = torch.from_numpy(initial_noise(run.seed, 64, 64))
    for index in range(6):
        context = contexts[0] if index <= 3 else contexts[1]
        sigma = torch.tensor([float(sigmas[index])])
        with torch.no_grad():
            cond, uncond = dit(x, sigma, context), dit(x, sigma, contexts[2])
        velocity = uncond + 4.0 * (cond - uncond)
        x = x + (float(sigmas[index + 1]) - float(sigmas[index])) * velocity
        np.testing.assert_allclose(events[index].x, x.numpy(), rtol=0, atol=2e-4)
    unedited = [demo.generate(params(text), on_step=None).latent for text in (FROM, TO)]
    assert not np.allclose(result.latent, unedited[0], atol=1e-3) and not np.allclose(result.latent, unedited[1],
                                                                                       atol=1e-3)


@pytest.mark.parametrize("cache", ["spectrum", "auto"])
def test_the_caches_compute_the_change_and_restart_there(demo, one_thread, cache):
    """20 steps, "when" 0.5: the conditioning changes at call 12. That call is computed, and from there the cache
    runs as a fresh cache of the 9 calls left (Spectrum's fixed pattern, auto's warm-up): nothing is forecast from
    the calls before the change."""
    edited = demo.generate(params(steps=20, cache=cache)).denoised.sample
    assert 12 in edited.computed_steps and edited.skipped_steps  # the cache still skips where it may
    after = [call - 11 for call in edited.computed_steps if call >= 12]
    if cache == "spectrum":
        fresh, zeros = make_cache("spectrum", 9), np.zeros(1, np.float32)
        fresh.set_sigmas(np.linspace(1.0, 0.0, 10))
        for _ in range(9):
            if fresh.should_skip(zeros):
                fresh.forecast(zeros)
            else:
                fresh.record(zeros, zeros)
        assert after == fresh.report().computed_steps
    else:
        assert after[:3] == [1, 2, 3]  # auto's warm-up of 3 computed calls, again from the change


@pytest.mark.parametrize("cache", ["none", "spectrum"])
def test_an_alternation_changes_every_step_and_the_caches_skip_nothing(demo, one_thread, cache):
    sample = demo.generate(params("a [red|blue] circle", steps=8, cache=cache)).denoised.sample
    assert sample.computed_steps == list(range(1, 9)) and sample.skipped_steps == []


def test_a_prompt_without_editing_runs_as_before(demo, one_thread):
    """The conditioning of a plain prompt is encode()'s for the prompt pair (nothing else encoded), and the
    picture is the one a pipeline without prompt editing makes: its own loop over the same two contexts."""
    run = params(FROM, cache="spectrum")
    result = demo.generate(run)
    assert result.conditioning.by_text == {}
    reference = demo.encode(FROM, DEFAULT_NEGATIVE)
    assert torch.equal(result.conditioning.positive, reference.positive)
    again = demo.denoise(reference, run)
    assert np.array_equal(again.sample.latent, result.latent)
    assert again.sample.computed_steps == result.denoised.sample.computed_steps


def test_the_hires_pass_schedules_over_its_own_steps(demo, one_thread):
    """WebUI's hires scheduling: "1.5" is half-way through the hires pass, the first pass is `from` throughout."""
    run = params("a [red circle:blue square:1.5] on a white background", steps=4, hires=True, hires_scale=1.5,
                 hires_steps=4, strength=1.0)
    result = demo.generate(run)
    assert set(result.conditioning.by_text) == {FROM, TO, DEFAULT_NEGATIVE}
    first = demo.generate(dataclasses.replace(run, prompt=FROM)).first_pass.sample.latent
    assert np.array_equal(result.first_pass.sample.latent, first)


@pytest.mark.parametrize("prompt, words", [
    ("a [red:blue:0.5 circle", "the prompt: the '[' at character 3 is never closed"),
    ("a [red:blue:1.5] circle", "the prompt: prompt editing [..:1.5]: the 'when' must be a share of the steps"),
    ("a [red:blue:7] circle", "a step from 0 to 6"),
    ("a [|] circle", "at least one option"),
])
def test_bad_editing_is_refused_before_any_model_loads(prompt, words):
    with pytest.raises(AnimaError, match=words.replace("[", "\\[").replace(".", "\\.")):
        params(prompt).validate()
    with pytest.raises(AnimaError, match="the negative prompt: "):
        params("cat", negative=prompt).validate()


def test_the_png_keeps_the_prompt_as_written(demo, one_thread):
    result = demo.generate(params())
    assert result.params.prompt == EDITED
    assert png_parameters(result.params, "demo", result).startswith(EDITED + "\n")


@pytest.mark.parametrize("step", [3, 9])  # before the change (call 8 of 12) and after it
def test_an_edited_run_resumes_bit_identical(tiny_set, tmp_path, one_thread, step):
    """The cache's parts and the texts' contexts come back with a resume state: the same latent as a run that was
    never stopped (Spectrum, whose parts skip calls on both sides of the change)."""
    pipeline = AnimaPipeline(tiny_set)
    run = params("a [red:blue:0.6] circle", steps=12, cache="spectrum")
    reference = pipeline.generate(run)
    assert reference.denoised.sample.skipped_steps
    asked = []
    with pytest.raises(Interrupted) as stopped:
        pipeline.generate(run, on_step=lambda e: asked.append(True) if e.step == step else None,
                          checkpoints=Checkpoints(tmp_path / "x.state", stop=lambda: bool(asked)))
    resumed = pipeline.generate(run, resume=read_state(stopped.value.path))
    assert np.array_equal(resumed.latent, reference.latent)
    assert resumed.denoised.sample.computed_steps == reference.denoised.sample.computed_steps


def test_the_onnx_backend_takes_each_calls_conditioning(tiny_set, tmp_path, one_thread):
    """The conditioning is an input of the exported cross-attention subgraphs: an edited run on onnx follows the
    torch run (the same engine contract the rknn backend keeps)."""
    from anima_rknn.export.onnx import export_subgraphs

    export_subgraphs(tiny_set.dit, 64, 64, tmp_path / "onnx", progress=False)
    pipeline = AnimaPipeline(tiny_set)
    run = params("a [red:blue:0.5] circle [big|small]", steps=4)
    on_torch = pipeline.generate(run).latent
    on_onnx = pipeline.generate(dataclasses.replace(run, backend="onnx", subgraphs=tmp_path / "onnx")).latent
    np.testing.assert_allclose(on_onnx, on_torch, atol=1e-3)
    plain = pipeline.generate(params("a red circle big")).latent
    assert not np.allclose(plain, on_torch, atol=1e-3)


def test_two_call_samplers_count_calls_as_webui_does():
    """heun calls the model twice a step (once on its last): WebUI doubles the steps its schedule spans and counts
    calls, so a share is the same point of the run and a step number counts calls."""
    run = params("[a:b:0.5]", sampler="heun")
    (positive, negative), = call_texts(run.prompt, run.negative, run.edit_passes())
    assert len(positive) == 11 and positive == ["a"] * 7 + ["b"] * 4 and set(negative) == {DEFAULT_NEGATIVE}
    (positive, _), = call_texts("[a:b:3]", run.negative, run.edit_passes())
    assert positive == ["a"] * 4 + ["b"] * 7
