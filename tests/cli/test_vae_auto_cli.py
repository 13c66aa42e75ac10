"""generate with --vae-backend auto (the default) as a user runs it: where the cached probe says ONNX Runtime is
faster, the VAE set is exported into the cache folder once and the picture is the one an explicit export-vae set
gives; where torch is faster, or the image is smaller than a tile, it is torch's picture; the JSON and the PNG
say which backend decoded."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from anima_rknn.core import cpu_speed
from anima_rknn.core.files import cache_dir, cached_sha256

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")
pytestmark = pytest.mark.usefixtures("one_thread")

GENERATE = ("generate", "-p", "a red circle", "--steps", "2", "-W", "112", "-H", "112", "--vae-tile-size", "64",
            "--vae-tile-overlap", "16", "--json")  # 2x2 tiles: 1.31x the image's pixels
EXPORTING = "exporting the VAE decoder for ONNX Runtime once into"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "anima-rknn"


def cached_probe(ratio):
    """The probe's answer on this machine, as a first run would have cached it."""
    import onnxruntime

    cache_dir().mkdir(parents=True, exist_ok=True)
    (cache_dir() / "vae-backend-probe.json").write_text(json.dumps({
        "format": "anima-rknn-vae-backend-probe/1", "onnx_over_torch": ratio,
        "machine": cpu_speed.machine_key(f"onnxruntime {onnxruntime.__version__}")}))


def pixels(path):
    return np.asarray(Image.open(path))


def test_onnx_where_the_probe_finds_it_faster_from_a_set_exported_once(run_cli, model_dir, tiny_set, cache,
                                                                       tiny_vae_onnx_set, tmp_path):
    cached_probe(0.5)  # 0.5 x 1.31 < 0.9 x torch's one piece
    first = run_cli(*GENERATE, "--model", model_dir, "--out", tmp_path / "auto.png")
    assert first.code == 0, first.err
    folder = cache / "vae-onnx" / f"{cached_sha256(tiny_set.vae)[:16]}-64-16"
    assert f"{EXPORTING} {folder}; --vae-backend torch skips this" in first.err
    assert json.loads(first.out)["vae_backend"] == "onnx"
    assert "VAE backend: onnx" in Image.open(tmp_path / "auto.png").info["parameters"]
    explicit = run_cli(*GENERATE, "--model", model_dir, "--vae-backend", "onnx", "--vae-subgraphs", tiny_vae_onnx_set,
                       "--out", tmp_path / "onnx.png")
    assert explicit.code == 0, explicit.err
    np.testing.assert_array_equal(pixels(tmp_path / "auto.png"), pixels(tmp_path / "onnx.png"))

    again = run_cli(*GENERATE, "--model", model_dir, "--out", tmp_path / "again.png")
    assert again.code == 0 and EXPORTING not in again.err  # the cached set is reused
    assert sorted(p.name for p in (cache / "vae-onnx").iterdir()) == [f".{folder.name}.lock", folder.name]

    (folder / "vae_decoder.onnx").write_bytes(b"damaged")  # a damaged cached set is exported again
    repaired = run_cli(*GENERATE, "--model", model_dir, "--out", tmp_path / "repaired.png")
    assert repaired.code == 0 and EXPORTING in repaired.err and json.loads(repaired.out)["vae_backend"] == "onnx"
    np.testing.assert_array_equal(pixels(tmp_path / "repaired.png"), pixels(tmp_path / "onnx.png"))
    assert sorted(p.name for p in (cache / "vae-onnx").iterdir()) == [f".{folder.name}.lock", folder.name]


def test_torch_where_the_probe_finds_it_faster_or_the_image_is_smaller_than_a_tile(run_cli, model_dir, cache,
                                                                                    tmp_path):
    cached_probe(0.8)  # 0.8 x 1.31 > 0.9: the tiles' overlaps cost more than ONNX Runtime saves
    auto = run_cli(*GENERATE, "--model", model_dir, "--out", tmp_path / "auto.png")
    on_torch = run_cli(*GENERATE, "--model", model_dir, "--vae-backend", "torch", "--out", tmp_path / "torch.png")
    assert auto.code == 0 and on_torch.code == 0, auto.err
    assert json.loads(auto.out)["vae_backend"] == "torch" and EXPORTING not in auto.err
    assert "VAE backend: torch" in Image.open(tmp_path / "auto.png").info["parameters"]
    np.testing.assert_array_equal(pixels(tmp_path / "auto.png"), pixels(tmp_path / "torch.png"))
    assert not (cache / "vae-onnx").exists()

    cached_probe(0.1)  # however fast: a 64-px tile does not fit a 48-px side
    small = run_cli(*GENERATE, "-W", "48", "--model", model_dir, "--out", tmp_path / "small.png")
    assert small.code == 0 and json.loads(small.out)["vae_backend"] == "torch" and EXPORTING not in small.err


def test_a_set_of_its_own_is_refused_with_auto(run_cli, model_dir, tiny_vae_onnx_set, tmp_path):
    result = run_cli(*GENERATE, "--model", model_dir, "--vae-subgraphs", tiny_vae_onnx_set, "--out", tmp_path / "x.png")
    assert result.code == 1 and result.err.count("\n") == 1
    assert "runs on --vae-backend onnx or rknn, not auto (which exports and caches its own)" in result.err
    assert list(tmp_path.iterdir()) == []
