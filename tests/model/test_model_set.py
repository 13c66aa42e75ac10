"""Finding a model set's files: the Hugging Face layout, explicit paths, and a hub that cannot be reached."""

import shutil
import time

import pytest

from anima_rknn.errors import AnimaError
from anima_rknn.model.model_set import HUB_REPO, from_model_dir, resolve


def test_model_dir_layout(tiny_set):
    root = tiny_set.dit.parents[2]
    assert from_model_dir(root) == tiny_set


def test_explicit_paths_override_the_directory(tiny_set, tmp_path):
    other = tmp_path / "dit.safetensors"
    shutil.copy(tiny_set.dit, other)
    files = resolve(tiny_set.dit.parents[2], dit=other)
    assert files.dit == other and files.vae == tiny_set.vae


def test_explicit_paths_alone(tiny_set):
    files = resolve(None, dit=tiny_set.dit, text_encoder=tiny_set.text_encoder, vae=tiny_set.vae,
                    qwen_tokenizer=tiny_set.qwen_tokenizer, t5_tokenizer=tiny_set.t5_tokenizer)
    assert files == tiny_set


def test_nothing_given_is_the_shipped_demo_model():
    files = resolve(None)
    assert files.dit.parent.name == "diffusion_models" and "demo_model" in str(files.dit)


@pytest.mark.parametrize("swapped", ["dit", "text_encoder"])
def test_a_dit_and_a_text_encoder_of_two_models_are_refused_naming_both(tiny_set, swapped):
    """The demo model's part with the tiny set's others: the adapter's width is checked on the headers, before
    any model loads (not "mat1 and mat2 shapes cannot be multiplied" after both did)."""
    demo = resolve(None)
    parts = {"dit": tiny_set.dit, "text_encoder": tiny_set.text_encoder, swapped: getattr(demo, swapped)}
    with pytest.raises(AnimaError, match="not parts of one model") as refused:
        resolve(tiny_set.dit.parents[2], **parts)
    assert parts["dit"].name in str(refused.value) and parts["text_encoder"].name in str(refused.value)
    assert "128-wide" in str(refused.value) and "64-wide" in str(refused.value)


def test_some_files_given_names_the_missing_flags(tiny_set):
    """The tokenizers are not asked for: the tiny set's are found beside its DiT (else the shipped ones serve)."""
    with pytest.raises(AnimaError, match="all of --text-encoder --vae$"):
        resolve(None, dit=tiny_set.dit)


def test_two_dits_in_the_folder_are_named(tiny_set, tmp_path):
    root = tmp_path / "set"
    shutil.copytree(tiny_set.dit.parents[2], root)
    folder = root / "split_files" / "diffusion_models"
    shutil.copy(folder / tiny_set.dit.name, folder / "second.safetensors")
    with pytest.raises(AnimaError, match="second.safetensors"):
        from_model_dir(root)


def test_missing_tokenizer(tiny_set, tmp_path):
    root = tmp_path / "set"
    shutil.copytree(tiny_set.dit.parents[2], root)
    (root / "tokenizers" / "t5" / "tokenizer.json").unlink()
    with pytest.raises(AnimaError, match="t5 tokenizer: no tokenizer.json"):
        from_model_dir(root)


def test_hub_without_network_fails_fast_with_instructions(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HOME", str(tmp_path))
    started = time.monotonic()
    with pytest.raises(AnimaError) as error:
        resolve(HUB_REPO)  # these machines have no route to the hub
    assert time.monotonic() - started < 10
    message = str(error.value)
    assert "anima-base-v1.0.safetensors" in message and "tokenizers/qwen3" in message and "--model DIR" in message
