"""LoRA files in the three layouts users have, merged at load, against diffusers' Anima LoRA loader (PEFT)."""

import math

import pytest
import torch

from anima_rknn.errors import AnimaError
from anima_rknn.model.config import PRESETS
from anima_rknn.model.io import load_dit, load_llm_adapter, random_dit, save_dit
from anima_rknn.model.lora import LoraRef, linear_shapes, open_lora, parse_lora_option

diffusers = pytest.importorskip("diffusers")
pytest.importorskip("peft")
import lora_files  # noqa: E402
from diffusers.loaders import AnimaLoraLoaderMixin  # noqa: E402
from diffusers.loaders.lora_conversion_utils import _convert_non_diffusers_anima_lora_to_diffusers  # noqa: E402
from diffusers_reference import diffusers_dit  # noqa: E402
from lora_files import RANK, comfy, kohya, write_lora  # noqa: E402

CONFIG = PRESETS["tiny"]


@pytest.fixture(scope="module")
def dit_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("lora") / "dit.safetensors"
    save_dit(random_dit(CONFIG, seed=5), path)
    return path


def random_pairs(seed, modules=None):
    return lora_files.random_pairs(CONFIG, seed, modules)


def write(tmp_path, name, tensors):
    return write_lora(tmp_path / name, tensors)


def merged_state(dit_file, *refs):
    from anima_rknn.model.lora import open_loras

    return load_dit(dit_file, torch.float32, loras=open_loras(list(refs), CONFIG)).state_dict()


class _DiffusersAnima(AnimaLoraLoaderMixin):
    """Just the two LoRA-loadable parts of diffusers' AnimaPipeline."""

    hf_device_map = None  # not offloaded

    def __init__(self, transformer, text_conditioner):
        self.transformer, self.text_conditioner = transformer, text_conditioner
        self.components = {"transformer": transformer, "text_conditioner": text_conditioner}


def _reference(dit_file, lora_state):
    base = load_dit(dit_file, torch.float32)
    transformer = diffusers_dit(CONFIG, {k: v for k, v in base.state_dict().items()})
    conditioner = diffusers.AnimaTextConditioner(
        source_dim=CONFIG.adapter_source_dim, target_dim=CONFIG.context_dim, model_dim=CONFIG.context_dim,
        num_layers=CONFIG.adapter_blocks, num_attention_heads=CONFIG.adapter_heads,
        mlp_ratio=CONFIG.adapter_mlp / CONFIG.context_dim, target_vocab_size=CONFIG.t5_vocab,
        min_sequence_length=CONFIG.context_tokens,
    ).eval()  # fmt: skip
    conditioner.load_state_dict(base.llm_adapter.state_dict(), strict=True)
    pipe = _DiffusersAnima(transformer, conditioner)
    pipe.load_lora_weights(dict(lora_state))
    return transformer.eval(), conditioner.eval()


def test_merged_model_matches_diffusers_lora_loader(dit_file, tmp_path):
    pairs = random_pairs(seed=1)
    path = write(tmp_path, "style.safetensors", comfy(pairs))
    lora = open_lora(LoraRef(path), CONFIG)
    assert lora.layout == "ComfyUI" and len(lora.layers) == len(linear_shapes(CONFIG))
    ours = load_dit(dit_file, torch.float32, loras=[lora])
    base = load_dit(dit_file, torch.float32)
    transformer, conditioner = _reference(dit_file, comfy(pairs))

    g = torch.Generator().manual_seed(0)
    x, sigma = torch.randn(1, 16, 8, 12, generator=g), torch.tensor([0.7])
    context = torch.randn(1, 512, CONFIG.context_dim, generator=g)
    with torch.no_grad():
        v = ours(x, sigma, context)
        v_base = base(x, sigma, context)
        ref = transformer(x[:, :, None], sigma, context, padding_mask=torch.zeros(1, 1, 8, 12),
                          return_dict=False)[0][:, :, 0]
    assert (v - v_base).norm() / v_base.norm() > 0.05  # the LoRA changes the model a lot ...
    assert (v - ref).norm() / ref.norm() < 1e-4  # ... exactly as diffusers applies it

    source = torch.randn(1, 7, CONFIG.adapter_source_dim, generator=g)
    t5_ids = torch.tensor([[5, 17, 300, 2, 1]])
    adapter = load_llm_adapter(dit_file, loras=[lora])
    with torch.no_grad():
        out, out_ref = adapter.condition(source, t5_ids), conditioner(source, t5_ids)
        out_base = base.llm_adapter.condition(source, t5_ids)
    assert (out - out_base).norm() / out_base.norm() > 0.05
    assert (out - out_ref).norm() / out_ref.norm() < 1e-4
    assert torch.equal(ours.llm_adapter.out_proj.weight, adapter.out_proj.weight)  # whole DiT and adapter alone


