"""Qwen3 text encoder against transformers' Qwen3Model built from an explicit config."""

from pathlib import Path

import pytest
import safetensors.torch
import torch
from transformers import Qwen3Config, Qwen3Model

from anima_rknn.errors import AnimaError
from anima_rknn.text.encoder import load_text_encoder, qwen3_config_from_shapes, write_random_text_encoder

SMALL = dict(hidden=64, layers=2, heads=2, kv_heads=1, head_dim=32, intermediate=128, vocab=300)


@pytest.fixture(scope="module")
def small_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("te") / "qwen3.safetensors"
    write_random_text_encoder(path, **SMALL, seed=3)
    return path


def reference_model(state: dict[str, torch.Tensor]) -> Qwen3Model:
    config = Qwen3Config(
        vocab_size=300,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        intermediate_size=128,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    )
    model = Qwen3Model(config).eval()
    model.load_state_dict({name.removeprefix("model."): t.float() for name, t in state.items()}, strict=True)
    return model


def test_written_file_has_real_layout(small_file: Path) -> None:
    state = safetensors.torch.load_file(small_file)
    assert len(state) == 2 + 11 * 2  # the real 28-layer file has 310 = 2 + 11 * 28
    assert all(name.startswith("model.") and not name.startswith("model.lm_head") for name in state)
    assert {t.dtype for t in state.values()} == {torch.bfloat16}
    assert state["model.layers.1.self_attn.k_proj.weight"].shape == (32, 64)
    assert state["model.layers.0.mlp.down_proj.weight"].shape == (64, 128)
    assert state["model.embed_tokens.weight"].float().std().item() == pytest.approx(0.02, rel=0.1)


def test_same_seed_same_weights(small_file: Path, tmp_path: Path) -> None:
    write_random_text_encoder(tmp_path / "again.safetensors", **SMALL, seed=3)
    write_random_text_encoder(tmp_path / "other.safetensors", **SMALL, seed=4)
    first = safetensors.torch.load_file(small_file)
    again = safetensors.torch.load_file(tmp_path / "again.safetensors")
    other = safetensors.torch.load_file(tmp_path / "other.safetensors")
    assert all(torch.equal(first[name], again[name]) for name in first)
    assert not torch.equal(first["model.embed_tokens.weight"], other["model.embed_tokens.weight"])


def test_encode_matches_transformers(small_file: Path) -> None:
    encoder = load_text_encoder(small_file)
    config = encoder.model.config
    inferred = (config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads)
    assert inferred == (64, 2, 2, 1)
    assert (config.head_dim, config.intermediate_size, config.vocab_size) == (32, 128, 300)
    assert encoder.hidden_size == 64

    reference = reference_model(safetensors.torch.load_file(small_file))
    ids = torch.Generator().manual_seed(0)
    for length in (1, 9):
        tokens = torch.randint(0, 300, (length,), generator=ids).tolist()
        ours = encoder.encode(tokens)
        with torch.no_grad():
            theirs = reference(input_ids=torch.tensor([tokens])).last_hidden_state
        assert ours.shape == (1, length, 64) and ours.dtype == torch.float32
        assert (ours - theirs).abs().max().item() <= 1e-5


def test_bf16_load_returns_float32(small_file: Path) -> None:
    encoder = load_text_encoder(small_file, dtype=torch.bfloat16)
    assert next(encoder.model.parameters()).dtype == torch.bfloat16
    reference = reference_model(safetensors.torch.load_file(small_file))
    with torch.no_grad():
        theirs = reference(input_ids=torch.tensor([[5, 17, 250]])).last_hidden_state
    ours = encoder.encode([5, 17, 250])
    assert ours.dtype == torch.float32
    assert (ours - theirs).abs().max().item() < 0.1 * theirs.abs().max().item()  # bf16 rounding only


def test_unprefixed_keys_and_lm_head_accepted(small_file: Path, tmp_path: Path) -> None:
    state = safetensors.torch.load_file(small_file)
    bare = {name.removeprefix("model."): t for name, t in state.items()}
    bare["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    safetensors.torch.save_file(bare, tmp_path / "bare.safetensors")
    tokens = [1, 2, 3, 299]
    expected = load_text_encoder(small_file).encode(tokens)
    assert torch.equal(load_text_encoder(tmp_path / "bare.safetensors").encode(tokens), expected)


def full_qwen3_shapes() -> dict[str, tuple[int, ...]]:
    """The Qwen3-0.6B key/shape table of formats.md (b), without allocating anything."""
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (151936, 1024), "model.norm.weight": (1024,)}
    for n in range(28):
        layer = f"model.layers.{n}."
        shapes |= {
            layer + "input_layernorm.weight": (1024,),
            layer + "post_attention_layernorm.weight": (1024,),
            layer + "self_attn.q_proj.weight": (2048, 1024),
            layer + "self_attn.k_proj.weight": (1024, 1024),
            layer + "self_attn.v_proj.weight": (1024, 1024),
            layer + "self_attn.o_proj.weight": (1024, 2048),
            layer + "self_attn.q_norm.weight": (128,),
            layer + "self_attn.k_norm.weight": (128,),
            layer + "mlp.gate_proj.weight": (3072, 1024),
            layer + "mlp.up_proj.weight": (3072, 1024),
            layer + "mlp.down_proj.weight": (1024, 3072),
        }
    return shapes


