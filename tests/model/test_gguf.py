"""GGUF checkpoints against the format's own library (the `gguf` package): its writer makes the files, its
quantizers the blocks (random blocks with valid scales for the K types it cannot quantize), its dequantizer and
reader are the references our reader, dequantizers, quantized layers and writer are held to."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from anima_rknn.core.gguf import QUANTIZED_TYPES, SUPPORTED_TYPES, map_gguf, read_gguf_header
from anima_rknn.core.quant import ENCODABLE, QuantizedTensor, encode
from anima_rknn.core.tensorfile import fingerprint, load_tensors, read_shapes
from anima_rknn.model.io import load_dit, load_llm_adapter, read_dit_config
from anima_rknn.model.lora import LoraRef, open_loras
from anima_rknn.model.model_set import from_model_dir
from anima_rknn.model.quantize import quantize_checkpoint
from anima_rknn.model.quantized import QuantizedLinear
from anima_rknn.text.encoder import load_text_encoder
from lora_files import comfy, random_pairs, write_lora

ROWS, COLUMNS = 8, 512
# Where each K type keeps its fp16 scales (d, dmin): set to sane values in otherwise random blocks.
_SCALE_BYTES = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def _blocks(dtype: str, rng: np.random.Generator) -> np.ndarray:
    """[ROWS, COLUMNS] values in GGML type `dtype`, as the gguf package stores them (uint8 rows for quantized)."""
    qtype = GGMLQuantizationType[dtype]
    values = rng.standard_normal((ROWS, COLUMNS)).astype(np.float32)
    if dtype in _SCALE_BYTES:  # the package has no quantizer for these: random blocks, finite scales
        block, size = GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, (ROWS * COLUMNS // block, size), dtype=np.uint8)
        scales = (rng.random(len(raw)) * 0.1).astype(np.float16).view(np.uint8).reshape(-1, 2)
        for at in _SCALE_BYTES[dtype]:
            raw[:, at:at + 2] = scales
        return raw.reshape(ROWS, -1)
    return gguf.quantize(values, qtype)


@pytest.fixture(scope="module")
def every_type(tmp_path_factory):
    """One tensor of each supported type, written by gguf's GGUFWriter."""
    path = tmp_path_factory.mktemp("gguf") / "types.gguf"
    writer = gguf.GGUFWriter(str(path), "anima")
    writer.add_string("anima_rknn.note", "hello")
    writer.add_array("comfy.gguf.orig_shape.F32", [2, 4, COLUMNS])
    rng = np.random.default_rng(0)
    for dtype in SUPPORTED_TYPES:
        data = _blocks(dtype, rng)
        writer.add_tensor(dtype, data, raw_dtype=GGMLQuantizationType[dtype])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("dtype", SUPPORTED_TYPES)
def test_every_type_dequantizes_as_gguf_does(every_type, dtype):
    reference = {t.name: t for t in gguf.GGUFReader(str(every_type)).tensors}[dtype]
    expected = gguf.dequantize(reference.data, reference.tensor_type).reshape(ROWS, COLUMNS)
    tensor = map_gguf(read_gguf_header(every_type, "test"))[dtype]
    if dtype in QUANTIZED_TYPES:
        assert isinstance(tensor, QuantizedTensor) and tensor.shape == (ROWS, COLUMNS)
        ours = tensor.dequantize(torch.float32).numpy()
    else:
        ours = tensor.float().numpy().reshape(ROWS, COLUMNS)
    assert np.array_equal(ours.view(np.uint32), expected.astype(np.float32).view(np.uint32))


def test_header_agrees_with_gguf_reader(every_type):
    header = read_gguf_header(every_type, "test")
    reader = gguf.GGUFReader(str(every_type))
    assert list(header.tensors) == [t.name for t in reader.tensors]
    for t in reader.tensors:
        info = header.tensors[t.name]
        assert info.dtype == t.tensor_type.name and info.shape == tuple(int(d) for d in reversed(t.shape))
        assert header.data_start + info.begin == t.data_offset and info.end - info.begin == t.n_bytes
    assert header.metadata["anima_rknn.note"] == "hello" and header.metadata["general.architecture"] == "anima"
    # ComfyUI-GGUF's record of a flattened shape is applied by the safetensors-style readers
    assert read_shapes(every_type, "test")["F32"] == (2, 4, COLUMNS)
    assert load_tensors(every_type, "test")["F32"].shape == (2, 4, COLUMNS)
    assert load_tensors(every_type, "test")["Q4_K"].dtype == torch.float32


@pytest.mark.parametrize("dtype", [t for t in ENCODABLE if t in QUANTIZED_TYPES])
def test_our_encoders_decode_in_gguf_within_a_step(dtype):
    """The blocks `quantize` writes, read by gguf's dequantizer: within half a quantization step of the input."""
    weight = torch.randn(4, 1024)
    raw = encode(weight, dtype)
    decoded = gguf.dequantize(raw, GGMLQuantizationType[dtype]).reshape(4, 1024)
    bits = {"Q8_0": 8, "Q6_K": 6, "Q5_0": 5, "Q5_1": 5}.get(dtype, 4)
    step = 2 * weight.abs().max().item() / (2**bits - 1)
    assert np.abs(decoded - weight.numpy()).max() <= step  # K scales are themselves rounded: a whole step
    assert np.abs(decoded - weight.numpy()).max() > 0


