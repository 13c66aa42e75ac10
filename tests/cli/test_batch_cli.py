"""`anima-rknn batch` as a user runs it: the images and records of separate `generate` runs, one-line errors
before anything runs, a batch killed mid-way and run again, and --ray local."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from folder_locks import held

from anima_rknn.batch.results import RESULTS

FAST = ("--width", "64", "--height", "64", "--steps", "4")
# What differs between a generate run and the same job in a batch: where the image is, how long it took, who made it.
NOT_COMPARED = {"image", "timings", "job", "line", "png_sha256", "params", "worker"}


def _records(folder):
    return [json.loads(line) for line in (folder / RESULTS).read_text().splitlines()]


def test_batch_matches_separate_generate_runs(run_cli, model_dir, tmp_path, one_thread):
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps({"prompt": "a red circle", "cfg": 3.0}) + "\n"
                    + json.dumps({"prompt": "a blue square", "seed": 11, "cache": "spectrum",
                                  "cache_options": {"warmup": 2}, "steps": 6}) + "\n")
    result = run_cli("batch", jobs, "--model", model_dir, *FAST, "--seeds", "1-2", "--out", tmp_path / "out")
    assert result.code == 0, result.err
    records = _records(tmp_path / "out")
    assert [(r["params"]["prompt"], r["seed"]) for r in records] == [
        ("a red circle", 1), ("a red circle", 2), ("a blue square", 11)]
    for record in records:
        params = record["params"]
        alone = tmp_path / f"alone-{record['job']}.png"
        flags = ["--cache", params["cache"]] + (["--cache-option", "warmup=2"] if params["cache_options"] else [])
        single = run_cli("generate", "--model", model_dir, "-p", params["prompt"], "-W", "64", "-H", "64",
                         "--steps", params["steps"], "--cfg", params["cfg"], "--seed", params["seed"], *flags,
                         "-o", alone, "--json")
        assert single.code == 0, single.err
        report = json.loads(single.out)
        assert {k: v for k, v in record.items() if k not in NOT_COMPARED} == \
               {k: v for k, v in report.items() if k not in NOT_COMPARED}
        # Bit for bit, `parameters` chunk included.
        assert (tmp_path / "out" / record["image"]).read_bytes() == alone.read_bytes()
    again = run_cli("batch", jobs, "--model", model_dir, *FAST, "--seeds", "1-2", "--out", tmp_path / "out")
    assert again.code == 0 and "3 jobs: 3 done before, 0 to run" in again.err


@pytest.mark.parametrize("lines, args, message", [
    (['{"prompt": "cat"}', '{"prompt": "dog"'], (), r"jobs.jsonl line 2: not valid JSON"),
    (['{"prompt": "cat", "sampler": "dpm"}'], (), r"jobs.jsonl line 1: unknown sampler 'dpm'; choose one of euler"),
    (['{"prompt": "cat", "scheduler": "karras", "sampler_name": "dpm"}'], (),
     r"jobs.jsonl line 1: unknown key 'sampler_name'"),
    (['{"prompt": "cat"}', '{"prompt": "cat", "steps": 5000}'], (), r"line 2: steps must be an integer"),
    (['{"prompt": "cat", "width": 4096, "height": 4096}'], ("--no-vae-tiling",), r"line 1: decoding 4096x4096 in one piece needs"),
    (['{"prompt": "cat"}'], ("--seeds", "3-1"), r"--seeds"),
    (['{"prompt": "cat"}'], ("--seed", "-1"), r"a batch needs fixed seeds"),
    (['{"prompt": "cat"}'], ("--ray", "local", "--ray-resources", "{npu: 1}"), r"--ray-resources must be"),
])
def test_bad_input_is_one_line_and_writes_nothing(run_cli, model_dir, tmp_path, lines, args, message):
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text("\n".join(lines) + "\n")
    result = run_cli("batch", jobs, "--model", model_dir, *FAST, "--out", tmp_path / "out", *args)
    assert result.code == 1 and "Traceback" not in result.err
    assert len(result.err.strip().splitlines()) == 1 and result.err.startswith("error: ")
    assert re.search(message, result.err), result.err
    assert not (tmp_path / "out").exists()


def _advertised(help_text: str) -> list[tuple[str, str | None]]:
    """(flag, metavar) of each option `--help` lists: the first long flag of the line (other spellings, such as
    stable-diffusion.cpp's, after it), its metavar if any."""
    found = re.findall(r"^  (?:-\w, )?(--[\w-]+)(?:, -[\w-]+)*(?: / --[\w-]+)?(?: ([^\s][^ \n]*))?(?:  |$)", help_text,
                       re.M)
    return [(flag, metavar or None) for flag, metavar in found if flag != "--help"]


def test_every_option_batch_help_offers_is_taken(run_cli, model_dir, tiny_set, tiny_vae_onnx_set, tmp_path,
                                                 one_thread):
    """batch's --help is built from the one table less what batch refuses: each option it lists, given a valid
    value, gets past the command line and the jobs' defaults (to the missing jobs file, which is read next)."""
    shown = run_cli("batch", "--help")
    assert shown.code == 0 and "--prompt" not in shown.out and "draws a random seed" not in shown.out
    (tmp_path / "lora.safetensors").write_bytes(b"")
    from PIL import Image

    Image.new("RGB", (64, 64)).save(tmp_path / "init.png")
    values = {"--model": model_dir, "--dit": tiny_set.dit, "--text-encoder": tiny_set.text_encoder,
              "--vae": tiny_set.vae, "--qwen-tokenizer": tiny_set.qwen_tokenizer,
              "--t5-tokenizer": tiny_set.t5_tokenizer, "--width": 64, "--height": 64, "--hires-width": 128,
              "--hires-height": 128, "--vae-tile-size": 64, "--vae-tile-overlap": 16, "--seed": 5,
              "--cache-option": "w=0.4", "--rknn-budget": "6GB", "--seeds": "1-2", "--init-img": tmp_path / "init.png",
              "--mask": tmp_path / "init.png", "--lora": f"{tmp_path / 'lora.safetensors'}:0.5", "--outpaint": "8",
              "--ray": "local", "--ray-resources": '{"CPU": 1}', "--out": tmp_path / "out",
              "--vae-subgraphs": tiny_vae_onnx_set}  # (whose tile and overlap become the defaults)
    by_metavar = {"INTEGER": 1, "INTEGER RANGE": 1, "NUMBER": 0.5, "TEXT": "blurry", "DIRECTORY": tmp_path}
    advertised = _advertised(shown.out)
    assert len(advertised) > 60 and ("--threads", "INTEGER") in advertised
    for flag, metavar in advertised:
        if metavar is None:  # a flag
            args = [flag]
        else:
            value = values.get(flag, by_metavar.get(metavar))
            if value is None and metavar.startswith("["):
                value = metavar.strip("[]").split("|")[0]  # a choice: the first
            args = [flag, value]
        extra = (() if flag == "--out" else ("--out", tmp_path / "out")) + (
            () if flag == "--model" else ("--model", model_dir))
        result = run_cli("batch", tmp_path / "no-jobs.jsonl", *args, *extra)
        assert result.code == 1 and "no-jobs.jsonl" in result.err, (flag, result.err)


def test_a_batch_on_a_vae_set_decodes_in_its_tiles(run_cli, model_dir, tiny_vae_onnx_set, tmp_path, one_thread):
    """--vae-subgraphs with a set exported at 64-px tiles, overlap 16: a job that leaves the tile alone decodes in
    the set's tiles, as generate and serve do (engine/vae_plan.py); a job line asking for another tile is refused
    with its line before anything runs."""
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps({"prompt": "a red circle"}) + "\n")
    on_set = ("--model", model_dir, *FAST, "--vae-backend", "onnx", "--vae-subgraphs", tiny_vae_onnx_set)
    result = run_cli("batch", jobs, *on_set, "--steps", "1", "--out", tmp_path / "out")
    assert result.code == 0, result.err
    [record] = _records(tmp_path / "out")
    assert (record["params"]["vae_tile"], record["params"]["vae_overlap"], record["vae_backend"]) == (64, 16, "onnx")
    jobs.write_text(json.dumps({"prompt": "a red circle", "vae_tile": 512}) + "\n")
    refused = run_cli("batch", jobs, *on_set, "--out", tmp_path / "other")
    assert refused.code == 1 and "line 1: the VAE set in" in refused.err and "asked for 512" in refused.err
    assert not (tmp_path / "other").exists()


