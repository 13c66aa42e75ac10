"""stable-diffusion.cpp's command line on ours: its Anima command line from its docs, its flags as aliases of the
settings table's, the three model files alone (the shipped tokenizers), -b/--batch-count, one spelling per concept
across our commands, and the size warning."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from PIL import Image

from anima_rknn.cli import cli
from anima_rknn.cli.options import params_from_cli, resolve_model
from anima_rknn.demo.tiny_set import write_model_set
from anima_rknn.generation.params import settings_of
from anima_rknn.model.model_set import LAYOUT, SHIPPED_TOKENIZERS, demo_model_dir, from_model_dir

FAST = ("-W", "64", "-H", "64", "--steps", "1")
# stable-diffusion.cpp's docs/anima.md, its example as it stands, the files renamed to where they are here (and sd-cli
# to anima-rknn generate): what its users type.
SDCPP_ANIMA = ["--diffusion-model", "../models/diffusion_models/anima-preview.safetensors",
               "--vae", "../models/vae/qwen_image_vae.safetensors",
               "--llm", "../models/text_encoders/qwen_3_06b_base.safetensors",
               "-p", "a lovely cat holding a sign says 'anima.cpp'", "--cfg-scale", "6.0", "--sampling-method", "euler",
               "-v", "--offload-to-cpu", "--diffusion-fa"]


def _sdcpp_layout(root: Path, files, tokenizers: bool) -> None:
    """The model files where sd.cpp's example has them; the model's own tokenizers beside them, if asked."""
    for part, path in (("diffusion_models/anima-preview", files.dit), ("vae/qwen_image_vae", files.vae),
                       ("text_encoders/qwen_3_06b_base", files.text_encoder)):
        (root / part).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, root / f"{part}.safetensors")
    if tokenizers:
        for part in ("qwen_tokenizer", "t5_tokenizer"):
            shutil.copytree(getattr(files, part), root / LAYOUT[part])


def test_sdcpp_anima_command_line_runs_verbatim(run_cli, tmp_path, monkeypatch, one_thread):
    """The demo model's files (its tokenizers beside them: the demo's own small vocabulary) at the docs' paths."""
    _sdcpp_layout(tmp_path / "models", from_model_dir(demo_model_dir()), tokenizers=True)
    (tmp_path / "run").mkdir()
    monkeypatch.chdir(tmp_path / "run")
    result = run_cli("generate", *SDCPP_ANIMA)
    assert result.code == 0, result.err
    assert "note: --offload-to-cpu (stable-diffusion.cpp's) changes nothing here" in result.err
    settings = json.loads(next(line for line in result.err.splitlines() if line.startswith("settings: "))[10:])
    assert (settings["cfg"], settings["sampler"], settings["width"]) == (6.0, "euler", 64)
    with Image.open(tmp_path / "run" / "out.png") as image:
        assert image.size == (64, 64)


@pytest.fixture(scope="module")
def real_tokenizer_files(tmp_path_factory, real_tokenizers):
    """A tiny model whose text encoder takes the real Qwen3 vocabulary, its three files alone in sd.cpp's layout."""
    files = write_model_set(tmp_path_factory.mktemp("models") / "real-tok", "tiny", tokenizers=real_tokenizers,
                            seed=5)
    root = tmp_path_factory.mktemp("alone")
    _sdcpp_layout(root / "models", files, tokenizers=False)
    return root / "models"


def test_the_three_model_files_alone_take_the_shipped_tokenizers(run_cli, real_tokenizer_files, tmp_path,
                                                                  one_thread):
    models = real_tokenizer_files
    files = resolve_model(str(models / "diffusion_models/anima-preview.safetensors"),
                          text_encoder=str(models / "text_encoders/qwen_3_06b_base.safetensors"),
                          vae=str(models / "vae/qwen_image_vae.safetensors"))
    assert (files.qwen_tokenizer, files.t5_tokenizer) == tuple(SHIPPED_TOKENIZERS.values())
    out = tmp_path / "cat.png"
    result = run_cli("generate", "-m", files.dit, "--llm", files.text_encoder, "--vae", files.vae, "-p",
                     "1girl, (long hair:1.2), 日本語", *FAST, "-o", out, "--json")
    assert result.code == 0, result.err
    assert out.is_file() and json.loads(result.out)["image"] == str(out)


SDCPP_SPELLINGS = ["-s", "7", "-t", "1", "--cfg-scale", "5", "--flow-shift", "2", "--sampling-method", "dpm++2m",
                   "--scheduler", "discrete", "--cache-mode", "spectrum", "--cache-option", "w=0.4,warmup=2",
                   "--negative-prompt", "blurry", "--steps", "8", "-W", "64", "-H", "64", "-p", "cat"]
OUR_SPELLINGS = ["--seed", "7", "--threads", "1", "--cfg", "5", "--shift", "2", "--sampler", "dpmpp_2m",
                 "--scheduler", "normal", "--cache", "spectrum", "--spectrum-w", "0.4", "--spectrum-warmup", "2",
                 "--negative", "blurry", "--steps", "8", "--width", "64", "--height", "64", "--prompt", "cat"]


def _settings(model_dir: Path, args: list[str]) -> dict:
    context = cli.load_all()["generate"].make_context("generate", ["--model", str(model_dir), *args])
    with context:
        return settings_of(params_from_cli(from_model_dir(model_dir), context.params))


