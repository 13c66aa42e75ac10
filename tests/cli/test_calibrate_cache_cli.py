"""`anima-rknn calibrate-cache` on a random tiny set: it writes the set's cache fit next to its DiT, atomically and
never over one there, every number fitted on the set (the plan's and the flag's choices too), and `--cache auto`
with a budget (refused before) then runs on that fit: its plan computes the calls the fitted plan places."""

from __future__ import annotations

import json

import pytest

from anima_rknn.bench.cache_choices import planned_calls
from anima_rknn.bench.calibrate import CHOSEN
from anima_rknn.demo.tiny_set import write_model_set
from anima_rknn.generation.pipeline import AnimaPipeline
from anima_rknn.model.model_set import from_model_dir
from anima_rknn.sampling.cache_fit import fit_path, read_fit
from anima_rknn.sampling.schedule import flow_sigmas

PROMPTS = "a red circle\na blue square on white\na green triangle, left\n"
RUN = ("-W", "64", "-H", "64", "--steps", "8", "--dtype", "fp32")


@pytest.fixture
def own_set(tmp_path):
    """A tiny set of this test's own: the session's is shared, and a fit next to its DiT would change other runs."""
    return write_model_set(tmp_path / "tiny", "tiny", seed=3)


def test_calibrate_cache_writes_a_fit_that_auto_then_uses(run_cli, own_set, tmp_path):
    model = own_set.dit.parents[2]
    (tmp_path / "prompts.txt").write_text(PROMPTS)
    generate = ("generate", "--model", model, "-p", "a red circle", *RUN, "--cache", "auto", "--cache-option",
                "budget=5", "-o", tmp_path / "out.png", "--overwrite", "--json")
    refused = run_cli(*generate)
    assert refused.code == 1 and "needs this model's cache fit" in refused.err and "calibrate-cache" in refused.err

    made = run_cli("calibrate-cache", "--model", model, "--prompts", tmp_path / "prompts.txt", "--held-out", "1",
                   *RUN)
    assert made.code == 0, made.err
    assert "about 15 runs (78 model calls) of 8 steps" in made.err and "estimate: about" in made.err
    assert "held out: the flag caught" in made.out and "the plan computed the asked budget" in made.out
    fit = read_fit(fit_path(own_set.dit))
    assert "on 2 prompts x 1 seeds" in fit.fitted_on and {"typical_miss_held_out", "plan_growth", "flag_score",
                                                          "plan_psnr_se"} <= set(fit.fit_error)
    assert "chosen by mean PSNR" in fit.fitted_on and "kept as chosen on the demo" not in fit.fitted_on
    # measured on this set: its flag's numbers are its own, not the demo's
    assert (fit.flag_sigma, fit.flag_score) != (CHOSEN["flag_sigma"], CHOSEN["flag_score"])
    assert AnimaPipeline(from_model_dir(model)).cache_fit == fit
    assert sorted(p.name for p in own_set.dit.parent.iterdir()) == sorted(  # nothing else left behind
        [own_set.dit.name, fit_path(own_set.dit).name])

    used = run_cli(*generate)
    assert used.code == 0, used.err
    report = json.loads(used.out)
    assert tuple(report["computed_steps"]) == planned_calls([*flow_sigmas(8)], 5, fit)
    assert report["cache_may_differ"] is not None

    again = run_cli("calibrate-cache", "--model", model, "--prompts", tmp_path / "prompts.txt", "--held-out", "1",
                    *RUN)
    assert again.code == 1 and "exists" in again.err and read_fit(fit_path(own_set.dit)) == fit


@pytest.mark.parametrize(("prompts", "held_out", "named"), [
    ("one\ntwo\n", "1", "needs at least 2 prompts to fit on and 1 held out"),
    ("one\ntwo\nthree\n", "2", "needs at least 2 prompts to fit on"),
])
def test_too_few_prompts_are_refused_before_any_run(run_cli, own_set, tmp_path, prompts, held_out, named):
    (tmp_path / "prompts.txt").write_text(prompts)
    done = run_cli("calibrate-cache", "--model", own_set.dit.parents[2], "--prompts", tmp_path / "prompts.txt",
                   "--held-out", held_out, *RUN)
    assert done.code == 1 and named in done.err and not fit_path(own_set.dit).exists()


def test_unreadable_prompts_are_one_line(run_cli, own_set, tmp_path):
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe not text")
    for prompts in (tmp_path / "missing.txt", tmp_path / "bad.txt"):
        done = run_cli("calibrate-cache", "--model", own_set.dit.parents[2], "--prompts", prompts, *RUN)
        assert done.code == 1 and done.err.startswith("error: cannot read the prompts") and len(
            done.err.strip().splitlines()) == 1
