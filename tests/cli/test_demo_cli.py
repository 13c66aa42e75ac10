"""train-demo and eval-demo through the CLI: training state is never unpickled, a folder train-demo did not
make is refused unchanged, bad options stop before any work, and the contact sheet follows the output rules."""

from __future__ import annotations

import dataclasses
import json
import pickle
from pathlib import Path

import pytest
import torch
from PIL import Image

from anima_rknn.core import threads as thread_counts
from anima_rknn.core.files import sha256_file, write_json
from anima_rknn.demo.state import CONFIG_FILE, DIT_STATE, LATENTS, VAE_STATE, WORK_FOLDER
from anima_rknn.demo.train import DemoConfig

STEPS = ("--vae-steps", "1", "--dit-steps", "1")  # never reached: every run here is refused before training


def hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): sha256_file(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def assert_refused(result, *needles: str) -> None:
    assert result.code == 1 and "Traceback" not in result.err, result.err
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


class _CreatesMarker:
    """Unpickling this creates `marker`: proof that a pickle was loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def test_the_planted_pickle_is_live(tmp_path) -> None:
    """Without this the tests below could not fail: loading the payload does create the marker."""
    marker = tmp_path / "marker"
    pickle.loads(pickle.dumps(_CreatesMarker(marker))).close()
    assert marker.exists()


def _own_run(out: Path) -> None:
    """The config.json of an interrupted `train-demo --out out --vae-steps 1 --dit-steps 1`, as it writes it."""
    (out / WORK_FOLDER).mkdir(parents=True)
    config = dataclasses.replace(DemoConfig(), vae_steps=1, dit_steps=1)
    write_json(out / WORK_FOLDER / CONFIG_FILE, dataclasses.asdict(config), overwrite=False)


@pytest.mark.parametrize("name", [VAE_STATE, DIT_STATE, LATENTS, "vae.pt", "dit.pt", "latents.pt", CONFIG_FILE])
def test_a_planted_pickle_is_refused_unread(name, run_cli, tmp_path) -> None:
    out, marker = tmp_path / "run", tmp_path / "marker"
    _own_run(out)
    planted = out / WORK_FOLDER / name
    planted.write_bytes(pickle.dumps(_CreatesMarker(marker)))
    before = hashes(out)
    result = run_cli("train-demo", "--out", out, *STEPS)
    assert_refused(result, str(planted))
    assert not marker.exists()
    assert hashes(out) == before


def _model_set(run_cli, out: Path) -> None:
    assert run_cli("make-tiny", "--out", out).code == 0


def _other_files(run_cli, out: Path) -> None:
    out.mkdir()
    (out / "notes.txt").write_text("mine")


@pytest.mark.parametrize("make", [_model_set, _other_files], ids=["model set", "other files"])
def test_a_folder_train_demo_did_not_make_is_refused_unchanged(make, run_cli, tmp_path) -> None:
    out = tmp_path / "taken"
    make(run_cli, out)
    before = hashes(out)
    assert_refused(run_cli("train-demo", "--out", out, *STEPS), str(out), "--overwrite")
    assert hashes(out) == before


def test_overwrite_lets_train_demo_into_a_folder_it_did_not_make(run_cli, tmp_path) -> None:
    out = tmp_path / "taken"
    _model_set(run_cli, out)
    (out / WORK_FOLDER).mkdir()
    old = out / WORK_FOLDER / "dit.pt"  # stops the run right after the folder check, before any training
    old.write_bytes(b"old pickle")
    assert_refused(run_cli("train-demo", "--out", out, *STEPS, "--overwrite"), str(old))


@pytest.mark.parametrize("option", [("--minutes", "0"), ("--minutes", "-1"), ("--threads", "-1"),
                                    ("--vae-steps", "0"), ("--dit-steps", "-3"), ("--seed", "-1")])
def test_bad_options_stop_before_the_folder_is_made(option, run_cli, tmp_path) -> None:
    out = tmp_path / "new"
    result = run_cli("train-demo", "--out", out, *STEPS, *option)
    assert_refused(result, option[0].removeprefix("--").replace("-", "_"))
    assert not out.exists()


@pytest.mark.parametrize("minutes", ["nan", "inf"])
def test_a_budget_that_is_not_a_number_is_a_usage_error(minutes, run_cli, tmp_path) -> None:
    result = run_cli("train-demo", "--out", tmp_path / "new", *STEPS, "--minutes", minutes)
    assert result.code == 2 and "is not a finite number" in result.err and "Traceback" not in result.err
    assert not (tmp_path / "new").exists()


# ---- eval-demo --------------------------------------------------------------------------------------------

FAST = ("--prompts", "1", "--steps", "2")


@pytest.mark.parametrize("sheet, existing, message", [
    ("sheet.png", "my notes", "exists; pass --overwrite"),
    ("sheet.txt", None, "must be a .png"),
    ("missing/sheet.png", None, "does not exist"),
])
def test_eval_demo_refuses_a_sheet_before_generating(sheet, existing, message, run_cli, tmp_path) -> None:
    path = tmp_path / sheet
    if existing is not None:
        path.write_text(existing)
    assert_refused(run_cli("eval-demo", *FAST, "--sheet", path), message)  # one line: no progress bar
    assert path.read_text() == existing if existing is not None else not path.exists()


@pytest.mark.parametrize("option, message", [(("--prompts", "0"), "prompt set"), (("--prompts", "9999"), "prompt set"),
                                             (("--steps", "0"), "steps")])
def test_eval_demo_checks_its_options_before_generating(option, message, run_cli, tmp_path) -> None:
    sheet = tmp_path / "sheet.png"
    assert_refused(run_cli("eval-demo", *FAST, *option, "--sheet", sheet), message)
    assert not sheet.exists()


def test_eval_demo_writes_a_sheet_and_replaces_it_only_with_overwrite(run_cli, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(thread_counts, "_auto", lambda: 1)  # --threads 0, the default: auto, named one thread here
    sheet = tmp_path / "sheet.png"
    first = run_cli("eval-demo", *FAST, "--sheet", sheet, "--json")
    assert first.code == 0, first.err
    scores = json.loads(first.out.strip().splitlines()[-1])
    assert set(scores) == {"train", "held_out", "all"} and set(scores["all"]) >= {"background", "all"}
    assert Image.open(sheet).size == (6 * 128, 128 + 56)
    written = sha256_file(sheet)
    assert_refused(run_cli("eval-demo", *FAST, "--sheet", sheet), "--overwrite")
    assert sha256_file(sheet) == written
    torch.set_num_threads(2)  # the run sets torch to its own threads, auto's as everywhere
    again = run_cli("eval-demo", *FAST, "--seed", "7", "--sheet", sheet, "--overwrite", "--threads", "0")
    assert again.code == 0, again.err
    assert torch.get_num_threads() == 1
    assert sha256_file(sheet) != written and Image.open(sheet).format == "PNG"
