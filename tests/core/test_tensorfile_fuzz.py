"""Properties of the header reader and of the configs read off headers: whatever the bytes, only AnimaError.

Whatever the header reader accepts, safetensors itself must load (our checks are at least as strict as its
own), and no header makes us allocate more than a small bound: sizes must be backed by bytes in the file.
"""

import json
import math
import struct
import tracemalloc

import pytest
import torch
from crafted_files import write
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from transformers import Qwen3Model

from anima_rknn.core.tensorfile import (
    DTYPE_BYTES,
    MAX_HEADER_BYTES,
    Header,
    TensorInfo,
    load_tensors,
    read_header,
    read_shapes,
)
from anima_rknn.errors import AnimaError
from anima_rknn.model.adapter import rope_1d
from anima_rknn.model.config import PRESETS, infer_dit_config
from anima_rknn.model.io import expected_shapes
from anima_rknn.model.layers import rope_tables
from anima_rknn.text.encoder import qwen3_config_from_shapes, write_random_text_encoder
from anima_rknn.vae.io import _infer_config, file_shapes
from anima_rknn.vae.wan import WanVAE, WanVAEConfig

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
ALLOCATION_BOUND = 8 * 2**20  # bytes; every input here is a few kB

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
sizes = st.integers(0, 6) | st.integers(-3, 2**66) | st.booleans()
tensor_entries = st.fixed_dictionaries({
    "dtype": st.sampled_from([*DTYPE_BYTES, "F4", "Q8", ""]),
    "shape": st.lists(sizes, max_size=9) | json_values,
    "data_offsets": st.lists(st.integers(0, 40) | st.integers(-5, 2**66), min_size=2, max_size=2) | json_values,
})
headers = st.dictionaries(
    st.sampled_from(["a", "b", "c", "net.w", "__metadata__"]) | st.text(max_size=6),
    tensor_entries | json_values | st.dictionaries(st.text(max_size=4), st.text(max_size=4) | json_values),
    max_size=4,
)


@st.composite
def near_valid_files(draw):
    """(header, data) of a valid file in shuffled order, often with one field or the data length changed."""
    tensors, offset = [], 0
    for i in range(draw(st.integers(0, 4))):
        dtype = draw(st.sampled_from(sorted(DTYPE_BYTES)))
        shape = draw(st.lists(st.integers(0, 3), max_size=3))
        end = offset + math.prod(shape) * DTYPE_BYTES[dtype]
        tensors.append((f"t{i}", {"dtype": dtype, "shape": shape, "data_offsets": [offset, end]}))
        offset = end
    header = dict(draw(st.permutations(tensors)))
    shift = 0
    if header and draw(st.booleans()):  # a gap or an overlap, the size kept
        entry = header[draw(st.sampled_from(sorted(header)))]
        shift = draw(st.integers(-2, 2))
        entry["data_offsets"] = [position + shift for position in entry["data_offsets"]]
    if header and draw(st.booleans()):
        entry = header[draw(st.sampled_from(sorted(header)))]
        key = draw(st.sampled_from(sorted(entry)))
        entry[key] = draw(st.sampled_from([*DTYPE_BYTES, "F4"]) | st.lists(sizes, max_size=3) | json_values)
    if draw(st.booleans()):
        header["__metadata__"] = draw(st.dictionaries(st.text(max_size=4), st.text(max_size=4) | json_values))
    return header, bytes(max(0, offset + draw(st.sampled_from([0, 0, shift, -1, 1, 8]))))


def _read_bounded(path):
    """read_header's answer, after checking that it refused with AnimaError or kept its promises."""
    tracemalloc.start()
    try:
        header = read_header(path, "DiT", dtypes=DTYPE_BYTES)
    except AnimaError as e:
        assert "\n" not in str(e)
        header = None
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < ALLOCATION_BOUND
    return header


@FUZZ
@given(raw=st.binary(max_size=200))
def test_arbitrary_bytes_are_refused_in_one_line(tmp_path, raw):
    path = tmp_path / "x.safetensors"
    path.write_bytes(raw)
    if _read_bounded(path) is not None:  # e.g. b"\x02" + 7 zeros + "{}": a valid empty file
        assert load_tensors(path, "DiT") == {}


@FUZZ
@given(file=st.tuples(headers, st.binary(max_size=64)) | near_valid_files(), pad=st.sampled_from([b"", b"  "]))
def test_arbitrary_json_headers_are_refused_or_loadable(tmp_path, file, pad):
    header, data = file
    path = write(tmp_path / "x.safetensors", json.dumps(header).encode() + pad, data)
    found = _read_bounded(path)
    event(f"accepted: {found is not None}")
    if found is not None:  # then safetensors agrees, tensor for tensor
        with safe_open(str(path), framework="pt") as f:
            loaded = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
        assert loaded == {name: info.shape for name, info in found.tensors.items()}


@pytest.mark.parametrize("elements", [10**12, 2**62])
def test_a_huge_tensor_is_refused_from_the_header_alone(tmp_path, elements):
    header = {"w": {"dtype": "F32", "shape": [elements], "data_offsets": [0, 4 * elements]}}
    path = write(tmp_path / "huge.safetensors", header, bytes(64))
    assert _read_bounded(path) is None


def test_a_header_over_the_limit_is_refused_without_reading_it(tmp_path):
    path = tmp_path / "big.safetensors"
    with open(path, "wb") as f:  # sparse: no 100 MB written
        f.write(struct.pack("<Q", MAX_HEADER_BYTES + 1))
        f.truncate(MAX_HEADER_BYTES + 16)
    assert _read_bounded(path) is None