def test_sdcpp_spellings_set_what_ours_set(model_dir):
    assert _settings(model_dir, SDCPP_SPELLINGS) == _settings(model_dir, OUR_SPELLINGS)


@pytest.mark.parametrize("sampler, scheduler, expected", [
    ("DPM++ 2M Karras", None, ("dpmpp_2m", "karras")),
    ("DPM++ 2M Karras", "simple", ("dpmpp_2m", "simple")),  # a schedule named beside it wins, as on the server
    ("DPM++ 2M SDE Exponential", None, ("dpmpp_2m_sde", "exponential")),
    ("UniPC", None, ("uni_pc", "simple")),
    ("DDIM", None, ("euler", "simple")),
])
def test_a1111_sampler_names_work_on_the_command_line(model_dir, sampler, scheduler, expected):
    args = ["-p", "cat", "--sampler", sampler, *(["--scheduler", scheduler] if scheduler else [])]
    settings = _settings(model_dir, args)
    assert (settings["sampler"], settings["scheduler"]) == expected


def test_batch_count_makes_n_images_with_consecutive_seeds(run_cli, model_dir, tmp_path, one_thread):
    out = tmp_path / "img.png"
    result = run_cli("generate", "--model", model_dir, "-p", "cat", *FAST, "-b", "3", "-s", "41", "-o", out, "--json")
    assert result.code == 0, result.err
    records = [json.loads(line) for line in result.out.splitlines()]
    assert [(r["image"], r["seed"]) for r in records] == [(str(tmp_path / f"img_{i}.png"), 41 + i) for i in range(3)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["img_0.png", "img_1.png", "img_2.png"]
    with Image.open(tmp_path / "img_0.png") as first, Image.open(tmp_path / "img_1.png") as second:
        assert first.tobytes() != second.tobytes()  # another seed, another picture


def test_batch_count_fills_a_printf_pattern_from_the_begin_index(run_cli, model_dir, tmp_path, one_thread):
    result = run_cli("generate", "--model", model_dir, "-p", "cat", *FAST, "-b", "2", "--output-begin-idx", "5",
                     "-o", tmp_path / "out_%03d.png", "--preview", "proj", "--preview-path", tmp_path / "p.png")
    assert result.code == 0, result.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out_005.png", "out_006.png", "p.png"]


def test_one_image_keeps_its_name_and_a_random_seed_is_drawn_once(run_cli, model_dir, tmp_path, one_thread):
    out = tmp_path / "one.png"
    result = run_cli("generate", "--model", model_dir, "-p", "cat", *FAST, "-o", out, "--json")
    assert result.code == 0 and out.is_file()
    result = run_cli("generate", "--model", model_dir, "-p", "cat", *FAST, "-b", "2", "-s", "-1",
                     "-o", tmp_path / "r.png", "--json")
    seeds = [json.loads(line)["seed"] for line in result.out.splitlines()]
    assert result.code == 0 and seeds[1] == seeds[0] + 1


def test_a_size_far_from_the_trained_one_is_warned_in_the_record_log_and_summary(run_cli, tmp_path, one_thread):
    out = tmp_path / "big.png"
    result = run_cli("generate", "-p", "red circle", "-W", "256", "-H", "256", "--steps", "1", "-o", out)
    assert result.code == 0, result.err
    warning = "256x256 is far from the 64x64 this model was trained at"
    assert warning in result.err and warning in result.out  # the log (stderr) and the summary
    result = run_cli("generate", "-p", "red circle", "-W", "256", "-H", "256", "--steps", "1", "-o", out,
                     "--overwrite", "--json")
    assert warning in json.loads(result.out)["warnings"][0]
    result = run_cli("generate", "-p", "red circle", "--steps", "1", "-o", out, "--overwrite", "--json")
    assert "warnings" not in json.loads(result.out) and "warning" not in result.err


def test_every_out_has_o_and_the_old_spellings_are_hidden_but_work(run_cli, tmp_path):
    commands = cli.load_all()
    for name, command in commands.items():
        for param in command.params:
            if "--out" in param.opts:
                assert "-o" in param.opts, name
    hidden = {"export-vae": ("--tile", "--overlap"), "plan": ("--budget",), "verify-rknn": ("--runtime",)}
    for name, old in hidden.items():
        text = run_cli(name, "--help").out
        assert all(f"{flag} " not in text for flag in old), text
    assert "--vae-tile-size" in run_cli("export-vae", "--help").out
    for budget in ("--budget", "--rknn-budget"):
        result = run_cli("plan", "--preset", "tiny", "-W", "64", "-H", "64", budget, "1KB")
        assert result.code == 1 and result.err.startswith("error: ") and "Traceback" not in result.err
    context = commands["verify-rknn"].make_context("verify-rknn", ["--subgraphs", str(tmp_path), "--runtime",
                                                                   "simulator"])
    assert context.params["runtime"] == "simulator"


def test_the_size_warning_looks_at_the_hires_pass_and_not_at_a_model_without_a_size():
    from anima_rknn.generation.params import build, size_warning

    assert size_warning(build({"width": 64, "height": 96}), 64) is None
    assert "128x64 is far from the 32x32" in size_warning(build({"width": 128, "height": 64}), 32)
    assert size_warning(build({"width": 64, "height": 64, "hires": True, "hires_scale": 4.0}), 64) is not None
    assert size_warning(build({"width": 512, "height": 512}), None) is None
