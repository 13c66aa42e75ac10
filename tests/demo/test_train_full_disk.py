"""train-demo stopped mid-run by a full disk or a file size limit (issue 46): one line naming the file, no
half-written model set in --out (the set is built in the work folder and moved into --out whole at the end), only
the work folder `.train`, from which a rerun resumes and publishes the whole set."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import pytest

from anima_rknn.demo.state import SET_STAGING, WORK_FOLDER
from anima_rknn.demo.train import train_demo
from anima_rknn.errors import AnimaError
from anima_rknn.model.model_set import from_model_dir

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "core"))
from test_full_disk import file_size_limit, small_disk  # noqa: E402  (the helpers of the core tests)


def _stopped(out: Path, config, pattern: str) -> None:
    """A run into `out` ends in one line matching `pattern`, leaving only the work folder and no temporary."""
    with pytest.raises(AnimaError, match=pattern) as caught:
        train_demo(out, config, threads=1)
    assert "\n" not in str(caught.value)
    assert [path.name for path in out.iterdir()] == [WORK_FOLDER]
    assert not [path for path in out.rglob("*.part")]


def test_a_run_stopped_by_a_full_disk_leaves_only_its_work_folder_and_resumes_to_a_whole_set(tmp_path, tiny_config):
    out = tmp_path / "demo"
    config = dataclasses.replace(tiny_config, vae_steps=3, dit_steps=3)
    with file_size_limit(2 << 20):  # the VAE stage's checkpoint (about 2.9 MiB) cannot be written
        _stopped(out, config, r"^cannot write .*vae\.safetensors: File too large \(it needs .*; the file size limit "
                              r"is 2\.0 MiB\)$")
    # The set on a full disk: the staging folder as a small tmpfs that takes the text side and the VAE as trained
    # (1.3 MiB), not the set's VAE file made from it. The space checked up front (--out's) is plenty.
    with small_disk(out / WORK_FOLDER / SET_STAGING, "2m"):
        _stopped(out, config, r"^writing .*/set/split_files/vae/wan-vae-demo\.safetensors needs about 1\.3 MiB in .*, "
                              r"and only .* is free there")
    train_demo(out, config, threads=1)  # resumes from the checkpoints
    assert sorted(path.name for path in out.iterdir()) == [WORK_FOLDER, "split_files", "tokenizers"]
    from_model_dir(out)
    assert not (out / WORK_FOLDER / SET_STAGING).exists()
