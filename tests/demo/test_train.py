"""train-demo on a tiny setting: it runs, the losses fall, the files are a loadable model set with the
config and seed in their metadata, the batched conditioning equals the pipeline's, and a resumed run ends
where an uninterrupted one does."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from anima_rknn.checkpoint import read_metadata
from anima_rknn.demo import train
from anima_rknn.demo.train import CaptionBank, DemoConfig, TextEncoderSize, train_demo, train_vae
from anima_rknn.model.config import DiTConfig
from anima_rknn.model.io import load_dit
from anima_rknn.model_set import from_model_dir
from anima_rknn.pipeline import AnimaPipeline
from anima_rknn.vae import load_vae

TINY = DemoConfig(
    seed=5, vae_steps=40, dit_steps=40, vae_batch=4, dit_batch=16, latent_pool=64, vae_dim=8, warmup_steps=5,
    vae_lr=2e-3, dit_lr=2e-3,
    text_encoder=TextEncoderSize(hidden=32, layers=1, heads=2, kv_heads=1, head_dim=16, intermediate=64),
    dit=DiTConfig(hidden=64, heads=2, blocks=2, mlp=128, adaln_lora=16, context_dim=32, adapter_source_dim=32,
                  adapter_blocks=1, adapter_heads=2, adapter_mlp=64, context_tokens=16),
)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory):
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("demo")
    results = train_demo(out, TINY, threads=1)
    return out, results


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


def test_resumed_vae_run_ends_where_an_uninterrupted_one_does(tmp_path, monkeypatch) -> None:
    torch.set_num_threads(1)
    config = dataclasses.replace(TINY, vae_steps=6)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    straight, _ = train_vae(config, tmp_path / "a")

    monkeypatch.setattr(train, "CHECKPOINT_EVERY_S", 0.0)  # checkpoint after every step
    calls = {"n": 0}
    real_loss = train._vae_loss

    def interrupted_loss(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return real_loss(*args, **kwargs)

    monkeypatch.setattr(train, "_vae_loss", interrupted_loss)
    with pytest.raises(KeyboardInterrupt):
        train_vae(config, tmp_path / "b")
    monkeypatch.setattr(train, "_vae_loss", real_loss)
    resumed, result = train_vae(config, tmp_path / "b")
    assert result.steps == 6
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
