"""Choosing a sampler on the command line: generate's --sampler / --eta / --s-noise (A1111's display names taken
too), what the PNG and the report say, one-line refusals, and bench's row per sampler."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from anima_rknn.batch.results import RESULTS
from anima_rknn.demo import dataset
from anima_rknn.demo.evaluate import adherence, judge
from anima_rknn.sampling.samplers import SAMPLER_NAMES

FAST = ("-W", "64", "-H", "64", "--steps", "2")


def _one_line(result, text: str) -> None:
    assert result.code == 1, (result.code, result.err)
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert "Traceback" not in result.err and len(lines) == 1, result.err
    assert lines[0].startswith("error: ") and text in lines[0], lines[0]


@pytest.mark.parametrize("args, text", [
    (("--sampler", "dpm_fast"), "unknown sampler 'dpm_fast'; choose one of euler (Euler), euler_ancestral (Euler a)"),
    (("--eta", "0.5"), "sampler euler has no eta; these do: euler_ancestral, dpmpp_2m_sde, dpmpp_sde, sa_solver"),
    (("--sampler", "heun", "--s-noise", "0.5"), "sampler heun has no s_noise; these do: euler_ancestral"),
    (("--sampler", "euler_ancestral", "--eta", "1.5"), "eta must be a finite number from 0 to 1, got 1.5"),
    (("--sampler", "Euler a", "--eta", "-0.1"), "eta must be a finite number from 0 to 1"),
    (("--sampler", "er_sde", "--s-noise", "11"), "s_noise must be a finite number from 0 to 10"),
])
def test_bad_sampler_settings_are_one_line_and_exit_1_before_any_work(run_cli, model_dir, tmp_path, args, text):
    out = tmp_path / "x.png"
    _one_line(run_cli("generate", "--model", model_dir, "-p", "cat", *FAST, *args, "--out", out), text)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_the_unknown_sampler_line_lists_every_sampler(run_cli, model_dir, tmp_path):
    result = run_cli("generate", "--model", model_dir, "-p", "cat", *FAST, "--sampler", "dpm_fast",
                     "-o", tmp_path / "x.png")
    assert result.code == 1 and all(f" {name} (" in result.err for name in SAMPLER_NAMES)


def test_an_a1111_display_name_picks_the_sampler_and_the_png_names_it(run_cli, model_dir, tmp_path, one_thread):
    out = tmp_path / "a.png"
    result = run_cli("generate", "--model", model_dir, "-p", "cat", *FAST, "--sampler", "Euler a", "--eta", "0.5",
                     "--s-noise", "0.9", "--out", out, "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert (report["sampler"], report["model_calls"], report["computed_steps"]) == ("euler_ancestral", 2, [1, 2])
    with Image.open(out) as image:
        fields = image.text["parameters"].split("\n")[-1].split(", ")
    assert {"Sampler: Euler a", "Schedule type: Simple", "Eta: 0.5", "Sigma noise: 0.9"} <= set(fields)
    assert "computed 2/2 steps," in result.err  # one call a step: the wording of every earlier version


def test_cfgpp_ud10_ab_at_cfg_2_draws_the_prompt_on_the_demo_model(run_cli, tmp_path, one_thread):
    """ComfyUI's sampler for base Anima on the shipped demo model at its recommended CFG: one guided model call a
    step (the two passes of CFG), the PNG names it by its A1111 label, and the demo's reader finds what the prompt
    asks for in the picture."""
    spec, out = dataset.ShapeSpec("circle", "red", "blue", "top left"), tmp_path / "c.png"
    result = run_cli("generate", "-p", spec.caption, "--sampler", "cfgpp_ud10_ab", "--cfg", "2", "--steps", "12",
                     "-o", out, "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert (report["sampler"], report["model_calls"], report["transformer_passes"]) == ("cfgpp_ud10_ab", 12, 24)
    with Image.open(out) as image:
        assert "Sampler: CFG++ UD10 AB" in image.text["parameters"].split("\n")[-1].split(", ")
        assert adherence(judge([spec], [np.asarray(image.convert("RGB"))]))["all"] == 1.0


def test_batch_runs_cfgpp_ud10_ab_by_its_a1111_label_as_generate_does(run_cli, model_dir, tmp_path, one_thread):
    jobs, size = tmp_path / "jobs.jsonl", ("--width", "64", "--height", "64", "--steps", "3", "--seed", "5")
    jobs.write_text(json.dumps({"prompt": "a red circle", "sampler": "CFG++ UD10 AB", "cfg": 2.0}) + "\n")
    result = run_cli("batch", jobs, "--model", model_dir, *size, "--out", tmp_path / "out")
    assert result.code == 0, result.err
    record = json.loads((tmp_path / "out" / RESULTS).read_text().splitlines()[0])
    assert record["sampler"] == "cfgpp_ud10_ab"
    alone = run_cli("generate", "--model", model_dir, "-p", "a red circle", *size, "--sampler", "cfgpp_ud10_ab",
                    "--cfg", "2", "-o", tmp_path / "alone.png")
    assert alone.code == 0, alone.err
    assert (tmp_path / "out" / record["image"]).read_bytes() == (tmp_path / "alone.png").read_bytes()


def test_a_two_call_sampler_reports_model_calls(run_cli, model_dir, tmp_path, one_thread):
    out = tmp_path / "h.png"
    result = run_cli("generate", "--model", model_dir, "-p", "cat", "-W", "64", "-H", "64", "--steps", "4",
                     "--sampler", "heun", "--cache", "spectrum", "--cache-option", "warmup=1", "--out", out, "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    calls = len(report["computed_steps"]) + len(report["skipped_steps"])
    assert report["model_calls"] == calls == 7 and report["skipped_steps"]  # heun: 2 calls a step, 1 on the last
    assert f"computed {len(report['computed_steps'])}/7 model calls," in result.err
    with Image.open(out) as image:
        fields = image.text["parameters"].split("\n")[-1].split(", ")
    assert "Sampler: Heun" in fields and f"Computed model calls: {len(report['computed_steps'])}/7" in fields


def test_bench_compares_samplers_a_row_each_against_its_own_baseline(run_cli, model_dir, tmp_path, one_thread):
    out = tmp_path / "bench"
    result = run_cli("bench", "--model", model_dir, "-p", "a red circle", "-W", "32", "-H", "32", "--steps", "3",
                     "--seeds", "1,2", "--cache", "none", "--sampler", "euler,Heun,dpmpp_2m_sde", "--out", out,
                     "--fail-on-verdict")
    assert result.code == 0, result.err
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["samplers"] == ["euler", "heun", "dpmpp_2m_sde"]
    assert [(e["seed"], e["sampler"]) for e in report["seeds"]] == [
        (1, "euler"), (1, "heun"), (1, "dpmpp_2m_sde"), (2, "euler"), (2, "heun"), (2, "dpmpp_2m_sde")]
    rows = report["samplers"]
    assert {name: (row["label"], row["model_calls"]) for name, row in rows.items()} == {
        "euler": ("Euler", 3), "heun": ("Heun", 5), "dpmpp_2m_sde": ("DPM++ 2M SDE", 3)}
    assert rows["heun"]["baseline_transformer_passes"] == 10  # 5 model calls, each with CFG's two passes
    # A second uncached run of a sampler is its baseline again, bit for bit (the same seed's noise).
    assert all(row["policies"]["none"]["psnr_db"]["min"] == "inf" for row in rows.values())
    assert set(report["aggregate"]) == {"euler/none", "heun/none", "dpmpp_2m_sde/none"}
    assert report["verdict"]["passed"] and "heun/none is safe here" in report["verdict"]["line"]
    names = {p.name for p in out.iterdir()}
    assert {"heun_baseline_seed1.png", "heun_none_seed2.png", "compare_heun_none_seed1.png",
            "steps_heun_seed2.png", "euler_baseline_seed1.png"} <= names
    with Image.open(out / "dpmpp_2m_sde_baseline_seed2.png") as image:
        assert "Sampler: DPM++ 2M SDE" in image.text["parameters"] and "Seed: 2" in image.text["parameters"]
    markdown = (out / "report.md").read_text()
    assert "## Samplers" in markdown and "| heun (Heun) | 5 |" in markdown and "## Seed 2, heun" in markdown
    assert "| computed model calls | 5/5 |" in markdown


def test_bench_of_one_sampler_reads_as_before_and_bad_lists_are_refused(run_cli, model_dir, tmp_path, one_thread):
    out = tmp_path / "one"
    result = run_cli("bench", "--model", model_dir, "-p", "cat", "-W", "32", "-H", "32", "--steps", "2",
                     "--cache", "none", "--seed", "4", "--sampler", "Euler a", "--out", out)
    assert result.code == 0, result.err
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["samplers"] == ["euler_ancestral"] and set(report["aggregate"]) == {"none"}
    assert {"baseline_seed4.png", "none_seed4.png", "steps_seed4.png"} <= {p.name for p in out.iterdir()}
    base = ("bench", "--model", model_dir, "-p", "cat", "-W", "32", "-H", "32")
    _one_line(run_cli(*base, "--sampler", "euler,dpm_fast", "--out", tmp_path / "a"), "unknown sampler 'dpm_fast'")
    _one_line(run_cli(*base, "--sampler", "euler,Euler", "--out", tmp_path / "b"), "a sampler is listed twice")
    _one_line(run_cli(*base, "--sampler", "euler_ancestral,euler", "--eta", "0.5", "--out", tmp_path / "c"),
              "sampler euler has no eta")
    assert not any((tmp_path / name).exists() for name in "abc")
