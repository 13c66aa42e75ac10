"""The bad-input suite: hostile or careless input, met the way a user meets the CLI.

Every case: input -> exit code, one line naming the problem, no traceback, and the output folder exactly as it
was (no output, no temporary file). Add a row for every new finding. Checkpoint headers, manifests and training
state have suites of their own beside their modules' tests.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import resource
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import click
import pytest
import torch
from PIL import Image

from anima_rknn.core.tensorfile import load_tensors, save_tensors

FAST = ("-W", "64", "-H", "64", "--steps", "2")
USAGE = 2  # click's exit code for a value its type refuses


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` (hidden ones too) and its content hash."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def assert_refused(result, code: int, pattern: str) -> None:
    assert result.code == code, (result.code, result.err)
    assert "Traceback" not in result.err and "Traceback" not in result.out
    if code == USAGE:  # click's usage errors: a usage line, then "Error: ..."
        assert pattern in result.err, result.err
        return
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and pattern in lines[0], result.err


@pytest.fixture
def out_dir(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "keep.txt").write_text("precious")
    return folder


GENERATE_CASES = [
    # settings, checked before any model loads
    (("--cfg", "nan"), USAGE, "not a finite number"),
    (("--cfg", "1e9"), 1, "cfg must be a finite number from 0 to 100"),
    (("--shift", "inf"), USAGE, "not a finite number"),
    (("--shift", "0"), 1, "shift must be a finite number"),
    (("--seed", str(2**64)), 1, "seed must be an integer from 0 to 18446744073709551615"),
    (("--seed", "-2"), 1, "seed must be an integer from 0"),
    (("-W", "100000"), 1, "width must be an integer from 16 to 4096"),
    (("-W", "72"), 1, "multiples of 16"),
    (("--steps", "1000000"), 1, "steps must be an integer from 1 to 1000"),
    (("--vae-tile-size", "7"), 1, "VAE tile size must be an integer from 64"),
    (("--vae-tile-overlap", "1000"), 1, "VAE tile overlap must be an integer from 0 to 256"),
    (("--vae-tile-size", "100", "--vae-tile-overlap", "8"), 1, "multiples of 8 pixels"),
    (("--cache", "spectrum", "--cache-option", "m=100000"), 1, "m must be an integer from 0 to 8"),
    (("--cache", "spectrum", "--cache-option", "w=nan"), 1, "w must be in [0, 1]"),
    (("--cache", "spectrum", "--cache-option", "flex=1e308"), 1, "flex must be in"),
    (("--cache", "spectrum", "--spectrum-w", "nan"), USAGE, "not a finite number"),
    (("--cache", "spectrum", "--cache-option", "m=3,m=4"), 1, "given twice"),
    (("--cache", "auto", "--cache-option", "tol=-1"), 1, "tol must be a number >= 0"),
    (("--cache", "auto", "--cache-option", "budget=1"), 1, "budget must be an integer of at least the warm-up's"),
    (("--cache", "auto", "--cache-option", "w=0.4"), 1, "cache option 'w' does not apply to cache 'auto'"),
    (("--backend", "onnx"), 1, "the onnx backend needs an exported subgraph folder"),
    (("--backend", "onnx", "--subgraphs", "no-such-set"), 1, "no-such-set"),
    # prompts
    (("--prompt", "(" * 200 + "cat" + ")" * 200), 1, "nest more than 100 parentheses or brackets deep"),
    # prompt editing (docs/prompt-editing.md): FAST runs 2 steps
    (("--prompt", "a [red:blue:0.5 cat"), 1, "the prompt: the '[' at character 3 is never closed"),
    (("--prompt", "a red:blue:0.5] cat"), 1, "the prompt: the ']' at character 15 closes no '['"),
    (("--prompt", "a [red:blue:3] cat"), 1, "the 'when' must be a step from 0 to 2"),
    (("--prompt", "a [red:blue:1.5] cat"), 1, "the 'when' must be a share of the steps from 0 to 1"),
    (("--negative", "a [|] cat"), 1, "the negative prompt: an alternation [a|b] needs at least one option"),
    (("--prompt", "[a:" * 150 + "cat" + ":1]" * 150), 1, "nest more than 100 parentheses or brackets deep"),
    (("--prompt", "[" + "|".join(f"w{i}" for i in range(40)) + "]", "--steps", "40"), 1,
     "prompt editing makes more than 32 different prompts"),
    (("--prompt", "cat " * 6000), 1, "characters; at most 20000"),
    (("--negative", "x" * 30000), 1, "negative prompt has 30000 characters"),
    (("--prompt", "cat " * 4500), 1, "tokens long; at most 4096"),
]


@pytest.mark.parametrize("args, code, pattern", GENERATE_CASES, ids=[" ".join(c[0])[:40] for c in GENERATE_CASES])
def test_generate_refuses(run_cli, model_dir, out_dir, args, code, pattern):
    before = snapshot(out_dir)
    base = ["generate", "--model", model_dir, "-p", "cat", *FAST, "-o", out_dir / "x.png"]
    assert_refused(run_cli(*base, *args), code, pattern)
    assert snapshot(out_dir) == before


# ---- image to image: the files given and the settings around them ---------------------------------------------

def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _bomb(size: int = 30000) -> bytes:
    """A real 8x8 PNG whose IHDR claims size x size pixels, its CRC recomputed so only the size is wrong."""
    data = bytearray(_png(Image.new("RGB", (8, 8), (10, 20, 30))))
    assert data[12:16] == b"IHDR"
    data[16:24] = size.to_bytes(4, "big") * 2
    data[29:33] = zlib.crc32(bytes(data[12:29])).to_bytes(4, "big")
    return bytes(data)


@pytest.fixture
def images(tmp_path):
    """Files a user may pass as --init-img / --mask: good ones and every kind of bad one."""
    folder = tmp_path / "images"
    folder.mkdir()
    noise = _png(Image.frombytes("RGB", (64, 64), random.Random(0).randbytes(64 * 64 * 3)))
    (folder / "good.png").write_bytes(noise)
    (folder / "mask32.png").write_bytes(_png(Image.new("L", (32, 32), 255)))
    (folder / "empty-mask.png").write_bytes(_png(Image.new("L", (64, 64), 0)))
    (folder / "notes.png").write_text("not a picture at all\n")
    (folder / "truncated.png").write_bytes(noise[: len(noise) // 2])
    (folder / "bomb.png").write_bytes(_bomb())
    (folder / "a-folder").mkdir()
    return folder


IMAGE_CASES = [
    (("--init-img", "{img}/notes.png"), "image {img}/notes.png: not an image"),
    (("--init-img", "{img}/truncated.png"), "image {img}/truncated.png: truncated or corrupt"),
    (("--init-img", "{img}/bomb.png"), "image {img}/bomb.png: more than 67108864 pixels, refused before decoding"),
    (("--init-img", "{img}/a-folder"), "image {img}/a-folder: a folder, not a file"),
    (("--init-img", "{img}/missing.png"), "image {img}/missing.png: no such file"),
    (("--init-img", "{img}/good.png", "--mask", "{img}/truncated.png"), "image {img}/truncated.png: truncated"),
    (("--mask", "{img}/good.png"), "a mask needs an init image (--init-img)"),
    (("--outpaint", "16"), "outpainting needs an init image (--init-img)"),
    (("--init-img", "{img}/good.png", "--mask", "{img}/mask32.png"),
     "the mask is 32x32 px, the init image 64x64: give a mask of the image's size"),
    (("--init-img", "{img}/good.png", "--mask", "{img}/empty-mask.png"), "the mask is empty"),
    (("--init-img", "{img}/good.png", "--mask", "{img}/good.png", "--outpaint", "8"), "not both"),
    (("--init-img", "{img}/good.png", "--strength", "1.5"), "strength must be a finite number from 0 to 1, got 1.5"),
    (("--init-img", "{img}/good.png", "--strength", "-0.1"), "strength must be a finite number from 0 to 1"),
    # 20 steps at strength 0.01 run the last one (diffusers' get_timesteps); at 0 none: refused
    (("--init-img", "{img}/good.png", "--steps", "20", "--strength", "0"), "strength 0.0 runs no step of 20"),
    (("--init-img", "{img}/good.png", "--outpaint", "0,0,0,0"), "outpaint grows no side"),
    (("--init-img", "{img}/good.png", "--outpaint", "a,b"), "--outpaint takes LEFT,TOP,RIGHT,BOTTOM pixel counts"),
    (("--init-img", "{img}/good.png", "--outpaint", "1,2,3"), "got '1,2,3'"),
    (("--init-img", "{img}/good.png", "--outpaint", "-8"), "outpaint left must be an integer from 0 to 4096"),
    (("--init-img", "{img}/good.png", "--hires"), "the hires fix refines a text-to-image render"),
    (("--hires", "--hires-scale", "100"), "hires_scale must be a finite number from 1 to 8"),
    (("--hires", "--hires-width", "8000"), "hires_width must be an integer from 0 to 4096"),
    (("--init-img", "{img}/good.png", "--mask", "{img}/good.png", "--mask-blur", "1000"),
     "mask_blur must be an integer from 0 to 256"),
]


@pytest.mark.parametrize("args, pattern", IMAGE_CASES, ids=[" ".join(c[0])[:60] for c in IMAGE_CASES])
def test_generate_refuses_bad_images_and_image_settings(run_cli, model_dir, out_dir, images, args, pattern):
    """One line, exit 1, before any model loads; no image and no state file left behind."""
    before = snapshot(out_dir)
    given = [str(arg).format(img=images) for arg in args]
    result = run_cli("generate", "--model", model_dir, "-p", "cat", "--steps", "4", "-o", out_dir / "x.png", *given)
    assert_refused(result, 1, pattern.format(img=images))
    assert snapshot(out_dir) == before


def test_a_nan_strength_is_refused_as_every_nan_is(run_cli, model_dir, out_dir, images):
    """The finite-number type refuses it as a usage error, as --cfg nan (no command takes a NaN)."""
    before = snapshot(out_dir)
    result = run_cli("generate", "--model", model_dir, "-p", "cat", "--init-img", images / "good.png", "--strength",
                     "nan", "-o", out_dir / "x.png")
    assert_refused(result, USAGE, "not a finite number")
    assert snapshot(out_dir) == before


@pytest.mark.parametrize("command", ["bench", "batch"])
def test_bench_and_batch_refuse_a_bad_init_image_in_one_line(run_cli, model_dir, out_dir, images, command):
    before = snapshot(out_dir.parent)
    if command == "bench":
        args = ("bench", "--model", model_dir, "-p", "cat", *FAST, "--out", out_dir / "report")
    else:
        (out_dir.parent / "p.txt").write_text("cat\n")
        before = snapshot(out_dir.parent)
        args = ("batch", out_dir.parent / "p.txt", "--model", model_dir, *FAST, "--out", out_dir / "batch")
    result = run_cli(*args, "--init-img", images / "bomb.png")
    assert_refused(result, 1, "more than 67108864 pixels")
    assert snapshot(out_dir.parent) == before


OUTPUT_CASES = [
    ("x" * 250 + ".png", 1, "bytes long"),
    ("x.txt", 1, "must be a .png file"),
    ("keep.txt", 1, "must be a .png file"),
    ("sub", USAGE, "is a directory"),
    ("missing/x.png", 1, "does not exist or is not writable"),
    ("taken.png", 1, "exists; pass --overwrite"),
]


@pytest.mark.parametrize("name, code, pattern", OUTPUT_CASES)
def test_generate_checks_its_output_before_any_work(run_cli, model_dir, out_dir, name, code, pattern):
    (out_dir / "sub").mkdir()
    (out_dir / "taken.png").write_bytes(b"someone else's picture")
    before = snapshot(out_dir)
    started = time.perf_counter()
    result = run_cli("generate", "--model", model_dir, "-p", "cat", "--steps", "1000", "-o", out_dir / name)
    assert_refused(result, code, pattern)
    assert time.perf_counter() - started < 30  # refused up front, not after 1000 steps
    assert snapshot(out_dir) == before


@pytest.mark.parametrize("args, code, pattern", [
    (("--min-psnr", "nan"), USAGE, "not a finite number"),
    (("--min-ssim", "inf"), USAGE, "not a finite number"),
    (("--seeds", "1,x"), 1, "takes seeds and ranges such as 1-8"),  # batch's grammar
    (("--seeds", f"1,{2**64}"), 1, f"is not a seed or a rising range of seeds from 0 to {2**64 - 1}"),
    (("--cfg", "-1"), 1, "cfg must be a finite number from 0"),
    (("--repeat", "101"), USAGE, "101 is not in the range 1<=x<=100"),
    (("--seeds", ",".join(map(str, range(65)))), 1, "names more than 64 seeds"),
    (("--seeds", "1-65"), 1, "names more than 64 seeds"),
])
def test_bench_refuses(run_cli, model_dir, out_dir, args, code, pattern):
    before = snapshot(out_dir.parent)
    result = run_cli("bench", "--model", model_dir, "-p", "cat", *FAST, "--out", out_dir / "report", *args)
    assert_refused(result, code, pattern)
    assert snapshot(out_dir.parent) == before


@pytest.mark.parametrize("command", [
    ("bench", "--model", "{model}", "-p", "cat", *FAST, "--out", "{out}"),
    ("make-tiny", "--out", "{out}"),
])
def test_foreign_folders_are_refused_unchanged(run_cli, model_dir, out_dir, command):
    before = snapshot(out_dir)
    args = [str(a).format(model=model_dir, out=out_dir) for a in command]
    assert_refused(run_cli(*args), 1, "is not empty")
    assert snapshot(out_dir) == before


# ---- NaN anywhere: "no image was written", exit 1 ------------------------------------------------------------

def _poisoned(source: Path, folder: Path, pick: str) -> Path:
    """A copy of a real checkpoint with the first tensor whose name contains `pick` set to NaN."""
    tensors = {k: v.clone() for k, v in load_tensors(source, "model").items()}
    name = next(k for k in tensors if pick in k)
    tensors[name] = torch.full_like(tensors[name], float("nan"))
    path = folder / source.name
    save_tensors(tensors, path)
    return path


@pytest.mark.parametrize("part, pick, pattern", [
    ("dit", "final_layer.linear.weight", "the latent turned non-finite (NaN/Inf) at step 1 of 2, where the run stopped"),
    ("dit", "llm_adapter.", "the prompt conditioning is not finite"),
    ("text_encoder", "embed_tokens", "the prompt conditioning is not finite"),
    ("vae", "decoder.head", "the VAE decoded non-finite pixels"),
])
def test_nan_weights_write_no_image(run_cli, tiny_set, out_dir, tmp_path, part, pick, pattern):
    files = {"dit": tiny_set.dit, "text_encoder": tiny_set.text_encoder, "vae": tiny_set.vae}
    files[part] = _poisoned(files[part], tmp_path, pick)
    before = snapshot(out_dir)
    result = run_cli("generate", "--dit", files["dit"], "--text-encoder", files["text_encoder"], "--vae", files["vae"],
                     "--qwen-tokenizer", tiny_set.qwen_tokenizer, "--t5-tokenizer", tiny_set.t5_tokenizer,
                     "-p", "cat", *FAST, "-o", out_dir / "x.png")
    assert result.code == 1 and "Traceback" not in result.err
    assert pattern in result.err and "no image was written" in result.err.splitlines()[-1]
    assert snapshot(out_dir) == before


def test_huge_prompt_weight_writes_no_image(run_cli, model_dir, out_dir):
    before = snapshot(out_dir)
    result = run_cli("generate", "--model", model_dir, "-p", "(cat:1e300)", *FAST, "-o", out_dir / "x.png")
    assert_refused(result, 1, "the prompt conditioning is not finite")
    assert snapshot(out_dir) == before


# ---- seeds and JSON -------------------------------------------------------------------------------------------

def _strict_json(text: str):
    def refuse(token: str):
        raise ValueError(f"non-standard JSON token {token}")
    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("seed", ["-1", str(2**64 - 1), "0"])
def test_seeds_cover_64_bits_and_minus_one_draws_one(run_cli, model_dir, tmp_path, seed):
    out = tmp_path / "s.png"
    result = run_cli("generate", "--model", model_dir, "-p", "cat", *FAST, "-o", out, "--json")
    assert result.code == 0
    result = run_cli("generate", "--model", model_dir, "-p", "cat", *FAST, "--seed", seed, "-o", out, "--overwrite",
                     "--json")
    assert result.code == 0, result.err
    used = _strict_json(result.out)["seed"]
    assert 0 <= used < 2**64 and (seed == "-1" or used == int(seed))
    assert f"Seed: {used}," in Image.open(out).text["parameters"]


def test_random_seed_reproduces_with_the_reported_seed(run_cli, model_dir, tmp_path):
    first = _strict_json(run_cli("generate", "--model", model_dir, "-p", "cat", *FAST, "--seed", "-1",
                                 "-o", tmp_path / "a.png", "--json").out)
    again = run_cli("generate", "--model", model_dir, "-p", "cat", *FAST, "--seed", str(first["seed"]),
                    "-o", tmp_path / "b.png")
    assert again.code == 0
    assert Image.open(tmp_path / "a.png").tobytes() == Image.open(tmp_path / "b.png").tobytes()


# ---- in a real process: argv bytes, signals, bus errors, full disks, races ------------------------------------

def _command(*args) -> list[str | bytes]:
    return [sys.executable, "-m", "anima_rknn", *args]


def test_invalid_utf8_argument_is_one_line(model_dir, out_dir):
    before = snapshot(out_dir)
    done = subprocess.run(_command("generate", "--model", str(model_dir), "-p", b"caf\xe9 \xff", *FAST,
                                   "-o", str(out_dir / "x.png")), capture_output=True, timeout=300)
    err = done.stderr.decode(errors="replace")
    assert done.returncode == 1 and "Traceback" not in err
    assert err.strip() == "error: the prompt is not valid UTF-8 text"
    assert snapshot(out_dir) == before


def _wait_for_denoising(process: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while "denoise:" not in log.read_text(errors="replace"):
        assert process.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "denoising never started"
        time.sleep(0.2)
    time.sleep(1.0)  # into the loop


def _default_hangup() -> None:
    """A run started under nohup inherits an ignored SIGHUP and rightly keeps ignoring it; these tests are about
    a terminal that closes, so the child gets the default disposition whatever the test runner was started with."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def _signalled_run(model_dir, out_dir, log, *signums) -> int:
    """A long generation into out_dir/x.png, sent `signums` once denoising runs; its exit code."""
    with open(log, "wb") as stderr:
        # fp32 at 128x128: 1000 steps take a minute even where bf16 is fast, so the signal lands mid-run
        process = subprocess.Popen(_command("generate", "--model", str(model_dir), "-p", "cat", "-W", "128", "-H",
                                            "128", "--dtype", "fp32", "--steps", "1000", "-o", str(out_dir / "x.png")),
                                   stderr=stderr, preexec_fn=_default_hangup)
        _wait_for_denoising(process, log)
        for signum in signums:
            process.send_signal(signum)
        return process.wait(timeout=120)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_mid_run_stops_after_the_step_and_leaves_only_its_state(model_dir, out_dir, tmp_path, signum):
    before = snapshot(out_dir)
    code = _signalled_run(model_dir, out_dir, tmp_path / "log.txt", signum)
    text = (tmp_path / "log.txt").read_text()
    assert code == 128 + signum, text
    assert "Traceback" not in text
    assert (f"resume with: anima-rknn generate --model {model_dir} --resume {out_dir / 'x.png.state'}"
            in text.splitlines()[-1])
    assert snapshot(out_dir).keys() == {*before, "x.png.state"}  # no PNG, no temporary: just the state


