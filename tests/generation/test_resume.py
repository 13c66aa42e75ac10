"""Stop and resume: a resumed image is bit-identical to the uninterrupted one, and a state that does not belong
to the run is refused in one line."""

from __future__ import annotations

import dataclasses
import json
import pickle

import numpy as np
import pytest
import torch

from anima_rknn.core.tensorfile import fingerprint, load_tensors, read_metadata, save_tensors
from anima_rknn.errors import AnimaError
from anima_rknn.generation.params import GenerationParams
from anima_rknn.generation.pipeline import AnimaPipeline
from anima_rknn.generation.resume import STATE_KEY, Checkpoints, Interrupted, read_state
from anima_rknn.sampling.caches import CACHE_NAMES
from anima_rknn.sampling.samplers import SAMPLERS

STEPS = 12  # the Spectrum schedule at 12 steps: computed 1-4, 6, 8, 11, 12; forecast 5, 7, 9, 10
BASE = GenerationParams(prompt="a red circle", width=64, height=64, steps=STEPS, seed=7)


@pytest.fixture(scope="module")
def pipeline(tiny_set):
    return AnimaPipeline(tiny_set)


@pytest.fixture(scope="module")
def references(pipeline, one_thread):
    return {name: pipeline.generate(dataclasses.replace(BASE, cache=name)) for name in CACHE_NAMES}


def stop_after(pipeline, params, path, step):
    """Run until `step` has finished, as Ctrl-C during that step would; return the Interrupted."""
    asked = []
    checkpoints = Checkpoints(path, stop=lambda: bool(asked))
    with pytest.raises(Interrupted) as stopped:
        pipeline.generate(params, on_step=lambda e: asked.append(True) if e.step == step else None,
                          checkpoints=checkpoints)
    return stopped.value


@pytest.mark.parametrize("name", CACHE_NAMES)
@pytest.mark.parametrize("step", [2, 5, 8, 11])  # warm-up, forecast, computed, and the step before the last
def test_resumed_image_is_bit_identical(pipeline, references, tmp_path, one_thread, name, step):
    params = dataclasses.replace(BASE, cache=name)
    stopped = stop_after(pipeline, params, tmp_path / "x.png.state", step)
    assert (stopped.step, stopped.total) == (step, STEPS)
    state = read_state(stopped.path)
    resumed = pipeline.generate(params, resume=state)
    reference = references[name]
    assert np.array_equal(resumed.latent, reference.latent)
    assert resumed.image.tobytes() == reference.image.tobytes()
    assert resumed.denoised.sample.computed_steps == reference.denoised.sample.computed_steps


@pytest.mark.parametrize("sampler", [name for name in SAMPLERS if name != "euler"])
def test_every_sampler_resumes_bit_identically(pipeline, tmp_path, one_thread, sampler):
    """The sampler's history travels in the state and its noise is drawn again from (seed, step): stopped after
    a forecast step, a stochastic or multistep run still ends on the uninterrupted image's bits."""
    params = dataclasses.replace(BASE, cache="spectrum", sampler=sampler)
    reference = pipeline.generate(params)
    stopped = stop_after(pipeline, params, tmp_path / "x.png.state", 7)
    resumed = pipeline.generate(params, resume=read_state(stopped.path))
    assert np.array_equal(resumed.latent, reference.latent)
    assert resumed.denoised.sample.skipped_steps == reference.denoised.sample.skipped_steps


def test_a_damaged_sampler_history_is_refused(pipeline, tmp_path, one_thread):
    params = dataclasses.replace(BASE, sampler="dpmpp_2m_sde")
    stopped = stop_after(pipeline, params, tmp_path / "x.png.state", 5)
    for edit_record, edit_tensors in (
            (lambda r: r["sampler"].pop("x0"), lambda t: t.pop("sampler.x0.0")),
            (None, lambda t: t.update({"sampler.x0.0": t["sampler.x0.0"][..., :4].clone()}))):
        path = _rewrite(stopped.path, tmp_path, edit_record, edit_tensors)
        with pytest.raises(AnimaError, match="sampler history does not fit dpmpp_2m_sde at step 5"):
            read_state(path)
    other = dataclasses.replace(params, sampler="dpmpp_2m")
    with pytest.raises(AnimaError, match="made with sampler 'dpmpp_2m_sde'"):
        pipeline.generate(other, resume=read_state(stopped.path))