@pytest.fixture(scope="module")
def quantized_dit(tiny_set, tmp_path_factory):
    path = tmp_path_factory.mktemp("q") / "dit-q8_0.gguf"
    counts = quantize_checkpoint(tiny_set.dit, path, "q8_0")
    assert counts["Q8_0"] > 0 and counts["F32"] > 0
    return path


def _reference_dit(path, config):
    """The DiT built from gguf's own reading and dequantization of every tensor of `path`."""
    from anima_rknn.model.dit import AnimaDiT

    state = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        value = gguf.dequantize(t.data, t.tensor_type).reshape([int(d) for d in reversed(t.shape)])
        state[t.name.removeprefix("net.")] = torch.from_numpy(np.array(value, dtype=np.float32))
    model = AnimaDiT(config)
    model.load_state_dict(state, strict=True)
    return model.eval()


def _pass(model, config, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 16, 8, 8, generator=g)
    context = torch.randn(1, config.context_tokens, config.context_dim, generator=g)
    with torch.no_grad():
        return model(x, torch.tensor([0.6]), context)


def test_quantized_dit_stays_quantized_and_matches_gguf(quantized_dit):
    """Quantized layers dequantized as they run give the very pass of gguf's dequantized weights, in fp32."""
    config = read_dit_config(quantized_dit)
    model = load_dit(quantized_dit, torch.float32)
    assert isinstance(model.blocks[0].mlp.layer1, QuantizedLinear)
    assert isinstance(model.llm_adapter.blocks[0].mlp[0], QuantizedLinear)
    assert torch.equal(_pass(model, config), _pass(_reference_dit(quantized_dit, config), config))
    dense = load_dit(quantized_dit, torch.float32, dequantize=True)
    assert not any(isinstance(m, QuantizedLinear) for m in dense.modules())
    assert torch.equal(_pass(dense, config), _pass(model, config))
    bf16 = _pass(load_dit(quantized_dit, torch.bfloat16, denoise_only=True), config)
    assert torch.allclose(bf16, _pass(model, config), atol=0.1)


def test_q8_0_is_close_to_the_safetensors_source(tiny_set, quantized_dit):
    config = read_dit_config(tiny_set.dit)
    exact, quantized = _pass(load_dit(tiny_set.dit), config), _pass(load_dit(quantized_dit), config)
    assert 0 < (exact - quantized).abs().max() < 0.05 * exact.abs().max()


def test_lora_on_quantized_layers_equals_merging_into_the_dequantized_weights(tiny_set, quantized_dit, tmp_path):
    config = read_dit_config(quantized_dit)
    lora = write_lora(tmp_path / "l.safetensors", comfy(random_pairs(config, seed=3)))
    opened = open_loras([LoraRef(lora, 0.7)], config)
    merged_at_run = load_dit(quantized_dit, torch.float32, loras=opened)
    assert merged_at_run.blocks[0].self_attn.q_proj.lora is not None
    merged_at_load = load_dit(quantized_dit, torch.float32, loras=opened, dequantize=True)
    without = _pass(load_dit(quantized_dit), config)
    a, b = _pass(merged_at_run, config), _pass(merged_at_load, config)
    assert torch.allclose(a, b, atol=1e-4) and not torch.allclose(a, without, atol=1e-3)
    adapter, dense_adapter = load_llm_adapter(quantized_dit, opened), load_llm_adapter(tiny_set.dit, opened)
    assert isinstance(adapter.blocks[0].self_attn.q_proj, QuantizedLinear)
    assert dense_adapter is not None


def test_quantize_writes_what_gguf_reads_with_sd_cpp_choices(tiny_set, quantized_dit):
    """Same names as the source; linear weights Q8_0, 1-D norms F32, embedders and final layer kept in bf16
    (stable-diffusion.cpp's choice); every value equal to the encoder's, read back by gguf."""
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(quantized_dit)).tensors}
    assert set(types) == set(read_shapes(tiny_set.dit, "DiT"))
    assert types["net.blocks.0.mlp.layer1.weight"] == "Q8_0"
    assert types["net.blocks.0.self_attn.q_norm.weight"] == "F32"
    assert types["net.x_embedder.proj.1.weight"] == types["net.final_layer.linear.weight"] == "BF16"
    assert types["net.llm_adapter.blocks.0.mlp.0.bias"] == "F32"


