"""The one writer on a disk that really fills up: a small tmpfs (mounted for the test; skipped where this user
cannot mount), and a file size limit (RLIMIT_FSIZE: EFBIG, the same error path, runs anywhere)."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from anima_rknn.core.files import save_png, write_text
from anima_rknn.core.tensorfile import save_tensors
from anima_rknn.errors import AnimaError


@contextlib.contextmanager
def small_disk(folder: Path, size: str):
    """`folder` as a tmpfs of `size` for the block."""
    folder.mkdir(exist_ok=True)
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs mount (root) for a small tmpfs")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def fill(path: Path, leave: int = 0) -> None:
    """`path` grown until the disk has about `leave` bytes free (0: none at all)."""
    with open(path, "wb", buffering=0) as f:
        for chunk in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):
                while os.statvfs(path.parent).f_bavail * os.statvfs(path.parent).f_frsize > leave + chunk:
                    f.write(b"\0" * chunk)
        if not leave:
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0")


@contextlib.contextmanager
def file_size_limit(limit: int):
    """Writes past `limit` bytes fail with EFBIG for the block (SIGXFSZ ignored)."""
    limits, handler = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limits[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)


def noise_picture(side: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(0).integers(0, 256, (side, side, 3), dtype=np.uint8))


def test_a_png_that_fills_the_disk_is_one_line_with_the_space_and_leaves_nothing(tmp_path):
    with small_disk(tmp_path / "disk", "1m") as disk:
        fill(disk / "filler", leave=64 << 10)
        with pytest.raises(AnimaError) as caught:
            save_png(noise_picture(512), disk / "x.png", overwrite=False)  # about 770 KiB of noise
        message = str(caught.value)
        assert message.startswith(f"cannot write {disk / 'x.png'}: No space left on device (it needs more than the ")
        assert " was free there)" in message and "\n" not in message, message
        assert sorted(p.name for p in disk.iterdir()) == ["filler"]  # no temporary, no partial PNG


def test_a_write_of_known_size_is_refused_before_a_byte_is_written(tmp_path):
    with small_disk(tmp_path / "disk", "2m") as disk:
        with pytest.raises(AnimaError, match=r"^writing .*big\.safetensors needs about 4\.0 MiB in .*disk, and only "
                                             r"2\.0 MiB is free there"):
            save_tensors({"a": torch.zeros(1 << 20)}, disk / "big.safetensors")
        assert list(disk.iterdir()) == []


def test_a_replaced_record_file_keeps_every_finished_record_when_the_disk_fills(tmp_path):
    """Records (batch's results.jsonl, progress files) are rewritten whole through atomic_path: on a full disk the
    rewrite fails in one line and the file holds what it held, never a torn last line."""
    with small_disk(tmp_path / "disk", "1m") as disk:
        records = disk / "results.jsonl"
        write_text(records, '{"job": 1}\n', overwrite=True)
        fill(disk / "filler")
        with pytest.raises(AnimaError, match="No space left on device"):
            write_text(records, '{"job": 1}\n' + '{"job": 2, "pad": "' + "x" * 8192 + '"}\n', overwrite=True)
        assert records.read_text() == '{"job": 1}\n'
        assert sorted(p.name for p in disk.iterdir()) == ["filler", "results.jsonl"]


def test_a_file_size_limit_names_the_limit(tmp_path):
    with file_size_limit(100 << 10), pytest.raises(AnimaError, match=r"x\.png: File too large \(it needs more than "
                                                                    r"the .* written; the file size limit is 100\.0 "
                                                                    r"KiB\)$"):
        save_png(noise_picture(256), tmp_path / "x.png", overwrite=False)
    assert list(tmp_path.iterdir()) == []