def test_resume_on_the_onnx_backend(tiny_set, tmp_path, one_thread):
    from anima_rknn.export.onnx import export_subgraphs

    export_subgraphs(tiny_set.dit, 64, 64, tmp_path / "onnx", progress=False)
    pipeline = AnimaPipeline(tiny_set)
    params = dataclasses.replace(BASE, backend="onnx", subgraphs=tmp_path / "onnx", cache="spectrum")
    reference = pipeline.generate(params)
    stopped = stop_after(pipeline, params, tmp_path / "x.png.state", 5)
    resumed = pipeline.generate(params, resume=read_state(stopped.path))
    assert np.array_equal(resumed.latent, reference.latent)
    other = dataclasses.replace(params, backend="torch", subgraphs=None)
    with pytest.raises(AnimaError, match="made with backend 'onnx'"):
        pipeline.generate(other, resume=read_state(stopped.path))


@pytest.fixture(scope="module")
def state_file(pipeline, tmp_path_factory, one_thread):
    path = tmp_path_factory.mktemp("state") / "x.png.state"
    stop_after(pipeline, dataclasses.replace(BASE, cache="spectrum"), path, 6)
    return path


def test_the_state_file_format_is_what_earlier_releases_wrote(state_file):
    """Read with the safetensors library itself: the record's metadata key and format name are the file format
    (a state written by an earlier release must still resume), not names of this package's modules."""
    from safetensors import safe_open

    with safe_open(state_file, "np") as opened:
        metadata, keys = opened.metadata(), set(opened.keys())
    assert STATE_KEY == "anima_rknn.resume" and set(metadata) == {STATE_KEY}
    record = json.loads(metadata[STATE_KEY])
    assert record["format"] == "anima-rknn-resume/1" and record["step"] == 6
    assert {"latent", "context.positive", "context.negative"} <= keys


def test_a_state_from_before_a_setting_existed_resumes_with_the_value_it_meant(state_file, tmp_path):
    """States written before the schedule was a setting name none: they were made with "simple"."""
    record = json.loads(read_metadata(state_file, "state")[STATE_KEY])
    del record["params"]["scheduler"]
    older = tmp_path / "older.png.state"
    save_tensors(load_tensors(state_file, "state"), older, {STATE_KEY: json.dumps(record)})
    assert read_state(older).params.scheduler == "simple"
    assert read_state(older).params == read_state(state_file).params


@pytest.mark.parametrize("change, pattern", [
    ({"prompt": "a blue square"}, "made with prompt 'a red circle', this run asks for 'a blue square'"),
    ({"steps": 13}, "made with steps 12"),
    ({"width": 128}, "made with width 64"),
    ({"seed": 8}, "made with seed 7"),
    ({"cfg": 5.0}, "made with cfg 4.0"),
    ({"cache": "reuse"}, "made with cache 'spectrum'"),
    ({"cache_options": {"w": 0.5}}, "made with cache_options {}"),
    ({"dtype": "bf16"}, "made with dtype 'fp32'"),
    ({"threads": 2}, "made with threads 1, this run asks for 2"),  # the picture's last bits may differ
])
def test_other_settings_are_refused(pipeline, state_file, change, pattern):
    params = dataclasses.replace(BASE, **{"cache": "spectrum", **change})
    with pytest.raises(AnimaError, match=pattern.replace("(", r"\(").replace(")", r"\)")):
        pipeline.generate(params, resume=read_state(state_file))


def test_a_refused_resume_leaves_torchs_threads_as_they_were(pipeline, state_file, one_thread):
    """prepare() sets torch to the run's threads before the state is checked: the refusal must set them back."""
    assert torch.get_num_threads() == 1  # as the state was made
    with pytest.raises(AnimaError, match="made with threads 1, this run asks for 2"):
        pipeline.generate(dataclasses.replace(BASE, cache="spectrum", threads=2), resume=read_state(state_file))
    assert torch.get_num_threads() == 1


