"""Every command's outputs under the one rule: a file that appears at an output name while the command works is
left alone (the run ends with one line saying so), and an output folder is one run's at a time."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from anima_rknn.core.files import held_folder, output_folder

pytestmark = pytest.mark.usefixtures("one_thread")


def _when(appears: Path, then: Path, data: bytes = b"mine") -> threading.Thread:
    """A thread that, once `appears` exists (the command is at work), puts a file of someone else's at `then`."""
    def put() -> None:
        deadline = time.monotonic() + 120
        while not appears.exists() and time.monotonic() < deadline:
            time.sleep(0.002)
        tmp = then.with_name(then.name + ".someone-else")
        tmp.write_bytes(data)
        os.replace(tmp, then)

    thread = threading.Thread(target=put, daemon=True)
    thread.start()
    return thread


def _one_line(result) -> bool:
    """One error line, no traceback (a progress bar may stand before it)."""
    return result.err.count("error: ") == 1 and result.err.endswith("\n") and "Traceback" not in result.err


def test_export_onnx_leaves_a_file_that_appears_in_its_set(run_cli, tiny_set, tmp_path):
    pytest.importorskip("onnxruntime")
    out = tmp_path / "set"
    other = _when(out / "b00_self_attn.onnx", out / "manifest.json")  # the manifest is written last
    result = run_cli("export-onnx", "--dit", tiny_set.dit, "-W", "64", "-H", "64", "--out", out)
    other.join()
    assert result.code == 1 and _one_line(result) and "manifest.json" in result.err
    assert "exists; pass --overwrite" in result.err or "appeared while this run was working" in result.err
    assert (out / "manifest.json").read_bytes() == b"mine"


def test_a_second_run_into_a_held_folder_is_refused_in_one_line(run_cli, tiny_set, tmp_path):
    """Two export-onnx runs into one --out: the second is refused before it writes anything."""
    out = tmp_path / "set"
    with held_folder(lambda: output_folder(out, overwrite=False, holds="a subgraph set")):  # the first run
        result = run_cli("export-onnx", "--dit", tiny_set.dit, "-W", "64", "-H", "64", "--out", out)
        assert result.code == 1 and _one_line(result)
        assert f"another anima-rknn run is writing into {out}" in result.err
        result = run_cli("make-tiny", "--out", out)
        assert result.code == 1 and _one_line(result) and "another anima-rknn run is writing" in result.err
        assert list(out.iterdir()) == []


def test_export_vae_leaves_a_decoder_file_that_appears(run_cli, tiny_set, tmp_path):
    pytest.importorskip("onnxruntime")
    out = tmp_path / "set"
    other = _when(out, out / "vae_decoder.onnx")  # the folder is made just before the decoder is written
    result = run_cli("export-vae", "--vae", tiny_set.vae, "--tile", "32", "--overlap", "8", "--out", out)
    other.join()
    # Either the decoder's publish found it, or (when it came first) the folder's check under the lock did.
    assert result.code == 1 and _one_line(result), result.err
    assert any(why in result.err for why in ("vae_decoder.onnx appeared while", "vae_decoder.onnx exists", "not empty"))
    assert (out / "vae_decoder.onnx").read_bytes() == b"mine" and not (out / "manifest.json").exists()


def test_generate_leaves_a_file_that_replaces_its_preview(run_cli, model_dir, tmp_path):
    out, preview = tmp_path / "x.png", tmp_path / "live.png"
    other = _when(preview, preview)  # after the first preview, someone else's file takes the name
    result = run_cli("generate", "--model", model_dir, "-p", "cat", "-W", "64", "-H", "64", "--steps", "30",
                     "-o", out, "--preview", preview)
    other.join()
    assert result.code == 0, result.err  # the image is the run's result; a preview is only a view of it
    assert "warning: previews stopped:" in result.err and "live.png appeared while this run was working" in result.err
    assert preview.read_bytes() == b"mine" and out.is_file()


LONG = "x" * 5000


@pytest.mark.parametrize("command", [
    ("generate", "-p", "cat", "-o", LONG + ".png"),
    ("generate", "-p", "cat", "-o", "{tmp}/x.png", "--state", LONG + ".state"),
    ("generate", "-p", "cat", "-o", "{tmp}/" + "/".join(["d" * 200] * 25) + "/x.png"),
    ("eval-demo", "--sheet", LONG + ".png"),
    ("export-onnx", "--out", LONG),
    ("make-tiny", "--out", "{tmp}/" + LONG),
])
def test_an_output_path_too_long_is_one_line_before_any_work(run_cli, tmp_path, command):
    result = run_cli(*(word.replace("{tmp}", str(tmp_path)) for word in command))
    assert result.code == 1 and _one_line(result) and ("too long" in result.err or "bytes" in result.err), result.err
    assert list(tmp_path.iterdir()) == []