def test_model_folder_takes_a_gguf_and_its_fingerprint(tiny_set, quantized_dit, tmp_path):
    root = tmp_path / "set"
    for part in ("dit", "text_encoder", "vae"):
        source = getattr(tiny_set, part)
        folder = root / source.parent.relative_to(tiny_set.dit.parents[2])
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / (quantized_dit.name if part == "dit" else source.name)
        target.write_bytes((quantized_dit if part == "dit" else source).read_bytes())
    for tok in ("qwen_tokenizer", "t5_tokenizer"):
        target = root / getattr(tiny_set, tok).relative_to(tiny_set.dit.parents[2])
        target.mkdir(parents=True)
        (target / "tokenizer.json").write_bytes((getattr(tiny_set, tok) / "tokenizer.json").read_bytes())
    files = from_model_dir(root)
    assert files.dit.suffix == ".gguf"
    before = fingerprint(files.dit, "DiT")
    raw = bytearray(files.dit.read_bytes())
    raw[read_gguf_header(files.dit, "DiT").data_start] ^= 1  # the first tensor's first byte, which it samples
    files.dit.write_bytes(bytes(raw))
    assert fingerprint(files.dit, "DiT") != before


def test_text_encoder_gguf_with_llama_cpp_names(tiny_set, tmp_path):
    """A Qwen3 GGUF in llama.cpp's names (blk.N.attn_q, token_embd, ...), F32: the same hidden states."""
    names = {"self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
             "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    path = tmp_path / "qwen3.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen3")
    for name, tensor in load_tensors(tiny_set.text_encoder, "text encoder").items():
        name = name.removeprefix("model.").replace("embed_tokens.", "token_embd.").replace("layers.", "blk.")
        name = "output_norm.weight" if name == "norm.weight" else name
        for hf, llama in names.items():
            name = name.replace(hf, llama)
        writer.add_tensor(name, tensor.float().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ids = [3, 1, 4, 1, 5]
    expected = load_text_encoder(tiny_set.text_encoder).encode(ids)
    assert torch.equal(load_text_encoder(path).encode(ids), expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_q8_0_straight_to_a_narrow_dtype(dtype):
    """The fast bf16/fp16 path against gguf's fp32 dequantization rounded once: equal in fp16, within 2 ulps in
    bf16 (its scale is rounded to bf16 first)."""
    weight = torch.randn(64, 256)
    raw = encode(weight, "Q8_0")
    reference = torch.from_numpy(gguf.dequantize(raw, GGMLQuantizationType.Q8_0).reshape(64, 256))
    ours = QuantizedTensor(torch.from_numpy(raw), "Q8_0", (64, 256)).dequantize(dtype)
    if dtype == torch.float16:
        assert torch.equal(ours, reference.to(dtype))
    else:
        assert torch.allclose(ours.float(), reference, rtol=2**-7, atol=0)


def test_vae_gguf_in_comfyui_gguf_layout(tiny_set, tmp_path):
    """ComfyUI-GGUF stores 5-D convolutions flattened to 4-D with their shape in comfy.gguf.orig_shape.<name>:
    the VAE loads from it and decodes as from the safetensors."""
    from anima_rknn.vae.io import load_vae

    path = tmp_path / "vae.gguf"
    writer = gguf.GGUFWriter(str(path), "wan")
    for name, tensor in load_tensors(tiny_set.vae, "VAE").items():
        array = tensor.float().numpy()
        if array.ndim == 5:
            writer.add_array(f"comfy.gguf.orig_shape.{name}", list(array.shape))
            array = array.reshape(-1, *array.shape[2:])
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    latent = torch.randn(1, 16, 4, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = load_vae(tiny_set.vae).decode(latent)
        assert torch.equal(load_vae(path).decode(latent), expected)


def test_vae_gguf_in_stable_diffusion_cpp_layout(tiny_set, tmp_path):
    """stable-diffusion.cpp folds a 5-D conv weight [out, in, t, h, w] into GGML's 4 dims as [out * in, t, h, w]
    (src/model_io/safetensors_io.cpp: `if (n_dims == 5) { ne[0] = ne[0] * ne[1]; ...}`, then reverse_ne; src/wan.hpp
    CausalConv3d: ggml_new_tensor_4d(w, h, t, in_channels * out_channels)) and its converter writes that shape,
    no metadata (checked against stable-diffusion-cpp-python 0.4.7's convert): the VAE loads from it, with its
    real 4-D convolutions (attention, 2-D resamples) left as they are, and decodes as from the safetensors."""
    from anima_rknn.vae.io import load_vae, read_vae_config

    path = tmp_path / "vae.gguf"
    writer = gguf.GGUFWriter(str(path), "wan")
    folded = 0
    for name, tensor in load_tensors(tiny_set.vae, "VAE").items():
        array = tensor.float().numpy()
        if array.ndim == 5:
            array, folded = array.reshape(-1, *array.shape[2:]), folded + 1
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert folded and any(len(s) == 4 for s in read_shapes(tiny_set.vae, "VAE").values())
    assert read_vae_config(path) == read_vae_config(tiny_set.vae)
    latent = torch.randn(1, 16, 4, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = load_vae(tiny_set.vae).decode(latent)
        assert torch.equal(load_vae(path).decode(latent), expected)
