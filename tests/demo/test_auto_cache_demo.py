"""The `auto` cache's quality point on the shipped demo model, pinned: the first 12 of the README's 48 held-out
prompts (benchmarks/auto_cache.py; noise seeds 1000 + i), 20 steps, CFG 4, each image against the uncached
one from the same noise. A subset, so that it runs in seconds; the README's table has all 48. Then `verify=1` on
the held-out set `h2`, whose images break worst at that budget: the flag marks them and verify re-runs them; and
`check=1` on held-out images of `h1` and `h2` whose plan its partial pass moves."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from anima_rknn.bench.metrics import psnr
from anima_rknn.core.tensorfile import load_tensors, read_metadata, save_tensors
from anima_rknn.demo import demo_model_dir
from anima_rknn.demo.dataset import IMAGE_SIZE
from anima_rknn.demo.evaluate import prompt_set
from anima_rknn.errors import AnimaError
from anima_rknn.generation.params import GenerationParams
from anima_rknn.generation.pipeline import AnimaPipeline
from anima_rknn.generation.resume import STATE_KEY, Checkpoints, Interrupted, read_state
from anima_rknn.model.model_set import from_model_dir

PROMPTS = 12
QUALITY_POINT = {"budget": 10}
# Measured on these 12 prompts: mean PSNR 48.3 dB, worst 41.3 dB, 20 passes each (all 48: 46.1 / 30.1 dB);
# bounds 3 dB below.
MIN_PSNR = (45.3, 38.3)


@pytest.fixture(scope="module")
def pipeline():
    torch.set_num_threads(1)
    return AnimaPipeline(from_model_dir(demo_model_dir()), keep_dit=True)


@pytest.fixture(scope="module")
def runs(pipeline):
    pairs = []
    for i, spec in enumerate(prompt_set(PROMPTS)):
        base = GenerationParams(prompt=spec.caption, width=IMAGE_SIZE, height=IMAGE_SIZE, steps=20, cfg=4.0,
                                seed=1000 + i)
        conditioning = pipeline.encode(base.prompt, base.negative, base.dtype)
        uncached = pipeline.denoise(conditioning, base)
        auto = pipeline.denoise(conditioning, dataclasses.replace(base, cache="auto", cache_options=QUALITY_POINT))
        pairs.append((np.asarray(pipeline.decode(uncached.sample.latent)[0]),
                      np.asarray(pipeline.decode(auto.sample.latent)[0]), auto))
    return pairs


def test_quality_point_holds_its_figures(runs) -> None:
    values = [psnr(base, cached) for base, cached, _ in runs]
    assert np.mean(np.minimum(values, 100.0)) >= MIN_PSNR[0] and min(values) >= MIN_PSNR[1], values
    assert all(auto.transformer_passes == 2 * QUALITY_POINT["budget"] for _, _, auto in runs)  # spent, not exceeded
    assert all(auto.sample.error_estimate > 0 for _, _, auto in runs)



H1, H2 = (48, 101, 31000), (48, 202, 32000)  # benchmarks/auto_cache.py's `h1`, `h2`: prompts, prompt-set seed,
# noise seed of the first. h2's three worst images at budget=10 (15.2-18.9 dB) and its first three:
VERIFIED = (20, 29, 32, 0, 1, 2)


def held_out_params(held_out: tuple[int, int, int], i: int) -> GenerationParams:
    prompts, prompt_seed, seed = held_out
    return GenerationParams(prompt=prompt_set(prompts, prompt_seed)[i].caption, width=IMAGE_SIZE, height=IMAGE_SIZE,
                            steps=20, cfg=4.0, seed=seed + i)


def h2_params(i: int) -> GenerationParams:
    return held_out_params(H2, i)


@pytest.fixture(scope="module")
def verified(pipeline):
    """Per image of VERIFIED: the uncached, `budget=10` and `budget=10,verify=1` Denoised and images."""
    runs = {}
    for i in VERIFIED:
        base = h2_params(i)
        conditioning = pipeline.encode(base.prompt, base.negative, base.dtype)
        sides = [pipeline.denoise(conditioning, dataclasses.replace(base, cache=cache, cache_options=options))
                 for cache, options in (("none", {}), ("auto", QUALITY_POINT), ("auto", {**QUALITY_POINT, "verify": True}))]
        runs[i] = [(d, np.asarray(pipeline.decode(d.sample.latent)[0])) for d in sides]
    return runs


def test_verify_re_runs_what_the_flag_marks_and_nothing_else(verified):
    """A flagged image comes back as the uncached one, bit for bit, for 17 more calls; an unflagged one is the
    plain budget's own run."""
    for i, ((uncached, _), (plain, _), (checked, _)) in verified.items():
        assert checked.sample.may_differ == plain.sample.may_differ, i
        if plain.sample.may_differ:
            assert np.array_equal(checked.sample.latent, uncached.sample.latent), i
            assert checked.sample.rerun_from == 3 and checked.transformer_passes == 2 * (10 + 17), i
        else:
            assert np.array_equal(checked.sample.latent, plain.sample.latent), i
            assert checked.sample.rerun_from is None and checked.transformer_passes == 20, i


