"""`anima-rknn generate` as a user runs it: JSON, PNG metadata, determinism, and one-line errors."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from anima_rknn.core.tensorfile import load_tensors, save_tensors
from anima_rknn.demo.evaluate import prompt_set

FAST = ("--width", "64", "--height", "64", "--steps", "4")


def test_generate_writes_png_with_parameters_and_json(run_cli, model_dir, tmp_path):
    out = tmp_path / "a.png"
    result = run_cli("generate", "--model", model_dir, "--prompt", "a red circle", *FAST, "--out", out, "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert report["image"] == str(out) and report["finite"] is True
    assert (report["width"], report["height"], report["steps"], report["cfg"]) == (64, 64, 4, 4.0)
    assert report["transformer_passes"] == 8 and report["subgraph_runs"] == 8 * 3 * 2
    assert set(report["timings"]) == {"encode_s", "vae_encode_s", "denoise_s", "decode_s", "total_s", "stages"}
    image = Image.open(out)
    assert image.size == (64, 64)
    parameters = image.text["parameters"]
    assert parameters.startswith("a red circle\nNegative prompt: worst quality")
    assert "Steps: 4" in parameters and "Seed: 20260812" in parameters and "CFG scale: 4.0" in parameters


def test_a_schedule_is_chosen_by_its_comfyui_or_a1111_name_and_named_in_the_png(run_cli, model_dir, tmp_path):
    paths = {name: tmp_path / f"{name}.png" for name in ("simple", "karras", "Karras")}
    for name, path in paths.items():
        result = run_cli("generate", "--model", model_dir, "-p", "cat", *FAST, "--scheduler", name, "-o", path)
        assert result.code == 0, result.err
    simple, karras, label = (np.asarray(Image.open(path)) for path in paths.values())
    assert np.array_equal(karras, label) and not np.array_equal(simple, karras)
    assert "Schedule type: Karras," in Image.open(paths["karras"]).text["parameters"]
    assert "Schedule type: Simple," in Image.open(paths["simple"]).text["parameters"]
    refused = run_cli("generate", "--model", model_dir, "-p", "cat", *FAST, "--scheduler", "ddim", "-o",
                      tmp_path / "x.png")
    assert refused.code == 1 and refused.err.startswith("error: unknown schedule 'ddim': choose one of simple")
    assert refused.err.count("\n") == 1 and not (tmp_path / "x.png").exists()


def test_same_seed_same_image_other_seed_other_image(run_cli, model_dir, tmp_path):
    paths = [tmp_path / f"{i}.png" for i in range(3)]
    for path, seed in zip(paths, (7, 7, 8)):
        assert run_cli("generate", "--model", model_dir, "-p", "cat", *FAST, "--seed", seed, "-o", path).code == 0
    a, b, c = (np.asarray(Image.open(p)) for p in paths)
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_spectrum_runs_11_of_20_steps(run_cli, model_dir, tmp_path):
    result = run_cli("generate", "--model", model_dir, "-p", "cat", "-W", "64", "-H", "64", "--cache", "spectrum",
                     "-o", tmp_path / "s.png", "--json")
    report = json.loads(result.out)
    assert report["computed_steps"] == [1, 2, 3, 4, 6, 8, 11, 14, 18, 19, 20]
    assert report["transformer_passes"] == 22 and report["finite"] is True
    assert "computed 11/20 steps" in result.err


def test_auto_cache_reports_its_error_estimate(run_cli, fitted_tiny_set, tmp_path):
    """In the JSON, on the summary line and in the PNG's parameters: the run's own estimate of its distance from
    the uncached image, made without rendering that image."""
    model_dir = fitted_tiny_set.dit.parents[2]
    result = run_cli("generate", "--model", model_dir, "-p", "cat", "-W", "64", "-H", "64", "--cache", "auto",
                     "--cache-option", "budget=8", "-o", tmp_path / "a.png", "--json")
    report = json.loads(result.out)
    assert len(report["computed_steps"]) <= 8 and report["transformer_passes"] <= 16
    estimate = report["cache_error_estimate"]
    assert isinstance(estimate, float) and estimate >= 0
    assert f"cache error estimate: {estimate:.4f}" in result.err
    assert f"Cache error estimate: {estimate:.4g}" in Image.open(tmp_path / "a.png").text["parameters"]
    none = json.loads(run_cli("generate", "--model", model_dir, "-p", "cat", "-W", "64", "-H", "64",
                              "-o", tmp_path / "n.png", "--json").out)
    assert none["cache_error_estimate"] is None


def test_cache_options_string_and_flags(run_cli, model_dir, tmp_path):
    result = run_cli("generate", "--model", model_dir, "-p", "cat", "-W", "64", "-H", "64", "--cache", "spectrum",
                     "--cache-option", "warmup=6,w=0.5", "--spectrum-warmup", "5", "-o", tmp_path / "s.png", "--json")
    report = json.loads(result.out)
    assert report["cache_options"] == {"warmup": 5, "w": 0.5}
    assert report["computed_steps"][:5] == [1, 2, 3, 4, 5]


def _assert_one_line_error(result, pattern: str) -> None:
    assert result.code != 0
    assert "Traceback" not in result.err
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.err
    assert pattern in lines[0]


@pytest.mark.parametrize("args, pattern", [
    (("-W", "100"), "multiples of 16"),
    (("--steps", "0"), "steps must be an integer from 1 to 1000"),
    (("--cache-option", "bogus=1"), "bogus"),
])
def test_bad_options(run_cli, model_dir, tmp_path, args, pattern):
    out = tmp_path / "x.png"
    result = run_cli("generate", "--model", model_dir, "-p", "cat", *args, "-o", out)
    _assert_one_line_error(result, pattern)
    assert not out.exists()


def test_unknown_dtype_is_refused(run_cli, model_dir, tmp_path):
    result = run_cli("generate", "--model", model_dir, "-p", "cat", "--dtype", "fp8", "-o", tmp_path / "x.png")
    assert result.code == 2 and "Traceback" not in result.err and "fp8" in result.err


def test_unwritable_output(run_cli, model_dir, tmp_path):
    result = run_cli("generate", "--model", model_dir, "-p", "cat", "-o", tmp_path / "no" / "such" / "x.png")
    _assert_one_line_error(result, "does not exist or is not writable")


def test_existing_output_is_kept_unless_overwrite(run_cli, model_dir, tmp_path):
    out = tmp_path / "keep.png"
    out.write_bytes(b"precious")
    _assert_one_line_error(run_cli("generate", "--model", model_dir, "-p", "cat", *FAST, "-o", out), "--overwrite")
    assert out.read_bytes() == b"precious"
    assert run_cli("generate", "--model", model_dir, "-p", "cat", *FAST, "-o", out, "--overwrite").code == 0
    assert Image.open(out).size == (64, 64)
    assert [p.name for p in tmp_path.iterdir()] == ["keep.png"]  # no temporary files left behind


def _explicit(tiny_set, **override):
    files = {"--dit": tiny_set.dit, "--text-encoder": tiny_set.text_encoder, "--vae": tiny_set.vae,
             "--qwen-tokenizer": tiny_set.qwen_tokenizer, "--t5-tokenizer": tiny_set.t5_tokenizer, **override}
    return [str(x) for pair in files.items() for x in pair]


def test_bad_model_files(run_cli, tiny_set, tmp_path):
    out = tmp_path / "x.png"
    _assert_one_line_error(run_cli("generate", *_explicit(tiny_set, **{"--dit": tmp_path / "nope.safetensors"}),
                                   "-p", "cat", "-o", out), "not found")
    # the VAE file given as the DiT: says which key is missing
    _assert_one_line_error(run_cli("generate", *_explicit(tiny_set, **{"--dit": tiny_set.vae}), "-p", "cat",
                                   *FAST, "-o", out), "missing tensor x_embedder.proj.1.weight")
    truncated = tmp_path / "cut.safetensors"
    truncated.write_bytes(tiny_set.dit.read_bytes()[:100_000])
    _assert_one_line_error(run_cli("generate", *_explicit(tiny_set, **{"--dit": truncated}), "-p", "cat", *FAST,
                                   "-o", out), "truncated")
    tensors = load_tensors(tiny_set.dit, "DiT")
    tensors["net.blocks.1.mlp.layer1.weight"] = torch.zeros(7, 128, dtype=torch.bfloat16)
    save_tensors(tensors, tmp_path / "shape.safetensors")
    _assert_one_line_error(run_cli("generate", *_explicit(tiny_set, **{"--dit": tmp_path / "shape.safetensors"}),
                                   "-p", "cat", *FAST, "-o", out), "blocks.1.mlp.layer1.weight has shape [7, 128]")
    assert not out.exists()


def test_console_script_end_to_end(model_dir, tmp_path):
    """The installed `anima-rknn` entry point itself, in a fresh process."""
    out = tmp_path / "e2e.png"
    cmd = [sys.executable, "-m", "anima_rknn", "generate", "--model", str(model_dir), "-p", "cat", *FAST,
           "-o", str(out), "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["finite"] is True and out.is_file()


def test_verify_reruns_a_flagged_image_uncached_and_says_so(run_cli, tmp_path):
    """The shipped demo model on a held-out prompt and noise whose `budget=10` image breaks (h2's image 20 in
    benchmarks/auto_cache.py, 15.2 dB): the flag goes up, verify re-runs steps 4-20 uncached, and the PNG is the
    uncached one's pixels; JSON, summary and parameters say what happened and what it cost."""
    caption = prompt_set(48, 202)[20].caption
    common = ["-p", caption, "--seed", "32020", "--steps", "20", "--cfg", "4", "--json"]
    plain = json.loads(run_cli("generate", *common, "--cache", "auto", "--cache-option", "budget=10",
                               "-o", tmp_path / "plain.png").out)
    assert plain["cache_may_differ"] is True and plain["cache_rerun_from"] is None
    result = run_cli("generate", *common, "--cache", "auto", "--cache-option", "budget=10,verify=1",
                     "-o", tmp_path / "verified.png")
    report = json.loads(result.out)
    assert report["cache_may_differ"] is True and report["cache_rerun_from"] == 3
    assert report["transformer_passes"] == 2 * (10 + 17) and report["computed_steps"] == list(range(1, 21))
    assert "verify re-ran every step after step 3 uncached" in result.err
    parameters = Image.open(tmp_path / "verified.png").text["parameters"]
    assert "Cache may differ: yes" in parameters and "Cache re-run from step: 3" in parameters
    run_cli("generate", *common, "-o", tmp_path / "uncached.png")
    assert Image.open(tmp_path / "verified.png").tobytes() == Image.open(tmp_path / "uncached.png").tobytes()
    assert Image.open(tmp_path / "plain.png").tobytes() != Image.open(tmp_path / "uncached.png").tobytes()


