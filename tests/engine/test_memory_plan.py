"""Memory planner against the figures written down in spec/rknn.md and spec/anima.md."""

from __future__ import annotations

import pytest

from anima_rknn.engine.memory_plan import (
    HOST_RUNTIME_BYTES,
    NPU_DOMAIN_BYTES,
    loads_per_pass,
    parse_size,
    pinned_contexts,
    plan_memory,
    plan_vae,
    predict_memory,
    size,
)
from anima_rknn.errors import AnimaError

# Anima DiT (spec/anima.md): hidden 2048, 28 blocks, MLP 8192, context 1024 wide.
HIDDEN, BLOCKS, MLP = 2048, 28, 8192
BOARD_BYTES = 8 * 10**9  # ROCK 5C 8 GB
MB = 10**6


def by_kind(plan, field):
    return {c.kind: getattr(c, field) for c in plan.contexts}


def test_activations_reproduce_the_measured_4096_token_figures_and_scale_to_1024():
    full = by_kind(predict_memory(HIDDEN, BLOCKS, 4096, MLP), "activation_bytes")
    assert full == {"self_attn": 227 * MB, "cross_attn": 119 * MB, "mlp": 272 * MB}
    quarter = by_kind(predict_memory(HIDDEN, BLOCKS, 1024, MLP), "activation_bytes")
    assert quarter == {kind: value / 4 for kind, value in full.items()}


def test_weights_match_the_linear_shapes_and_the_spec_sizes():
    plan = predict_memory(HIDDEN, BLOCKS, 1024, MLP)
    weights = by_kind(plan, "weight_bytes")
    # q,k,v,o 2048x2048; q,o 2048x2048 + k,v 1024->2048; 2048->8192->2048; fp16
    assert weights == {"self_attn": 2 * 4 * 2048 * 2048, "cross_attn": 2 * (2 * 2048 * 2048 + 2 * 1024 * 2048),
                       "mlp": 2 * 2 * 2048 * 8192}
    # spec: self-attention and FFN .rknn files are ~35-70 MB each
    assert 30 * MB < weights["self_attn"] < weights["mlp"] < 75 * MB
    # spec: the 2B fp16 weights alone nearly fill the ~4 GB NPU domain
    total = sum(c.weight_bytes for c in plan.contexts)
    assert len(plan.contexts) == 84 and 0.75 * NPU_DOMAIN_BYTES < total < NPU_DOMAIN_BYTES


def test_full_model_does_not_fit_the_board_and_the_bound_respects_budget_and_npu_domain():
    for tokens in (1024, 4096):
        plan = predict_memory(HIDDEN, BLOCKS, tokens, MLP, budget_bytes=BOARD_BYTES)
        everything = plan.host_bytes + sum(c.total_bytes for c in plan.contexts)
        assert everything > BOARD_BYTES  # spec: 84 live contexts do not fit 8 GB
        assert 1 <= plan.max_resident < 84
        assert plan.peak_bytes <= BOARD_BYTES and plan.npu_peak_bytes <= NPU_DOMAIN_BYTES
        # k resident = contexts 0..k-2 pinned + the costliest of the rest in the last slot; one more breaks a limit
        totals = [c.total_bytes for c in plan.contexts]
        npu = [c.npu_bytes for c in plan.contexts]
        k = plan.max_resident
        assert plan.peak_bytes == plan.host_bytes + sum(totals[:k - 1]) + max(totals[k - 1:])
        assert plan.npu_peak_bytes == sum(npu[:k - 1]) + max(npu[k - 1:])
        assert (plan.host_bytes + sum(totals[:k]) + max(totals[k:]) > BOARD_BYTES
                or sum(npu[:k]) + max(npu[k:]) > NPU_DOMAIN_BYTES)
        # every pass reloads the 84-(k-1) contexts that are not pinned
        assert (plan.loads_per_pass, plan.releases_per_pass) == (84 - k + 1, 84 - k + 1)
    assert (predict_memory(HIDDEN, BLOCKS, 4096, MLP, BOARD_BYTES).max_resident
            < predict_memory(HIDDEN, BLOCKS, 1024, MLP, BOARD_BYTES).max_resident)


@pytest.mark.parametrize(("bound", "pinned", "loads"),
                         [(None, 84, 0), (84, 84, 0), (100, 84, 0), (83, 82, 2), (10, 9, 75), (2, 1, 83), (1, 0, 84)])
def test_k_minus_one_pinned_contexts_and_the_loads_they_save(bound, pinned, loads):
    assert pinned_contexts(84, bound) == pinned and loads_per_pass(84, bound) == loads


@pytest.mark.parametrize(("text", "value"), [("8GB", 8 * 10**9), ("6GiB", 6 << 30), ("6g", 6 << 30),
                                             ("512 MB", 512 * 10**6), ("1.5GB", 1_500_000_000), ("4096", 4096)])
