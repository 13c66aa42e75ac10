"""A resumed run's summary counts its transformer passes over the same span as its steps: the whole run, as the
uninterrupted run counts them."""

from __future__ import annotations

import dataclasses

import pytest
from test_resume import BASE, stop_after

from anima_rknn.generation.pipeline import AnimaPipeline
from anima_rknn.generation.resume import read_state


@pytest.mark.parametrize("cache, cfg", [("spectrum", 4.0), ("none", 1.0)])
def test_a_resumed_summary_counts_passes_over_the_whole_run(tiny_set, tmp_path, one_thread, cache, cfg):
    pipeline = AnimaPipeline(tiny_set)
    params = dataclasses.replace(BASE, cache=cache, cfg=cfg)
    whole = pipeline.generate(params).summary(None)
    stopped = stop_after(pipeline, params, tmp_path / "x.png.state", 5)
    resumed = pipeline.generate(params, resume=read_state(stopped.path)).summary(None)
    assert resumed["computed_steps"] == whole["computed_steps"]
    for count in ("transformer_passes", "subgraph_runs"):
        assert resumed[count] == whole[count], count
    assert resumed["transformer_passes"] == len(whole["computed_steps"]) * (2 if cfg != 1.0 else 1)
