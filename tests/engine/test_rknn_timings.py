"""Where a pass's time goes on the rknn backend, stage by stage, run on rknn-toolkit2's x86 simulator (in .venv-rknn).

The same code times the board (runtime lite); here the times are the simulator's and the record says so.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from anima_rknn.engine import RknnOptions, SplitEngine
from anima_rknn.engine.backends.base import STAGES
from anima_rknn.engine.backends.rknn import RknnBackend
from anima_rknn.generation.params import GenerationParams
from anima_rknn.generation.pipeline import AnimaPipeline
from anima_rknn.generation.result import stage_text

pytest.importorskip("rknn.api")
from test_rknn_backend import COUNT, HEIGHT, WIDTH, context, dit, run_pass  # noqa: E402, F401  (fixtures too)


def timed_passes(engine: SplitEngine, context: torch.Tensor, sigmas: tuple[float, ...]) -> list[float]:
    """Each pass's wall time, as a caller sees it."""
    walls = []
    for sigma in sigmas:
        began = time.perf_counter()
        run_pass(engine, context, sigma)
        walls.append(time.perf_counter() - began)
    return walls


@pytest.mark.parametrize("bound, steady_loads", [(None, 0), (4, 3)])
def test_every_stage_of_a_pass_is_timed_and_they_add_up_to_its_wall_time(tiny_rknn_set, dit, context, bound,
                                                                         steady_loads):
    backend = RknnBackend(tiny_rknn_set, runtime="simulator", max_resident=bound)
    engine = SplitEngine(dit, backend)
    walls = timed_passes(engine, context, (1.0, 0.7, 0.4))
    engine.close()
    record = engine.stage_record()
    assert record["board_times"] is False and "simulator" in record["source"] and "meaningless" in record["source"]
    assert record["passes"] == 3 and record["first_pass_loads"] == COUNT
    assert record["loads_per_pass"] == steady_loads and record["loads"] == COUNT + 2 * steady_loads
    assert record["loads"] == backend.loads
    for spent, wall in zip(engine.pass_stages, walls):
        assert set(spent) == {*STAGES, "loads"}
        seconds = sum(value for key, value in spent.items() if key != "loads")
        # the stages cover the pass: the caller's wall time differs only by the call itself
        assert seconds <= wall and seconds == pytest.approx(wall, rel=0.05, abs=2e-3)
        assert all(spent[stage] > 0 for stage in ("prepare", "run", "output", "host"))
    first, steady = record["first_pass_s"], record["per_pass_s"]
    # opening a simulator context compiles its subgraph: seconds for the first pass, none after it while resident
    assert first["load"] > 0.1
    if steady_loads:
        assert steady["load"] > 0.1 * steady_loads
    else:
        assert steady["load"] < 0.01
    # the totals hold every pass and the releases at close
    for stage in STAGES:
        in_passes = sum(spent[stage] for spent in engine.pass_stages)
        assert record["total_s"][stage] >= in_passes - 1e-5
    assert np.isclose(record["per_pass_s"]["run"], np.mean([s["run"] for s in engine.pass_stages[1:]]), atol=1e-5)


def test_the_run_record_holds_the_stage_times_labelled_as_the_simulators(tiny_set, tiny_rknn_set):
    params = GenerationParams("a red circle", width=WIDTH, height=HEIGHT, steps=3, cfg=2.0, backend="rknn",
                              subgraphs=tiny_rknn_set, rknn=RknnOptions(runtime="simulator"))
    pipeline = AnimaPipeline(tiny_set)
    pipeline.prepare(params)
    record = pipeline.generate(params).summary(None)
    times = record["timings"]["stages"]
    assert record["transformer_passes"] == times["passes"] == 6 and record["passes_per_model_call"] == 2
    assert times["board_times"] is False and times["first_pass_loads"] == COUNT and times["loads_per_pass"] == 0
    assert set(times["per_pass_s"]) == set(STAGES)
    # the stages are part of the denoising and make most of it on a model this small
    assert 0.5 * record["timings"]["denoise_s"] < sum(times["total_s"].values()) <= record["timings"]["denoise_s"]
    line = stage_text(times)
    assert "meaningless for the board" in line and "0 context loads per pass (first pass 6)" in line