def test_verify_lifts_the_held_out_worst_case(verified):
    """Measured on these six: budget=10 alone gives 15.3 / 18.9 / 15.2 dB on images 20 / 29 / 32 and 50.4 / 32.3 /
    30.2 dB on 0 / 1 / 2; the flag marks 20, 29, 32 and 2, so with verify the worst is image 1's 32.3 dB."""
    plain = {i: psnr(sides[0][1], sides[1][1]) for i, sides in verified.items()}
    checked = {i: psnr(sides[0][1], sides[2][1]) for i, sides in verified.items()}
    assert min(plain.values()) < 20, plain
    assert min(checked.values()) >= 30, checked
    assert {i for i, sides in verified.items() if sides[1][0].sample.may_differ} == {2, 20, 29, 32}


def stopped_state(pipeline, params, path: Path, events: int) -> Path:
    """Run until `events` steps have been told (a re-run's count too), as Ctrl-C then would; the state's path."""
    seen: list[int] = []
    checkpoints = Checkpoints(path, stop=lambda: len(seen) >= events)
    with pytest.raises(Interrupted) as stopped:
        pipeline.generate(params, on_step=lambda event: seen.append(event.step), checkpoints=checkpoints)
    return stopped.value.path


VERIFY_20 = dataclasses.replace(h2_params(20), cache="auto", cache_options={**QUALITY_POINT, "verify": True})


@pytest.mark.parametrize("events", [10, 28])  # in the first run (after its step 10), in the re-run (its step 11)
def test_a_stopped_verify_run_resumes_to_the_same_bits(pipeline, verified, tmp_path, events):
    state = read_state(stopped_state(pipeline, VERIFY_20, tmp_path / "x.state", events))
    assert ("trusted" in state.sampler_state) == (events < 20)  # the kept step travels until the re-run began
    resumed = pipeline.generate(VERIFY_20, resume=state)
    assert np.array_equal(resumed.latent, verified[20][2][0].sample.latent)
    assert resumed.denoised.sample.rerun_from == 3


@pytest.mark.parametrize("edit, tensor", [
    (lambda trusted: trusted.update(step=15), None),  # after the state's own step
    (lambda trusted: trusted.update(recomputed=["x"]), None),
    (lambda trusted: trusted.pop("history"), None),
    (None, lambda tensors: tensors.update({"trusted.latent": tensors["trusted.latent"][..., :4].clone()})),
    (None, lambda tensors: tensors.pop("trusted.latent")),
    (None, lambda tensors: tensors["trusted.latent"].view(-1)[7:9].fill_(float("nan"))),
])
def test_a_damaged_verify_snapshot_is_refused_in_one_line(pipeline, tmp_path, edit, tensor):
    path = stopped_state(pipeline, VERIFY_20, tmp_path / "x.state", 10)
    tensors = dict(load_tensors(path, "state", dtypes=("F32",)))
    record = json.loads(read_metadata(path, "state", dtypes=("F32",))[STATE_KEY])
    if edit is not None:
        edit(record["trusted"])
    if tensor is not None:
        tensor(tensors)
    save_tensors(tensors, path, {STATE_KEY: json.dumps(record)})
    with pytest.raises(AnimaError, match="verify snapshot is damaged") as refused:
        read_state(path)
    assert "\n" not in str(refused.value)