def test_another_batch_s_folder_is_refused(run_cli, model_dir, tmp_path, one_thread):
    for name, prompt in (("a.txt", "cat"), ("b.txt", "dog")):
        (tmp_path / name).write_text(prompt + "\n")
    assert run_cli("batch", tmp_path / "a.txt", "--model", model_dir, *FAST, "-o", tmp_path / "out").code == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    refused = run_cli("batch", tmp_path / "b.txt", "--model", model_dir, *FAST, "-o", tmp_path / "out")
    assert refused.code == 1 and "holds another batch's results" in refused.err
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == before


def test_a_second_batch_into_a_running_batch_s_folder_is_refused(run_cli, model_dir, tmp_path, one_thread):
    """Two batches at once into one --out (different jobs) would each rewrite results.jsonl with their own
    records: the second is refused in one line while the first holds the folder's lock, and writes nothing."""
    for name, prompt in (("a.txt", "cat"), ("b.txt", "dog")):
        (tmp_path / name).write_text(prompt + "\n")
    out = tmp_path / "out"
    with open(tmp_path / "log", "wb") as log:
        first = subprocess.Popen(_command("batch", tmp_path / "a.txt", "--model", model_dir, "-W", "64", "-H", "64",
                                          "--steps", "1000", "--cfg", "1", "-o", out), stderr=log,
                                 env={**os.environ, "OMP_NUM_THREADS": "1"})
        try:
            deadline = time.monotonic() + 240
            while not (out / RESULTS).is_file() or not held(out):  # the first's records begin
                assert first.poll() is None and time.monotonic() < deadline, (tmp_path / "log").read_text()
                time.sleep(0.02)
            second = run_cli("batch", tmp_path / "b.txt", "--model", model_dir, *FAST, "-o", out)
            assert second.code == 1 and len(second.err.strip().splitlines()) == 1, second.err
            assert f"another anima-rknn run is writing into {out}" in second.err
            assert (out / RESULTS).read_text() == "" and not list(out.glob("*.png"))  # the first's job still runs
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=60)


