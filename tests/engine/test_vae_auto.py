"""--vae-backend auto: the per-image rule (given probe numbers), the probe measured once per machine and cached,
and the ONNX set it exports into the cache folder once, again only when damaged."""

from __future__ import annotations

import json

import pytest

from anima_rknn.core import cpu_speed
from anima_rknn.core.files import cache_dir
from anima_rknn.engine import vae_auto
from anima_rknn.engine.vae_auto import MARGIN, choose_vae_backend, onnx_is_faster

pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "anima-rknn"


def probe_file():
    return cache_dir() / "vae-backend-probe.json"


def write_probe(ratio):
    import onnxruntime

    probe_file().parent.mkdir(parents=True, exist_ok=True)
    probe_file().write_text(json.dumps({
        "format": "anima-rknn-vae-backend-probe/1", "onnx_over_torch": ratio,
        "machine": cpu_speed.machine_key(f"onnxruntime {onnxruntime.__version__}")}))


# ---- the rule -----------------------------------------------------------------------------------------------

def test_onnx_wins_one_tile_and_loses_to_torchs_one_piece_when_tiles_recompute_too_much():
    # This machine's measured tile ratio (README): 0.73.
    assert onnx_is_faster(0.73, 512, 512, 512, 64, torch_tile=None)  # one tile, same work: 0.73 < 0.9
    assert not onnx_is_faster(0.95, 512, 512, 512, 64, torch_tile=None)  # not clearly faster
    # 1024x1024 in 512-px tiles overlapping 64: 3x3 tiles, 2.25x the pixels; 0.73 x 2.25 = 1.64 against torch's 1
    assert not onnx_is_faster(0.73, 1024, 1024, 512, 64, torch_tile=None)
    assert onnx_is_faster(0.39, 1024, 1024, 512, 64, torch_tile=None)  # 0.39 x 2.25 = 0.88
    # where torch tiles too (too little memory for one piece) both do the same tiles: the ratio alone decides
    assert onnx_is_faster(0.73, 1024, 1024, 512, 64, torch_tile=512)
    assert not onnx_is_faster(0.73, 1024, 512, 512, 64, torch_tile=None)  # 3x1 tiles, 1.5x: 1.1 > 0.9
    assert not onnx_is_faster(0.1, 448, 1024, 512, 64, torch_tile=None)  # a tile cannot lie inside the image
    assert MARGIN == 0.9


def test_torch_without_probing_where_tiles_are_ruled_out(fresh_cache, tiny_set):
    # --no-vae-tiling, or an image smaller than the tile: no probe, no export
    assert choose_vae_backend(tiny_set.vae, 512, 512, 512, 64, tiling=False, torch_tile=None) == ("torch", None)
    assert choose_vae_backend(tiny_set.vae, 64, 64, 512, 64, tiling=True, torch_tile=None) == ("torch", None)
    assert not fresh_cache.exists()


# ---- the probe ----------------------------------------------------------------------------------------------

def test_the_probe_is_measured_once_per_machine_and_cached(fresh_cache):
    ratio = vae_auto.probe_ratio()
    assert 0.05 < ratio < 20  # ONNX Runtime's time over torch's for the same stack, threads and input
    cached = json.loads(probe_file().read_text())
    assert cached["onnx_over_torch"] == ratio
    write_probe(3.5)  # the next call reads, not measures
    assert vae_auto.probe_ratio() == 3.5


@pytest.mark.parametrize("content", [
    "{not json", "[]", json.dumps({"format": "other"}),
    json.dumps({"format": "anima-rknn-vae-backend-probe/1", "machine": "another machine", "onnx_over_torch": 0.5}),
])
def test_a_damaged_or_foreign_cache_is_measured_again(fresh_cache, content):
    """The helper shared with the dtype probe (its real probe is timed above, once: it takes seconds)."""
    path, runs = fresh_cache / "probe.json", []
    path.parent.mkdir(parents=True)
    path.write_text(content)

    def measure():
        runs.append(1)
        return 0.7

    read = lambda: cpu_speed.cached_measurement(path, "anima-rknn-vae-backend-probe/1",  # noqa: E731
                                                cpu_speed.machine_key("x"), "onnx_over_torch",
                                                vae_auto._valid_ratio, measure)
    assert read() == 0.7 and read() == 0.7 and len(runs) == 1  # measured again once, then read
    assert json.loads(path.read_text())["machine"] == cpu_speed.machine_key("x")