def test_a_second_signal_aborts_at_once_and_leaves_nothing(model_dir, out_dir, tmp_path):
    before = snapshot(out_dir)
    code = _signalled_run(model_dir, out_dir, tmp_path / "log.txt", signal.SIGINT, signal.SIGINT)
    text = (tmp_path / "log.txt").read_text()
    assert code == 130 and "Traceback" not in text, text
    assert snapshot(out_dir).keys() <= {*before, "x.png.state"}  # at most a state written whole before
    assert not any(name.endswith(".part") for name in os.listdir(out_dir))


def test_model_file_truncated_while_mapped_is_one_line(tiny_set, out_dir, tmp_path):
    """A DiT cut short on disk mid-run kills the worker with SIGBUS; the console script says so in one line."""
    dit = tmp_path / "dit.safetensors"
    dit.write_bytes(tiny_set.dit.read_bytes())
    log = tmp_path / "log.txt"
    before = snapshot(out_dir)
    with open(log, "wb") as stderr:
        process = subprocess.Popen(_command(
            "generate", "--dit", str(dit), "--text-encoder", str(tiny_set.text_encoder), "--vae", str(tiny_set.vae),
            "--qwen-tokenizer", str(tiny_set.qwen_tokenizer), "--t5-tokenizer", str(tiny_set.t5_tokenizer),
            "-p", "cat", "-W", "128", "-H", "128", "--dtype", "fp32", "--steps", "1000", "-o", str(out_dir / "x.png")),
            stderr=stderr)
        _wait_for_denoising(process, log)
        os.truncate(dit, 1000)
        code = process.wait(timeout=120)
    text = log.read_text()
    assert code == 1 and "Traceback" not in text and "Bus error" not in text
    assert text.rstrip().endswith("error: a model file was truncated or changed on disk while in use (bus error); "
                                  "no output was written")
    # No PNG and no temporary; a checkpoint written (whole) before the crash may stay, as after a power cut.
    assert snapshot(out_dir).keys() <= {*before, "x.png.state"}


