"""A calibration set's .npy files as untrusted input (issue 46), in any environment: a FIFO is never waited on, a
folder or a file larger than its array is refused, a pickled (object) array is refused from its header and never
unpickled, a file cut short is named. Each is one line, and the file is left as it was. (Whole sets that do not
fit their ONNX set: tests/export/test_rknn_int8.py, in .venv-rknn.)"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

from anima_rknn.errors import AnimaError
from anima_rknn.export.calibration import read_npy

SHAPE = [1, 4, 8]


class _Touch:
    """Unpickling this creates the file `marker`: proof that a reader ran a pickle."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


def _crafted(folder: Path, kind: str) -> Path:
    path = folder / "000_x.npy"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "pickle":
        np.save(path, np.array([_Touch(folder / "unpickled"), None], dtype=object), allow_pickle=True)
    elif kind == "larger":
        np.save(path, np.zeros(SHAPE, np.float32))
        path.write_bytes(path.read_bytes() + bytes(1 << 20))
    elif kind == "short":
        np.save(path, np.zeros(SHAPE, np.float32))
        path.write_bytes(path.read_bytes()[:-4])
    return path


@pytest.mark.parametrize("kind, words", [
    ("fifo", "not a regular file"),
    ("folder", "not a regular file"),
    ("pickle", "expected a float32 array of shape [1, 4, 8], got object [2]"),
    ("larger", "larger than"),
    ("short", "is cut short"),
])
def test_a_crafted_calibration_file_is_one_line_and_left_as_it_was(tmp_path, kind, words):
    path = _crafted(tmp_path, kind)
    before = path.read_bytes() if path.is_file() else None
    raised: list[BaseException] = []

    def read() -> None:
        try:
            read_npy(path, SHAPE)
        except BaseException as e:  # noqa: BLE001  (handed to the test's thread)
            raised.append(e)

    reader = threading.Thread(target=read, daemon=True)  # a reader waiting on a FIFO would never return
    reader.start()
    reader.join(30)
    assert not reader.is_alive(), "the reader waits on the file"
    assert len(raised) == 1 and isinstance(raised[0], AnimaError), raised
    assert words in str(raised[0]) and "\n" not in str(raised[0]) and str(path) in str(raised[0])
    assert (path.read_bytes() if path.is_file() else None) == before
    assert not (tmp_path / "unpickled").exists()


def test_a_whole_file_reads_back(tmp_path):
    """The bound is no obstacle to a right file."""
    array = np.arange(32, dtype=np.float32).reshape(SHAPE)
    np.save(tmp_path / "000_x.npy", array)
    assert np.array_equal(read_npy(tmp_path / "000_x.npy", SHAPE), array)
