"""`--dtype` as a user meets it: auto is the default, an explicit dtype this CPU runs slowly warns once."""

import json

from probe_cache import write_cache

from anima_rknn.core import cpu_speed


def test_an_explicit_slow_dtype_runs_with_one_warning_line(tmp_path, monkeypatch, run_cli, model_dir):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    write_cache({"fp32": 122.0, "bf16": 0.3, "fp16": 0.3})  # an AVX2-only machine
    assert cpu_speed.slow_dtype_warning("fp32") is None and cpu_speed.slow_dtype_warning("auto") is None
    out = tmp_path / "x.png"
    run = run_cli("generate", "--model", model_dir, "-p", "a cat", "--steps", "1", "-W", "32", "-H", "32",
                  "--dtype", "bf16", "--out", out, "--json")
    assert run.code == 0 and out.exists() and json.loads(run.out)["dtype"] == "bf16"
    warnings = [line for line in run.err.splitlines() if line.startswith("warning:")]
    assert warnings == ["warning: bf16 matmuls run 407x slower than fp32 on this CPU (0.3 vs 122.0 GFLOP/s); "
                        "--dtype auto would pick fp32"]


def test_auto_is_the_default_and_the_json_reports_the_choice(tmp_path, monkeypatch, run_cli, model_dir):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    write_cache({"fp32": 122.0, "bf16": 0.3, "fp16": 0.3})
    run = run_cli("generate", "--model", model_dir, "-p", "a cat", "--steps", "1", "-W", "32", "-H", "32",
                  "--out", tmp_path / "x.png", "--json")
    assert run.code == 0 and json.loads(run.out)["dtype"] == "fp32" and "warning" not in run.err
