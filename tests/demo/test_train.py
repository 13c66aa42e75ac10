"""train-demo on a tiny setting: it runs, the losses fall, the files are a loadable model set with the
config and seed in their metadata, and the batched conditioning equals the pipeline's. (Resumption and the
saved state: test_train_state.py.)"""

from __future__ import annotations

import dataclasses
import json
import threading
import time

import pytest
import torch

from anima_rknn.core.tensorfile import read_metadata
from anima_rknn.demo.harness import CaptionBank
from anima_rknn.demo.state import CONFIG_FILE, WORK_FOLDER
from anima_rknn.demo.train import VAE_FILE, DemoConfig, train_demo
from anima_rknn.errors import AnimaError
from anima_rknn.generation.pipeline import AnimaPipeline
from anima_rknn.model.io import load_dit
from anima_rknn.model.model_set import LAYOUT, from_model_dir
from anima_rknn.vae import load_vae


def test_losses_fall(trained) -> None:
    _, results = trained
    assert results["vae"].steps == results["dit"].steps == 40
    assert results["vae"].last_loss < 0.9 * results["vae"].first_loss
    assert results["dit"].last_loss < 0.9 * results["dit"].first_loss


def test_output_is_a_model_set_with_config_and_seed(trained) -> None:
    out, _ = trained
    files = from_model_dir(out)
    dit = load_dit(files.dit)
    assert dit.config.hidden == 64 and dit.config.context_tokens == 16  # read back from the file
    for path in (files.dit, files.vae, files.text_encoder):
        meta = read_metadata(path, "model")
        assert meta["anima_rknn.demo.seed"] == "5"
        assert DemoConfig.from_json(meta["anima_rknn.demo.config"]).vae_steps == 40
    training = json.loads(read_metadata(files.dit, "DiT")["anima_rknn.demo.training"])
    assert training["steps"] == 40
    vae = load_vae(files.vae)
    assert vae.config.dim == 8 and vae.config.latents_std != (1.0,) * 16  # latent statistics were measured


def test_batched_conditioning_equals_the_pipeline(trained) -> None:
    out, _ = trained
    files = from_model_dir(out)
    captions = ["a red circle on a blue background, top left", "", "an orange square on a black background, center"]
    bank = CaptionBank(files, captions)
    pipeline = AnimaPipeline(files)
    dit = load_dit(files.dit)
    with torch.no_grad():
        batched = bank.context(dit.llm_adapter, captions)
        for row, caption in zip(batched, captions):
            expected = pipeline.encode(caption, "").positive[0]
            torch.testing.assert_close(row, expected, rtol=1e-5, atol=1e-5)


def test_a_model_file_that_appears_during_the_run_is_left_alone(tmp_path, tiny_config) -> None:
    """The VAE file of the set, put there by someone else while the run trains: the run ends with one line when it
    would publish its set, the file stays, and none of the set is published beside it."""
    out = tmp_path / "demo"
    config, vae = out / WORK_FOLDER / CONFIG_FILE, out / LAYOUT["vae"] / VAE_FILE

    def put() -> None:
        deadline = time.monotonic() + 120
        while not config.exists() and time.monotonic() < deadline:  # written as the run starts
            time.sleep(0.002)
        vae.parent.mkdir(parents=True)
        vae.write_bytes(b"mine")

    other = threading.Thread(target=put, daemon=True)
    other.start()
    refused = "wan-vae-demo.safetensors (appeared while this run was working|exists; pass --overwrite)"
    with pytest.raises(AnimaError, match=refused):
        train_demo(out, dataclasses.replace(tiny_config, vae_steps=3, dit_steps=2), threads=1)
    other.join()
    assert vae.read_bytes() == b"mine"
    assert sorted(str(path.relative_to(out)) for path in out.rglob("*") if path.is_file()
                  and WORK_FOLDER not in path.parts) == [str(vae.relative_to(out))]



def test_a_bad_thread_count_is_refused_before_the_folder_is_made(tmp_path, tiny_config) -> None:
    """--threads' range, as everywhere (0 is auto); that a run takes its count: test_train_state.py."""
    with pytest.raises(AnimaError, match="threads must be an integer from 0 to 1024, got -1"):
        train_demo(tmp_path / "refused", tiny_config, threads=-1)
    assert not (tmp_path / "refused").exists()
