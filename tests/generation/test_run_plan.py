"""A run is planned once: pipeline.generate validates its settings once and prepares once (the VAE plan, the
subgraph sets, the cache fit's refusals); each denoise pass takes the validated settings (a hires run's two passes
too: render() calls denoise() per pass, and denoise() validates nothing)."""

from __future__ import annotations

import collections

import torch

from anima_rknn.demo import demo_model_dir
from anima_rknn.generation.params import GenerationParams
from anima_rknn.generation.pipeline import AnimaPipeline
from anima_rknn.model.model_set import from_model_dir


def test_generate_validates_and_prepares_once(monkeypatch):
    torch.set_num_threads(1)
    counts = collections.Counter()
    validate, prepare = GenerationParams.validate, AnimaPipeline.prepare

    def counted_validate(self):
        counts["validate"] += 1
        return validate(self)

    def counted_prepare(self, params):
        counts["prepare"] += 1
        return prepare(self, params)

    monkeypatch.setattr(GenerationParams, "validate", counted_validate)
    monkeypatch.setattr(AnimaPipeline, "prepare", counted_prepare)
    params = GenerationParams(prompt="a red circle", steps=3, dtype="fp32", backend="torch", vae_backend="torch",
                              cache="auto")
    result = AnimaPipeline(from_model_dir(demo_model_dir())).generate(params)
    assert result.image is not None
    assert counts == {"validate": 1, "prepare": 1}
