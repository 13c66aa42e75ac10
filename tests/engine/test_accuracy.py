"""The DiT set verification's parts that need no toolkit: the agreement measure, the recorded torch pass, and
what is flagged and shown. verify-rknn on a converted set runs in tests/cli/test_rknn_cli.py (.venv-rknn)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from anima_rknn.engine.backends.torch import TorchBackend
from anima_rknn.engine.accuracy import SubgraphAccuracy, accuracy_table, agreement, capture_pass, flagged
from anima_rknn.model.config import PRESETS
from anima_rknn.model.io import load_dit, random_dit, save_dit

CONFIG = PRESETS["tiny"]

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: thread hand-offs cost more than they save


def test_agreement_measures_cosine_and_error_relative_to_the_reference_scale():
    cosine, rel_error = agreement(np.array([1.0, 0.0], np.float32), np.array([1.0, 1.0], np.float32))
    assert cosine == pytest.approx(2**-0.5) and rel_error == 1.0
    assert agreement(np.array([2.0, -4.0]), np.array([2.0, -4.0])) == (pytest.approx(1.0), 0.0)


def test_the_captured_pass_holds_each_subgraphs_inputs_and_the_output_they_give(tmp_path):
    path = tmp_path / "tiny.safetensors"
    save_dit(random_dit(CONFIG, seed=3), path, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    latent = torch.randn((1, CONFIG.in_channels, 16, 16), generator=generator)
    context = torch.randn((1, CONFIG.context_tokens, CONFIG.context_dim), generator=generator)
    recorder = capture_pass(load_dit(path, torch.float32), latent, 1.0, context)
    assert sorted(recorder.records) == list(range(3 * CONFIG.blocks))
    replay = TorchBackend(load_dit(path, torch.float32))
    for index, (inputs, output) in recorder.records.items():
        assert output.dtype == np.float32
        np.testing.assert_array_equal(replay.run(index, inputs), output)
    # each record owns its arrays: the self-attention inputs of two blocks are two arrays, not one reused
    assert not np.shares_memory(recorder.records[0][0]["rope_cos"], recorder.records[3][0]["rope_cos"])


def test_the_subgraphs_below_the_cosine_are_flagged_and_marked_in_the_table():
    results = [SubgraphAccuracy(0, "b00_self_attn.rknn", 0.99999, 1e-3),
               SubgraphAccuracy(1, "b00_cross_attn.rknn", 0.5, 0.8, "w8a8", 0.9991)]
    assert flagged(results, 0.999) == ["b00_cross_attn.rknn"]
    assert accuracy_table(results, 0.999).splitlines() == [
        "  #  subgraph               precision   held out      cosine  max rel err",
        "  0  b00_self_attn.rknn       float16          -   0.9999900     1.00e-03",
        "  1  b00_cross_attn.rknn         w8a8  0.9991000   0.5000000     8.00e-01  BELOW 0.999"]
