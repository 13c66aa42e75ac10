"""train-demo-lora and eval-demo's LoRA options through the CLI: bad input is one line, exit 1, nothing written."""

from __future__ import annotations

import pytest

from anima_rknn.demo.train_lora import work_folder


def assert_one_line(result, *needles: str) -> None:
    assert result.code == 1 and "Traceback" not in result.err, result.err
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.mark.parametrize("args, needle", [
    (("--out", "{tmp}/l.pt"), "must be a .safetensors file"),
    (("--out", "{tmp}/l.safetensors", "--rank", "0"), "rank must be an integer in [1, 64]"),
    (("--out", "{tmp}/l.safetensors", "--minutes", "0"), "minutes must be a finite number > 0"),
    (("--out", "{tmp}/l.safetensors", "--steps", "0"), "steps must be an integer >= 1"),
    (("--out", "{tmp}/none/l.safetensors",), "does not exist"),
    (("--out", "{tmp}/l.safetensors", "--model", "{tmp}/nothing"), "nothing"),
])
def test_train_demo_lora_refuses_bad_input_in_one_line(args, needle, run_cli, tmp_path) -> None:
    result = run_cli("train-demo-lora", *(a.format(tmp=tmp_path) for a in args))
    assert_one_line(result, needle)
    assert list(tmp_path.iterdir()) == []


def test_an_existing_lora_is_not_replaced_without_overwrite(run_cli, tmp_path) -> None:
    out = tmp_path / "l.safetensors"
    out.write_bytes(b"mine")
    assert_one_line(run_cli("train-demo-lora", "--out", out, "--steps", "1"), "--overwrite")
    assert out.read_bytes() == b"mine" and not work_folder(out).exists()


@pytest.mark.parametrize("args, needle", [
    (("--lora", "{tmp}/missing.safetensors"), "LoRA file not found"),
    (("--lora", "{tmp}/l.ckpt"), "pickles are never loaded"),
    (("--lora", "{tmp}/l.safetensors:big"), "is not a number"),
    (("--concept", "large", "--prompts", "1"), "2 to"),
])
def test_eval_demo_refuses_bad_lora_settings_in_one_line(args, needle, run_cli, tmp_path) -> None:
    (tmp_path / "l.ckpt").write_bytes(b"not read")
    sheet = tmp_path / "sheet.png"
    result = run_cli("eval-demo", "--sheet", sheet, "--prompts", "2", *(a.format(tmp=tmp_path) for a in args))
    assert_one_line(result, needle)
    assert not sheet.exists()