def test_full_qwen3_config_inferred() -> None:
    shapes = full_qwen3_shapes()
    assert len(shapes) == 310
    config = qwen3_config_from_shapes(shapes)
    assert config.hidden_size == 1024
    assert config.num_hidden_layers == 28
    assert config.num_attention_heads == 16
    assert config.num_key_value_heads == 8
    assert config.head_dim == 128
    assert config.intermediate_size == 3072
    assert config.vocab_size == 151936
    assert config.rope_parameters["rope_theta"] == 1e6
    assert config.rms_norm_eps == 1e-6
    assert config.tie_word_embeddings
    # The meta-device model built from it has exactly the table's names and shapes.
    with torch.device("meta"):
        model = Qwen3Model(config)
    assert {"model." + name: tuple(t.shape) for name, t in model.state_dict().items()} == shapes


def rewrite(small_file: Path, target: Path, change) -> Path:
    state = safetensors.torch.load_file(small_file)
    change(state)
    safetensors.torch.save_file(state, target)
    return target


def test_missing_key_is_named(small_file: Path, tmp_path: Path) -> None:
    path = rewrite(small_file, tmp_path / "m.safetensors", lambda s: s.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(AnimaError, match=r"lacks tensor model\.layers\.1\.mlp\.up_proj\.weight"):
        load_text_encoder(path)
    path = rewrite(small_file, tmp_path / "e.safetensors", lambda s: s.pop("model.embed_tokens.weight"))
    with pytest.raises(AnimaError, match=r"lacks tensor model\.embed_tokens\.weight"):
        load_text_encoder(path)


def test_wrong_shape_is_named(small_file: Path, tmp_path: Path) -> None:
    def shrink(state: dict[str, torch.Tensor]) -> None:
        state["model.layers.1.self_attn.v_proj.weight"] = torch.zeros(31, 64, dtype=torch.bfloat16)

    path = rewrite(small_file, tmp_path / "w.safetensors", shrink)
    with pytest.raises(AnimaError, match=r"model\.layers\.1\.self_attn\.v_proj\.weight has shape \[31, 64\], expected \[32, 64\]"):
        load_text_encoder(path)


def test_unexpected_key_is_named(small_file: Path, tmp_path: Path) -> None:
    def add(state: dict[str, torch.Tensor]) -> None:
        state["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64, dtype=torch.bfloat16)

    path = rewrite(small_file, tmp_path / "u.safetensors", add)
    with pytest.raises(AnimaError, match=r"unexpected tensor model\.layers\.0\.self_attn\.q_proj\.bias"):
        load_text_encoder(path)


@pytest.mark.parametrize("keep", [0.99, 0.5, 0.0001])
def test_truncated_file(small_file: Path, tmp_path: Path, keep: float) -> None:
    data = small_file.read_bytes()
    path = tmp_path / "t.safetensors"
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(AnimaError, match=r"t\.safetensors is truncated"):
        load_text_encoder(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(AnimaError, match="text encoder file not found: .*absent.safetensors"):
        load_text_encoder(tmp_path / "absent.safetensors")


def test_bad_ids_rejected(small_file: Path) -> None:
    encoder = load_text_encoder(small_file)
    with pytest.raises(AnimaError, match="token id 300 is outside"):
        encoder.encode([1, 300])
    with pytest.raises(AnimaError, match="at least one"):
        encoder.encode([])


ODD_SHAPES = {
    "head size 0": ({"layers.0.self_attn.q_norm.weight": (0,)}, r"q_norm.weight has shape \[0\], expected 1 non-zero"),
    "head size odd": ({"layers.0.self_attn.q_norm.weight": (1,)}, "heads of an even head_dim 1"),
    "q rows not whole heads": ({"layers.0.self_attn.q_proj.weight": (2000, 1024)}, r"\(2000, 1024 rows\)"),
    "k/v heads not a group": ({"layers.0.self_attn.k_proj.weight": (768, 1024)}, r"\(2048, 768 rows\)"),
    "embedding rank 1": ({"embed_tokens.weight": (151936,)}, "expected 2 non-zero sizes"),
    "empty vocabulary": ({"embed_tokens.weight": (0, 1024)}, "expected 2 non-zero sizes"),
    "no mlp": ({"layers.0.mlp.gate_proj.weight": None}, r"lacks tensor model\.layers\.0\.mlp\.gate_proj\.weight"),
    "a billion layers": ({"layers.999999999.mlp.up_proj.weight": (1,)},
                         r"names model\.layers\.999999999\.\*, but at most 1024 layers are read"),
}


@pytest.mark.parametrize("case", ODD_SHAPES)
def test_odd_shapes_are_refused_in_one_line(case: str) -> None:
    changes, pattern = ODD_SHAPES[case]
    shapes = full_qwen3_shapes()
    for name, shape in changes.items():
        if shape is None:
            del shapes["model." + name]
        else:
            shapes["model." + name] = shape
    with pytest.raises(AnimaError, match=pattern):
        qwen3_config_from_shapes(shapes)


def test_file_problems_name_the_file_and_tensor(small_file: Path, tmp_path: Path) -> None:
    def ints(state: dict[str, torch.Tensor]) -> None:
        state["model.layers.1.mlp.up_proj.weight"] = state["model.layers.1.mlp.up_proj.weight"].to(torch.int16)

    path = rewrite(small_file, tmp_path / "i.safetensors", ints)
    with pytest.raises(AnimaError, match=rf"^{path}: tensor model\.layers\.1\.mlp\.up_proj\.weight has dtype I16; "
                                         "a floating-point weight is expected$"):
        load_text_encoder(path)
    path = rewrite(small_file, tmp_path / "m.safetensors", lambda s: s.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(AnimaError, match=rf"^{path}: text encoder file lacks tensor model\.layers\.1\.mlp\.up_proj"):
        load_text_encoder(path)
