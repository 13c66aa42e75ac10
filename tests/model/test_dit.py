"""The DiT against an independent implementation: diffusers' CosmosTransformer3DModel with the same weights."""

import pytest
import torch

from anima_rknn.model.config import PRESETS
from anima_rknn.model.dit import patchify, unpatchify
from anima_rknn.model.io import random_dit

pytest.importorskip("diffusers")
from diffusers_reference import diffusers_dit  # noqa: E402


@pytest.fixture(scope="module")
def models():
    config = PRESETS["tiny"]
    ours = random_dit(config, seed=1)
    return ours, diffusers_dit(config, ours.state_dict())


def _inputs(h=8, w=12, batch=2):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 16, h, w, generator=g)
    sigma = torch.tensor([0.9, 0.3])[:batch]
    context = torch.randn(batch, 512, PRESETS["tiny"].context_dim, generator=g)
    context[:, 20:] = 0  # the zero-padded rows are attended unmasked
    return x, sigma, context


def test_full_pass_matches_diffusers(models):
    ours, reference = models
    x, sigma, context = _inputs()
    with torch.no_grad():
        v = ours(x, sigma, context)
        ref = reference(x[:, :, None], sigma, context, padding_mask=torch.zeros(1, 1, 8, 12),
                        return_dict=False)[0][:, :, 0]
    assert v.shape == x.shape
    assert (v - ref).norm() / ref.norm() < 1e-4


def test_one_block_matches_diffusers(models):
    ours, reference = models
    x, sigma, context = _inputs()
    with torch.no_grad():
        state = ours.prologue(x, sigma)
        tokens_in = state.tokens.clone()
        mods = ours.modulations(state)[0]
        kv = ours.context_key_values(context)[0]
        block = ours.blocks[0]
        from anima_rknn.model.dit import layer_norm_modulate
        for part in range(3):
            shift, scale, gate = mods[part]
            state.tokens = state.tokens + gate * block.body(part, layer_norm_modulate(state.tokens, shift, scale),
                                                            state.rope, kv)
        temb, embedded = reference.time_embed(tokens_in, sigma)
        rope = reference.rope(torch.zeros(2, 17, 1, 8, 12))
        ref = reference.transformer_blocks[0](tokens_in, context, embedded, temb, rope)
    assert (state.tokens - ref).norm() / ref.norm() < 1e-5


def test_patch_layouts_written_from_the_spec():
    x = torch.arange(2 * 17 * 4 * 4, dtype=torch.float32).reshape(2, 17, 4, 4)
    tokens = patchify(x, 2)
    # token 0 covers rows 0-1, cols 0-1; feature = c*4 + dy*2 + dx
    assert tokens.shape == (2, 4, 68)
    assert tokens[0, 0, 5 * 4 + 1 * 2 + 0] == x[0, 5, 1, 0]
    assert tokens[1, 3, 16 * 4 + 1 * 2 + 1] == x[1, 16, 3, 3]
    # the output layout is feature = dy*32 + dx*16 + c
    out = torch.randn(1, 4, 64)
    img = unpatchify(out, 2, 2, 2)
    assert img.shape == (1, 16, 4, 4)
    assert img[0, 7, 2 + 1, 0 + 1] == out[0, 2, 1 * 32 + 1 * 16 + 7]