CHECK_20 = dataclasses.replace(h2_params(20), cache="auto", cache_options={"budget": 8, "check": True})


def test_a_stopped_checked_run_resumes_to_the_same_bits(pipeline, tmp_path):
    """The first block's tokens of the last two computed steps travel in the resume state (they are not the
    latent's size, and the cache checks them itself), so the check after a resume decides as it would have."""
    whole = pipeline.generate(CHECK_20)
    state = read_state(stopped_state(pipeline, CHECK_20, tmp_path / "x.state", 10))
    assert len(state.cache_state["probe_features"]) == 2
    resumed = pipeline.generate(CHECK_20, resume=state)
    assert np.array_equal(resumed.latent, whole.latent)
    assert resumed.denoised.sample.computed_steps == whole.denoised.sample.computed_steps
    assert resumed.denoised.partial_passes < whole.denoised.partial_passes  # only the checks after step 10 ran


# budget=10 plain -> check=1 in benchmarks/auto_cache.py: h1's images 8, 38, 41 (its worst) 30.6 -> 44.9, 34.9 ->
# 50.1, 20.9 -> 28.8 dB; h2's image 45 33.6 -> 54.1 dB.
CHECKED = ((H1, 8), (H1, 38), (H1, 41), (H2, 45))


def test_check_moves_the_plan_where_the_partial_pass_sees_a_miss(pipeline):
    """The same 20 passes, placed where the first block disagrees with its line: each of these held-out images
    comes out at least 5 dB nearer its uncached one, for 8-14 partial passes (1/6 of a pass each here)."""
    for held_out, i in CHECKED:
        base = held_out_params(held_out, i)
        conditioning = pipeline.encode(base.prompt, base.negative, base.dtype)
        images = {}
        for label, cache, options in (("uncached", "none", {}), ("plain", "auto", QUALITY_POINT),
                                      ("checked", "auto", {**QUALITY_POINT, "check": True})):
            denoised = pipeline.denoise(conditioning, dataclasses.replace(base, cache=cache, cache_options=options))
            images[label] = (np.asarray(pipeline.decode(denoised.sample.latent)[0]), denoised)
        plain, checked = (psnr(images["uncached"][0], images[label][0]) for label in ("plain", "checked"))
        assert checked >= plain + 5 and checked >= 28, (held_out, i, plain, checked)
        denoised = images["checked"][1]
        assert denoised.transformer_passes == 20 and 8 <= denoised.partial_passes <= 14, (held_out, i)


@pytest.mark.parametrize("tensor, message", [
    (lambda tensors: tensors["cache.probe_features.1"].view(-1)[3:5].fill_(float("nan")), "does not fit"),
    (lambda tensors: tensors.update({"cache.probe_features.0": tensors["cache.probe_features.0"][:7].clone()}),
     "does not fit"),
    (lambda tensors: tensors.pop("cache.probe_features.1"), "cache arrays do not match its record"),
])
def test_damaged_check_tokens_in_a_resume_file_are_refused_in_one_line(pipeline, tmp_path, tensor, message):
    """The first block's tokens in the resume file: NaN, cut short or missing, each a one-line refusal."""
    path = stopped_state(pipeline, CHECK_20, tmp_path / "x.state", 10)
    tensors = dict(load_tensors(path, "state", dtypes=("F32",)))
    tensor(tensors)
    save_tensors(tensors, path, {STATE_KEY: read_metadata(path, "state", dtypes=("F32",))[STATE_KEY]})
    with pytest.raises(AnimaError, match=message) as refused:
        read_state(path)
    assert "\n" not in str(refused.value)
