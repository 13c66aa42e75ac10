"""Loading the DiT file: both key prefixes, sizes from shapes, precision policy, and named errors."""

import pytest
import torch

from anima_rknn.core.tensorfile import load_tensors, read_metadata, save_tensors
from anima_rknn.errors import AnimaError
from anima_rknn.model.config import PRESETS
from anima_rknn.model.io import (
    CONTEXT_TOKENS_KEY,
    IMAGE_SIZE_KEY,
    load_dit,
    random_dit,
    read_dit_config,
    save_dit,
    trained_image_size,
)


@pytest.fixture(scope="module")
def dit_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("dit") / "dit.safetensors"
    save_dit(random_dit(PRESETS["tiny"], seed=0), path)
    return path


def test_file_is_bf16_with_net_prefix(dit_file):
    tensors = load_tensors(dit_file, "DiT")
    assert all(k.startswith("net.") for k in tensors)
    assert {v.dtype for v in tensors.values()} == {torch.bfloat16}
    assert "net.llm_adapter.blocks.0.cross_attn.q_proj.weight" in tensors


def test_both_prefixes_load_to_the_same_model(dit_file, tmp_path):
    other = tmp_path / "comfy.safetensors"
    tensors = load_tensors(dit_file, "DiT", strip=("net.",))
    save_tensors({f"model.diffusion_model.{k}": v for k, v in tensors.items()}, other)
    a, b = load_dit(dit_file), load_dit(other)
    assert a.config == b.config == PRESETS["tiny"]
    for (name, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(p, q), name


def test_precision_policy(dit_file):
    model = load_dit(dit_file, torch.bfloat16)
    assert model.blocks[0].mlp.layer1.weight.dtype == torch.bfloat16
    assert model.blocks[0].self_attn.q_proj.weight.dtype == torch.bfloat16
    assert model.blocks[0].adaln_modulation_mlp[1].weight.dtype == torch.float32
    assert model.final_layer.linear.weight.dtype == torch.float32
    x = torch.randn(1, 16, 8, 8)
    context = torch.zeros(1, 512, PRESETS["tiny"].context_dim)
    v16 = model(x, torch.tensor([0.5]), context)
    v32 = load_dit(dit_file)(x, torch.tensor([0.5]), context)
    assert v16.dtype == torch.float32 and torch.isfinite(v16).all()
    assert (v16 - v32).norm() / v32.norm() < 0.05


def test_missing_and_misshapen_tensors_are_named(dit_file, tmp_path):
    tensors = load_tensors(dit_file, "DiT")
    broken = dict(tensors)
    del broken["net.blocks.1.mlp.layer2.weight"]
    save_tensors(broken, tmp_path / "missing.safetensors")
    with pytest.raises(AnimaError, match="missing tensor blocks.1.mlp.layer2.weight"):
        load_dit(tmp_path / "missing.safetensors")
    broken = dict(tensors)
    broken["net.blocks.0.cross_attn.k_proj.weight"] = torch.zeros(128, 32, dtype=torch.bfloat16)
    save_tensors(broken, tmp_path / "shape.safetensors")
    with pytest.raises(AnimaError, match=r"blocks.0.cross_attn.k_proj.weight has shape \[128, 32\], expected"):
        load_dit(tmp_path / "shape.safetensors")


def test_a_vae_file_is_not_a_dit(tmp_path):
    save_tensors({"decoder.conv1.weight": torch.zeros(4, 16, 3, 3, 3)}, tmp_path / "vae.safetensors")
    with pytest.raises(AnimaError, match="not an Anima DiT checkpoint: missing tensor x_embedder.proj.1.weight"):
        read_dit_config(tmp_path / "vae.safetensors")


def test_context_tokens_travel_in_metadata(tmp_path):
    import dataclasses

    config = dataclasses.replace(PRESETS["tiny"], context_tokens=32)
    save_dit(random_dit(config), tmp_path / "short.safetensors")
    model = load_dit(tmp_path / "short.safetensors")
    assert model.config.context_tokens == 32
    context = model.llm_adapter.condition(torch.randn(1, 3, 64), torch.tensor([[3, 4, 1]]))
    assert context.shape == (1, 32, 64)


def _with_metadata(dit_file, path, metadata):
    tensors = load_tensors(dit_file, "DiT")
    save_tensors(tensors, path, {**read_metadata(dit_file, "DiT"), **metadata})
    return path


@pytest.mark.parametrize("value", ["0", "-5", "4097", "1e9", "NaN", "512.0", " 512", "", "٥١٢", "9" * 5000,
                                   "true", "512\nrm -rf"])
def test_context_tokens_metadata_is_checked_like_an_option(dit_file, tmp_path, value):
    path = _with_metadata(dit_file, tmp_path / "bad.safetensors", {CONTEXT_TOKENS_KEY: value})
    pattern = rf"{path}: metadata anima_rknn.context_tokens is .*; expected a whole number from 1 to 4096$"
    for read in (read_dit_config, load_dit):
        with pytest.raises(AnimaError, match=pattern) as caught:
            read(path)
        assert "\n" not in str(caught.value) and len(str(caught.value)) < len(str(path)) + 200


@pytest.mark.parametrize("value, size", [("64", 64), ("4096", 4096), ("16", 16)])
def test_trained_image_size_metadata(dit_file, tmp_path, value, size):
    assert trained_image_size(_with_metadata(dit_file, tmp_path / "d.safetensors", {IMAGE_SIZE_KEY: value})) == size
    assert trained_image_size(dit_file) is None


@pytest.mark.parametrize("value", ["0", "8", "100", "4112", "-64", "64.0", "inf", "nan", "1" * 30])
def test_bad_trained_image_size_metadata_is_named(dit_file, tmp_path, value):
    path = _with_metadata(dit_file, tmp_path / "bad.safetensors", {IMAGE_SIZE_KEY: value})
    with pytest.raises(AnimaError, match=rf"{path}: metadata anima_rknn.demo.image_size is .*; expected a whole "
                                         "number from 16 to 4096, a multiple of 16$"):
        trained_image_size(path)


def test_shape_problems_name_the_file(dit_file, tmp_path):
    tensors = load_tensors(dit_file, "DiT")
    tensors["net.blocks.0.self_attn.q_norm.weight"] = torch.ones(8, dtype=torch.bfloat16)
    save_tensors(tensors, tmp_path / "heads.safetensors")
    with pytest.raises(AnimaError, match=rf"^{tmp_path}/heads.safetensors: Anima DiT head size 8 .* must be even, "
                                         "at least 12"):
        load_dit(tmp_path / "heads.safetensors")
