"""Every way a checkpoint file can be wrong ends in one line that names the problem."""

import pytest
import torch

from anima_rknn.checkpoint import check_shapes, load_tensors, read_shapes, save_tensors
from anima_rknn.errors import AnimaError


@pytest.fixture
def checkpoint(tmp_path):
    path = tmp_path / "a.safetensors"
    save_tensors({"net.w": torch.ones(4, 3), "net.b": torch.zeros(5)}, path, {"k": "v"})
    return path


def test_round_trip_and_prefix_strip(checkpoint):
    assert read_shapes(checkpoint, "DiT") == {"net.w": (4, 3), "net.b": (5,)}
    tensors = load_tensors(checkpoint, "DiT", strip=("net.",), skip=("b",))
    assert list(tensors) == ["w"] and torch.equal(tensors["w"], torch.ones(4, 3))


def test_missing_file(tmp_path):
    with pytest.raises(AnimaError, match="DiT file not found"):
        read_shapes(tmp_path / "nope.safetensors", "DiT")


@pytest.mark.parametrize("keep", [4, 30, -8])
def test_truncated_file(checkpoint, keep):
    data = checkpoint.read_bytes()
    checkpoint.write_bytes(data[:keep] if keep > 0 else data[:keep])
    with pytest.raises(AnimaError, match="truncated"):
        load_tensors(checkpoint, "DiT")


def test_not_a_safetensors_file(tmp_path):
    path = tmp_path / "x.safetensors"
    path.write_text("hello, this is text and not a checkpoint at all")
    with pytest.raises(AnimaError, match="truncated or not a safetensors file"):
        read_shapes(path, "VAE")


def test_shape_checks_name_the_tensor():
    with pytest.raises(AnimaError, match="missing tensor b"):
        check_shapes({"a": (1,)}, {"a": (1,), "b": (2,)}, "X")
    with pytest.raises(AnimaError, match=r"tensor a has shape \[3\], expected \[1\]"):
        check_shapes({"a": (3,)}, {"a": (1,)}, "X")
