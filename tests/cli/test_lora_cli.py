"""`--lora` as a user meets it: generate, prompt tags, baked ONNX sets, and bad files (exit codes and files)."""

import json

import numpy as np
import pytest
from lora_files import comfy, kohya, random_pairs, write_lora
from PIL import Image

from anima_rknn.bench.metrics import psnr
from anima_rknn.model.io import read_dit_config

FAST = ("--steps", "3", "--width", "32", "--height", "32", "--seed", "7")


@pytest.fixture(scope="module")
def loras(tiny_set, tmp_path_factory):
    """A LoRA folder: style (ComfyUI layout) and detail (kohya layout), random but strong enough to see."""
    folder = tmp_path_factory.mktemp("loras")
    config = read_dit_config(tiny_set.dit)
    write_lora(folder / "style.safetensors", comfy(random_pairs(config, seed=1, strength=1.0)))
    write_lora(folder / "detail.safetensors", kohya(random_pairs(config, seed=2, strength=1.0)))
    return folder


def pixels(path):
    return np.asarray(Image.open(path).convert("RGB"))


def test_lora_changes_the_image_and_is_reported_as_webui_reads_it(run_cli, model_dir, loras, tmp_path):
    base, styled = tmp_path / "base.png", tmp_path / "styled.png"
    assert run_cli("generate", "--model", model_dir, "-p", "a cat", *FAST, "--out", base).code == 0
    run = run_cli("generate", "--model", model_dir, "-p", "a cat", *FAST, "--out", styled, "--json",
                  "--lora", f"{loras / 'style.safetensors'}:0.8", "--lora", loras / "detail.safetensors")
    assert run.code == 0, run.err
    assert psnr(pixels(base), pixels(styled)) < 30  # the LoRAs change the picture
    report = json.loads(run.out)
    assert [(lora["name"], lora["scale"]) for lora in report["loras"]] == [("style", 0.8), ("detail", 1.0)]
    text = Image.open(styled).info["parameters"]
    first_line, fields = text.splitlines()[0], text.splitlines()[-1]
    assert first_line == "a cat <lora:style:0.8> <lora:detail:1>"
    assert 'Lora hashes: "style: ' in fields and ", detail: " in fields


def test_prompt_tags_pick_loras_from_the_lora_dir(run_cli, model_dir, loras, tmp_path):
    by_flag, by_tag = tmp_path / "flag.png", tmp_path / "tag.png"
    assert run_cli("generate", "--model", model_dir, "-p", "a cat", *FAST, "--out", by_flag,
                   "--lora", f"{loras / 'style.safetensors'}:0.8").code == 0
    run = run_cli("generate", "--model", model_dir, "-p", "a cat <lora:style:0.8>", *FAST, "--out", by_tag,
                  "--lora-dir", loras)
    assert run.code == 0, run.err
    assert np.array_equal(pixels(by_flag), pixels(by_tag))
    assert Image.open(by_tag).info["parameters"] == Image.open(by_flag).info["parameters"]