def test_a_failed_job_is_recorded_the_rest_done_and_retried_next_time(run_cli, model_dir, tmp_path, one_thread):
    (tmp_path / "p.txt").write_text("cat\n" + "cat " * 4100 + "\n")  # 4,100 tokens: refused by the encoder
    args = ("batch", tmp_path / "p.txt", "--model", model_dir, *FAST, "-o", tmp_path / "out")
    first = run_cli(*args)
    assert first.code == 1 and "1 of 2 jobs failed (first: line 2 (seed 20260812): the prompt is 4100 tokens" in first.err
    good, bad = _records(tmp_path / "out")
    assert good["finite"] and "error" not in good and (tmp_path / "out" / good["image"]).is_file()
    assert bad["error"].startswith("the prompt is 4100 tokens long") and "image" not in bad and bad["line"] == 2
    again = run_cli(*args)
    assert again.code == 1 and "2 jobs: 1 done before, 1 to run" in again.err


def _command(*args) -> list[str]:
    return [sys.executable, "-m", "anima_rknn", *map(str, args)]


def test_killed_mid_batch_then_run_again_loses_nothing(run_cli, model_dir, tmp_path, one_thread):
    """SIGKILL while the second job runs, with a checkpoint after every step: the rerun continues that job
    from its state and ends with the images (and records) of an uninterrupted batch, each job once."""
    (tmp_path / "p.txt").write_text("a red circle\n")
    args = ("batch", tmp_path / "p.txt", "--model", model_dir, "-W", "64", "-H", "64", "--steps", "40", "--cfg", "1",
            "--seeds", "1-2", "--checkpoint-every", "1")
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    with open(tmp_path / "log", "wb") as log:
        process = subprocess.Popen(_command(*args, "-o", tmp_path / "out"), stderr=log, env=env)
        deadline = time.monotonic() + 240
        while not list((tmp_path / "out").glob("*.state")) or not (tmp_path / "out" / RESULTS).read_text():
            assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "log").read_text()
            time.sleep(0.02)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
    assert len(_records(tmp_path / "out")) == 1
    again = run_cli(*args, "-o", tmp_path / "out")
    assert again.code == 0 and "2 jobs: 1 done before, 1 to run" in again.err
    assert run_cli(*args, "-o", tmp_path / "clean").code == 0
    resumed, reference = _records(tmp_path / "out"), _records(tmp_path / "clean")
    assert [r["job"] for r in resumed] == [r["job"] for r in reference]  # each job once, in order
    for record in reference:
        assert (tmp_path / "out" / record["image"]).read_bytes() == (tmp_path / "clean" / record["image"]).read_bytes()
    assert not list((tmp_path / "out").glob("*.state")) and not list((tmp_path / "out").glob(".*.part"))


