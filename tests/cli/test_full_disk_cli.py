"""Long writers on a disk too small for them: refused before they start, in one line naming the space; a writer
stopped mid-set (here by a file size limit, EFBIG) leaves no folder that a later run could take for a set."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "core"))
from test_full_disk import file_size_limit, small_disk  # noqa: E402  (the helpers of the core tests)


def _last_line(done) -> str:
    assert done.code == 1 and "Traceback" not in done.err, done.err
    return done.err.strip().splitlines()[-1]


@pytest.mark.parametrize("command", [
    ("make-tiny", "--out", "{disk}/set"),
    ("export-onnx", "--dit", "{dit}", "--out", "{disk}/subgraphs", "--width", "64", "--height", "64"),
    ("export-vae", "--vae", "{vae}", "--out", "{disk}/vae"),
    ("train-demo", "--out", "{disk}/demo"),
])
def test_a_long_writer_is_refused_before_it_starts_when_its_output_cannot_fit(run_cli, tiny_set, tmp_path, command):
    with small_disk(tmp_path / "disk", "2m") as disk:
        args = [part.format(disk=disk, dit=tiny_set.dit, vae=tiny_set.vae) for part in command]
        line = _last_line(run_cli(*args))
        assert line.startswith("error: ") and " needs about " in line and "only 2.0 MiB is free there" in line, line
        assert list(disk.iterdir()) == []  # not even an empty folder


def test_make_tiny_stopped_mid_set_leaves_no_set_and_a_rerun_writes_it(run_cli, tmp_path):
    out = tmp_path / "set"
    with file_size_limit(3 << 20):  # the VAE (about 5 MiB) cannot be written
        line = _last_line(run_cli("make-tiny", "--out", out))
    assert line.startswith("error: cannot write ") and "wan-vae-tiny-random.safetensors: File too large (it needs "
    assert "the file size limit is 3.0 MiB)" in line, line
    assert [p.name for p in tmp_path.iterdir()] == ["set"] and list(out.iterdir()) == []  # no staging, no files
    done = run_cli("make-tiny", "--out", out)
    assert done.code == 0, done.err
    assert sorted(p.name for p in out.iterdir()) == ["split_files", "tokenizers"]
