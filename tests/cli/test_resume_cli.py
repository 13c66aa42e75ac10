"""Stop and resume as a user does it: Ctrl-C or SIGTERM in the middle, then `generate --resume`."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from PIL import Image

RUN = ("-p", "a red circle", "-W", "64", "-H", "64", "--steps", "800")  # seconds long: time to stop it


def _stop_midway(model_dir, out, log, signum):
    command = [sys.executable, "-m", "anima_rknn", "generate", "--model", str(model_dir), *RUN, "-o", str(out)]
    with open(log, "wb") as stderr:
        process = subprocess.Popen(command, stderr=stderr)
        deadline = time.monotonic() + 120
        while "denoise:" not in log.read_text(errors="replace"):
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        time.sleep(0.3)
        process.send_signal(signum)
        return process.wait(timeout=120)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_stop_then_resume_gives_the_uninterrupted_image(run_cli, model_dir, tmp_path, signum):
    reference = tmp_path / "reference.png"
    assert run_cli("generate", "--model", model_dir, *RUN, "-o", reference).code == 0
    out, log = tmp_path / "x.png", tmp_path / "log.txt"
    assert _stop_midway(model_dir, out, log, signum) == 128 + signum
    state = tmp_path / "x.png.state"
    assert state.is_file() and not out.exists()
    # A new run to the same output must not throw the stopped one away.
    refused = run_cli("generate", "--model", model_dir, *RUN, "-o", out)
    assert refused.code == 1 and "holds a stopped run: continue it with --resume" in refused.err
    # Resuming with another setting given explicitly is refused, naming it.
    other = run_cli("generate", "--model", model_dir, "--resume", state, "--seed", "5")
    assert other.code == 1 and "made with seed 20260812, this run asks for 5" in other.err
    resumed = run_cli("generate", "--model", model_dir, "--resume", state, "--json")
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
