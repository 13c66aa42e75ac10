"""--threads on every command that runs a model, from the one table: a bad count is one line before any work."""

import pytest

FP32 = ("--dtype", "fp32")  # no dtype probe first
COMMANDS = [("generate", "-p", "cat", *FP32), ("batch", "JOBS", "--out", "OUT", *FP32),
            ("bench", "-p", "cat", "--out", "OUT", *FP32), ("serve", *FP32), ("export-onnx", "--out", "OUT"),
            ("export-vae", "--out", "OUT"), ("verify-rknn", "--subgraphs", "HERE"), ("train-demo", "--out", "OUT"),
            ("train-demo-lora", "--out", "OUT"), ("eval-demo", "--prompts", "1", "--sheet", "SHEET")]
NO_MODEL = ("export-onnx", "export-vae", "train-demo")  # they make one


@pytest.mark.parametrize("command", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_every_model_command_takes_threads_and_refuses_a_bad_count(run_cli, model_dir, tmp_path, command):
    (tmp_path / "jobs.txt").write_text("cat\n")
    args = [{"JOBS": tmp_path / "jobs.txt", "OUT": tmp_path / "out", "HERE": tmp_path,
             "SHEET": tmp_path / "sheet.png"}.get(a, a) for a in command]
    model = ("--model", model_dir) if command[0] not in NO_MODEL else ()
    result = run_cli(*args, *model, "--threads", "-1")
    assert result.code == 1 and result.err.count("\n") == 1, result.err
    assert "threads must be an integer from 0 to 1024, got -1" in result.err
    assert not (tmp_path / "out").exists() and not (tmp_path / "sheet.png").exists()
