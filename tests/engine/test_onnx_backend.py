"""The ONNX Runtime backend on an exported tiny set against the torch split engine and torch bodies."""

import dataclasses

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from anima_rknn.engine import make_engine  # noqa: E402
from anima_rknn.engine.backends.onnx import OnnxBackend  # noqa: E402
from anima_rknn.engine.backends.torch import TorchBackend  # noqa: E402
from anima_rknn.engine.split import rope_inputs  # noqa: E402
from anima_rknn.errors import AnimaError  # noqa: E402
from anima_rknn.export.onnx import export_subgraphs, load_manifest  # noqa: E402
from anima_rknn.model.config import PRESETS  # noqa: E402
from anima_rknn.model.io import load_dit, random_dit, save_dit  # noqa: E402
from anima_rknn.model.layers import rope_tables  # noqa: E402

CONFIG = PRESETS["tiny"]
WIDTH, HEIGHT = 128, 96  # latent 12x16 -> grid 6x8 -> 48 tokens


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("onnx_backend")
    dit_path = root / "tiny.safetensors"
    save_dit(random_dit(CONFIG, seed=5), dit_path)
    sets = {dtype: export_subgraphs(dit_path, WIDTH, HEIGHT, root / dtype, dtype, progress=False).parent
            for dtype in ("float32", "float16")}
    return dit_path, load_dit(dit_path), sets


def inputs_for(index: int, generator: torch.Generator) -> dict[str, np.ndarray]:
    tokens = (WIDTH // 16) * (HEIGHT // 16)
    inputs = {"x": torch.randn((1, tokens, CONFIG.hidden), generator=generator).numpy()}
    if index % 3 == 0:
        inputs.update(rope_inputs(rope_tables(CONFIG.head_dim, HEIGHT // 16, WIDTH // 16)))
    if index % 3 == 1:
        inputs["context"] = torch.randn((1, CONFIG.context_tokens, CONFIG.context_dim), generator=generator).numpy()
    return inputs


def test_each_fp32_subgraph_equals_its_torch_body(model):
    dit_path, dit, sets = model
    onnx = OnnxBackend(sets["float32"], load_manifest(sets["float32"], dit_path=dit_path, width=WIDTH, height=HEIGHT))
    reference = TorchBackend(dit, cache_context_kv=False)
    generator = torch.Generator().manual_seed(0)
    for index in range(3 * CONFIG.blocks):
        inputs = inputs_for(index, generator)
        y, y_ref = onnx.run(index, inputs), reference.run(index, inputs)
        assert y.dtype == np.float32 and y.shape == y_ref.shape
        # fp32 on both sides, different kernels: only summation order differs.
        np.testing.assert_allclose(y, y_ref, rtol=0, atol=1e-5 * np.abs(y_ref).max())


@pytest.mark.parametrize(("dtype", "bound"), [("float32", 1e-5), ("float16", 2e-3)])
def test_onnx_engine_equals_torch_engine(model, dtype, bound):
    """Measured relative errors: fp32 ~4e-7 (summation order), fp16 ~3e-4 (under one fp16 unit roundoff,
    4.9e-4, since the residual stream, norms and gates stay fp32 on the host)."""
    dit_path, dit, sets = model
    generator = torch.Generator().manual_seed(1)
    x = torch.randn((1, CONFIG.in_channels, HEIGHT // 8, WIDTH // 8), generator=generator)
    context = torch.randn((1, CONFIG.context_tokens, CONFIG.context_dim), generator=generator)
    engine = make_engine(dit, "onnx", width=WIDTH, height=HEIGHT, subgraphs=sets[dtype], dit_path=dit_path)
    reference = make_engine(dit, width=WIDTH, height=HEIGHT)
    for sigma in (1.0, 0.2):
        v, v_ref = engine.velocity(x, sigma, context), reference.velocity(x, sigma, context)
        assert torch.isfinite(v).all()
        assert ((v - v_ref).norm() / v_ref.norm()).item() <= bound
    assert (engine.passes, engine.subgraph_runs) == (2, 2 * 3 * CONFIG.blocks)
    engine.close()


def test_onnx_engine_refuses_a_dit_of_other_sizes(model):
    _, _, sets = model
    other = random_dit(dataclasses.replace(CONFIG, blocks=3), seed=0)
    with pytest.raises(AnimaError, match="are for a DiT with .*'blocks': 2.*, this one has .*'blocks': 3"):
        make_engine(other, "onnx", width=WIDTH, height=HEIGHT, subgraphs=sets["float32"])
