"""The split engine with the torch backend against diffusers' CosmosTransformer3DModel and against the
monolithic DiT forward (itself checked against diffusers in tests/model/test_dit.py)."""

import copy

import numpy as np
import pytest
import torch

from anima_rknn.engine import make_engine
from anima_rknn.engine.backends.torch import TorchBackend
from anima_rknn.engine.split import FirstBlockProbe, SplitEngine
from anima_rknn.errors import AnimaError
from anima_rknn.model.config import PRESETS
from anima_rknn.model.io import load_dit, random_dit, save_dit

CONFIG = PRESETS["tiny"]


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: thread hand-offs cost more than they save


@pytest.fixture(scope="module")
def dit(tmp_path_factory):
    path = tmp_path_factory.mktemp("dit") / "tiny.safetensors"
    save_dit(random_dit(CONFIG, seed=3), path, dtype=torch.float32)
    return load_dit(path)


def contexts(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    shape = (1, CONFIG.context_tokens, CONFIG.context_dim)
    return torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)


def latent(h: int = 16, w: int = 16, seed: int = 1) -> torch.Tensor:
    return torch.randn((1, CONFIG.in_channels, h, w), generator=torch.Generator().manual_seed(seed))


def monolithic(dit, x: torch.Tensor, sigma: float, context: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return dit(x, torch.tensor([sigma]), context)


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def simple_sigmas(steps: int, shift: float = 3.0) -> list[float]:
    """The "simple" schedule with sigma shift, as anima.md writes it."""
    table = [shift * t / (1 + (shift - 1) * t) for t in (i / 1000 for i in range(1, 1001))]
    return [table[-(1 + int(k * 1000 / steps))] for k in range(steps)] + [0.0]


def euler_cfg(velocity, x: torch.Tensor, cond: torch.Tensor, uncond: torch.Tensor, steps: int = 20,
              cfg: float = 4.0) -> torch.Tensor:
    sigmas = simple_sigmas(steps)
    for sigma, sigma_next in zip(sigmas[:-1], sigmas[1:]):
        v_cond, v_uncond = velocity(x, sigma, cond), velocity(x, sigma, uncond)
        x = x + (sigma_next - sigma) * (v_uncond + cfg * (v_cond - v_uncond))
    return x


@pytest.mark.parametrize(("h", "w"), [(16, 16), (12, 20), (9, 14)])
def test_one_pass_equals_monolithic(dit, h, w):
    cond, _ = contexts()
    x = latent(h, w)
    engine = make_engine(dit, width=w * 8, height=h * 8)
    for sigma in (1.0, 0.37):
        assert relative_error(engine.velocity(x, sigma, cond), monolithic(dit, x, sigma, cond)) <= 1e-5


def test_one_pass_equals_diffusers(dit):
    diffusers_reference = pytest.importorskip("diffusers_reference")
    reference = diffusers_reference.diffusers_dit(CONFIG, dit.state_dict())
    cond, _ = contexts()
    cond[:, 20:] = 0  # zero-padded rows, attended unmasked
    x = latent(12, 16)
    v = make_engine(dit, width=128, height=96).velocity(x, 0.6, cond)
    with torch.no_grad():
        ref = reference(x[:, :, None], torch.tensor([0.6]), cond, padding_mask=torch.zeros(1, 1, 12, 16),
                        return_dict=False)[0][:, :, 0]
    assert relative_error(v, ref) <= 1e-5


def test_sampling_run_equals_monolithic_and_counts_runs(dit):
    cond, uncond = contexts()
    noise = latent()
    engine = make_engine(dit, width=128, height=128)
    split = euler_cfg(engine.velocity, noise, cond, uncond)
    reference = euler_cfg(lambda x, s, c: monolithic(dit, x, s, c), noise, cond, uncond)
    assert torch.isfinite(split).all()
    assert relative_error(split, reference) <= 1e-5
    # 20 steps x (cond + uncond) batch-1 passes, 3 bodies per block each.
    assert engine.passes == 40
    assert engine.subgraph_runs == 40 * 3 * CONFIG.blocks
    engine.reset_counters()
    assert (engine.passes, engine.subgraph_runs) == (0, 0)


@pytest.mark.parametrize(("dtype", "bound"), [(torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
def test_low_precision_bodies_stay_close(dit, dtype, bound):
    """Measured relative errors: fp16 ~4.7e-4, bf16 ~3.5e-3 (about one unit roundoff of each format)."""
    cond, _ = contexts()
    x = latent()
    low = copy.deepcopy(dit)
    engine = SplitEngine(low, TorchBackend(low, dtype))
    for sigma in (1.0, 0.5, 0.05):
        v = engine.velocity(x, sigma, cond)
        assert torch.isfinite(v).all()
        assert relative_error(v, monolithic(dit, x, sigma, cond)) <= bound


def count_calls(monkeypatch, obj, name: str) -> list[int]:
    """Spy on a real method: it still runs, the list grows by one per call."""
    calls, original = [], getattr(obj, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(obj, name, counted)
    return calls


@pytest.mark.parametrize("share", [True, False])
def test_modulations_once_per_sigma(dit, monkeypatch, share):
    cond, uncond = contexts()
    x = latent()
    engine = SplitEngine(dit, TorchBackend(dit), share_modulations=share)
    calls = count_calls(monkeypatch, dit, "modulations")
    runs = [(sigma, c, engine.velocity(x, sigma, c)) for sigma in (0.9, 0.6) for c in (cond, uncond)]
    assert len(calls) == (2 if share else 4)
    for sigma, c, v in runs:
        assert relative_error(v, monolithic(dit, x, sigma, c)) <= 1e-5


def test_context_key_values_once_per_prompt_and_never_stale(dit, monkeypatch):
    cond, uncond = contexts()
    x = latent()
    engine = make_engine(dit, width=128, height=128)
    calls = count_calls(monkeypatch, dit, "context_key_values")
    for sigma in (0.9, 0.6, 0.3):
        engine.velocity(x, sigma, cond)
        engine.velocity(x, sigma, uncond)
    assert len(calls) == 2
    cond.mul_(-0.5)  # same tensor, new values: cached K/V must not be reused
    v = engine.velocity(x, 0.3, cond)
    assert len(calls) == 3
    assert relative_error(v, monolithic(dit, x, 0.3, cond)) <= 1e-5


def test_uncached_key_values_give_the_same_velocity(dit):
    cond, _ = contexts()
    x = latent()
    cached = make_engine(dit, width=128, height=128).velocity(x, 0.5, cond)
    uncached = SplitEngine(dit, TorchBackend(dit, cache_context_kv=False)).velocity(x, 0.5, cond)
    assert relative_error(uncached, cached) <= 1e-6


def test_refusals(dit):
    cond, _ = contexts()
    engine = make_engine(dit, width=128, height=128)
    with pytest.raises(AnimaError, match="engine set up for 128x128 images, got a latent for 128x96"):
        engine.velocity(latent(12, 16), 0.5, cond)
    with pytest.raises(ValueError, match="batch-1"):
        engine.velocity(latent().expand(2, -1, -1, -1), 0.5, cond.expand(2, -1, -1))
    with pytest.raises(AnimaError, match="unknown backend 'cuda'"):
        make_engine(dit, "cuda", width=128, height=128)
    with pytest.raises(AnimaError, match="needs an exported subgraph folder"):
        make_engine(dit, "onnx", width=128, height=128)


def test_a_fixed_run_gives_the_same_velocity_with_its_weights_freed(tmp_path):
    """fix_run computes every AdaLN modulation and prompt K/V up front and frees those weights."""
    path = tmp_path / "tiny.safetensors"
    save_dit(random_dit(CONFIG, seed=4), path)
    x = torch.randn(1, 16, 8, 8, generator=torch.Generator().manual_seed(1))
    cond, uncond = contexts(1)
    reference = make_engine(load_dit(path), "torch", width=64, height=64)
    expected = [reference.velocity(x, s, c) for s in (1.0, 0.5) for c in (cond, uncond)]

    lean = load_dit(path, denoise_only=True)
    engine = make_engine(lean, "torch", width=64, height=64)
    engine.fix_run([1.0, 0.5], [cond, uncond])
    assert lean.blocks[0].adaln_modulation_mlp is None and lean.blocks[1].cross_attn.k_proj is None
    got = [engine.velocity(x, s, c) for s in (1.0, 0.5) for c in (cond, uncond)]
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="not in it"):
        engine.velocity(x, 1.0, cond + 1)


def test_a_partial_pass_is_the_monolithic_forward_cut_after_its_first_block(dit):
    """first_block() against the monolithic forward of the same DiT with one block left and its epilogue cut
    off; a full pass asked to keep them leaves the same tokens, and both are counted for what they ran."""
    cond, _ = contexts()
    x = latent(12, 20)
    cut = copy.deepcopy(dit)
    cut.blocks = cut.blocks[:1]
    cut.epilogue = lambda state: state.tokens
    engine = make_engine(dit, width=160, height=96)
    for sigma in (1.0, 0.37):
        tokens = engine.first_block(x, sigma, cond)
        assert relative_error(tokens, monolithic(cut, x, sigma, cond)) <= 1e-5
        engine.velocity(x, sigma, cond, keep_first_block=True)
        assert torch.equal(engine.first_block_tokens, tokens)
    assert (engine.passes, engine.partial_passes) == (2, 2)
    assert engine.subgraph_runs == 2 * 3 * CONFIG.blocks + 2 * 3
    probe = FirstBlockProbe(engine, cond)
    assert np.array_equal(probe(x.numpy(), 0.37), tokens.numpy()) and np.array_equal(probe.last(), tokens.numpy())
    with pytest.raises(RuntimeError, match="no full pass"):
        FirstBlockProbe(make_engine(dit, width=160, height=96), cond).last()
