"""report.json / report.md / figures from a real tiny-model bench: consistency, strict JSON, the verdict."""

import dataclasses
import json
import math

import numpy as np
import pytest
from PIL import Image

from anima_rknn.bench.figures import write_figures
from anima_rknn.bench.report import Thresholds, build_report, markdown, to_json, write_report
from anima_rknn.bench.run import run_bench
from anima_rknn.generation.params import GenerationParams
from anima_rknn.generation.pipeline import AnimaPipeline
from anima_rknn.model.config import PRESETS


def _strict_json(text: str) -> dict:
    def refuse(constant: str):
        raise ValueError(f"non-standard JSON constant {constant}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def bench(tiny_set):
    params = GenerationParams(prompt="a red circle", width=32, height=32, steps=20, seed=9)
    return run_bench(AnimaPipeline(tiny_set, keep_dit=True), params, ["spectrum", "none"], repeats=2)


@pytest.fixture(scope="module")
def report(bench):
    return _strict_json(to_json(build_report(bench, "tiny.safetensors")))


def test_speedups_follow_from_the_recorded_timings(bench, report):
    (entry,) = report["seeds"]
    base, spectrum = entry["baseline"], entry["cached"]["spectrum"]
    for side, runs in ((base, bench.seeds[0].baseline.runs), (spectrum, bench.seeds[0].cached["spectrum"].runs)):
        timings = side["timings_s"]
        assert timings["denoise"]["all"] == [run.denoised.denoise_s for run in runs]
        for i in range(2):
            assert timings["total_excl_encode"]["all"][i] == pytest.approx(
                timings["denoise"]["all"][i] + timings["decode"]["all"][i])
        assert timings["denoise"]["min"] == min(timings["denoise"]["all"])
        assert timings["denoise"]["median"] == pytest.approx(sum(timings["denoise"]["all"]) / 2)
        assert len(side["step_times_s"]) == 20
    comparison = spectrum["vs_baseline"]
    for stat in ("min", "median"):
        assert comparison["speedup"]["denoise"][stat] == pytest.approx(
            base["timings_s"]["denoise"][stat] / spectrum["timings_s"]["denoise"][stat])
        assert comparison["speedup"]["end_to_end"][stat] == pytest.approx(
            base["timings_s"]["total_excl_encode"][stat] / spectrum["timings_s"]["total_excl_encode"][stat])
    assert comparison["ideal_speedup"] == pytest.approx(20 / 11)
    assert comparison["measured_over_ideal"] == pytest.approx(comparison["speedup"]["denoise"]["median"] / (20 / 11))
    assert (base["transformer_passes"], spectrum["transformer_passes"]) == (40, 22)


def test_uncached_against_baseline_is_identical_and_passes(report):
    none = report["seeds"][0]["cached"]["none"]
    assert none["vs_baseline"]["psnr_db"] == "inf"  # strict JSON has no Infinity
    assert none["vs_baseline"]["ssim"] == 1.0
    assert none["vs_baseline"]["latent_error"] == {"relative_l2": 0.0, "max_abs": 0.0, "rmse": 0.0}
    assert set(none["vs_baseline"]["x0_distance"]) == {0.0}
    assert report["verdict"]["policies"]["none"] == {"passed": True, "failures": []}


def test_spectrum_fidelity_numbers_match_the_images(bench, report):
    comparison = report["seeds"][0]["cached"]["spectrum"]["vs_baseline"]
    a = np.asarray(bench.seeds[0].baseline.first.image, np.float64) / 255
    b = np.asarray(bench.seeds[0].cached["spectrum"].first.image, np.float64) / 255
    assert comparison["psnr_db"] == pytest.approx(10 * math.log10(1 / np.mean((a - b) ** 2)))
    assert 0 < comparison["ssim"] < 1
    assert comparison["x0_distance"][:4] == [0.0] * 4 and comparison["x0_distance"][4] > 0  # first skip: step 5
    assert 0 < comparison["latent_error"]["relative_l2"] < 1


def test_verdict_follows_the_thresholds(bench):
    strict = build_report(bench, "tiny.safetensors", Thresholds(min_psnr=1000.0))
    assert strict["verdict"]["passed"] is False and strict["verdict"]["line"].startswith("FAIL")
    assert strict["verdict"]["policies"]["none"]["passed"] is True
    assert "PSNR" in strict["verdict"]["policies"]["spectrum"]["failures"][0]
    by_ssim = build_report(bench, "tiny.safetensors", Thresholds(min_psnr=0.0, min_ssim=0.999999))
    assert by_ssim["verdict"]["policies"]["spectrum"]["failures"][0].startswith("seed 9: SSIM")
    lenient = build_report(bench, "tiny.safetensors", Thresholds(min_psnr=0.0))
    assert lenient["verdict"]["passed"] is True and lenient["verdict"]["line"].startswith("PASS")


def test_a_non_finite_cached_run_fails_the_verdict(bench):
    cached = bench.seeds[0].cached["spectrum"]
    run = cached.first
    broken_sample = dataclasses.replace(run.denoised.sample, latent=np.full_like(run.denoised.sample.latent, np.nan),
                                        finite=False)
    broken_run = dataclasses.replace(run, denoised=dataclasses.replace(run.denoised, sample=broken_sample),
                                     image=None, decode_s=0.0)
    broken = dataclasses.replace(bench, seeds=[dataclasses.replace(
        bench.seeds[0], cached={"spectrum": dataclasses.replace(cached, runs=[broken_run])})])
    report = build_report(broken, "tiny.safetensors")
    side = report["seeds"][0]["cached"]["spectrum"]
    assert side["vs_baseline"]["psnr_db"] is None and side["image"] is None
    assert report["verdict"]["passed"] is False and "not finite" in report["verdict"]["line"]
    assert "n/a" in markdown(report)


def test_files_exist_and_parse(bench, report, tmp_path):
    built = build_report(bench, "tiny.safetensors")
    write_report(built, tmp_path)
    write_figures(bench, built, tmp_path)
    assert _strict_json((tmp_path / "report.json").read_text()) == report
    text = (tmp_path / "report.md").read_text()
    assert "| | baseline | spectrum | spectrum vs baseline | none | none vs baseline |" in text
    assert "| transformer passes | 40 | 22 | -18 | 40 | +0 |" in text
    assert "| computed steps | 20/20 | 11/20 | ideal 1.82x |" in text
    assert f"**Verdict: {report['verdict']['line']}**" in text
    for name in ("compare_spectrum_seed9.png", "compare_none_seed9.png", "steps_seed9.png"):
        with Image.open(tmp_path / name) as image:
            assert image.format == "PNG" and image.width > 300
    assert not list(tmp_path.glob("*.part"))


def test_an_adaptive_cache_reports_its_estimate_and_the_spread_of_its_passes(fitted_tiny_set):
    """auto's computed steps can differ per seed: the aggregate gives mean and max passes, every seed its error
    estimate, and over the seeds how well the estimate ranks the true PSNR (Spearman, strict JSON)."""
    params = GenerationParams(prompt="a red circle", width=32, height=32, steps=20, seed=9)
    result = run_bench(AnimaPipeline(fitted_tiny_set, keep_dit=True), params, ["auto", "spectrum"], seeds=[1, 2, 3])
    report = _strict_json(to_json(build_report(result, "tiny.safetensors")))
    sides = [entry["cached"]["auto"] for entry in report["seeds"]]
    passes = [side["transformer_passes"] for side in sides]
    assert report["aggregate"]["auto"]["transformer_passes"] == {"mean": np.mean(passes), "max": max(passes)}
    assert all(isinstance(side["error_estimate"], float) for side in sides)
    assert [entry["cached"]["spectrum"]["error_estimate"] for entry in report["seeds"]] == [None] * 3
    assert report["aggregate"]["spectrum"]["estimate_psnr_spearman"] is None
    rho = report["aggregate"]["auto"]["estimate_psnr_spearman"]
    assert rho is None or -1 <= rho <= 1  # None only if every seed gave the same PSNR or estimate
    text = markdown(report)
    assert "passes mean / max" in text and "error estimate vs PSNR (Spearman)" in text
    assert "| cache error estimate |" in text
    flag = report["aggregate"]["auto"]["flag"]  # the flag against the seeds under 30 dB
    flags = [side["may_differ"] for side in sides]
    assert all(isinstance(f, bool) for f in flags) and flag["flagged"] == sum(flags)
    assert flag["below_30db"] == sum(e["cached"]["auto"]["vs_baseline"]["psnr_db"] < 30 for e in report["seeds"])
    assert report["aggregate"]["spectrum"]["flag"] is None and "| cache may differ |" in text


def test_auto_check_reports_its_partial_passes(fitted_tiny_set):
    """The first block's partial passes are counted per run and shown beside the subgraph runs they add to."""
    params = GenerationParams(prompt="a red circle", width=32, height=32, steps=20, seed=9)
    result = run_bench(AnimaPipeline(fitted_tiny_set, keep_dit=True), params, ["auto"], {"budget": 8, "check": True})
    report = _strict_json(to_json(build_report(result, "tiny.safetensors")))
    auto, base = report["seeds"][0]["cached"]["auto"], report["seeds"][0]["baseline"]
    assert auto["partial_passes"] > 0 and base["partial_passes"] == 0
    assert auto["transformer_passes"] == 16
    assert auto["subgraph_runs"] == 3 * PRESETS["tiny"].blocks * 16 + 3 * auto["partial_passes"]
    assert f"| partial passes (auto's check) | 0 | {auto['partial_passes']} |" in markdown(report)
