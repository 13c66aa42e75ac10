"""Bad input to what stable-diffusion.cpp's users type, and to -b / the new samplers and spellings: one line
`error: ...`, exit 1, nothing written; sd.cpp's flags we lack are refused with what to use, never click's guess."""

from __future__ import annotations

import pytest

from anima_rknn.cli.sdcpp import REFUSED

FAST = ("-W", "64", "-H", "64", "--steps", "1")


def _one_line(result, text: str) -> None:
    assert result.code == 1, (result.code, result.err)
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and text in lines[0], result.err
    assert "Did you mean" not in result.err and "Traceback" not in result.err


@pytest.mark.parametrize("args, text", [
    (("--clip_l", "clip.safetensors"), "--clip_l (stable-diffusion.cpp's) has no equivalent here: Anima has no CLIP"),
    (("--t5xxl", "t5.safetensors"), "its text encoder is the Qwen3 model, --llm"),
    (("--taesd", "taesd.safetensors"), "--preview writes the cheap latent projection"),
    (("--type", "q8_0"), "anima-rknn quantize DIT -o DIT.gguf --type q8_0"),
    (("--rng", "cuda"), "its own seeded generator"),
    (("-M", "convert"), "generate makes images"),
    (("--vae-relative-tile-size", "2x2"), "use --vae-tile-size"),
    (("--clip-skip", "2"), "no CLIP layers to skip"),
    (("--guidance", "3.5"), "--cfg-scale is its guidance"),
    (("--sigmas", "1,0.5,0"), "use --steps with --scheduler"),
    (("--hires-denoising-strength", "0.5"), "use --strength"),
    (("--prompt-file", "p.txt"), "pass the text with -p"),
])
def test_sdcpp_flags_we_lack_are_refused_saying_what_to_use(run_cli, tmp_path, args, text):
    out = tmp_path / "x.png"
    _one_line(run_cli("generate", "-p", "cat", *FAST, *args, "-o", out), text)
    assert list(tmp_path.iterdir()) == []


def test_every_refused_flag_names_a_replacement_or_a_reason():
    assert all(flag.startswith("-") and len(reason) > 10 for flag, reason in REFUSED.items())


@pytest.mark.parametrize("args, text", [
    (("--sampling-method", "ipndm"), "sampler 'ipndm': iPNDM is not implemented here: use uni_pc"),
    (("--sampling-method", "PLMS"), "a flow model has no such grid: use uni_pc"),
    (("--sampling-method", "dpm++3m"), "unknown sampler 'dpm++3m'"),
    (("--scheduler", "ays"), "stable-diffusion.cpp's schedule 'ays' is not implemented here"),
    (("--cache-mode", "easycache"), "stable-diffusion.cpp's cache 'easycache' is not implemented here: use --cache"),
    (("--cache-mode", "fast"), "cache must be one of none, spectrum, spectrum-plus, reuse, auto, got 'fast'"),
    (("--sampler", "DPM++ 2M Nonsense"), "unknown sampler 'DPM++ 2M Nonsense'"),
    (("--preview", "tae"), "--preview tae: no tiny autoencoder here"),
    (("--preview", "{tmp}/a.png", "--preview-path", "{tmp}/b.png"), "name the preview file twice"),
    (("-b", "2", "-o", "{tmp}/a%d_%d.png"), "at most one printf number pattern"),
    (("-b", "2", "-o", "{tmp}/a%s.png"), "at most one printf number pattern"),
    (("-b", "2", "--seed", str(2**64 - 1)), "runs past the largest seed"),
    (("-b", "2", "--state", "{tmp}/s.png.state"), "--batch-count makes each image with its own resume state"),
    (("-m", "{model}", "--diffusion-model", "{model}"), "-m FILE is the diffusion model"),
])
def test_bad_new_input_is_one_line_and_writes_nothing(run_cli, tmp_path, args, text, tiny_set):
    work = tmp_path / "work"
    work.mkdir()
    args = [a.format(tmp=work, model=tiny_set.dit) for a in args]
    out = [] if "-o" in args else ["-o", work / "x.png"]
    _one_line(run_cli("generate", "-p", "cat", *FAST, *args, *out), text)
    assert list(work.iterdir()) == []


def test_an_existing_batch_image_is_refused_before_any_work(run_cli, tmp_path):
    (tmp_path / "x_1.png").write_bytes(b"keep")
    _one_line(run_cli("generate", "-p", "cat", *FAST, "-b", "2", "-o", tmp_path / "x.png"), "x_1.png")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x_1.png"]
    assert (tmp_path / "x_1.png").read_bytes() == b"keep"


@pytest.mark.parametrize("args", [("-b", "0"), ("-b", "x"), ("--output-begin-idx", "-1")])
def test_bad_batch_numbers_are_click_usage_errors(run_cli, tmp_path, args):
    result = run_cli("generate", "-p", "cat", *FAST, *args, "-o", tmp_path / "x.png")
    assert result.code == 2 and "Invalid value" in result.err and list(tmp_path.iterdir()) == []