def test_ray_batch_killed_mid_job_continues_from_the_state_on_the_worker_s_node(run_cli, model_dir, tmp_path,
                                                                                 monkeypatch, one_thread):
    """With --ray the output folder is the driver's alone, so a worker checkpoints into its node's cache folder:
    the batch SIGKILLed mid-job and run again continues the job there (fewer model calls than a whole job) and
    makes the uninterrupted image."""
    pytest.importorskip("ray")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the one node's cache, for both runs
    states = tmp_path / "cache" / "anima-rknn" / "batch-states"
    (tmp_path / "p.txt").write_text("a red circle\n")
    args = ("batch", tmp_path / "p.txt", "--model", model_dir, "-W", "64", "-H", "64", "--steps", "400", "--cfg", "1",
            "--seeds", "3", "--checkpoint-every", "1")
    with open(tmp_path / "log", "wb") as log:
        process = subprocess.Popen(_command(*args, "--ray", "local", "--ray-workers", "1", "-o", tmp_path / "out"),
                                   stderr=log, env={**os.environ, "OMP_NUM_THREADS": "1"})
        deadline = time.monotonic() + 240
        while not list(states.glob("*.state")):
            assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "log").read_text()
            time.sleep(0.02)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
    assert _records(tmp_path / "out") == [] and len(list(states.glob("*.state"))) == 1
    again = run_cli(*args, "--ray", "local", "--ray-workers", "1", "-o", tmp_path / "out")
    assert again.code == 0, again.err
    assert run_cli(*args, "-o", tmp_path / "clean").code == 0
    (resumed,), (clean,) = _records(tmp_path / "out"), _records(tmp_path / "clean")
    assert resumed["job"] == clean["job"] and clean["transformer_passes"] == 400
    assert resumed["transformer_passes"] == 400  # counted over the whole run, as its steps are
    assert 0 < resumed["timings"]["stages"]["passes"] < 400  # the passes this run made: continued, not started over
    assert (tmp_path / "out" / resumed["image"]).read_bytes() == (tmp_path / "clean" / clean["image"]).read_bytes()
    assert not list(states.glob("*.state"))


def test_ctrl_c_stops_after_the_step_and_the_next_run_continues(run_cli, model_dir, tmp_path, one_thread):
    (tmp_path / "p.txt").write_text("a red circle\n")
    args = ("batch", tmp_path / "p.txt", "--model", model_dir, "-W", "64", "-H", "64", "--steps", "400", "--cfg", "1",
            "--checkpoint-every", "1000")  # no periodic checkpoint: the state is the stop's own
    with open(tmp_path / "log", "wb") as log:
        process = subprocess.Popen(_command(*args, "-o", tmp_path / "out"), stderr=log,
                                   env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
        deadline = time.monotonic() + 240
        while "step " not in (tmp_path / "log").read_text(errors="replace"):
            assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "log").read_text()
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=120) == 128 + signal.SIGINT
    err = (tmp_path / "log").read_text()
    assert "its state kept; run the same command again to continue" in err and "Traceback" not in err
    assert len(list((tmp_path / "out").glob("*.png.state"))) == 1 and (tmp_path / "out" / RESULTS).read_text() == ""
    again = run_cli(*args, "-o", tmp_path / "out")
    assert again.code == 0 and len(_records(tmp_path / "out")) == 1
    assert not list((tmp_path / "out").glob("*.state"))


