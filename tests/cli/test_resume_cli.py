"""Stop and resume as a user does it: Ctrl-C or SIGTERM in the middle, then `generate --resume`."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time

import pytest
from PIL import Image

RUN = ("-p", "a red circle", "-W", "64", "-H", "64", "--steps", "300")  # seconds long: time to stop it


def _stop_midway(model_dir, out, log, signum):
    command = [sys.executable, "-m", "anima_rknn", "generate", "--model", str(model_dir), *RUN, "-o", str(out)]
    with open(log, "wb") as stderr:
        # One thread, as the in-process runs here (one_thread): two spinning threads on a busy CPU cost 5x.
        process = subprocess.Popen(command, stderr=stderr, env={**os.environ, "OMP_NUM_THREADS": "1"})
        deadline = time.monotonic() + 120
        while "denoise:" not in log.read_text(errors="replace"):
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        time.sleep(0.3)
        process.send_signal(signum)
        return process.wait(timeout=120)


# SIGTERM, as a service manager stops a run; Ctrl-C's SIGINT is sent to the in-process runs below and to the
# console script in test_bad_input.py.
@pytest.mark.parametrize("signum", [signal.SIGTERM])
def test_stop_then_resume_gives_the_uninterrupted_image(run_cli, model_dir, tmp_path, signum, one_thread):
    reference = tmp_path / "reference.png"
    assert run_cli("generate", "--model", model_dir, *RUN, "-o", reference).code == 0
    out, log = tmp_path / "x.png", tmp_path / "log.txt"
    assert _stop_midway(model_dir, out, log, signum) == 128 + signum
    state = tmp_path / "x.png.state"
    assert state.is_file() and not out.exists()
    # A new run to the same output must not throw the stopped one away.
    refused = run_cli("generate", "--model", model_dir, *RUN, "-o", out)
    resume = shlex.join(["anima-rknn", "generate", "--model", str(model_dir), "--resume", str(state)])
    assert refused.code == 1 and f"holds a stopped run: continue it with {resume}, or pass" in refused.err
    # Resuming with another setting given explicitly is refused, naming it.
    other = run_cli("generate", "--model", model_dir, "--resume", state, "--seed", "5")
    assert other.code == 1 and "made with seed 20260812, this run asks for 5" in other.err
    resumed = run_cli(*printed_resume(log.read_text(errors="replace")))  # what the run said, verbatim
    assert resumed.code == 0, resumed.err
    assert Image.open(out).tobytes() == Image.open(reference).tobytes()
    assert Image.open(out).text["parameters"] == Image.open(reference).text["parameters"].replace(
        str(reference), str(out))
    assert not state.exists()  # done: nothing left to resume


def test_resume_needs_a_state_and_an_output(run_cli, model_dir, tmp_path):
    missing = run_cli("generate", "--model", model_dir, "--resume", tmp_path / "nope.png.state")
    assert missing.code == 1 and "resume state not found" in missing.err
    no_prompt = run_cli("generate", "--model", model_dir, "-o", tmp_path / "x.png")
    assert no_prompt.code == 1 and "pass --prompt" in no_prompt.err


def printed_resume(err: str) -> list[str]:
    """The arguments of the command a stopped run printed ("resume with: anima-rknn generate ...")."""
    line = next(line for line in err.splitlines() if "; resume with: " in line)
    words = shlex.split(line.split("; resume with: ", 1)[1])
    assert words[:2] == ["anima-rknn", "generate"], line
    return words[1:]


def _stopped_in_process(run_cli, args, preview):
    """Run `generate ARGS --preview PREVIEW` here and Ctrl-C it (a real SIGINT to this process) once the first
    preview is written, that is after its first finished step."""
    def interrupt() -> None:
        deadline = time.monotonic() + 120
        while not preview.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)

    watcher = threading.Thread(target=interrupt, daemon=True)
    watcher.start()
    result = run_cli("generate", *args, "--preview", preview)
    watcher.join()
    return result


def _single_files(tiny_set):
    return ["--dit", tiny_set.dit, "--text-encoder", tiny_set.text_encoder, "--vae", tiny_set.vae,
            "--qwen-tokenizer", tiny_set.qwen_tokenizer, "--t5-tokenizer", tiny_set.t5_tokenizer]


@pytest.fixture(scope="module")
def tiny_onnx_subgraphs(tiny_set, tmp_path_factory):
    pytest.importorskip("onnxruntime")
    from anima_rknn.export.onnx import export_subgraphs

    folder = tmp_path_factory.mktemp("onnx-resume")
    export_subgraphs(tiny_set.dit, 64, 64, folder, progress=False, overwrite=True)
    return folder


@pytest.mark.parametrize("models", ["single files", "demo default", "onnx", "state and out named"])
def test_the_printed_resume_command_resumes(run_cli, tiny_set, model_dir, tmp_path, request, models, one_thread):
    """Whatever named the models and the backend, the command a stopped run prints finishes it, and leaves no
    state behind."""
    out, preview, state = tmp_path / "x.png", tmp_path / "live.png", tmp_path / "x.png.state"
    args = ["-p", "a red circle", "--steps", "20", "-o", out]
    if models == "single files":
        args += [*_single_files(tiny_set), "-W", "64", "-H", "64"]
    elif models == "onnx":
        args += ["--model", model_dir, "-W", "64", "-H", "64", "--backend", "onnx", "--subgraphs",
                 request.getfixturevalue("tiny_onnx_subgraphs"), "--vae-backend", "torch"]
    elif models == "state and out named":  # a state whose name says nothing of its image, over an older image
        state = tmp_path / "run.state"
        out.write_bytes(b"old")
        args += ["--model", model_dir, "-W", "64", "-H", "64", "--state", state, "--overwrite"]
    stopped = _stopped_in_process(run_cli, args, preview)
    assert stopped.code == 130 and state.is_file() and out.exists() == (models == "state and out named"), stopped.err
    resumed = run_cli(*printed_resume(stopped.err))
    assert resumed.code == 0, resumed.err
    assert Image.open(out).size == (64, 64) and not state.exists()


def test_a_state_resumed_into_another_output_is_removed(run_cli, model_dir, tmp_path, one_thread):
    """--resume X.state --out other.png: the run goes on in X.state, and once other.png is written nothing is left
    to resume, so X.state goes as a plain resume's does."""
    out, preview, state = tmp_path / "x.png", tmp_path / "live.png", tmp_path / "x.png.state"
    stopped = _stopped_in_process(run_cli, ["--model", model_dir, "-p", "a red circle", "-W", "64", "-H", "64",
                                            "--steps", "20", "-o", out], preview)
    assert stopped.code == 130 and state.is_file(), stopped.err
    resumed = run_cli("generate", "--model", model_dir, "--resume", state, "--out", tmp_path / "other.png")
    assert resumed.code == 0, resumed.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["live.png", "other.png"]
