"""diffusers models loaded with our checkpoints' weights: the independent references the parity tests compare to.

Key tables follow formats.md ("diffusers mapping" for the DiT, the Wan <-> diffusers VAE table).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
import torch.nn.functional as F
from diffusers import AutoencoderKLQwenImage
from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers
from diffusers.models.transformers import transformer_cosmos
from safetensors.torch import load_file

from anima_rknn.model.config import DiTConfig
from anima_rknn.vae import WanVAEConfig

ADAPTER_PREFIX = "llm_adapter."

# Cosmos-Predict2 checkpoint names -> diffusers names.
DIT_RENAMES = [
    ("x_embedder.proj.1", "patch_embed.proj"),
    ("t_embedder.1", "time_embed.t_embedder"),
    ("t_embedding_norm", "time_embed.norm"),
    ("blocks.", "transformer_blocks."),
    ("self_attn.", "attn1."),
    ("cross_attn.", "attn2."),
    ("q_proj", "to_q"), ("k_proj", "to_k"), ("v_proj", "to_v"),
    ("output_proj", "to_out.0"),
    ("q_norm", "norm_q"), ("k_norm", "norm_k"),
    ("mlp.layer1", "ff.net.0.proj"), ("mlp.layer2", "ff.net.2"),
    ("adaln_modulation_attn1.", "norm1.linear_"), ("adaln_modulation_attn2.", "norm2.linear_"),
    ("adaln_modulation_mlp.", "norm3.linear_"),
    ("final_layer.adaln_modulation.", "norm_out.linear_"),
    ("final_layer.linear", "proj_out"),
]  # fmt: skip


def dit_to_diffusers(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Unprefixed DiT checkpoint names -> CosmosTransformer3DModel names (the adapter is left out)."""
    out = {}
    for name, value in state.items():
        if name.startswith(ADAPTER_PREFIX):
            continue
        for old, new in DIT_RENAMES:
            name = name.replace(old, new)
        # The two linears of each AdaLN are `.1`/`.2` in the checkpoint and `linear_1`/`linear_2` in diffusers.
        out[name.replace("linear_.", "linear_")] = value
    return out


class _NearestResize:
    """Stand-in for torchvision's resize (formats.md: torchvision does not import beside this torch)."""

    class InterpolationMode:
        NEAREST = "nearest"

    class functional:  # noqa: N801 - mirrors torchvision's module name
        @staticmethod
        def resize(x, size, interpolation=None):
            return x if list(x.shape[-2:]) == list(size) else F.interpolate(x, size=size, mode="nearest")


def diffusers_dit(config: DiTConfig, state: dict[str, torch.Tensor]) -> transformer_cosmos.CosmosTransformer3DModel:
    """The Anima DiT as diffusers builds it (Cosmos-Predict2 2B layout), float32, weights loaded strictly."""
    model = transformer_cosmos.CosmosTransformer3DModel(
        in_channels=config.in_channels, out_channels=config.in_channels, num_attention_heads=config.heads,
        attention_head_dim=config.head_dim, num_layers=config.blocks, mlp_ratio=config.mlp / config.hidden,
        text_embed_dim=config.context_dim, adaln_lora_dim=config.adaln_lora, patch_size=(1, 2, 2),
        rope_scale=(1.0, 4.0, 4.0), concat_padding_mask=True, extra_pos_embed_type=None,
    )  # fmt: skip
    model.load_state_dict({k: v.float() for k, v in dit_to_diffusers(state).items()}, strict=True)
    transformer_cosmos.transforms = _NearestResize  # the forward resizes its padding mask with torchvision
    return model.eval()


def dit_file_error(path: Path) -> float:
    """Relative error of our loader's DiT against diffusers' with a DiT file's tensors (renamed by this module, not
    our loader), on seeded noise at sigma 0.6 and a random context."""
    from anima_rknn.model.io import load_dit

    ours = load_dit(path, torch.float32)
    reference = diffusers_dit(ours.config, {k.removeprefix("net."): v for k, v in load_file(path).items()})
    g = torch.Generator().manual_seed(0)
    x, sigma = torch.randn(1, 16, 8, 8, generator=g), torch.tensor([0.6])
    context = torch.randn(1, 512, ours.config.context_dim, generator=g)
    with torch.no_grad():
        v = ours(x, sigma, context)
        ref = reference(x[:, :, None], sigma, context, padding_mask=torch.zeros(1, 1, 8, 8), return_dict=False)[0]
    return float((v - ref[:, :, 0]).norm() / ref.norm())


def wan_to_diffusers_key(key: str, num_res_blocks: int) -> str:
    """Wan/ComfyUI VAE name -> diffusers name, for any number of residual blocks per level."""
    residual = [("residual.0.", "norm1."), ("residual.2.", "conv1."), ("residual.3.", "norm2."),
                ("residual.6.", "conv2."), ("shortcut.", "conv_shortcut.")]  # fmt: skip

    def rename_residual(rest: str) -> str:
        for old, new in residual:
            if rest.startswith(old):
                return new + rest[len(old) :]
        return rest

    top = {"conv1.": "quant_conv.", "conv2.": "post_quant_conv."}
    for old, new in top.items():
        if key.startswith(old):
            return new + key[len(old) :]
    part, rest = key.split(".", 1)
    fixed = {"conv1.": "conv_in.", "head.0.": "norm_out.", "head.2.": "conv_out.", "middle.1.": "mid_block.attentions.0."}
    for old, new in fixed.items():
        if rest.startswith(old):
            return f"{part}.{new}{rest[len(old):]}"
    if m := re.match(r"middle\.([02])\.(.*)", rest):
        return f"{part}.mid_block.resnets.{int(m[1]) // 2}.{rename_residual(m[2])}"
    if m := re.match(r"downsamples\.(\d+)\.(.*)", rest):
        return f"{part}.down_blocks.{m[1]}.{rename_residual(m[2])}"
    m = re.match(r"upsamples\.(\d+)\.(.*)", rest)
    assert m, key
    level, index = divmod(int(m[1]), num_res_blocks + 2)
    if index == num_res_blocks + 1:
        return f"{part}.up_blocks.{level}.upsamplers.0.{m[2]}"
    return f"{part}.up_blocks.{level}.resnets.{index}.{rename_residual(m[2])}"


def diffusers_vae(path: Path, config: WanVAEConfig) -> AutoencoderKLQwenImage:
    """A Wan VAE file loaded strictly into diffusers' AutoencoderKLQwenImage, float32, with `config`'s statistics."""
    levels = len(config.dim_mult)
    model = AutoencoderKLQwenImage(
        base_dim=config.dim,
        z_dim=config.z_dim,
        dim_mult=list(config.dim_mult),
        num_res_blocks=config.num_res_blocks,
        temperal_downsample=[False, True, True][: levels - 1],
        latents_mean=list(config.latents_mean),
        latents_std=list(config.latents_std),
    )
    wan = {k: v.float() for k, v in load_file(str(path)).items()}
    mine = {wan_to_diffusers_key(k, config.num_res_blocks): v for k, v in wan.items()}
    if config.num_res_blocks == 2 and levels == 4:
        # diffusers' own converter only knows this layout; it must agree with the table above.
        theirs = convert_wan_vae_to_diffusers(wan)
        assert theirs.keys() == mine.keys()
        mine = theirs
    model.load_state_dict(mine, strict=True)
    return model.eval()