def _mutated(shapes: dict, draw, sizing: list[str]) -> dict:
    """Real shapes with some removed and some reshaped, mostly of the `sizing` tensors a config is read from.
    A reshaped tensor keeps its rank half the time, so that changed sizes get past the rank checks."""
    shapes = dict(shapes)
    names = st.sampled_from(sizing) | st.sampled_from(sorted(shapes))
    for name in draw(st.lists(names, max_size=2)):
        shapes.pop(name, None)
    size = st.sampled_from([0, 1, 2, 4, 6, 8, 10, 12, 14, 16, 32, 64, 128]) | st.integers(0, 300)
    for name in draw(st.lists(names, max_size=3)):
        rank = len(shapes.get(name, ())) if draw(st.booleans()) else draw(st.integers(0, 4))
        shapes[name] = tuple(draw(st.lists(size, min_size=rank, max_size=rank)))
    return shapes


layer_numbers = st.integers(0, 4) | st.integers(1024, 10**12)  # beyond the bound, or cheap to build


@pytest.fixture(scope="module")
def text_encoder_shapes(tmp_path_factory):
    path = tmp_path_factory.mktemp("te") / "te.safetensors"
    write_random_text_encoder(path)
    return read_shapes(path, "text encoder")


TINY_DIT_SHAPES = expected_shapes(PRESETS["tiny"])
DIT_SIZING = ["x_embedder.proj.1.weight", "blocks.0.self_attn.q_norm.weight", "blocks.0.mlp.layer1.weight",
              "blocks.0.adaln_modulation_self_attn.1.weight", "llm_adapter.embed.weight",
              "llm_adapter.blocks.0.self_attn.q_norm.weight", "llm_adapter.blocks.0.cross_attn.k_proj.weight",
              "llm_adapter.blocks.0.mlp.0.weight"]
TEXT_ENCODER_SIZING = [f"model.{name}" for name in (
    "embed_tokens.weight", "layers.0.self_attn.q_norm.weight", "layers.0.self_attn.q_proj.weight",
    "layers.0.self_attn.k_proj.weight", "layers.0.mlp.gate_proj.weight")]


@FUZZ
@given(data=st.data())
def test_a_dit_config_from_any_shapes_is_buildable_or_refused(data):
    shapes = _mutated(TINY_DIT_SHAPES, data.draw, DIT_SIZING)
    for number in data.draw(st.lists(layer_numbers, max_size=2)):
        prefix = data.draw(st.sampled_from(["blocks.", "llm_adapter.blocks."]))
        shapes[f"{prefix}{number}.mlp.layer1.weight"] = (4,)
    try:
        config = infer_dit_config(shapes)
    except AnimaError:
        event("refused")
        return
    assert config.blocks <= 1024 and config.adapter_blocks <= 1024
    assert all(value > 0 for value in config.to_dict().values())
    expected_shapes(config)  # builds on the meta device without complaint
    # and its position tables fit its heads (built at run time, not at load time)
    assert rope_tables(config.head_dim, 2, 3)[0].shape == (6, config.head_dim)
    assert rope_1d(5, config.adapter_head_dim)[0].shape == (5, config.adapter_head_dim)


@FUZZ
@given(data=st.data())
def test_a_text_encoder_config_from_any_shapes_is_buildable_or_refused(text_encoder_shapes, data):
    shapes = _mutated(text_encoder_shapes, data.draw, TEXT_ENCODER_SIZING)
    for number in data.draw(st.lists(layer_numbers, max_size=2)):
        shapes[f"model.layers.{number}.mlp.up_proj.weight"] = (4,)
    try:
        config = qwen3_config_from_shapes(shapes)
    except AnimaError:
        event("refused")
        return
    assert config.num_hidden_layers <= 1024
    with torch.device("meta"):
        Qwen3Model(config)


SMALL_VAE_SHAPES = file_shapes(WanVAEConfig(dim=4, z_dim=4, latents_mean=(0,) * 4, latents_std=(1,) * 4))
VAE_SIZING = ["decoder.conv1.weight", "encoder.conv1.weight", "decoder.head.2.weight",
              *(f"decoder.upsamples.{i}.residual.2.weight" for i in (0, 4, 8, 12)),
              *(f"decoder.upsamples.{i}.resample.1.weight" for i in (3, 7, 11))]


@FUZZ
@given(data=st.data(), mean=st.just("[0, 0, 0, 0]") | st.text(max_size=30) | json_values.map(json.dumps))
def test_a_vae_config_from_any_header_is_buildable_or_refused(tmp_path, data, mean):
    shapes = _mutated(SMALL_VAE_SHAPES, data.draw, VAE_SIZING)
    for number in data.draw(st.lists(layer_numbers, max_size=2)):
        shapes[f"decoder.upsamples.{number}.residual.0.gamma"] = (4,)
    metadata = {"latents_mean": mean, "latents_std": "[1, 1, 1, 1]"}
    header = Header(tmp_path / "vae.safetensors", {k: TensorInfo("F32", v, 0, 0) for k, v in shapes.items()},
                    metadata)
    try:
        config = _infer_config(header)
    except AnimaError as e:
        assert str(header.path) in str(e)
        event("refused")
        return
    assert len(config.dim_mult) <= 4 and config.num_res_blocks <= 8
    with torch.device("meta"):
        WanVAE(config)
