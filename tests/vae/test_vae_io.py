"""The Wan VAE file: the formats.md key table, saving and loading, random weights, and bad files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from anima_rknn.errors import AnimaError
from anima_rknn.vae import WanVAEConfig, file_shapes, load_vae, random_vae, read_vae_config, save_vae

SMALL = WanVAEConfig(dim=16)


def test_full_size_layout_matches_formats_table() -> None:
    shapes = file_shapes(WanVAEConfig())  # meta device: nothing allocated
    assert len(shapes) == 194
    assert len(file_shapes(WanVAEConfig(), decode_only=True)) == 108
    assert sum(torch.Size(s).numel() for s in shapes.values()) == pytest.approx(126.9e6, rel=1e-3)
    expected = {
        "conv1.weight": (32, 32, 1, 1, 1),
        "conv2.weight": (16, 16, 1, 1, 1),
        "encoder.conv1.weight": (96, 3, 3, 3, 3),
        "encoder.downsamples.2.resample.1.weight": (96, 96, 3, 3),
        "encoder.downsamples.5.time_conv.weight": (192, 192, 3, 1, 1),
        "encoder.downsamples.3.shortcut.weight": (192, 96, 1, 1, 1),
        "encoder.head.2.weight": (32, 384, 3, 3, 3),
        "decoder.conv1.weight": (384, 16, 3, 3, 3),
        "decoder.middle.0.residual.0.gamma": (384, 1, 1, 1),
        "decoder.middle.1.norm.gamma": (384, 1, 1),
        "decoder.middle.1.to_qkv.weight": (1152, 384, 1, 1),
        "decoder.middle.1.proj.weight": (384, 384, 1, 1),
        "decoder.upsamples.3.resample.1.weight": (192, 384, 3, 3),
        "decoder.upsamples.3.time_conv.weight": (768, 384, 3, 1, 1),
        "decoder.upsamples.4.shortcut.weight": (384, 192, 1, 1, 1),
        "decoder.upsamples.11.resample.1.weight": (96, 192, 3, 3),
        "decoder.upsamples.14.residual.6.weight": (96, 96, 3, 3, 3),
        "decoder.head.0.gamma": (96, 1, 1, 1),
        "decoder.head.2.weight": (3, 96, 3, 3, 3),
    }
    for name, shape in expected.items():
        assert shapes[name] == shape, name
    assert "decoder.upsamples.11.time_conv.weight" not in shapes  # the 2-D upsampler
    assert "encoder.downsamples.2.time_conv.weight" not in shapes  # the 2-D downsampler


def test_saved_file_layout_and_unused_slices(tmp_path: Path) -> None:
    path = tmp_path / "vae.safetensors"
    vae = random_vae(SMALL, seed=2)
    save_vae(vae, path)
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() in (None, {})  # default statistics are not written
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        kernel_file = f.get_tensor("decoder.upsamples.0.residual.2.weight")
        time_conv = f.get_tensor("decoder.upsamples.3.time_conv.weight")
    assert shapes == file_shapes(SMALL)
    assert kernel_file.dtype == torch.bfloat16
    kernel = vae.decoder.upsamples[0].residual[2].weight
    assert torch.equal(kernel_file[:, :, -1], kernel.to(torch.bfloat16))
    # Unused slices are random, not copies or zeros, so a loader reading the wrong slice would fail parity.
    assert not torch.equal(kernel_file[:, :, 0], kernel_file[:, :, -1])
    assert kernel_file[:, :, 0].float().std() > 0.5 * kernel.std()
    assert time_conv.float().abs().sum() > 0


def test_custom_statistics_round_trip_through_metadata(tmp_path: Path) -> None:
    config = WanVAEConfig(dim=8, latents_mean=tuple(range(16)), latents_std=tuple(0.5 + i for i in range(16)))
    path = tmp_path / "vae.safetensors"
    save_vae(random_vae(config, seed=3), path)
    with safe_open(str(path), framework="pt") as f:
        assert json.loads(f.metadata()["latents_mean"]) == list(range(16))
    assert load_vae(path).config == config


def test_random_vae_is_seeded_finite_and_unsaturated() -> None:
    torch.manual_seed(0)
    z = torch.randn(1, 16, 8, 8)
    with torch.no_grad():
        image = random_vae(SMALL, seed=4).decode(z)
        again = random_vae(SMALL, seed=4).decode(z)
        other = random_vae(SMALL, seed=5).decode(z)
    assert torch.equal(image, again) and not torch.equal(image, other)
    assert torch.isfinite(image).all()
    saturated = ((image == 0) | (image == 1)).float().mean().item()
    assert saturated < 0.05 and image.std().item() > 0.02


def test_decode_only_skips_encoder(tmp_path: Path) -> None:
    path = tmp_path / "vae.safetensors"
    save_vae(random_vae(SMALL, seed=7), path)
    decoder_only = {k: v for k, v in load_file(str(path)).items() if k.startswith(("decoder.", "conv2."))}
    save_file(decoder_only, str(path))
    vae = load_vae(path)
    assert vae.encoder is None
    with pytest.raises(AnimaError, match="decode-only"):
        vae.encode(torch.rand(1, 3, 16, 16))
    with pytest.raises(AnimaError, match="missing encoder.conv1.weight"):
        load_vae(path, decode_only=False)


@pytest.fixture(scope="module")
def small_file_tensors(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    path = tmp_path_factory.mktemp("vae") / "vae.safetensors"
    save_vae(random_vae(WanVAEConfig(dim=8), seed=8), path)
    return load_file(str(path))


def test_missing_key_is_named(tmp_path: Path, small_file_tensors: dict[str, torch.Tensor]) -> None:
    path = tmp_path / "vae.safetensors"
    for key in ("decoder.conv1.weight", "decoder.middle.1.proj.bias"):
        save_file({k: v for k, v in small_file_tensors.items() if k != key}, str(path))
        with pytest.raises(AnimaError, match=rf"not a Wan VAE file: missing {re.escape(key)}$"):
            load_vae(path)


def test_wrong_shape_is_named(tmp_path: Path, small_file_tensors: dict[str, torch.Tensor]) -> None:
    path = tmp_path / "vae.safetensors"
    save_file({**small_file_tensors, "decoder.middle.1.norm.gamma": torch.ones(32)}, str(path))
    with pytest.raises(AnimaError, match=r"decoder\.middle\.1\.norm\.gamma has shape \[32\], expected \[32, 1, 1\]"):
        load_vae(path)


def test_truncated_missing_and_foreign_files(tmp_path: Path, small_file_tensors: dict[str, torch.Tensor]) -> None:
    path = tmp_path / "vae.safetensors"
    save_file(small_file_tensors, str(path))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    missing = len(data) - len(data) // 2
    with pytest.raises(AnimaError, match=rf"vae\.safetensors is truncated: {missing} bytes missing$"):
        load_vae(path)
    path.write_bytes(b"this is a text file, not a checkpoint\n" * 10)
    with pytest.raises(AnimaError, match="is truncated or not a safetensors file"):
        load_vae(path)
    with pytest.raises(AnimaError, match="VAE file not found: .*nowhere.safetensors"):
        load_vae(tmp_path / "nowhere.safetensors")
    save_file({"weight": torch.zeros(2)}, str(path))
    with pytest.raises(AnimaError, match="missing decoder.conv1.weight"):
        load_vae(path)


def _vae_file(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> Path:
    save_file(tensors, str(path), metadata=metadata)
    return path


NOT_FINITE = "metadata latents_mean is not a JSON list of finite numbers"


@pytest.mark.parametrize("key, value, pattern", [
    ("latents_mean", "[1, 2]", r"VAE latents_mean/latents_std need 16 entries \(z_dim\), got 2/16"),
    ("latents_mean", "not json", NOT_FINITE),
    ("latents_mean", json.dumps([0.0] * 15 + [float("nan")]), NOT_FINITE),
    ("latents_mean", json.dumps([0.0] * 15 + ["1"]), NOT_FINITE),
    ("latents_mean", json.dumps([0.0] * 15 + [True]), NOT_FINITE),
    ("latents_mean", "[" + "1" * 400 + "]", NOT_FINITE),
    ("latents_mean", "[1e999]", NOT_FINITE),
    ("latents_mean", "[" * 100_000, NOT_FINITE),
    ("latents_mean", '{"0": 1}', NOT_FINITE),
    ("latents_std", json.dumps([1.0] * 15 + [0.0]), "metadata latents_std is not a JSON list of positive numbers"),
    ("latents_std", json.dumps([1.0] * 15 + [-2.0]), "metadata latents_std is not a JSON list of positive numbers"),
])
def test_bad_latent_statistics_are_named(tmp_path: Path, small_file_tensors, key, value, pattern) -> None:
    path = _vae_file(tmp_path / "vae.safetensors", small_file_tensors, {key: value})
    for read in (read_vae_config, load_vae):
        with pytest.raises(AnimaError, match=rf"^{re.escape(str(path))}: {pattern}$"):
            read(path)


def test_sizes_read_from_names_are_bounded(tmp_path: Path, small_file_tensors) -> None:
    deep = WanVAEConfig(dim=4, dim_mult=(1, 1, 1, 1, 1), num_res_blocks=1)  # 5 levels: 16x
    path = tmp_path / "deep.safetensors"
    save_vae(random_vae(deep, seed=0), path)
    with pytest.raises(AnimaError, match="decoder.upsamples has 5 levels of 1 residual blocks; at most 4 of 8"):
        load_vae(path)
    flat = {k: v for k, v in small_file_tensors.items() if not k.startswith("decoder.upsamples.")}
    for i in range(60):  # one level of 59 residual blocks, by name
        flat[f"decoder.upsamples.{i}.residual.2.weight"] = torch.ones(8, 8, 3, 3, 3)
    with pytest.raises(AnimaError, match="1 levels of 59 residual blocks; at most 4 of 8"):
        read_vae_config(_vae_file(path, flat))


def test_integer_or_empty_weights_are_refused(tmp_path: Path, small_file_tensors) -> None:
    ints = {**small_file_tensors, "decoder.head.2.bias": torch.zeros(3, dtype=torch.int32)}
    with pytest.raises(AnimaError, match="tensor decoder.head.2.bias has dtype I32; a floating-point weight"):
        load_vae(_vae_file(tmp_path / "ints.safetensors", ints))
    empty = {**small_file_tensors, "decoder.conv1.weight": torch.zeros(0, 16, 3, 3, 3)}
    with pytest.raises(AnimaError, match=r"tensor decoder.conv1.weight has shape \[0, 16, 3, 3, 3\], expected a conv"):
        read_vae_config(_vae_file(tmp_path / "empty.safetensors", empty))