def test_check_looks_at_planned_forecasts_with_partial_passes_and_says_what_they_cost(run_cli, tmp_path):
    """`budget=8,check=1` on the same held-out image: the first block's partial passes move the plan (other
    computed steps, still 8), and JSON, summary and subgraph count say how many ran (the demo DiT has 6 blocks, 3
    subgraphs each); without a budget the option is a one-line error."""
    caption = prompt_set(48, 202)[20].caption
    common = ["-p", caption, "--seed", "32020", "--steps", "20", "--cfg", "4", "--json", "--cache", "auto"]
    plain = json.loads(run_cli("generate", *common, "--cache-option", "budget=8", "-o", tmp_path / "plain.png").out)
    result = run_cli("generate", *common, "--cache-option", "budget=8,check=1", "-o", tmp_path / "checked.png")
    report = json.loads(result.out)
    assert plain["partial_passes"] == 0 and report["partial_passes"] > 0
    assert report["transformer_passes"] == 16 and len(report["computed_steps"]) == 8
    assert report["computed_steps"] != plain["computed_steps"]
    assert report["subgraph_runs"] == 3 * 6 * 16 + 3 * report["partial_passes"]
    assert f"16 transformer passes + {report['partial_passes']} partial passes of the first block" in result.err
    assert "Cache options: budget=8,check=True" in Image.open(tmp_path / "checked.png").text["parameters"]
    refused = run_cli("generate", "-p", caption, "--cache", "auto", "--cache-option", "check=1",
                      "-o", tmp_path / "none.png")
    assert refused.code == 1 and refused.err.strip().splitlines() == [
        "error: cache option check needs a budget (it moves a budget's plan)"]
    assert not (tmp_path / "none.png").exists()


def test_no_model_means_the_shipped_demo_model_at_its_trained_size(run_cli, tmp_path):
    out = tmp_path / "demo.png"
    result = run_cli("generate", "-p", "a red circle on a blue background, top left", "--steps", "8", "-o", out,
                     "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert (report["width"], report["height"]) == (64, 64) and report["finite"]
    assert "anima-demo.safetensors" in Image.open(out).text["parameters"]