def test_sizes_read_decimal_and_binary_units(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["eight", "8 XB", "-1GB", "IB", ""])
def test_unreadable_sizes_are_one_clear_line(text):
    with pytest.raises(AnimaError, match="as a memory size"):
        parse_size(text)


def test_a_budget_below_one_context_plus_host_names_the_minimum():
    plan = predict_memory(HIDDEN, BLOCKS, 4096, MLP)
    minimum = plan.host_bytes + max(c.total_bytes for c in plan.contexts)
    with pytest.raises(AnimaError, match=r"at least \d+\.\d+ GiB is needed"):
        predict_memory(HIDDEN, BLOCKS, 4096, MLP, budget_bytes=minimum - 1)
    assert predict_memory(HIDDEN, BLOCKS, 4096, MLP, budget_bytes=minimum).max_resident == 1


def tiny_manifest(with_compiler_figures: bool) -> dict:
    subgraphs, records = [], []
    for index, kind in enumerate(("self_attn", "cross_attn", "mlp") * 2):
        subgraphs.append({"index": index, "block": index // 3, "kind": kind, "file": f"{index}.onnx"})
        record = {"index": index, "rknn_file": f"{index}.rknn", "rknn_bytes": 1000 + index}
        if with_compiler_figures:
            record.update(internal_bytes=5000 + index, weight_bytes=800 + index)
        records.append(record)
    return {"format": "anima-rknn-subgraphs/1",
            "model": {"blocks": 2, "hidden": 128, "heads": 2, "head_dim": 64, "context_dim": 1024},
            "tokens": 64, "context_tokens": 512, "subgraphs": subgraphs, "rknn": {"subgraphs": records}}


def test_manifest_plan_prefers_the_compilers_figures():
    plan = plan_memory(tiny_manifest(with_compiler_figures=True), None)
    assert plan.activation_source == "compiler"
    assert [(c.weight_bytes, c.activation_bytes, c.file_bytes) for c in plan.contexts] == [
        (800 + i, 5000 + i, 1000 + i) for i in range(6)]
    assert plan.max_resident == 6 and plan.loads_per_pass == 0  # everything fits: loaded once, never again
    text = plan.describe()
    assert "activations compiler" in text and "resident contexts 6 of 6" in text
    assert all(kind in text for kind in ("self_attn", "cross_attn", "mlp"))


def test_manifest_without_conversion_matches_the_dimension_prediction():
    manifest = tiny_manifest(with_compiler_figures=False)
    del manifest["rknn"]
    from_manifest = plan_memory(manifest, None)
    from_dims = predict_memory(128, 2, 64, 4 * 128)
    assert from_manifest.activation_source == "spec-scaled"
    assert from_manifest.contexts == from_dims.contexts and from_manifest.peak_bytes == from_dims.peak_bytes


def vae_manifest(weights: int, internal: int) -> dict:
    """A converted VAE set's manifest as far as the planner reads it."""
    record = {"index": 0, "rknn_file": "vae_decoder.rknn", "rknn_bytes": weights + (8 << 20),
              "weight_bytes": weights, "internal_bytes": internal}
    return {"format": "anima-rknn-vae/1", "tile": 512, "rknn": {"subgraphs": [record]}}


def test_the_vae_stage_takes_the_dits_place_and_the_run_peak_is_the_larger_stage():
    # The compiler's figures for the full-size decoder's 512-px tile (README).
    stage = plan_vae(vae_manifest(50_608_742, 486_539_264), 512, 512, parse_size("8GB"))
    assert stage.activation_source == "compiler"
    assert stage.peak_bytes == HOST_RUNTIME_BYTES + 32 * 512 * 512 + 50_608_742 + 486_539_264 + 50_608_742 + (8 << 20)
    dit = predict_memory(2048, 28, 1024, 8192, parse_size("8GB"))
    assert stage.peak_bytes < dit.peak_bytes
    assert f"whole run (DiT contexts closed before the decode): peak {size(dit.peak_bytes)}" in stage.describe(dit)


def test_a_vae_stage_that_cannot_fit_is_refused_in_one_line():
    with pytest.raises(AnimaError, match="cannot hold the VAE decode stage"):
        plan_vae(vae_manifest(50 << 20, 500 << 20), 512, 512, parse_size("1GB"))
    with pytest.raises(AnimaError, match="more than the NPU's 4.00 GiB address space: export a smaller tile"):
        plan_vae(vae_manifest(50 << 20, 5 << 30), 512, 512, None)
    with pytest.raises(AnimaError, match="from its converted set"):
        plan_vae({"format": "anima-rknn-vae/1", "tile": 512}, 512, 512, None)
