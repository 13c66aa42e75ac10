"""The one job runner (jobs/runner.JobRunner) that generate, serve's queue and batch's workers drive: a job is
generated and published exactly as pipeline.generate + publish would; it checkpoints to its state file, stops
at a step boundary with the state kept, resumes to the same PNG, and leaves no state behind once it has
finished or failed."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from anima_rknn.core.tensorfile import load_tensors, save_tensors
from anima_rknn.errors import AnimaError
from anima_rknn.generation.params import GenerationParams
from anima_rknn.generation.pipeline import AnimaPipeline
from anima_rknn.generation.result import NotFinite, publish
from anima_rknn.generation.resume import Interrupted, ResumeState, default_state_path
from anima_rknn.jobs.runner import JobRunner, saved_state

PARAMS = GenerationParams(prompt="a red circle", width=64, height=64, steps=5, seed=7)


@pytest.fixture(scope="module")
def pipeline(tiny_set):
    return AnimaPipeline(tiny_set, keep_dit=True)


@pytest.fixture(scope="module")
def runner(pipeline):
    return JobRunner(pipeline, checkpoint_every=1)


@pytest.fixture(scope="module")
def reference(pipeline, one_thread):
    """The direct way: pipeline.generate, then publish to bytes."""
    result = pipeline.generate(PARAMS)
    return result, publish(result).png


def without_timings(record: dict) -> dict:
    return {k: v for k, v in record.items() if k != "timings"}


def interrupt(runner, params, state, after=2):
    """Run `params` until step `after` has finished, as Ctrl-C (or a cancel) during that step would."""
    seen = []
    with pytest.raises(Interrupted) as stopped:
        runner.run(params, state=state, on_step=lambda e: seen.append(e.step), stop=lambda: after in seen)
    assert seen == list(range(1, after + 1))
    return stopped.value


def test_a_job_publishes_to_a_path_like_generate_then_publish_and_leaves_no_state(runner, reference, tmp_path):
    result, png = reference
    out = tmp_path / "x.png"
    published = runner.run(PARAMS, state=default_state_path(out), to=out)
    assert out.read_bytes() == png and published.png is None
    assert without_timings(published.record) == without_timings(result.summary(str(out)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.png"]  # checkpoints were written, then removed


def test_a_job_publishes_to_bytes_and_image_says_where_the_record_puts_it(runner, reference, tmp_path):
    result, png = reference
    published = runner.run(PARAMS, state=tmp_path / "job.state", image="/api/jobs/1/image")
    assert published.png == png
    assert without_timings(published.record) == without_timings(result.summary("/api/jobs/1/image"))
    assert list(tmp_path.iterdir()) == []


def test_a_stopped_job_keeps_its_state_and_resumes_to_the_same_png(runner, reference, tmp_path):
    out = tmp_path / "x.png"
    state = default_state_path(out)
    stopped = interrupt(runner, PARAMS, state, after=2)
    assert (stopped.path, stopped.step, stopped.total) == (state, 2, 5)
    assert state.is_file() and not out.exists()
    kept = saved_state(state)
    assert isinstance(kept, ResumeState) and kept.step == 2
    seen = []
    runner.run(PARAMS, state=state, to=out, resume=kept, on_step=lambda e: seen.append(e.step))
    assert seen == [3, 4, 5]
    assert out.read_bytes() == reference[1]
    assert not state.exists()


def test_saved_state_is_none_unless_a_sound_state_is_there(runner, tmp_path):
    """A missing, absent or damaged state is worth nothing: the job starts over."""
    assert saved_state(None) is None
    assert saved_state(tmp_path / "missing.state") is None
    state = tmp_path / "x.png.state"
    interrupt(runner, PARAMS, state, after=1)
    good = state.read_bytes()
    assert isinstance(saved_state(state), ResumeState)
    state.write_bytes(b"\x00garbage, not a safetensors file\xff" * 8)
    assert saved_state(state) is None
    state.write_bytes(good[: len(good) // 2])  # cut short
    assert saved_state(state) is None


@pytest.fixture(scope="module")
def broken_runner(tiny_set, tmp_path_factory):
    """A runner on the tiny set with an infinite DiT final layer: every job's final latent is not finite."""
    tensors = load_tensors(tiny_set.dit, "DiT")
    tensors["net.final_layer.linear.weight"] = torch.full_like(tensors["net.final_layer.linear.weight"], math.inf)
    broken = tmp_path_factory.mktemp("broken") / "inf.safetensors"
    save_tensors(tensors, broken)
    return JobRunner(AnimaPipeline(dataclasses.replace(tiny_set, dit=broken), keep_dit=True), checkpoint_every=1)


def test_a_job_that_is_not_finite_raises_and_leaves_no_state(broken_runner, tmp_path, one_thread):
    """The run ends at its first non-finite step, before any listener: no checkpoint holds a NaN latent (nothing
    worth resuming), no image is written."""
    out, seen = tmp_path / "x.png", []
    with pytest.raises(NotFinite, match="no image was written"):
        broken_runner.run(PARAMS, state=default_state_path(out), to=out, on_step=lambda e: seen.append(e.step),
                          stop=lambda: 2 in seen)
    assert seen == [] and list(tmp_path.iterdir()) == []


def test_a_refused_job_keeps_the_state_it_was_asked_to_continue(runner, tmp_path):
    """Refusing a resume (other settings here; other model files alike) must not cost the user the run it refused:
    the state stays, and the job with its own settings continues from it."""
    state = tmp_path / "x.png.state"
    interrupt(runner, PARAMS, state, after=2)
    before = state.read_bytes()
    with pytest.raises(AnimaError, match="made with steps 5"):
        runner.run(dataclasses.replace(PARAMS, steps=6), state=state, to=tmp_path / "x.png",
                   resume=saved_state(state))
    with pytest.raises(AnimaError, match="multiples of 16, got 63x64"):
        runner.run(dataclasses.replace(PARAMS, width=63), state=state, to=tmp_path / "x.png")
    assert [p.name for p in tmp_path.iterdir()] == ["x.png.state"] and state.read_bytes() == before
    seen = []
    runner.run(PARAMS, state=state, to=tmp_path / "x.png", resume=saved_state(state),
               on_step=lambda e: seen.append(e.step))
    assert seen == [3, 4, 5] and not state.exists()


def test_without_a_state_no_checkpoint_is_written_and_none_is_read_or_removed(runner, reference, tmp_path):
    out = tmp_path / "x.png"
    beside = default_state_path(out)
    interrupt(runner, PARAMS, beside, after=2)  # a state where one would be, left alone
    before = beside.read_bytes()
    seen = []
    runner.run(PARAMS, state=None, to=out, on_step=lambda e: seen.append(e.step))
    assert seen == [1, 2, 3, 4, 5]  # from the start
    assert out.read_bytes() == reference[1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.png", "x.png.state"]
    assert beside.read_bytes() == before
