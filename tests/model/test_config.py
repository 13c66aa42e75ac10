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


def _changed(changes=None):
    """The tiny model's shapes with some replaced (None: removed)."""
    shapes = dict(expected_shapes(PRESETS["tiny"]))
    for name, shape in (changes or {}).items():
        if shape is None:
            shapes.pop(name)
        else:
            shapes[name] = shape
    return shapes


ODD_SHAPES = {
    "x_embedder rank 1": (_changed({"x_embedder.proj.1.weight": (128,)}),
                          r"x_embedder.proj.1.weight has shape \[128\], expected 2 non-zero sizes"),
    "x_embedder rank 3": (_changed({"x_embedder.proj.1.weight": (128, 68, 1)}), "expected 2 non-zero sizes"),
    "no latent channels": (_changed({"x_embedder.proj.1.weight": (128, 4)}), "unexpected x_embedder.proj.1.weight"),
    "zero width": (_changed({"x_embedder.proj.1.weight": (0, 68)}), "expected 2 non-zero sizes"),
    "head size 0": (_changed({"blocks.0.self_attn.q_norm.weight": (0,)}), r"q_norm.weight has shape \[0\]"),
    "head size rank 0": (_changed({"blocks.0.self_attn.q_norm.weight": ()}), "expected 1 non-zero sizes"),
    "head size 8 (RoPE)": (_changed({"blocks.0.self_attn.q_norm.weight": (8,)}), "head size 8 .* at least 12"),
    "head size odd": (_changed({"blocks.0.self_attn.q_norm.weight": (13,)}), "head size 13 .* must be even"),
    "head size not a divisor": (_changed({"blocks.0.self_attn.q_norm.weight": (48,)}), "divide the width 128"),
    "adapter head size odd": (_changed({"llm_adapter.blocks.0.self_attn.q_norm.weight": (1,)}),
                              "adapter head size 1 must be even"),
    "adapter head size not a divisor": (_changed({"llm_adapter.blocks.0.self_attn.q_norm.weight": (24,)}),
                                        "divide its width 64"),
    "empty vocabulary": (_changed({"llm_adapter.embed.weight": (0, 64)}), "expected 2 non-zero sizes"),
    "no adapter blocks": ({k: v for k, v in _changed().items() if not k.startswith("llm_adapter.blocks.")},
                          "no llm_adapter.blocks.N.* tensors"),
    "a billion blocks": (_changed({"blocks.999999999.mlp.layer1.weight": (4,)}),
                         "names blocks.999999999.*, but at most 1024 blocks are read"),
    "a million adapter blocks": (_changed({"llm_adapter.blocks.1000000.norm.weight": (4,)}), "at most 1024 blocks"),
    "missing mlp": (_changed({"blocks.0.mlp.layer1.weight": None}), "missing tensor blocks.0.mlp.layer1.weight"),
}


@pytest.mark.parametrize("case", ODD_SHAPES)
def test_odd_shapes_are_refused_in_one_line(case):
    shapes, pattern = ODD_SHAPES[case]
    with pytest.raises(AnimaError, match=pattern):
        infer_dit_config(shapes)


def test_a_block_name_past_nine_digits_is_not_a_block():
    shapes = _changed({"blocks." + "9" * 5000 + ".mlp.layer1.weight": (4,)})
    assert infer_dit_config(shapes) == PRESETS["tiny"]