def test_ray_local_from_the_command_line(run_cli, model_dir, tmp_path, one_thread):
    pytest.importorskip("ray")
    (tmp_path / "p.txt").write_text("cat\n")
    local = run_cli("batch", tmp_path / "p.txt", "--model", model_dir, *FAST, "--seeds", "1-2", "-o", tmp_path / "a")
    ray = run_cli("batch", tmp_path / "p.txt", "--model", model_dir, *FAST, "--seeds", "1-2", "-o", tmp_path / "b",
                  "--ray", "local", "--ray-workers", "1")
    assert local.code == 0 and ray.code == 0, ray.err
    nobody = run_cli("batch", tmp_path / "p.txt", "--model", model_dir, *FAST, "-o", tmp_path / "c",
                     "--ray", "127.0.0.1:1")
    assert nobody.code == 1 and nobody.err == "error: cannot reach the Ray head at 127.0.0.1:1: Connection refused\n"
    assert not (tmp_path / "c").exists()
    for record in _records(tmp_path / "a"):
        assert (tmp_path / "b" / record["image"]).read_bytes() == (tmp_path / "a" / record["image"]).read_bytes()


def test_bench_takes_its_sweep_from_a_jobs_file(run_cli, model_dir, tmp_path, one_thread):
    (tmp_path / "j.jsonl").write_text('{"prompt": "a red circle", "seed": 5}\n{"prompt": "a red circle", "seed": 2}\n')
    args = ("bench", "--model", model_dir, "-W", "32", "-H", "32", "--steps", "3", "--cache", "none")
    from_jobs = run_cli(*args, "--jobs", tmp_path / "j.jsonl", "--out", tmp_path / "a", "--json")
    assert from_jobs.code == 0, from_jobs.err
    assert [entry["seed"] for entry in json.loads(from_jobs.out)["seeds"]] == [5, 2]
    by_flags = run_cli(*args, "-p", "a red circle", "--seeds", "5,2", "--out", tmp_path / "b")
    assert by_flags.code == 0
    for seed in (5, 2):
        name = f"baseline_seed{seed}.png"
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    (tmp_path / "mixed.jsonl").write_text('{"prompt": "cat", "seed": 1}\n{"prompt": "dog", "seed": 2}\n')
    mixed = run_cli(*args, "--jobs", tmp_path / "mixed.jsonl", "--out", tmp_path / "d")
    assert mixed.code == 1 and "line 2: bench takes one prompt's seeds" in mixed.err and not (tmp_path / "d").exists()
    both = run_cli(*args, "--jobs", tmp_path / "j.jsonl", "-p", "cat", "--out", tmp_path / "e")
    assert both.code == 1 and "drop --prompt and --seeds" in both.err


def test_bench_runs_its_seeds_on_the_batch_runners_locally_and_over_ray(run_cli, model_dir, tmp_path, one_thread):
    pytest.importorskip("ray")
    (tmp_path / "j.jsonl").write_text("".join(json.dumps({"prompt": "a red circle", "seed": s}) + "\n" for s in (5, 2, 7)))
    args = ("bench", "--model", model_dir, "-W", "32", "-H", "32", "--steps", "6", "--cache", "spectrum",
            "--cache-option", "warmup=2", "--jobs", tmp_path / "j.jsonl", "--json")
    local = run_cli(*args, "--out", tmp_path / "local")
    ray = run_cli(*args, "--out", tmp_path / "ray", "--ray", "local", "--ray-workers", "2")
    assert local.code == 0 and ray.code == 0, ray.err
    local_report, ray_report = json.loads(local.out), json.loads(ray.out)
    assert [e["seed"] for e in ray_report["seeds"]] == [5, 2, 7]  # the jobs' order, whoever finished first
    assert all(e["worker"] and e["worker"] != local_report["seeds"][0]["worker"] for e in ray_report["seeds"])
    for entry in local_report["seeds"]:
        for name in (entry["baseline"]["image"], entry["cached"]["spectrum"]["image"]):
            assert (tmp_path / "ray" / name).read_bytes() == (tmp_path / "local" / name).read_bytes()
    for local_entry, ray_entry in zip(local_report["seeds"], ray_report["seeds"], strict=True):
        assert ray_entry["cached"]["spectrum"]["vs_baseline"]["psnr_db"] == \
            local_entry["cached"]["spectrum"]["vs_baseline"]["psnr_db"]
