"""Shared fixtures: one small model set in the real formats, written once per test session."""

from __future__ import annotations

import collections
import dataclasses
import gc
import hashlib
import lzma
from pathlib import Path

import pytest
import torch

from anima_rknn.demo.tiny_set import write_model_set
from anima_rknn.model.model_set import DEMO_MODEL, ModelFiles
from anima_rknn.sampling.cache_fit import fit_path, read_fit, write_fit

# The real Qwen3 and T5 tokenizer.json files, xz-compressed, as the package ships them (anima_rknn/model/tokenizers/
# README.md says where they come from and how they were checked; tests/data/tokenizers holds their 77 verified
# token-id vectors).
TOKENIZER_DATA = Path(__file__).resolve().parents[1] / "anima_rknn" / "model" / "tokenizers"
TOKENIZER_SHA256 = {
    "qwen3": "d3595c7174b17f68036a137992f9b04b4c0ae49b283f27a79caf5dbb2a56b6c2",
    "t5": "fe2ebbbbde2985be723e0ce18217853e4020c5e9d35bd07be2c27ab9d3ead57a",
}


def pytest_collection_finish(session: pytest.Session) -> None:
    """Every module and test item collected so far lives to the end of the session: frozen out of the garbage
    collector's view. The pipeline runs a full gc.collect() at each of its stages (core.memory), which over this
    process's million objects costs about half a second each time, several times a generation."""
    gc.collect()
    gc.freeze()


@pytest.fixture(scope="session", autouse=True)
def machine_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The per-machine caches (the dtype probe) go to a folder of the test session, not the user's home."""
    folder = tmp_path_factory.mktemp("xdg-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(folder))
        yield folder


@pytest.fixture(scope="session")
def tiny_set(tmp_path_factory: pytest.TempPathFactory) -> ModelFiles:
    return write_model_set(tmp_path_factory.mktemp("models") / "tiny", "tiny", seed=0)


@pytest.fixture(scope="session")
def fitted_tiny_set(tmp_path_factory: pytest.TempPathFactory) -> ModelFiles:
    """A tiny set (its own copy) with a cache fit next to its DiT, so that auto's budget, check and verify run on
    it: the demo model's numbers, standing in for a fit of this set (a test needs numbers, not this set's)."""
    files = write_model_set(tmp_path_factory.mktemp("models") / "tiny", "tiny", seed=0)
    demo = read_fit(fit_path(DEMO_MODEL / "split_files" / "diffusion_models" / "anima-demo.safetensors"))
    write_fit(fit_path(files.dit), dataclasses.replace(demo, dit=None, fitted_on="tests: the demo's numbers"),
              overwrite=False)
    return files


@pytest.fixture(scope="session")
def real_tokenizers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with qwen3/tokenizer.json and t5/tokenizer.json, the real files, checked byte for byte."""
    folder = tmp_path_factory.mktemp("tokenizers")
    for side, digest in TOKENIZER_SHA256.items():
        data = lzma.decompress((TOKENIZER_DATA / side / "tokenizer.json.xz").read_bytes())
        assert hashlib.sha256(data).hexdigest() == digest, f"anima_rknn/model/tokenizers/{side} is damaged"
        (folder / side).mkdir()
        (folder / side / "tokenizer.json").write_bytes(data)
    return folder


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models gain nothing from threads, and on a busy shared CPU torch's spinning threads cost 5x. A run
    sets torch's threads to its own (--threads), so the CLI's default, auto, is one thread here too."""
    from anima_rknn.core import threads as thread_counts

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(thread_counts, "_auto", lambda: 1)
        yield
    torch.set_num_threads(threads)


@pytest.fixture
def run_counts(monkeypatch) -> collections.Counter:
    """How many times GenerationParams.validate() and AnimaPipeline.prepare() were called, in any thread (the real
    methods still run): a run validates its settings and plans itself once (generation/run_plan.py)."""
    from anima_rknn.generation.params import GenerationParams
    from anima_rknn.generation.pipeline import AnimaPipeline

    counts: collections.Counter = collections.Counter()
    for cls, name in ((GenerationParams, "validate"), (AnimaPipeline, "prepare")):
        def counted(self, *args, _real=getattr(cls, name), _name=name, **kwargs):
            counts[_name] += 1
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(cls, name, counted)
    return counts


@pytest.fixture(scope="session")
def tiny_onnx_set(tiny_set, tmp_path_factory) -> Path:
    """The real exporter's subgraphs of the tiny model set at 64x64 (for the RKNN tests; copy before changing)."""
    pytest.importorskip("rknn.api")
    from anima_rknn.export.onnx import export_subgraphs

    folder = tmp_path_factory.mktemp("onnx")
    export_subgraphs(tiny_set.dit, 64, 64, folder, progress=False, overwrite=True)
    return folder


@pytest.fixture(scope="session")
def tiny_vae_onnx_set(tiny_set, tmp_path_factory) -> Path:
    """export-vae of the tiny model set's VAE for 64-px tiles, overlap 16 (copy before changing)."""
    pytest.importorskip("onnxscript")
    from anima_rknn.export.vae import export_vae_decoder

    folder = tmp_path_factory.mktemp("vae-onnx")
    export_vae_decoder(tiny_set.vae, folder, 64, 16)
    return folder


@pytest.fixture(scope="session")
def tiny_rknn_set(tiny_onnx_set, tmp_path_factory) -> Path:
    """tiny_onnx_set converted for rk3588 (copy before changing)."""
    from anima_rknn.export.rknn import convert_subgraphs

    return convert_subgraphs(tiny_onnx_set, tmp_path_factory.mktemp("rknn"), progress=False).parent


@pytest.fixture(scope="session")
def tiny_vae_rknn_set(tiny_vae_onnx_set, tmp_path_factory) -> Path:
    """tiny_vae_onnx_set converted for rk3588 (copy before changing)."""
    pytest.importorskip("rknn.api")
    from anima_rknn.export.rknn import convert_subgraphs

    return convert_subgraphs(tiny_vae_onnx_set, tmp_path_factory.mktemp("vae-rknn"), progress=False).parent