def test_the_three_layouts_give_identical_weights(dit_file, tmp_path):
    pairs = random_pairs(seed=2)
    files = {"ComfyUI": comfy(pairs), "kohya": kohya(pairs),
             "diffusers": _convert_non_diffusers_anima_lora_to_diffusers(comfy(pairs))}  # diffusers' own names
    states = {}
    for layout, tensors in files.items():
        path = write(tmp_path, f"{layout}.safetensors", tensors)
        assert open_lora(LoraRef(path), CONFIG).layout == layout
        states[layout] = merged_state(dit_file, LoraRef(path))
    for name, weight in states["ComfyUI"].items():
        assert torch.equal(weight, states["kohya"][name]) and torch.equal(weight, states["diffusers"][name]), name


def test_alpha_and_scale_follow_the_usual_rule(dit_file, tmp_path):
    """delta = scale * alpha / rank * up @ down, alpha defaulting to the rank."""
    module = "blocks.0.mlp.layer1"
    (down, up), = random_pairs(seed=3, modules=[module]).values()
    base = load_dit(dit_file, torch.float32).state_dict()[module + ".weight"]
    plain = write(tmp_path, "plain.safetensors", comfy({module: (down, up)}))
    halved = write(tmp_path, "halved.safetensors", {**kohya({module: (down, up)}, alpha=RANK / 2)})
    for ref, expected in ((LoraRef(plain, 0.5), 0.5), (LoraRef(halved, -2.0), -2.0)):
        got = merged_state(dit_file, ref)[module + ".weight"]
        torch.testing.assert_close(got - base, expected * up @ down, rtol=1e-5, atol=1e-6)


def test_scale_zero_is_the_base_model_and_loras_stack(dit_file, tmp_path):
    a = write(tmp_path, "a.safetensors", comfy(random_pairs(seed=4)))
    b = write(tmp_path, "b.safetensors", kohya(random_pairs(seed=5)))
    base = load_dit(dit_file, torch.float32).state_dict()
    zero = merged_state(dit_file, LoraRef(a, 0.0))
    assert all(torch.equal(base[k], zero[k]) for k in base)
    only_a, only_b = merged_state(dit_file, LoraRef(a)), merged_state(dit_file, LoraRef(b, 0.7))
    both = merged_state(dit_file, LoraRef(a), LoraRef(b, 0.7))
    for k in base:
        torch.testing.assert_close(both[k] - base[k], (only_a[k] - base[k]) + (only_b[k] - base[k]),
                                   rtol=1e-5, atol=1e-6)


def test_bodies_take_the_body_dtype_and_the_file_is_never_written(dit_file, tmp_path):
    path = write(tmp_path, "a.safetensors", comfy(random_pairs(seed=6)))
    before = dit_file.read_bytes(), path.read_bytes()
    model = load_dit(dit_file, torch.bfloat16, denoise_only=True, loras=[open_lora(LoraRef(path), CONFIG)])
    assert model.blocks[0].self_attn.q_proj.weight.dtype == torch.bfloat16
    assert model.blocks[0].adaln_modulation_mlp[1].weight.dtype == torch.float32  # merged host weight
    assert (dit_file.read_bytes(), path.read_bytes()) == before


@pytest.mark.parametrize("text, path, scale", [
    ("style.safetensors", "style.safetensors", 1.0), ("style.safetensors:0.8", "style.safetensors", 0.8),
    ("dir/a:b.safetensors", "dir/a:b.safetensors", 1.0), ("x.safetensors:-1.5", "x.safetensors", -1.5),
])  # fmt: skip
def test_lora_option_is_file_and_optional_scale(text, path, scale):
    ref = parse_lora_option(text)
    assert (str(ref.path), ref.scale) == (path, scale)


# ---- bad files: one line each ----------------------------------------------------------------------------------

def _refused(tmp_path, tensors, match, *, name="bad.safetensors", scale=1.0, **kwargs):
    path = write(tmp_path, name, tensors)
    with pytest.raises(AnimaError, match=match) as error:
        lora = open_lora(LoraRef(path, scale), CONFIG, **kwargs)
        tensors = lora.read()
        for name in lora.layers:  # the values are checked when merged
            lora.delta(name, tensors)
    assert "\n" not in str(error.value)


