"""The `auto` cache's quality point on the shipped demo model, pinned: the first 12 of the README's 48 held-out
prompts (benchmarks/auto_cache.py; noise seeds 1000 + i), 20 steps, CFG 4, each image against the uncached
one from the same noise. A subset, so that it runs in seconds; the README's table has all 48."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from anima_rknn.bench.metrics import psnr
from anima_rknn.demo import demo_model_dir
from anima_rknn.demo.dataset import IMAGE_SIZE
from anima_rknn.demo.evaluate import prompt_set
from anima_rknn.generation.params import GenerationParams
from anima_rknn.generation.pipeline import AnimaPipeline
from anima_rknn.model.model_set import from_model_dir

PROMPTS = 12
QUALITY_POINT = {"budget": 10}
# Measured on these 12 prompts: mean PSNR 48.3 dB, worst 41.3 dB, 20 passes each (all 48: 46.1 / 30.1 dB);
# bounds 3 dB below.
MIN_PSNR = (45.3, 38.3)


@pytest.fixture(scope="module")
def runs():
    torch.set_num_threads(1)
    pipeline = AnimaPipeline(from_model_dir(demo_model_dir()), keep_dit=True)
    pairs = []
    for i, spec in enumerate(prompt_set(PROMPTS)):
        base = GenerationParams(prompt=spec.caption, width=IMAGE_SIZE, height=IMAGE_SIZE, steps=20, cfg=4.0,
                                seed=1000 + i)
        conditioning = pipeline.encode(base.prompt, base.negative, base.dtype)
        uncached = pipeline.denoise(conditioning, base)
        auto = pipeline.denoise(conditioning, dataclasses.replace(base, cache="auto", cache_options=QUALITY_POINT))
        pairs.append((np.asarray(pipeline.decode(uncached.sample.latent)[0]),
                      np.asarray(pipeline.decode(auto.sample.latent)[0]), auto))
    return pairs


def test_quality_point_holds_its_figures(runs) -> None:
    values = [psnr(base, cached) for base, cached, _ in runs]
    assert np.mean(np.minimum(values, 100.0)) >= MIN_PSNR[0] and min(values) >= MIN_PSNR[1], values
    assert all(auto.transformer_passes == 2 * QUALITY_POINT["budget"] for _, _, auto in runs)  # spent, not exceeded
    assert all(auto.sample.error_estimate > 0 for _, _, auto in runs)