@pytest.mark.parametrize("part", ["dit", "text_encoder", "vae"])
def test_other_model_files_are_refused(tiny_set, state_file, tmp_path, part):
    path = getattr(tiny_set, part)
    tensors = {k: v.clone() for k, v in load_tensors(path, "model").items()}
    name = next(iter(tensors))
    tensors[name] = tensors[name] + 1  # same layout, other weights
    copy = tmp_path / path.name
    save_tensors(tensors, copy, read_metadata(path, "model"))
    assert fingerprint(copy, "model") != fingerprint(path, "model")
    other = AnimaPipeline(dataclasses.replace(tiny_set, **{part: copy}))
    with pytest.raises(AnimaError, match=f"made with another {part.replace('_', ' ')} file"):
        # threads=1 as the state was made (state_file's one_thread): these tests are about the files, and the
        # threads are checked first.
        other.generate(dataclasses.replace(BASE, cache="spectrum", threads=1), resume=read_state(state_file))


def _rewrite(state_file, tmp_path, edit_record=None, edit_tensors=None):
    tensors = {k: v.clone() for k, v in load_tensors(state_file, "state", dtypes=("F32",)).items()}
    record = json.loads(read_metadata(state_file, "state", dtypes=("F32",))[STATE_KEY])
    if edit_record:
        edit_record(record)
    if edit_tensors:
        edit_tensors(tensors)
    path = tmp_path / "edited.state"
    save_tensors(tensors, path, {STATE_KEY: json.dumps(record)})
    return path


BAD_STATES = {
    "other format": (lambda r: r.update(format="anima-rknn-resume/0"), None, "made by another version"),
    "step past the end": (lambda r: r.update(step=12), None, "step 12 of 12"),
    "negative step": (lambda r: r.update(step=-1), None, "step -1"),
    "settings missing": (lambda r: r["params"].pop("seed"), None, "settings are not the ones"),
    "settings invalid": (lambda r: r["params"].update(cfg=1e9), None, "settings are invalid"),
    "unknown setting": (lambda r: r["params"].update(evil=1), None, "settings are not the ones"),
    "fingerprints": (lambda r: r.update(fingerprints=[]), None, "fingerprints is missing or of the wrong type"),
    "cache schedule": (lambda r: r["cache"]["count"].update(value=11), None, "cache state"),
    "cache entry": (lambda r: r["cache"].update(count=5), None, "cache entry 'count' is damaged"),
    "latent shape": (None, lambda t: t.update(latent=t["latent"][..., :4]), "latent is missing"),
    "latent NaN": (None, lambda t: t["latent"].fill_(float("nan")), "not finite"),
    "no context": (None, lambda t: t.pop("context.negative"), "prompt contexts are missing"),
    "extra array": (None, lambda t: t.update({"cache.history.9": t["latent"].flatten().clone()}), "cache arrays"),
    "history shape": (None, lambda t: t.update({"cache.history.0": t["cache.history.0"][:3]}), "stored x0"),
    "cache behind the step": (lambda r: r.update(step=7), None, "not at step 7"),
    "scalar for a list": (lambda r: r["cache"].update(computed={"value": 5}), None, "cache state"),
    "context shape": (None, lambda t: t.update({f"context.{side}": t[f"context.{side}"][:, :3].clone()
                                                for side in ("positive", "negative")}), "prompt contexts are"),
}


@pytest.mark.parametrize("case", BAD_STATES)
def test_damaged_states_are_refused(pipeline, state_file, tmp_path, case):
    edit_record, edit_tensors, pattern = BAD_STATES[case]
    path = _rewrite(state_file, tmp_path, edit_record, edit_tensors)
    with pytest.raises(AnimaError, match=pattern):
        pipeline.generate(dataclasses.replace(BASE, cache="spectrum", threads=1), resume=read_state(path))