@pytest.mark.parametrize("prompt, extra, message", [
    ("a cat <lora:style:0.8>", (), "the folder of LoRAs is not set (--lora-dir DIR)"),
    ("a cat <lora:missing>", ("--lora-dir", "LORAS"), "LoRA 'missing': no missing.safetensors in"),
    ("a cat <lora:../style>", ("--lora-dir", "LORAS"), "is not a plain file name"),
    ("a cat <lora:style:strong>", ("--lora-dir", "LORAS"), "LoRA scale 'strong' in '<lora:style:strong>'"),
    ("a cat <lyco:style:1>", ("--lora-dir", "LORAS"), "<lyco:...> prompt tags are not supported"),
    ("a cat", ("--lora", "LORAS/style.safetensors:abc"), "is not a number"),
    ("a cat", ("--lora", "LORAS/style.safetensors:inf"), "must be a finite number"),
    ("a cat", ("--lora", "LORAS/nothing.safetensors"), "LoRA file not found"),
])  # fmt: skip
def test_bad_lora_requests_are_one_line_and_write_nothing(run_cli, model_dir, loras, tmp_path, prompt, extra,
                                                          message):
    out = tmp_path / "x.png"
    extra = [str(e).replace("LORAS", str(loras)) for e in extra]
    run = run_cli("generate", "--model", model_dir, "-p", prompt, *FAST, "--out", out, *extra)
    assert run.code == 1 and message in run.err and len(run.err.strip().splitlines()) == 1, run.err
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name, content, message", [
    ("sdxl.safetensors", {"lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight": (4, 320)},
     "is not a LoRA for Anima: none of its 1 keys"),
    ("old.ckpt", None, "is a pickle (.ckpt)"),
    ("cut.safetensors", b"\x10\x00\x00\x00\x00\x00\x00\x00{", "truncated"),
])  # fmt: skip
def test_bad_lora_files_are_refused_before_any_work(run_cli, model_dir, tmp_path, name, content, message):
    import torch

    path = tmp_path / name
    if isinstance(content, dict):
        write_lora(path, {k: torch.zeros(shape) for k, shape in content.items()})
    else:
        path.write_bytes(content or b"\x80\x04not read")
    out = tmp_path / "x.png"
    run = run_cli("generate", "--model", model_dir, "-p", "a cat", *FAST, "--out", out, "--lora", path)
    assert run.code == 1 and message in run.err and len(run.err.strip().splitlines()) == 1, run.err
    assert not out.exists()


def test_a_baked_onnx_set_matches_torch_with_the_same_loras(run_cli, model_dir, loras, tmp_path):
    pytest.importorskip("onnxruntime")
    style = f"{loras / 'style.safetensors'}:0.8"
    baked = tmp_path / "baked"
    run = run_cli("export-onnx", "--model", model_dir, "-W", "32", "-H", "32", "--out", baked, "--lora", style)
    assert run.code == 0 and "<lora:style:0.8> baked in" in run.out, run.err
    manifest = json.loads((baked / "manifest.json").read_text())
    assert [(lora["file"], lora["scale"]) for lora in manifest["loras"]] == [("style.safetensors", 0.8)]

    torch_png, onnx_png = tmp_path / "torch.png", tmp_path / "onnx.png"
    assert run_cli("generate", "--model", model_dir, "-p", "a cat", *FAST, "--out", torch_png,
                   "--lora", style).code == 0
    run = run_cli("generate", "--model", model_dir, "-p", "a cat", *FAST, "--out", onnx_png, "--lora", style,
                  "--backend", "onnx", "--subgraphs", baked)
    assert run.code == 0, run.err
    assert psnr(pixels(torch_png), pixels(onnx_png)) > 40

    for other in ((), ("--lora", f"{loras / 'style.safetensors'}:0.5"), ("--lora", style, "--lora",
                                                                         loras / "detail.safetensors")):
        out = tmp_path / "refused.png"
        run = run_cli("generate", "--model", model_dir, "-p", "a cat", *FAST, "--out", out, *other,
                      "--backend", "onnx", "--subgraphs", baked)
        assert run.code == 1 and "were baked with LoRAs style.safetensors:0.8, this run asks for" in run.err
        assert not out.exists()


def test_export_refuses_a_bad_lora_and_leaves_the_folder_alone(run_cli, model_dir, tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file at all")
    out = tmp_path / "set"
    run = run_cli("export-onnx", "--model", model_dir, "-W", "32", "-H", "32", "--out", out, "--lora", bad)
    assert run.code == 1 and len(run.err.strip().splitlines()) == 1
    assert not out.exists()


def test_bench_runs_with_the_same_loras_as_generate(run_cli, model_dir, loras, tmp_path):
    style = f"{loras / 'style.safetensors'}:0.8"
    run = run_cli("bench", "--model", model_dir, "-p", "a cat", *FAST, "--cache", "reuse", "--out", tmp_path / "b",
                  "--lora", style)
    assert run.code == 0, run.err
    single = tmp_path / "one.png"
    assert run_cli("generate", "--model", model_dir, "-p", "a cat", *FAST, "--out", single, "--lora", style).code == 0
    baseline = tmp_path / "b" / "baseline_seed7.png"
    assert np.array_equal(pixels(baseline), pixels(single))
    assert Image.open(baseline).info["parameters"].startswith("a cat <lora:style:0.8>\n")
