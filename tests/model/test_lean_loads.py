"""The fast and lean paths: bf16 CPU attention, the denoise-only DiT load, the adapter-only load."""

import pytest
import torch
import torch.nn.functional as F

from anima_rknn.model.config import PRESETS
from anima_rknn.model.io import load_dit, load_llm_adapter, random_dit, save_dit
from anima_rknn.model.layers import QUERY_CHUNK, attention


@pytest.mark.parametrize("tokens", [QUERY_CHUNK - 3, 2 * QUERY_CHUNK + 5])
def test_bf16_attention_matches_fp32_sdpa(tokens):
    # Reference: PyTorch's own fp32 SDPA on the same (bf16-representable) inputs. The bf16 path rounds the
    # scores, the probabilities and the output to bf16: measured ~5e-3 relative; PyTorch's bf16 SDPA ~4e-3.
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn((2, 4, n, 32), generator=g).bfloat16() for n in (tokens, 77, 77))
    reference = F.scaled_dot_product_attention(q.float(), k.float(), v.float()).transpose(1, 2).flatten(2)
    out = attention(q, k, v)
    assert out.dtype == torch.bfloat16 and out.shape == (2, tokens, 128)
    assert ((out.float() - reference).norm() / reference.norm()).item() < 1e-2


@pytest.fixture(scope="module")
def bf16_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("dit") / "dit.safetensors"
    save_dit(random_dit(PRESETS["tiny"], seed=5), path)  # bf16 on disk, like the real file
    return path


def test_denoise_only_load_keeps_host_weights_in_file_dtype_and_the_same_velocity(bf16_file):
    whole, lean = load_dit(bf16_file, torch.bfloat16), load_dit(bf16_file, torch.bfloat16, denoise_only=True)
    assert lean.llm_adapter is None
    assert lean.blocks[0].adaln_modulation_mlp[1].weight.dtype == torch.bfloat16  # used in place from the file
    g = torch.Generator().manual_seed(1)
    x, context = torch.randn((1, 16, 8, 8), generator=g), torch.randn((1, 512, 64), generator=g)
    sigma = torch.tensor([0.7])
    # bf16 weights upcast at use are exactly the fp32 copies of the whole load: same arithmetic, same result.
    assert torch.equal(lean(x, sigma, context), whole(x, sigma, context))
    with pytest.raises(ValueError, match="no LLM adapter"):
        save_dit(lean, bf16_file.parent / "lean.safetensors")


def test_adapter_only_load_matches_the_whole_dit_adapter(bf16_file):
    source, ids = torch.randn(1, 5, 64), torch.tensor([[3, 4, 1]])
    expected = load_dit(bf16_file).llm_adapter.condition(source, ids)
    assert torch.equal(load_llm_adapter(bf16_file).condition(source, ids), expected)


def test_just_in_time_cast_keeps_bf16_weights_and_computes_exactly_fp32(bf16_file, tiny_set):
    """fp32 bodies from a bf16 file: the weights stay the file's (in place), each body casts them as it runs,
    and the velocity is bit-identical to fp32 copies made at load; the engine path gives the same."""
    from anima_rknn.engine import make_engine

    resident = load_dit(bf16_file, torch.float32, denoise_only=True)
    lean = load_dit(bf16_file, torch.float32, denoise_only=True, just_in_time=True)
    assert lean.blocks[0].mlp.layer1.weight.dtype == torch.bfloat16 and lean.body_dtype == torch.float32
    assert resident.blocks[0].mlp.layer1.weight.dtype == torch.float32
    g = torch.Generator().manual_seed(2)
    x, context = torch.randn((1, 16, 8, 8), generator=g), torch.randn((1, 512, 64), generator=g)
    sigma = torch.tensor([0.4])
    assert torch.equal(lean(x, sigma, context), resident(x, sigma, context))
    assert lean.blocks[0].mlp.layer1.weight.dtype == torch.bfloat16  # the cast copies were dropped
    engines = [make_engine(model, "torch", width=64, height=64) for model in (lean, resident)]
    velocities = [engine.velocity(x, 0.4, context) for engine in engines]
    assert torch.equal(*velocities)
    # Not for fp32 files or narrower bodies: those are converted at load as before.
    assert load_dit(bf16_file, torch.float16, just_in_time=True).blocks[0].mlp.layer1.weight.dtype == torch.float16
