"""`anima-rknn bench` as a user runs it: the output folder, strict JSON, the verdict's exit code, one-line errors."""

import json
import re

import numpy as np
import pytest
from PIL import Image

from anima_rknn.demo.evaluate import prompt_set

SMALL = ("--width", "32", "--height", "32")


def test_none_against_baseline_is_identical_and_passes(run_cli, model_dir, tmp_path):
    out = tmp_path / "bench"
    result = run_cli("bench", "--model", model_dir, "-p", "a red circle", *SMALL, "--steps", "3", "--seed", "11",
                     "--cache", "none", "--out", out, "--json", "--fail-on-verdict")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert report == json.loads((out / "report.json").read_text())
    comparison = report["seeds"][0]["cached"]["none"]["vs_baseline"]
    assert comparison["psnr_db"] == "inf" and comparison["latent_error"]["max_abs"] == 0.0
    assert report["verdict"]["passed"] is True and "PASS: none is safe here" in result.err
    assert {p.name for p in out.iterdir()} == {"report.json", "report.md", "baseline_seed11.png", "none_seed11.png",
                                               "compare_none_seed11.png", "steps_seed11.png"}
    with Image.open(out / "baseline_seed11.png") as image:
        assert "Seed: 11" in image.text["parameters"] and "Cache: none" in image.text["parameters"]
    assert "**Verdict: PASS" in (out / "report.md").read_text()
    stages = report["seeds"][0]["baseline"]["stages"]  # where the baseline's passes went, not the board's times
    assert stages["passes"] == report["seeds"][0]["baseline"]["transformer_passes"] == 6
    assert stages["board_times"] is False and stages["per_pass_s"]["run"] > 0
    assert "- baseline: stage times per pass: load 0.000s" in (out / "report.md").read_text()


def test_failed_verdict_exits_3_only_when_asked(run_cli, model_dir, tmp_path):
    args = ("bench", "--model", model_dir, "-p", "cat", *SMALL, "--steps", "6", "--cache", "spectrum",
            "--seeds", "1,2", "--min-psnr", "1000")
    failing = run_cli(*args, "--out", tmp_path / "a", "--fail-on-verdict")
    assert failing.code == 3, failing.err
    assert "FAIL: spectrum is not safe here" in failing.out
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    assert [entry["seed"] for entry in report["seeds"]] == [1, 2]
    assert set(report["aggregate"]) == {"spectrum"} and report["aggregate"]["spectrum"]["seeds_passed"] == 0
    assert "## All seeds" in (tmp_path / "a" / "report.md").read_text()
    again = ("bench", "--model", model_dir, "-p", "cat", *SMALL, "--steps", "1", "--cache", "none")
    assert run_cli(*again, "--out", tmp_path / "a").code == 1
    assert run_cli(*again, "--out", tmp_path / "a", "--overwrite").code == 0


def _one_line_error(result, text: str) -> None:
    assert result.code == 1 and "Traceback" not in result.err
    assert result.err.startswith("error: ") and text in result.err and result.err.count("\n") == 1


def test_errors_before_any_work(run_cli, model_dir, tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    base = ("bench", "--model", model_dir, "-p", "cat", *SMALL)
    _one_line_error(run_cli(*base, "--out", full), "not empty")
    assert [p.name for p in full.iterdir()] == ["keep.txt"]
    _one_line_error(run_cli(*base, "--cache", "spectrum,fastest", "--out", tmp_path / "b"), "unknown cache")
    _one_line_error(run_cli(*base, "--cache", "reuse", "--cache-option", "w=0.2", "--out", tmp_path / "c"),
                    "does not apply")
    _one_line_error(run_cli(*base, "--seeds", "1,one", "--out", tmp_path / "d"), "such as 1-8")
    assert not (tmp_path / "b").exists() and not (tmp_path / "d").exists()


def test_a_sweep_over_an_init_image(run_cli, model_dir, tmp_path):
    image = tmp_path / "init.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(image)
    out = tmp_path / "bench"
    result = run_cli("bench", "--model", model_dir, "-p", "a red circle", "--init-img", image, "--strength", "0.6",
                     "--steps", "10", "--seed", "11", "--cache", "spectrum", "--out", out, "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    settings = report["settings"]
    assert (settings["width"], settings["height"], settings["steps"], settings["steps_run"]) == (32, 32, 10, 6)
    assert settings["init_image"]["name"] == str(image) and settings["strength"] == 0.6
    base = report["seeds"][0]["baseline"]
    assert base["computed_steps"] == [1, 2, 3, 4, 5, 6] and len(base["step_times_s"]) == 6
    assert base["timings_s"]["vae_encode"]["median"] > 0
    text = (out / "report.md").read_text()
    assert f"32x32, 6 of 10 steps (strength 0.6), img2img of {image}" in text and "| computed steps | 6/6 |" in text
    for name in ("baseline_seed11.png", "spectrum_seed11.png"):
        with Image.open(out / name) as picture:
            assert picture.size == (32, 32) and "Denoising strength: 0.6" in picture.text["parameters"]


def test_verify_going_back_over_steps_is_reported_as_the_run_that_made_the_image(run_cli, tmp_path):
    """A held-out image whose `budget=10` run verify re-runs (h2's image 20 in benchmarks/auto_cache.py): the
    cached run goes back over steps 4-20 uncached, 37 step events for its 20 steps. The report holds the re-run's
    20 steps (the uncached image, so x0 equal at every step and nothing forecast) and counts the passes both runs
    made in the ideal speedup (40 / 54); the bar follows the step number, never past its 2 runs x 20 steps."""
    caption = prompt_set(48, 202)[20].caption
    result = run_cli("bench", "-p", caption, "--seed", "32020", "--steps", "20", "--cfg", "4", "--cache", "auto",
                     "--cache-option", "budget=10,verify=1", "--out", tmp_path / "bench", "--json")
    assert result.code == 0, result.err
    auto = json.loads(result.out)["seeds"][0]["cached"]["auto"]
    assert auto["rerun_from"] == 3 and auto["transformer_passes"] == 2 * (10 + 17) and auto["forecast_steps"] == []
    comparison = auto["vs_baseline"]
    assert comparison["psnr_db"] == "inf" and comparison["x0_distance"] == [0.0] * 20
    assert comparison["ideal_speedup"] == pytest.approx(40 / 54)
    shown = [(int(n), int(total)) for n, total in re.findall(r"(\d+)/(\d+) \[", result.err)]
    assert shown[-1] == (40, 40) and all(n <= total == 40 for n, total in shown)
