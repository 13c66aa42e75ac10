"""The LLM adapter against diffusers' AnimaTextConditioner loaded with the same weights."""

import pytest
import torch

from anima_rknn.model.config import PRESETS
from anima_rknn.model.io import random_dit

diffusers = pytest.importorskip("diffusers")


def test_adapter_matches_diffusers_text_conditioner():
    config = PRESETS["tiny"]
    adapter = random_dit(config, seed=3).llm_adapter
    reference = diffusers.AnimaTextConditioner(
        source_dim=config.adapter_source_dim, target_dim=config.context_dim, model_dim=config.context_dim,
        num_layers=config.adapter_blocks, num_attention_heads=config.adapter_heads,
        mlp_ratio=config.adapter_mlp / config.context_dim, target_vocab_size=config.t5_vocab,
        min_sequence_length=config.context_tokens,
    ).eval()
    reference.load_state_dict(adapter.state_dict(), strict=True)  # same names, no conversion
    g = torch.Generator().manual_seed(0)
    source = torch.randn(1, 7, config.adapter_source_dim, generator=g)
    t5_ids = torch.tensor([[5, 17, 300, 2, 1]])
    with torch.no_grad():
        ours = adapter.condition(source, t5_ids)
        ref = reference(source, t5_ids)
    assert ours.shape == (1, 512, config.context_dim)
    assert ours[:, 5:].abs().max() == 0  # zero-padded to 512 rows
    assert (ours - ref).abs().max() / ref.abs().max() < 1e-5


def test_prompt_weights_scale_rows_and_context_is_cut_at_512():
    config = PRESETS["tiny"]
    adapter = random_dit(config, seed=3).llm_adapter
    source = torch.randn(1, 3, config.adapter_source_dim)
    ids = torch.tensor([[4, 9, 1]])
    plain = adapter.condition(source, ids)
    weighted = adapter.condition(source, ids, torch.tensor([[1.0, 1.5, 1.0]]))
    torch.testing.assert_close(weighted[:, 1], 1.5 * plain[:, 1])
    torch.testing.assert_close(weighted[:, [0, 2]], plain[:, [0, 2]])
    long_ids = torch.randint(0, config.t5_vocab, (1, 600))
    assert adapter.condition(source, long_ids).shape == (1, 512, config.context_dim)