def test_truncated_and_planted_states_are_refused(state_file, tmp_path):
    cut = tmp_path / "cut.state"
    cut.write_bytes(state_file.read_bytes()[:-100])
    with pytest.raises(AnimaError, match="truncated"):
        read_state(cut)
    marker = tmp_path / "marker"

    class Plant:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    planted = tmp_path / "planted.state"
    planted.write_bytes(pickle.dumps(Plant()))
    with pytest.raises(AnimaError):
        read_state(planted)
    assert not marker.exists()
    with pytest.raises(AnimaError, match="resume state not found"):
        read_state(tmp_path / "nope.state")


def test_checkpoints_every_n_steps_and_removed_when_done(pipeline, tmp_path, one_thread):
    path = tmp_path / "x.png.state"
    written = []
    checkpoints = Checkpoints(path, every=4)
    pipeline.generate(dataclasses.replace(BASE, cache="spectrum"),
                      on_step=lambda e: written.append(read_state(path).step) if path.exists() else None,
                      checkpoints=checkpoints)
    # The state is written before the other listeners run; each checkpoint is a whole, valid state.
    assert sorted(set(written)) == [4, 8]
    assert path.exists()
    checkpoints.remove()
    assert not path.exists()


def test_a_stop_asked_during_the_last_step_lets_the_run_finish(pipeline, references, tmp_path, one_thread):
    path = tmp_path / "x.png.state"
    asked = []
    result = pipeline.generate(dataclasses.replace(BASE, cache="spectrum"),
                               on_step=lambda e: asked.append(True) if e.step == STEPS else None,
                               checkpoints=Checkpoints(path, stop=lambda: bool(asked)))
    assert asked and np.array_equal(result.latent, references["spectrum"].latent)
    assert not path.exists()  # nothing left to resume


def test_a_stop_before_the_first_step_leaves_nothing_to_resume(pipeline, tmp_path):
    with pytest.raises(Interrupted) as stopped:
        pipeline.generate(BASE, checkpoints=Checkpoints(tmp_path / "x.png.state", stop=lambda: True))
    assert stopped.value.path is None and stopped.value.step == 0
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoint_that_cannot_be_written_warns_and_the_run_goes_on(pipeline, references, tmp_path, one_thread):
    folder = tmp_path / "gone"
    folder.mkdir()
    warnings = []
    checkpoints = Checkpoints(folder / "x.png.state", every=2, warn=warnings.append)
    folder.rmdir()  # the disk went away
    result = pipeline.generate(dataclasses.replace(BASE, cache="spectrum"), checkpoints=checkpoints)
    assert np.array_equal(result.latent, references["spectrum"].latent)
    assert len(warnings) == 5 and all(isinstance(w, AnimaError) for w in warnings)


def test_resume_keeps_the_loras_and_refuses_others(pipeline, tiny_set, tmp_path, one_thread):
    from lora_files import comfy, kohya, random_pairs, write_lora

    from anima_rknn.model.io import read_dit_config
    from anima_rknn.model.lora import LoraRef

    config = read_dit_config(tiny_set.dit)
    style = write_lora(tmp_path / "style.safetensors", comfy(random_pairs(config, seed=1, strength=1.0)))
    other = write_lora(tmp_path / "other.safetensors", kohya(random_pairs(config, seed=2, strength=1.0)))
    params = dataclasses.replace(BASE, cache="spectrum", loras=[LoraRef(style, 0.8)])
    reference = pipeline.generate(params)
    stopped = stop_after(pipeline, params, tmp_path / "x.png.state", 5)
    state = read_state(stopped.path)
    assert state.params.loras == [LoraRef(style, 0.8)]
    assert np.array_equal(pipeline.generate(params, resume=state).latent, reference.latent)
    for loras in ([], [LoraRef(style, 0.5)], [LoraRef(other, 0.8)]):
        with pytest.raises(AnimaError, match="the state was made with loras"):
            pipeline.generate(dataclasses.replace(params, loras=loras), resume=state)
    style.write_bytes(other.read_bytes())  # the same name and scale, another file
    with pytest.raises(AnimaError, match="the state was made with another set of LoRA files"):
        pipeline.generate(params, resume=state)