def test_an_unwritable_cache_only_costs_measuring_again_and_decodes_on_torch(fresh_cache, tiny_set):
    fresh_cache.parent.mkdir(parents=True)
    fresh_cache.write_text("a file where the cache folder should be")  # unwritable, even for root
    runs = []
    read = lambda: cpu_speed.cached_measurement(fresh_cache / "probe.json", "f/1", "key", "v",  # noqa: E731
                                                vae_auto._valid_ratio, lambda: runs.append(1) or 0.7)
    assert read() == 0.7 and read() == 0.7 and len(runs) == 2
    assert vae_auto.cached_vae_set(tiny_set.vae, 64, 16) is None  # no set: auto decodes on torch


def test_the_machine_key_holds_the_threads_and_the_runtimes_version():
    import torch

    key = cpu_speed.machine_key("onnxruntime 1.0")
    assert key != cpu_speed.machine_key("onnxruntime 2.0") and key != cpu_speed.machine_key()
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        assert cpu_speed.machine_key("onnxruntime 1.0") != key
    finally:
        torch.set_num_threads(threads)


# ---- the cached set ---------------------------------------------------------------------------------------------

def test_the_cached_set_holds_the_encoder_and_one_cached_without_it_is_exported_again(fresh_cache, tiny_set, capfd):
    from anima_rknn.core.files import cached_sha256
    from anima_rknn.engine.vae_tiles import open_tile_encoder, vae_set_manifest
    from anima_rknn.export.vae import export_vae_decoder

    folder = fresh_cache / "vae-onnx" / f"{cached_sha256(tiny_set.vae)[:16]}-64-16"
    export_vae_decoder(tiny_set.vae, folder, 64, 16, calibrate=False)  # as --vae-backend auto cached it before
    assert vae_auto.cached_vae_set(tiny_set.vae, 64, 16) == folder
    assert "exporting the VAE decoder for ONNX Runtime once into" in capfd.readouterr().err  # again, whole
    manifest = vae_set_manifest("onnx", folder, tiny_set.vae, 112, 112, encoder=True)  # image-to-image on auto-onnx
    assert [entry["kind"] for entry in manifest["subgraphs"]] == ["vae_decoder", "vae_encoder"]
    open_tile_encoder("onnx", folder, manifest).close()
    assert vae_auto.cached_vae_set(tiny_set.vae, 64, 16) == folder
    assert "exporting" not in capfd.readouterr().err  # reused from then on


def test_a_decode_only_vae_file_caches_a_set_of_its_decoder(fresh_cache, tiny_set, tmp_path):
    from safetensors.torch import load_file, save_file

    from anima_rknn.export.manifest import read_manifest

    path = tmp_path / "decoder-only.safetensors"
    save_file({k: v for k, v in load_file(tiny_set.vae).items() if not k.startswith(("encoder.", "conv1."))}, path)
    folder = vae_auto.cached_vae_set(path, 64, 16)
    assert [entry["kind"] for entry in read_manifest(folder, kind="vae")["subgraphs"]] == ["vae_decoder"]
    assert vae_auto.cached_vae_set(path, 64, 16) == folder


# ---- prepare() decides ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("ratio", "tiling", "tile", "backend"), [
    (0.5, "auto", 64, "onnx"),  # 0.5 x 1.31 < 0.9 x torch's one piece
    (0.8, "auto", None, "torch"),  # 0.8 x 1.31 > 0.9: torch in one piece
    (0.8, "on", 64, "onnx"),  # torch would tile too: the same tiles, 0.8 < 0.9
    (0.95, "on", 64, "torch"),
    (0.1, "off", None, "torch"),
])
def test_prepare_plans_the_decode_on_the_faster_backend(fresh_cache, tiny_set, ratio, tiling, tile, backend):
    """prepare() resolves auto into a concrete plan (tile and backend) that generate and bench decode with."""
    from anima_rknn.generation.params import GenerationParams
    from anima_rknn.generation.pipeline import AnimaPipeline

    write_probe(ratio)
    pipeline = AnimaPipeline(tiny_set)
    params = GenerationParams("a red circle", width=112, height=112, vae_tile=64, vae_overlap=16, vae_tiling=tiling)
    plan = pipeline.prepare(params).decode
    assert (plan.tile, plan.overlap, plan.backend) == (tile, 16, backend)
    assert (plan.subgraphs is not None) == (backend == "onnx")
    assert params.vae_backend == "auto"  # the request keeps what it asked for
