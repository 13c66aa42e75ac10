"""train-demo's saved state (safetensors + JSON): a resumed stage ends bit for bit where an uninterrupted one
does, and a corrupt, foreign or mismatched file in .train is refused in one line, unread and unchanged."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from anima_rknn.core import threads as thread_counts
from anima_rknn.core.tensorfile import load_tensors, read_metadata, save_tensors
from anima_rknn.demo import harness, train
from anima_rknn.demo.harness import CaptionBank, training_captions
from anima_rknn.demo.state import (
    CONFIG_FILE,
    DIT_STATE,
    LATENTS,
    PROGRESS_KEY,
    VAE_STATE,
    WORK_FOLDER,
    load_stage,
)
from anima_rknn.demo.train import train_demo, train_dit, train_vae
from anima_rknn.errors import AnimaError
from anima_rknn.model.io import load_dit
from anima_rknn.model.model_set import from_model_dir
from anima_rknn.vae import WanVAE, WanVAEConfig, load_vae

# ---- resumption -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dit_inputs(trained, tiny_config):
    """What train_dit takes besides its folder: the config with the built T5 vocabulary, the VAE, the captions."""
    files = from_model_dir(trained[0])
    config = dataclasses.replace(tiny_config, dit=load_dit(files.dit).config, dit_steps=6, latent_pool=32)
    return config, load_vae(files.vae, decode_only=False), CaptionBank(files, training_captions())


def _run_stage(stage: str, work: Path, dit_inputs) -> torch.nn.Module:
    config, vae, bank = dit_inputs
    if stage == "vae":
        return train_vae(dataclasses.replace(config, vae_steps=6), work)[0]
    return train_dit(config, work, vae, bank)[0]


# stage -> (its state file, a module and the function of it that the stage calls once per training step)
STAGES = {"vae": (VAE_STATE, train, "_vae_loss"), "dit": (DIT_STATE, harness, "shift_sigma")}


@pytest.mark.parametrize("stage", STAGES)
def test_a_resumed_stage_ends_bit_for_bit_where_an_uninterrupted_one_does(stage, dit_inputs, tmp_path,
                                                                          monkeypatch) -> None:
    torch.set_num_threads(1)
    state_file, module, per_step = STAGES[stage]
    straight_dir, resumed_dir = tmp_path / "straight", tmp_path / "resumed"
    straight_dir.mkdir()
    resumed_dir.mkdir()
    straight = _run_stage(stage, straight_dir, dit_inputs)

    monkeypatch.setattr(harness, "CHECKPOINT_EVERY_S", -1.0)  # checkpoint after every step
    real, calls = getattr(module, per_step), []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(module, per_step, interrupted)
    with pytest.raises(KeyboardInterrupt):
        _run_stage(stage, resumed_dir, dit_inputs)
    monkeypatch.setattr(module, per_step, real)
    assert json.loads(read_metadata(resumed_dir / state_file, "state")[PROGRESS_KEY])["step"] == 3
    resumed = _run_stage(stage, resumed_dir, dit_inputs)

    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    # the whole saved state too: model, EMA, optimizer moments and step counters, every loss
    a, b = load_tensors(straight_dir / state_file, "state"), load_tensors(resumed_dir / state_file, "state")
    assert a.keys() == b.keys() and any(k.startswith("optimizer.state.") for k in a)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)


def test_only_the_time_budget_of_a_run_may_change(trained, tiny_config, tmp_path, monkeypatch) -> None:
    """Also: the run sets torch to the threads asked, 0 as auto means everywhere (core/threads.py)."""
    out = tmp_path / "run"
    shutil.copytree(trained[0], out)
    monkeypatch.setattr(thread_counts, "_auto", lambda: 1)  # auto, named: one thread, as the tests run
    torch.set_num_threads(2)
    results = train_demo(out, dataclasses.replace(tiny_config, minutes=99.0), threads=0)
    assert torch.get_num_threads() == 1
    assert results["dit"].steps == 40  # both stages were done: nothing retrained
    with pytest.raises(AnimaError, match="another configuration"):
        train_demo(out, dataclasses.replace(tiny_config, seed=6), threads=1)


# ---- refusals ---------------------------------------------------------------------------------------------

Mutation = Callable[[Path], None]  # changes the .train folder of a finished run


def edit_tensors(name: str, change: Callable[[dict], None]) -> Mutation:
    def mutate(work: Path) -> None:
        tensors = {k: v.clone() for k, v in load_tensors(work / name, "state").items()}
        change(tensors)
        save_tensors(tensors, work / name, read_metadata(work / name, "state"))
    return mutate


def edit_progress(name: str, change: Callable[[dict], str | None]) -> Mutation:
    """`change` gets the progress record and returns its new text (None: no record)."""
    def mutate(work: Path) -> None:
        metadata = read_metadata(work / name, "state")
        text = change(json.loads(metadata.pop(PROGRESS_KEY)))
        tensors = {k: v.clone() for k, v in load_tensors(work / name, "state").items()}
        save_tensors(tensors, work / name, metadata if text is None else {**metadata, PROGRESS_KEY: text})
    return mutate


def edit_config(change: Callable[[dict], str]) -> Mutation:
    def mutate(work: Path) -> None:
        (work / CONFIG_FILE).write_text(change(json.loads((work / CONFIG_FILE).read_text())))
    return mutate


def write_file(name: str, data: bytes) -> Mutation:
    return lambda work: (work / name).write_bytes(data)


def truncate(name: str) -> Mutation:
    return lambda work: (work / name).write_bytes((work / name).read_bytes()[: (work / name).stat().st_size // 2])


def first(prefix: str, tensors: dict) -> str:
    return next(k for k in tensors if k.startswith(prefix))


def with_(record: dict, **changes) -> str:
    return json.dumps({**record, **changes})


def replace_tensor(prefix: str, make: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[dict], None]:
    def change(tensors: dict) -> None:
        name = first(prefix, tensors)
        tensors[name] = make(tensors[name])
    return change


def symlink_work(work: Path) -> None:
    moved = work.parent.parent / "elsewhere"
    work.rename(moved)
    work.symlink_to(moved)


# case: (the file the message names, in .train; the change; the message)
REFUSED: dict[str, tuple[str, Mutation, str]] = {
    # a file that is not what its name says
    "truncated stage": (VAE_STATE, truncate(VAE_STATE), "truncated"),
    "text as stage": (DIT_STATE, write_file(DIT_STATE, b"hello"), "truncated or not a safetensors"),
    "truncated latents": (LATENTS, truncate(LATENTS), "truncated"),
    "unknown file": ("notes.txt", write_file("notes.txt", b"mine"), "not a file train-demo writes"),
    "folder as stage": (VAE_STATE, lambda w: ((w / VAE_STATE).unlink(), (w / VAE_STATE).mkdir()),
                        "not a file train-demo writes"),
    "symlinked stage": (VAE_STATE, lambda w: ((w / VAE_STATE).unlink(), (w / VAE_STATE).symlink_to(w / DIT_STATE)),
                        "not a file train-demo writes"),
    "symlinked work folder": (".", symlink_work, "not a folder train-demo made"),
    # the progress record
    "no progress": (VAE_STATE, edit_progress(VAE_STATE, lambda p: None), "no progress record"),
    "progress not JSON": (VAE_STATE, edit_progress(VAE_STATE, lambda p: "{"), "not valid JSON"),
    "progress a list": (DIT_STATE, edit_progress(DIT_STATE, lambda p: "[]"), "object with exactly"),
    "progress extra field": (DIT_STATE, edit_progress(DIT_STATE, lambda p: with_(p, extra=1)), "object with exactly"),
    "step negative": (VAE_STATE, edit_progress(VAE_STATE, lambda p: with_(p, step=-1)), "step must be"),
    "step a string": (VAE_STATE, edit_progress(VAE_STATE, lambda p: with_(p, step="3")), "step must be"),
    "step a bool": (VAE_STATE, edit_progress(VAE_STATE, lambda p: with_(p, step=True)), "step must be"),
    "step huge": (VAE_STATE, edit_progress(VAE_STATE, lambda p: with_(p, step=10**12)), r"losses has shape \[40\]"),
    "elapsed NaN": (DIT_STATE, edit_progress(DIT_STATE, lambda p: with_(p, elapsed=float("nan"))), "elapsed must"),
    "done a string": (DIT_STATE, edit_progress(DIT_STATE, lambda p: with_(p, done="yes")), "done must be"),
    "groups not a list": (VAE_STATE, edit_progress(VAE_STATE, lambda p: with_(p, param_groups={})), "must be a list"),
    "two groups": (VAE_STATE, edit_progress(VAE_STATE, lambda p: with_(p, param_groups=p["param_groups"] * 2)),
                   "2 optimizer parameter groups"),
    "other betas": (VAE_STATE, edit_progress(VAE_STATE, lambda p: with_(
        p, param_groups=[{**p["param_groups"][0], "betas": [0.5, 0.5]}])), "optimizer settings differ"),
    "negative lr": (VAE_STATE, edit_progress(VAE_STATE, lambda p: with_(
        p, param_groups=[{**p["param_groups"][0], "lr": -1}])), "learning rate must be"),
    "unknown number": (VAE_STATE, edit_progress(VAE_STATE, lambda p: with_(p, optimizer_numbers={"bogus": 1})),
                       "unexpected entry bogus"),
    "step given twice": (VAE_STATE, edit_progress(VAE_STATE, lambda p: with_(
        p, optimizer_numbers={"optimizer.state.0.step": 3})), "given twice"),
    # tensors that do not fit the models being trained
    "model shape": (VAE_STATE, edit_tensors(VAE_STATE, replace_tensor("model.", lambda t: torch.zeros(3))),
                    "has shape"),
    "model dtype": (VAE_STATE, edit_tensors(VAE_STATE, replace_tensor("model.", lambda t: t.double())),
                    "is torch.float64"),
    "ema missing": (DIT_STATE, edit_tensors(DIT_STATE, lambda t: t.pop(first("ema.", t))), "missing"),
    "unknown tensor": (VAE_STATE, edit_tensors(VAE_STATE, lambda t: t.update(hello=torch.zeros(1))),
                       "unexpected entry hello"),
    "optimizer index": (VAE_STATE, edit_tensors(VAE_STATE, lambda t: t.update(
        {"optimizer.state.99999.exp_avg": torch.zeros(1)})), "unexpected entry optimizer.state.99999"),
    "optimizer moment shape": (VAE_STATE, edit_tensors(VAE_STATE, replace_tensor(
        "optimizer.state.0.exp_avg", lambda t: torch.zeros(7, 7))), "does not fit"),
    "optimizer step negative": (VAE_STATE, edit_tensors(VAE_STATE, replace_tensor(
        "optimizer.state.0.step", lambda t: torch.tensor(-1.0))), "does not fit"),
    "optimizer moment missing": (VAE_STATE, edit_tensors(VAE_STATE, lambda t: t.pop("optimizer.state.0.exp_avg_sq")),
                                 "optimizer state 0 has"),
    "losses too long": (VAE_STATE, edit_tensors(VAE_STATE, replace_tensor("losses", lambda t: torch.zeros(41))),
                        "losses has shape"),
    "latents shape": (LATENTS, edit_tensors(LATENTS, replace_tensor("latents", lambda t: t[:10])),
                      "latent pool has shape"),
    "latents dtype": (LATENTS, edit_tensors(LATENTS, replace_tensor("latents", lambda t: t.double())),
                      "torch.float64"),
    "latents extra": (LATENTS, edit_tensors(LATENTS, lambda t: t.update(more=torch.zeros(1))), "one tensor"),
    # a state that went non-finite: training on would only spread it ("loss nan")
    "model weight NaN": (VAE_STATE, edit_tensors(VAE_STATE, replace_tensor(
        "model.", lambda t: torch.full_like(t, float("nan")))), "tensor model.* holds NaN or infinity"),
    "optimizer moment NaN": (VAE_STATE, edit_tensors(VAE_STATE, replace_tensor(
        "optimizer.state.0.exp_avg", lambda t: torch.full_like(t, float("nan")))), "holds NaN or infinity"),
    "latents NaN": (LATENTS, edit_tensors(LATENTS, replace_tensor("latents", lambda t: torch.full_like(
        t, float("nan")))), "latent pool holds NaN"),
    # the run's config
    "config not JSON": (CONFIG_FILE, edit_config(lambda c: "seed = 5"), "not valid JSON"),
    "config deeply nested": (CONFIG_FILE, edit_config(lambda c: "[" * 50_000), "not valid JSON"),
    "config huge": (CONFIG_FILE, edit_config(lambda c: " " * 70_000 + json.dumps(c)), "larger than"),
    "config a list": (CONFIG_FILE, edit_config(lambda c: "[]"), "must be a JSON object"),
    "config missing field": (CONFIG_FILE, edit_config(lambda c: json.dumps({k: v for k, v in c.items()
                                                                            if k != "seed"})), "missing seed"),
    "config unknown field": (CONFIG_FILE, edit_config(lambda c: with_(c, evil=1)), "unknown evil"),
    "config bool seed": (CONFIG_FILE, edit_config(lambda c: with_(c, seed=True)), "seed must be an integer"),
    "config share out of range": (CONFIG_FILE, edit_config(lambda c: with_(c, vae_share=2)), "vae_share must be"),
    "config nested type": (CONFIG_FILE, edit_config(lambda c: with_(c, dit={**c["dit"], "hidden": "64"})),
                           "dit.hidden must be"),
    "config nested not an object": (CONFIG_FILE, edit_config(lambda c: with_(c, text_encoder=[])),
                                    "text_encoder must be a JSON object"),
}


def _contents(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", REFUSED)
def test_bad_state_is_refused_in_one_line_and_left_unchanged(case, trained, tiny_config, tmp_path) -> None:
    named, mutate, pattern = REFUSED[case]
    out = tmp_path / "run"
    shutil.copytree(trained[0], out)
    mutate(out / WORK_FOLDER)
    before = _contents(out / WORK_FOLDER)
    with pytest.raises(AnimaError, match=pattern) as refused:
        train_demo(out, tiny_config, threads=1)
    message = str(refused.value)
    assert "\n" not in message and str(out / WORK_FOLDER / named) in message
    assert _contents(out / WORK_FOLDER) == before


def test_a_non_finite_loss_stops_training_with_the_last_good_state_kept(tiny_config, tmp_path) -> None:
    """A learning rate far too high makes the VAE's loss overflow within a few steps: the run stops at the first
    non-finite loss in one line, and the state it keeps is the last good step's (finite, so it loads again)."""
    out = tmp_path / "run"
    diverging = dataclasses.replace(tiny_config, vae_lr=1e8, warmup_steps=1, vae_steps=40, dit_steps=2)
    with pytest.raises(AnimaError, match=r"^vae step [0-9]+: the loss is (nan|inf); training stopped") as stopped:
        train_demo(out, diverging, threads=1)
    assert "\n" not in str(stopped.value)
    torch.manual_seed(0)
    vae = WanVAE(WanVAEConfig(dim=diverging.vae_dim, z_dim=16, num_res_blocks=diverging.vae_res_blocks))
    optimizer = torch.optim.Adam(vae.parameters(), lr=diverging.vae_lr)
    kept = load_stage(out / WORK_FOLDER / VAE_STATE, {"model": vae}, optimizer)  # refused if anything were NaN
    assert 0 <= kept.step < 40 and all(math.isfinite(loss) for loss in kept.losses)