def test_a_lora_for_another_model_is_named(tmp_path):
    sdxl = {"lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight": torch.zeros(4, 320),
            "lora_unet_down_blocks_0_attentions_0_proj_in.lora_up.weight": torch.zeros(320, 4)}
    _refused(tmp_path, sdxl, r"not a LoRA for Anima: none of its 2 keys .*lora_unet_down_blocks_0")


def test_unmatched_keys_are_refused_unless_ignored(tmp_path):
    tensors = comfy(random_pairs(seed=7, modules=["blocks.0.mlp.layer1"]))
    tensors["diffusion_model.blocks.99.mlp.layer1.lora_A.weight"] = torch.zeros(RANK, CONFIG.hidden)
    _refused(tmp_path, tensors, r"1 of its 3 keys match nothing .*blocks\.99\.mlp.* \(--lora-ignore-unmatched")
    path = tmp_path / "bad.safetensors"
    assert list(open_lora(LoraRef(path), CONFIG, ignore_unmatched=True).layers) == ["blocks.0.mlp.layer1.weight"]


def test_wrong_shapes_name_the_tensor_and_both_shapes(tmp_path):
    wide = {"diffusion_model.blocks.0.mlp.layer1.lora_A.weight": torch.zeros(RANK, 2048),
            "diffusion_model.blocks.0.mlp.layer1.lora_B.weight": torch.zeros(8192, RANK)}
    _refused(tmp_path, wide, r"lora_B.weight x .*lora_A.weight is \[8192, 2048\], the model's blocks.0.mlp.layer1 is")


@pytest.mark.parametrize("key, kind", [
    ("lora_unet_blocks_0_mlp_layer1.hada_w1_a", "LoHa"), ("lora_unet_blocks_0_mlp_layer1.lokr_w1", "LoKr"),
    ("diffusion_model.blocks.0.mlp.layer1.dora_scale", "DoRA"),
])  # fmt: skip
def test_other_adapter_kinds_are_named(tmp_path, key, kind):
    _refused(tmp_path, {key: torch.zeros(4, 4)}, rf"is a {kind}.*adapter; only plain LoRA")


def test_non_finite_values_and_bad_scales(tmp_path):
    tensors = comfy(random_pairs(seed=8, modules=["blocks.0.mlp.layer1"]))
    tensors["diffusion_model.blocks.0.mlp.layer1.lora_B.weight"][0, 0] = math.nan
    _refused(tmp_path, tensors, r"lora_B.weight holds NaN or Inf")
    good = comfy(random_pairs(seed=8, modules=["blocks.0.mlp.layer1"]))
    _refused(tmp_path, good, r"scale .* must be a finite number", name="s.safetensors", scale=math.inf)
    with pytest.raises(AnimaError, match=r"LoRA scale .abc. in .style.safetensors:abc. is not a number"):
        parse_lora_option("style.safetensors:abc")


def test_pickles_and_truncated_files_are_refused_unread(tmp_path):
    pickle = tmp_path / "style.ckpt"
    pickle.write_bytes(b"\x80\x04not read")
    with pytest.raises(AnimaError, match="is a pickle .* never loaded"):
        open_lora(LoraRef(pickle), CONFIG)
    path = write(tmp_path, "cut.safetensors", comfy(random_pairs(seed=9)))
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(AnimaError, match="cut.safetensors is truncated"):
        open_lora(LoraRef(path), CONFIG)


def test_huge_values_and_scales_are_refused_not_merged_into_inf(tmp_path, dit_file):
    from anima_rknn.model.lora import open_loras

    module = "blocks.0.mlp.layer1"
    (down, up), = random_pairs(seed=10, modules=[module]).values()
    path = write(tmp_path, "huge.safetensors", comfy({module: (down * 1e30, up * 1e30)}))  # finite, product is not
    with pytest.raises(AnimaError, match=r"merging the LoRAs into blocks.0.mlp.layer1.weight gives NaN or Inf"):
        load_dit(dit_file, torch.float32, loras=open_loras([LoraRef(path)], CONFIG))
    with pytest.raises(AnimaError, match=r"scale for huge.safetensors must be a finite number from -100 to 100"):
        open_lora(LoraRef(path, 101.0), CONFIG)