def _limit_file_size() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))


def test_a_write_that_fails_is_one_line_and_leaves_no_temporary(model_dir, out_dir):
    """A disk that fills up mid-write (here: a file-size limit, the same write error path)."""
    before = snapshot(out_dir)
    done = subprocess.run(_command("generate", "--model", str(model_dir), "-p", "cat", *FAST,
                                   "-o", str(out_dir / "x.png")),
                          capture_output=True, text=True, timeout=300, preexec_fn=_limit_file_size)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(f"error: cannot write {out_dir / 'x.png'}: File too large "
                                                           "(it needs more than the ")
    assert snapshot(out_dir) == before


def test_two_runs_racing_to_one_path_cannot_both_succeed(model_dir, out_dir):
    target = out_dir / "race.png"
    runs = [subprocess.Popen(_command("generate", "--model", str(model_dir), "-p", "cat", *FAST, "--seed", str(seed),
                                      "-o", str(target)), stderr=subprocess.PIPE, text=True) for seed in (1, 2)]
    results = [(run.wait(timeout=300), run.stderr.read()) for run in runs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 1], results
    loser = next(err for code, err in results if code == 1)
    assert "exists; pass --overwrite" in loser or "appeared while this run was working" in loser
    assert sorted(p.name for p in out_dir.iterdir()) == ["keep.txt", "race.png"]


def test_no_command_takes_a_number_that_may_be_nan():
    """click's FLOAT accepts "nan" and "inf"; every float option of every command uses the finite type instead."""
    from anima_rknn.cli import cli

    floats = [f"{name} {param.name}" for name, command in cli.load_all().items() for param in command.params
              if isinstance(param.type, (click.types.FloatParamType, click.FloatRange))]
    assert floats == []


@pytest.mark.parametrize("args", [
    ("eval-demo", "--cfg", "nan"),
    ("train-demo", "--out", "{tmp}/t", "--minutes", "inf"),
    ("verify-rknn", "--subgraphs", "{tmp}", "--min-cosine", "nan"),
    ("bench", "-p", "cat", "--min-psnr", "-inf"),
])
def test_nan_thresholds_are_refused(run_cli, tmp_path, args):
    result = run_cli(*[a.format(tmp=tmp_path) for a in args])
    assert_refused(result, USAGE, "is not a finite number")
    assert list(tmp_path.iterdir()) == []
