"""train-demo-lora on a tiny setting, on the shipped demo model: the LoRA it trains is the LoRA the loader
merges (velocity for velocity), a resumed run writes the same file bit for bit as an uninterrupted one, and
bad input or a foreign work folder is refused in one line with nothing written."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from anima_rknn.core import threads as thread_counts
from anima_rknn.core.tensorfile import load_tensors, read_metadata, save_tensors
from anima_rknn.demo import demo_model_dir, harness, train_lora
from anima_rknn.demo.state import CONFIG_FILE, LORA_STATE, PROGRESS_KEY
from anima_rknn.demo.train_lora import LoraTrainConfig, add_lora, target_modules, train_demo_lora, work_folder
from anima_rknn.errors import AnimaError
from anima_rknn.model.io import load_dit
from anima_rknn.model.lora import LoraRef, kohya_tensors, open_lora
from anima_rknn.model.model_set import from_model_dir

TINY = LoraTrainConfig(steps=6, rank=2, batch=4, latent_pool=8, warmup_steps=2, lr=1e-2)


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> tuple:
    """(LoRA file, its tensors) of an uninterrupted tiny run."""
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("straight") / "tiny.safetensors"
    result = train_demo_lora(out, TINY)
    assert result.steps == 6
    return out, load_tensors(out, "LoRA")


def test_the_written_lora_is_kohya_and_touches_attention_and_mlp_of_dit_and_adapter(straight) -> None:
    out, tensors = straight
    config = load_dit(from_model_dir(demo_model_dir()).dit).config
    lora = open_lora(LoraRef(out), config)
    assert lora.layout == "kohya" and all(layer.rank == 2 for layer in lora.layers.values())
    modules = {layer.module for layer in lora.layers.values()}
    assert modules == set(target_modules(load_dit(from_model_dir(demo_model_dir()).dit)))
    assert any(m.startswith("llm_adapter.") for m in modules) and any(m.endswith("mlp.layer2") for m in modules)
    assert not any("adaln" in m or "embedder" in m or "final_layer" in m for m in modules)
    assert any(float(t.abs().max()) > 0 for k, t in tensors.items() if "lora_up" in k)  # it learned something
    assert not work_folder(out).exists()  # removed once the file is written
    meta = read_metadata(out, "LoRA")
    assert meta["anima_rknn.demo.lora.concept"] == "large" and json.loads(meta["anima_rknn.demo.lora"])["rank"] == 2


def test_training_form_equals_the_merged_file(tmp_path) -> None:
    """add_lora's parametrised DiT and load_dit(loras=[the file kohya_tensors wrote]) give the same velocity."""
    torch.manual_seed(0)
    path = from_model_dir(demo_model_dir()).dit
    trained = load_dit(path)
    pairs = add_lora(trained, rank=3, seed=1)
    with torch.no_grad():
        for pair in pairs.values():
            pair.up.normal_(0, 0.05)
    file = tmp_path / "pairs.safetensors"
    save_tensors(kohya_tensors({m: (p.down.detach(), p.up.detach()) for m, p in pairs.items()}, alpha=3), file)
    merged = load_dit(path, loras=[open_lora(LoraRef(file), trained.config)])
    x, sigma, context = torch.randn(2, 16, 8, 8), torch.tensor([0.3, 0.8]), torch.randn(2, 16, 128)
    with torch.no_grad():
        expected = trained(x, sigma, context)
        torch.testing.assert_close(merged(x, sigma, context), expected, rtol=1e-4, atol=1e-5)
        assert (load_dit(path)(x, sigma, context) - expected).abs().max() > 1e-3  # the pairs do change it


def test_a_resumed_run_writes_the_same_file_bit_for_bit(straight, tmp_path, monkeypatch) -> None:
    _, expected = straight
    out = tmp_path / "resumed.safetensors"
    monkeypatch.setattr(harness, "CHECKPOINT_EVERY_S", -1.0)  # checkpoint after every step
    real, calls = train_lora.optimizer_step, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(train_lora, "optimizer_step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train_demo_lora(out, TINY)
    monkeypatch.setattr(train_lora, "optimizer_step", real)
    assert not out.exists()
    progress = json.loads(read_metadata(work_folder(out) / LORA_STATE, "state")[PROGRESS_KEY])
    assert progress["step"] == 3
    # the time budget may change; threads 0 is auto (named: one thread, as the demo LoRA and these tests run), set
    # on torch from the 2 it is at
    monkeypatch.setattr(thread_counts, "_auto", lambda: 1)
    torch.set_num_threads(2)
    assert train_demo_lora(out, dataclasses.replace(TINY, minutes=99.0), threads=0).steps == 6
    assert torch.get_num_threads() == 1
    resumed = load_tensors(out, "LoRA")
    assert resumed.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(resumed[name], tensor, rtol=0, atol=0, msg=name)


def test_another_configuration_in_the_work_folder_is_refused(tmp_path) -> None:
    out = tmp_path / "l.safetensors"
    work = work_folder(out)
    work.mkdir()
    (work / CONFIG_FILE).write_text(json.dumps(dataclasses.asdict(dataclasses.replace(TINY, rank=4))))
    with pytest.raises(AnimaError, match="another configuration"):
        train_demo_lora(out, TINY)
    (work / "notes.txt").write_text("mine")
    with pytest.raises(AnimaError, match="notes.txt is not a file train-demo-lora writes"):
        train_demo_lora(out, TINY)
    assert not out.exists() and sorted(p.name for p in work.iterdir()) == [CONFIG_FILE, "notes.txt"]


@pytest.mark.parametrize("change, message", [
    (dict(rank=0), "rank must be an integer in [1, 64]"),
    (dict(concept_share=1.0), "concept_share must be a finite number in (0, 1)"),
    (dict(batch=1), "leaves no picture of one kind"),
    (dict(lr=float("nan")), "lr must be a finite number"),
])
def test_a_bad_setting_is_refused(change, message, tmp_path) -> None:
    with pytest.raises(AnimaError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        train_demo_lora(tmp_path / "l.safetensors", dataclasses.replace(TINY, **change))
    assert list(tmp_path.iterdir()) == []


def test_a_bad_thread_count_is_refused_before_anything_is_written(tmp_path) -> None:
    with pytest.raises(AnimaError, match="threads must be an integer from 0 to 1024, got -1"):
        train_demo_lora(tmp_path / "l.safetensors", TINY, threads=-1)
    assert list(tmp_path.iterdir()) == []
