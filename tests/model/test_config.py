"""Model sizes are read off tensor shapes, so one loader serves the full model and small ones."""

import pytest

from anima_rknn.errors import AnimaError
from anima_rknn.model.config import PRESETS, infer_dit_config
from anima_rknn.model.io import expected_shapes


def full_anima_shapes() -> dict[str, tuple[int, ...]]:
    """The formats.md table for the full model (written out, not computed by the model code)."""
    shapes = {
        "x_embedder.proj.1.weight": (2048, 68),
        "llm_adapter.embed.weight": (32128, 1024),
        "llm_adapter.blocks.0.self_attn.q_norm.weight": (64,),
        "llm_adapter.blocks.0.cross_attn.k_proj.weight": (1024, 1024),
        "llm_adapter.blocks.0.mlp.0.weight": (4096, 1024),
        "llm_adapter.blocks.5.norm_mlp.weight": (1024,),
    }
    for n in range(28):
        shapes[f"blocks.{n}.self_attn.q_norm.weight"] = (128,)
        shapes[f"blocks.{n}.mlp.layer1.weight"] = (8192, 2048)
        shapes[f"blocks.{n}.adaln_modulation_self_attn.1.weight"] = (256, 2048)
    return shapes


def test_full_config_inferred_from_the_spec_shapes():
    config = infer_dit_config(full_anima_shapes())
    assert config == PRESETS["full"]
    assert (config.hidden, config.heads, config.head_dim, config.blocks, config.mlp) == (2048, 16, 128, 28, 8192)


def test_full_config_builds_the_formats_md_key_set():
    shapes = expected_shapes(PRESETS["full"])
    dit = {k: v for k, v in shapes.items() if not k.startswith("llm_adapter.")}
    adapter = {k: v for k, v in shapes.items() if k.startswith("llm_adapter.")}
    # anima.md: "567 DiT tensors + 118 adapter tensors" (20 per block; formats.md's "21·NB" formula is off by one)
    assert len(dit) == 567 and len(adapter) == 118
    assert shapes["blocks.27.cross_attn.k_proj.weight"] == (2048, 1024)
    assert shapes["final_layer.adaln_modulation.2.weight"] == (4096, 256)
    assert shapes["t_embedder.1.linear_2.weight"] == (6144, 2048)
    assert shapes["llm_adapter.blocks.5.mlp.2.bias"] == (1024,)


@pytest.mark.parametrize("preset", ["tiny", "mid"])
def test_small_presets_round_trip_through_shapes(preset):
    assert infer_dit_config(expected_shapes(PRESETS[preset])) == PRESETS[preset]


def test_missing_tensor_is_named():
    shapes = full_anima_shapes()
    del shapes["llm_adapter.embed.weight"]
    with pytest.raises(AnimaError, match="missing tensor llm_adapter.embed.weight"):
        infer_dit_config(shapes)
