"""convert-rknn on a disk too small for it (issue 46), run in .venv-rknn (the toolkit converts for real): refused
before it starts in one line naming the space, and a conversion that the disk stops half-way leaves its finished
files and its progress file, no temporary, and resumes to the whole set once there is room."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "core"))
from test_full_disk import fill, small_disk  # noqa: E402  (the helpers of the core tests)

from anima_rknn.export.rknn import PROGRESS_FILE  # noqa: E402

pytestmark = pytest.mark.skipif(importlib.util.find_spec("rknn") is None, reason="rknn-toolkit2 lives in .venv-rknn")


def _one_line(result) -> str:
    """The one line a refused run ends with (after the progress bar's, on stderr too)."""
    assert result.code == 1 and "Traceback" not in result.err, result.err
    *before, line = result.err.rstrip("\n").split("\n")
    assert line.startswith("error: ") and not any("error: " in text for text in before), result.err
    return line


def test_convert_is_refused_before_it_starts_when_the_set_cannot_fit(run_cli, tiny_onnx_set, tmp_path):
    """About 2 MiB of graphs, copied to another disk beside their .rknn files: about 4 MiB (3.8 when written)."""
    with small_disk(tmp_path / "disk", "2m") as disk:
        line = _one_line(run_cli("convert-rknn", "--subgraphs", tiny_onnx_set, "--out", disk / "rknn"))
        assert re.search(r"the converted set needs about 3\.\d MiB in .*, and only 2\.0 MiB is free there", line), line
        assert list(disk.iterdir()) == []  # not even an empty folder


def test_a_conversion_stopped_by_a_full_disk_resumes_once_there_is_room(run_cli, tiny_onnx_set, tmp_path):
    with small_disk(tmp_path / "disk", "8m") as disk:
        out, filler = disk / "rknn", disk / "filler"

        def fill_after_the_first_subgraph() -> None:  # another program fills the disk after the check up front
            deadline = time.monotonic() + 300
            while not list(out.glob("*.rknn")) and time.monotonic() < deadline:
                time.sleep(0.01)
            fill(filler)

        other = threading.Thread(target=fill_after_the_first_subgraph, daemon=True)
        other.start()
        line = _one_line(run_cli("convert-rknn", "--subgraphs", tiny_onnx_set, "--out", out))
        other.join()
        # The next subgraph's graph copy or its .rknn: refused up front, or the disk filled while it was written.
        assert re.search(r"^error: (cannot write .*: No space left on device \(it needs|writing .* needs about .* and "
                         r"only .* is free there)", line), line
        assert not [path.name for path in out.iterdir() if path.name.endswith(".part")]  # no temporary
        assert (out / PROGRESS_FILE).is_file() and not (out / "manifest.json").exists()
        filler.unlink()
        result = run_cli("convert-rknn", "--subgraphs", tiny_onnx_set, "--out", out)
        assert result.code == 0, result.err
        records = json.loads((out / "manifest.json").read_text())["rknn"]["subgraphs"]
        assert sorted(record["rknn_file"] for record in records) == sorted(path.name for path in out.glob("*.rknn"))
        assert len(records) == 6
