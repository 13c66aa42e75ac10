"""Every `anima-rknn ...` command line shown in README.md and docs/ parses against the real click CLI (the command
exists, each flag is one of its options, each choice is valid); none is run. And the checker fails when one
does not."""

import shlex

import pytest

from anima_rknn.cli import cli
from anima_rknn.cli import commands  # noqa: F401  (registers every command on the group, as the console script does)
from doc_pages import ROOT, command_lines, command_problems, pages


def test_every_command_shown_parses():
    problems, seen = [], 0
    for page in pages():
        for line, words in command_lines(page.read_text(encoding="utf-8")):
            seen += 1
            problems += [f"{page.relative_to(ROOT)}:{line}: {p}" for p in command_problems(cli, words)]
    assert seen > 40  # the pages do show commands: the extraction found them
    assert not problems, "commands that do not parse:\n" + "\n".join(problems)


def test_what_the_extraction_finds():
    page = ("Run `anima-rknn generate --steps 20\n--cache auto` or `generate --x`.\n\n```bash\n"
            "OMP_NUM_THREADS=1 .venv-rknn/bin/anima-rknn convert-rknn --subgraphs onnx-512 \\\n"
            "    --out rknn-512   # resumable\npython x.py --not-ours\n```\n\n```json\n{\"a\": \"b\n```\n")
    assert command_lines(page) == [(5, ["convert-rknn", "--subgraphs", "onnx-512", "--out", "rknn-512"]),
                                   (1, ["generate", "--steps", "20", "--cache", "auto"])]


@pytest.mark.parametrize("line", [
    "generate --model DIR -p \"...\" --backend rknn --subgraphs rknn-512 --rknn-budget 8GB",
    "serve [--model DIR] [--host 127.0.0.1] [--port 7860] [--cache none]",
    "verify-rknn --model DIR --subgraphs rknn-512 [--json] [--min-cosine 0.999]",
    "batch prompts.txt --seeds 1-8 --steps 30 --out sweep/",
    "generate --vae-tiling --no-vae-tiling --lora a.safetensors:0.8 --lora b.safetensors -o out.png",
    "generate --sampler \"DPM++ 2M SDE\" --scheduler karras --hires --hires-upscaler lanczos",
    "bench --cache spectrum,spectrum-plus,auto --sampler euler,er_sde,\"Euler a\" --out bench/",
    "--version"])
def test_good_lines_pass(line):
    assert command_problems(cli, shlex.split(line)) == []


@pytest.mark.parametrize("line, problem", [
    ("generat --steps 2", "no such command: generat"),
    ("generate --stepz 2", "generate: No such option '--stepz'"),
    ("serve --vae-tile-size 512", "serve: No such option '--vae-tile-size'"),
    ("generate --cache spectrumm", "generate: --cache: cache must be one of none, spectrum"),
    ("serve --dtype fp8", "serve: Invalid value for '--dtype': 'fp8' is not one of"),
    ("generate --sampler er-sdee", "generate: --sampler: unknown sampler"),
    ("generate --scheduler karas", "generate: --scheduler: "),
    ("bench --cache spectrum,spectrun --out b/", "bench: --cache: unknown cache 'spectrun'"),
    ("bench --sampler euler,eulr --out b/", "bench: --sampler: unknown sampler"),
    ("generate --steps", "generate: Option '--steps' requires an argument."),
    ("generate stray.png", "generate: unexpected argument(s) ['stray.png']")])
def test_the_checker_fails_on_a_bad_line(line, problem):
    problems = command_problems(cli, shlex.split(line))
    assert len(problems) == 1 and problems[0].startswith(problem), problems
