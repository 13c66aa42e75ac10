"""--dtype auto: the body dtype this CPU runs fastest, measured by a short matmul probe cached per machine."""

import json

import pytest
from probe_cache import write_cache

from anima_rknn.core import cpu_speed
from anima_rknn.generation.params import GenerationParams


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path


def test_the_probe_measures_every_dtype_and_is_cached_per_machine(fresh_cache):
    speeds = cpu_speed.probe()
    assert set(speeds) == {"fp32", "bf16", "fp16"} and all(v > 0 for v in speeds.values())
    cached = json.loads(cpu_speed.cache_path().read_text())
    assert cached["gflops"] == speeds and cached["machine"] == cpu_speed.machine_key()
    write_cache({"fp32": 100.0, "bf16": 1.0, "fp16": 2.0})  # the next call reads, not measures
    assert cpu_speed.probe() == {"fp32": 100.0, "bf16": 1.0, "fp16": 2.0}


@pytest.mark.parametrize("content", ["{not json", json.dumps({"format": "other"}), "[]", json.dumps(
    {"format": "anima-rknn-dtype-probe/1", "machine": "another machine", "gflops": {"fp32": 1, "bf16": 9e9,
                                                                                   "fp16": 1}})])
def test_a_damaged_or_foreign_cache_is_measured_again(fresh_cache, content):
    cpu_speed.cache_path().parent.mkdir(parents=True)
    cpu_speed.cache_path().write_text(content)
    speeds = cpu_speed.probe()
    assert speeds["bf16"] < 1e9 and json.loads(cpu_speed.cache_path().read_text())["gflops"] == speeds


def test_auto_picks_bf16_only_where_it_is_clearly_faster(fresh_cache):
    assert cpu_speed.fastest_dtype({"fp32": 100.0, "bf16": 300.0, "fp16": 1.0}) == "bf16"  # AVX-512 BF16
    assert cpu_speed.fastest_dtype({"fp32": 122.0, "bf16": 0.3, "fp16": 0.3}) == "fp32"  # AVX2 only
    assert cpu_speed.fastest_dtype({"fp32": 100.0, "bf16": 110.0, "fp16": 1.0}) == "fp32"  # not worth its rounding
    write_cache({"fp32": 122.0, "bf16": 0.3, "fp16": 0.3})
    assert GenerationParams(prompt="x", dtype="auto").dtype == "fp32"
    write_cache({"fp32": 100.0, "bf16": 300.0, "fp16": 1.0})
    assert GenerationParams(prompt="x", dtype="auto").dtype == "bf16"
    assert GenerationParams(prompt="x", dtype="fp16").dtype == "fp16"  # an explicit choice is kept
