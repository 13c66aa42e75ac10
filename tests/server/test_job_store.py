"""The job store under hostile and damaged input, and its paging: what jobs.sqlite and the data folder hold is
read back as untrusted input; a bad row fails in one line and the server runs on."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sqlite3
import subprocess
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from test_server import SMALL, call, running

from anima_rknn.errors import AnimaError
from anima_rknn.generation.params import build, settings_of
from anima_rknn.generation.pipeline import AnimaPipeline
from anima_rknn.server.job_queue import JobQueue
from anima_rknn.server.store import FINISHED, STORE


@pytest.fixture(scope="module")
def pipeline(tiny_set):
    return AnimaPipeline(tiny_set)


@pytest.fixture
def idle(pipeline, tmp_path):
    """A queue whose worker never starts: jobs stay queued, in the order given."""
    return JobQueue(pipeline, tmp_path / "data", max_queue=16)


def test_the_job_list_is_paged_newest_first_with_the_total_in_a_header(idle):
    jobs = [idle.submit(build({"prompt": f"job {i}", **SMALL, "seed": i})) for i in range(5)]
    newest = [job.id for job in reversed(jobs)]
    with running(idle) as url:
        with urllib.request.urlopen(f"{url}/api/jobs?limit=2&offset=1") as response:
            assert response.headers["X-Total-Count"] == "5"
            assert [job["id"] for job in json.loads(response.read())] == newest[1:3]
        assert [job["id"] for job in call(f"{url}/api/jobs")[1]] == newest  # default: the 50 newest
        assert call(f"{url}/api/jobs?offset=5")[1] == []
        for query in ("limit=0", "limit=201", "limit=-1", "limit=2.5", "offset=-1", "offset=x", "limit=",
                      "limit=%EF%BC%93"):  # a full-width digit is no number here
            code, answer = call(f"{url}/api/jobs?{query}")
            assert code == 400 and "must be a whole number" in answer["error"], (query, answer)


# ---- rows and files read back -----------------------------------------------------------------------------

GOOD = settings_of(build({"prompt": "a cat", **SMALL, "seed": 1}))


def rows(data_dir: Path, *values: tuple) -> None:
    """Rows written into the store behind the server's back, as anyone who can write the folder could."""
    with sqlite3.connect(data_dir / STORE) as db:
        db.executemany("INSERT INTO jobs VALUES (?, ?, ?, ?, ?, ?)", values)


def state_of(data_dir: Path, job_id: object) -> tuple:
    with sqlite3.connect(data_dir / STORE) as db:
        return db.execute("SELECT state, error FROM jobs WHERE id IS ?", (job_id,)).fetchone()


def test_rows_that_cannot_be_jobs_are_marked_failed_in_one_line_and_the_server_runs_on(pipeline, tmp_path, caplog):
    data = tmp_path / "data"
    JobQueue(pipeline, data)  # an empty store
    bad = {
        "../escaped-job": (time.time(), "queued", json.dumps(GOOD), None, None),  # its PNG would land outside
        "a" * 15 + "/": (time.time(), "queued", json.dumps(GOOD), None, None),
        "1000000000000001": (time.time(), "queued", "{not json", None, None),
        "1000000000000002": (time.time(), "completed", json.dumps(GOOD), "[1, 2", None),
        "1000000000000003": (time.time(), "queued", json.dumps(GOOD | {"colour": "red"}), None, None),
        "1000000000000004": (None, "queued", json.dumps(GOOD), None, None),
        "1000000000000005": ("yesterday", "queued", json.dumps(GOOD), None, None),
        "1000000000000006": (time.time(), "queued", json.dumps(GOOD | {"cfg": math.nan}), None, None),
        "1000000000000007": (time.time(), "completed", json.dumps(GOOD), '{"psnr": NaN}', None),
        "1000000000000008": (time.time(), "exploded", json.dumps(GOOD), None, None),
        "1000000000000009": (time.time(), "queued", json.dumps(GOOD | {"width": "wide"}), None, None),
        "100000000000000a": (time.time(), "queued", "[]", None, None),
        "100000000000000b": (time.time(), "failed", json.dumps(GOOD), None, b"\xff"),  # a blob, not text
    }
    rows(data, *((job_id, *row) for job_id, row in bad.items()),
         ("00000000000000aa", time.time(), "queued", json.dumps(GOOD), None, None))
    with caplog.at_level(logging.WARNING, "anima_rknn.server.store"):
        queue = JobQueue(pipeline, data)
    lines = [r.getMessage() for r in caplog.records if "marked failed" in r.getMessage()]
    assert len(lines) == len(bad) and all("\n" not in line for line in lines), lines
    assert [job.id for job in queue.recent()] == ["00000000000000aa"] and queue.position(queue.recent()[0]) == 1
    for job_id in bad:
        assert state_of(data, job_id)[0] == "failed", job_id
    assert "unknown" not in state_of(data, "1000000000000003")[1] and "colour" in state_of(data, "1000000000000003")[1]
    with running(queue) as url:
        code, listed = call(f"{url}/api/jobs")
    assert code == 200 and [job["id"] for job in listed] == ["00000000000000aa"]
    assert not (tmp_path / "escaped-job.png").exists()


def test_rows_over_the_servers_limits_fail_in_one_line(pipeline, tmp_path):
    data = tmp_path / "data"
    JobQueue(pipeline, data)
    large = settings_of(build({"prompt": "a cat", "width": 2048, "height": 2048, "steps": 2, "seed": 1}))
    many = settings_of(build({"prompt": "a cat", **SMALL, "steps": 500, "seed": 1}))
    rows(data, ("00000000000000a1", time.time(), "queued", json.dumps(large), None, None),
         ("00000000000000a2", time.time() + 1, "generating", json.dumps(many), None, None))
    queue = JobQueue(pipeline, data, max_side=1024, max_steps=150)
    large_job, many_job = queue.get("00000000000000a1"), queue.get("00000000000000a2")
    assert large_job.state == many_job.state == "failed" and queue.position(large_job) is None
    assert large_job.error == "its picture (2048 px a side) is over this server's --max-side 1024"
    assert many_job.error == "its steps are over this server's --max-steps 150"
    assert state_of(data, "00000000000000a1")[0] == "failed"


def _real_store(pipeline, data: Path) -> bytes:
    queue = JobQueue(pipeline, data)
    queue.submit(build({"prompt": "a cat", **SMALL, "seed": 1}))
    queue.store._db.close()
    return (data / STORE).read_bytes()


@pytest.mark.parametrize("damage", ["random bytes", "truncated", "another table", "empty jobs table of another kind"])
def test_a_store_that_is_not_this_servers_is_refused_in_one_line_and_kept(pipeline, tmp_path, damage):
    data = tmp_path / "data"
    store = data / STORE
    real = _real_store(pipeline, data)
    if damage == "random bytes":
        store.write_bytes(np.random.default_rng(0).bytes(8192))
    elif damage == "truncated":
        store.write_bytes(real[: len(real) // 2])
    else:
        store.unlink()
        with sqlite3.connect(store) as db:
            db.execute("CREATE TABLE jobs (id TEXT, colour TEXT)" if damage == "another table" else
                       "CREATE TABLE jobs (id TEXT, created REAL)")
    before = store.read_bytes()
    with pytest.raises(AnimaError) as refused:
        JobQueue(pipeline, data)
    message = str(refused.value)
    assert "\n" not in message and str(store) in message and "is not a job store this server can use" in message
    assert store.read_bytes() == before  # never deleted or rewritten


@contextlib.contextmanager
def mounted(target: Path, *options: str, source: str = "tmpfs"):
    """A mount for the length of a test (tmpfs of a given size, or a read-only bind); skipped where this user
    cannot mount (not root)."""
    args = ["mount", "--bind", source, str(target)] if source != "tmpfs" else ["mount", "-t", "tmpfs", "-o",
                                                                                ",".join(options), "tmpfs", str(target)]
    if os.geteuid() != 0 or subprocess.run(args, capture_output=True).returncode != 0:
        pytest.skip("needs mount (root)")
    try:
        if source != "tmpfs":
            subprocess.run(["mount", "-o", "remount,bind,ro", str(target)], check=True, capture_output=True)
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=True)


def test_a_read_only_store_is_refused_at_start_not_mid_job(pipeline, tmp_path):
    data = tmp_path / "data"
    _real_store(pipeline, data)
    store = data / STORE
    with mounted(store, source=str(store)):  # the store alone read-only (root ignores a file's mode)
        with pytest.raises(AnimaError, match="readonly"):
            JobQueue(pipeline, data)


def _finished(queue: JobQueue, job_id: str, seconds: float = 120) -> dict:
    deadline = time.monotonic() + seconds
    while (job := queue.get(job_id)).state not in FINISHED:
        assert time.monotonic() < deadline, "the job did not finish"
        time.sleep(0.05)
    return job


def test_only_a_plain_png_of_the_data_folder_is_served(pipeline, tmp_path):
    queue = JobQueue(pipeline, tmp_path / "data")
    queue.start()
    try:
        job = _finished(queue, queue.submit(build({"prompt": "a cat", **SMALL, "seed": 1})).id)
        png = queue.image_path(job)
        with running(queue) as url:
            code, served = call(f"{url}/api/jobs/{job.id}/image")
            assert code == 200 and served == png.read_bytes()
            original = png.read_bytes()
            outside = tmp_path / "outside.png"
            outside.write_bytes(original)
            for swap in ("symlink to /etc/passwd", "symlink to a PNG outside", "hard link", "folder", "missing",
                         "not a PNG"):
                png.unlink(missing_ok=True)
                if swap == "symlink to /etc/passwd":
                    png.symlink_to("/etc/passwd")
                elif swap == "symlink to a PNG outside":
                    png.symlink_to(outside)
                elif swap == "hard link":
                    os.link(outside, png)
                elif swap == "folder":
                    png.mkdir()
                elif swap == "not a PNG":
                    png.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n")
                code, answer = call(f"{url}/api/jobs/{job.id}/image")
                assert code == 410 and answer == {"error": f"the image of job {job.id} is no longer on the server"}, \
                    (swap, code, answer)
                if png.is_dir() and not png.is_symlink():
                    png.rmdir()
    finally:
        queue.close()


def fill(path: Path) -> None:
    """`path` grown until the file system has no byte left (a real ENOSPC for everything after)."""
    with open(path, "wb", buffering=0) as f:
        for chunk in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * chunk)


def test_a_full_disk_refuses_a_submission_with_507_and_a_finishing_job_fails_in_one_line(pipeline, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    with mounted(data, "size=4m"):
        queue = JobQueue(pipeline, data)
        filler = data / "filler"
        with running(queue) as url:
            fill(filler)
            before = queue.count()
            code, answer = call(f"{url}/api/jobs", {"prompt": "a cat", **SMALL})
            assert code == 507 and "disk is full" in answer["error"] and str(data) not in answer["error"], answer
            assert queue.count() == before and queue.position  # nothing was queued
            code, answer = call(f"{url}/sdapi/v1/txt2img", {"prompt": "a cat", **SMALL})
            assert code == 507, answer
            code, answer = call(f"{url}/v1/images/generations", {"prompt": "a cat", "size": "64x64"})
            assert code == 507 and "disk is full" in answer["error"]["message"], answer  # OpenAI's shape
            # A job stored while there was room, finishing on a full disk: it fails, the worker lives on.
            filler.write_bytes(b"")
            stored = queue.submit(build({"prompt": "a cat", **SMALL, "seed": 2}))
            fill(filler)
            queue.start()
            failed = _finished(queue, stored.id)
            assert failed.state == "failed" and "\n" not in failed.error and str(data) not in failed.error, failed.error
            filler.unlink()
            code, job = call(f"{url}/api/jobs", {"prompt": "a cat", **SMALL, "seed": 3})
            assert code == 200 and _finished(queue, job["id"]).state == "completed"  # the worker ran it
        queue.close()


# ---- retention and DELETE ---------------------------------------------------------------------------------

def test_the_store_keeps_the_newest_jobs_never_an_unfinished_one(pipeline, tmp_path):
    data = tmp_path / "data"
    JobQueue(pipeline, data)
    record = json.dumps({"timings": {"denoise_s": 1.0}, "computed_steps": [1, 2]})
    states = ["completed", "queued", "failed", "completed", "cancelled", "completed"]  # oldest first
    ids = [f"{i:016x}" for i in range(len(states))]
    rows(data, *((job_id, 1000.0 + i, state, json.dumps(GOOD), record if state == "completed" else None, None)
                 for i, (job_id, state) in enumerate(zip(ids, states))))
    for job_id in ids:
        (data / f"{job_id}.png").write_bytes(b"png")
        (data / f"{job_id}.png.state").write_bytes(b"state")
    queue = JobQueue(pipeline, data, keep_jobs=3)
    # Three go, the oldest finished ones; the queued one (second oldest) stays, over the count if need be.
    kept = {ids[1], ids[4], ids[5]}
    assert {job.id for job in queue.recent()} == kept and queue.count() == 3
    for job_id in ids:
        assert (state_of(data, job_id) is not None) == (job_id in kept)
        assert (data / f"{job_id}.png").exists() == (job_id in kept)
        assert (data / f"{job_id}.png.state").exists() == (job_id in kept)
    with running(queue) as url:
        assert call(f"{url}/api/jobs/{ids[4]}", method="DELETE") == (200, {"id": ids[4], "deleted": True})
        assert state_of(data, ids[4]) is None and not (data / f"{ids[4]}.png").exists()
        assert not (data / f"{ids[4]}.png.state").exists() and queue.get(ids[4]) is None
        code, answer = call(f"{url}/api/jobs/{ids[1]}", method="DELETE")
        assert code == 409 and answer == {"error": f"job {ids[1]} is queued: cancel it first"}
        assert call(f"{url}/api/jobs/{ids[4]}", method="DELETE")[0] == 404
    assert queue.get(ids[1]).state == "queued" and (data / f"{ids[1]}.png.state").exists()


def test_new_jobs_push_the_oldest_finished_one_out(pipeline, tmp_path):
    queue = JobQueue(pipeline, tmp_path / "data", keep_jobs=2)  # not started: every job stays as it is made
    oldest = queue.submit(build({"prompt": "a cat", **SMALL, "seed": 1}))
    queue.cancel(oldest)
    queued = [queue.submit(build({"prompt": "a cat", **SMALL, "seed": seed})) for seed in (2, 3)]
    assert [job.id for job in queue.recent()] == [queued[1].id, queued[0].id] and queue.get(oldest.id) is None
    queue.submit(build({"prompt": "a cat", **SMALL, "seed": 4}))
    assert queue.count() == 3  # over the count: no queued job is ever removed


def test_a_running_job_cannot_be_deleted(pipeline, tmp_path):
    queue = JobQueue(pipeline, tmp_path / "data")
    queue.start()
    try:
        long = queue.submit(build({"prompt": "a cat", **SMALL, "steps": 150, "seed": 1}))
        while queue.current is not long:
            time.sleep(0.02)
        with running(queue) as url:
            code, answer = call(f"{url}/api/jobs/{long.id}", method="DELETE")
        assert code == 409 and answer == {"error": f"job {long.id} is generating: cancel it first"}
        queue.cancel(long)
        assert _finished(queue, long.id).state == "cancelled"
    finally:
        queue.close()


def test_a_failed_jobs_error_names_no_server_folder(pipeline, tmp_path, tiny_set, caplog):
    from lora_files import comfy, random_pairs, write_lora

    from anima_rknn.model.io import read_dit_config

    loras = tmp_path / "private-loras"
    loras.mkdir()
    lora = write_lora(loras / "style.safetensors", comfy(random_pairs(read_dit_config(tiny_set.dit), seed=1)))
    queue = JobQueue(pipeline, tmp_path / "data")
    job = queue.submit(build({"prompt": "a cat <lora:style:1>", **SMALL}, lora_dir=loras))
    lora.unlink()  # gone before the job runs
    with caplog.at_level(logging.WARNING, "anima_rknn.server.job_queue"):
        queue.start()
        try:
            failed = _finished(queue, job.id)
        finally:
            queue.close()
    assert failed.state == "failed" and "style.safetensors" in failed.error, failed.error
    assert str(loras) not in failed.error and "private-loras" not in failed.error
    assert any(str(loras) in record.getMessage() for record in caplog.records)  # the log has it whole


def test_serve_refuses_a_damaged_store_in_one_line_and_keeps_it(tiny_set, tmp_path, capsys, monkeypatch):
    import socket
    import sys

    from anima_rknn.cli import main
    from anima_rknn.cli.serve import serve
    from anima_rknn.server.store import KEEP_JOBS

    assert next(p.default for p in serve.params if p.name == "keep_jobs") == KEEP_JOBS
    data = tmp_path / "data"
    data.mkdir()
    (data / STORE).write_bytes(b"not a database, but someone's file" * 100)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(sys, "argv", ["anima-rknn", "serve", "--model", str(tiny_set.dit.parents[2]), "--data-dir",
                                      str(data), "--port", str(port), "--keep-jobs", "5", "--vae-backend", "torch"])
    with pytest.raises(SystemExit) as exited:
        main()
    err = capsys.readouterr().err.strip()
    assert exited.value.code == 1 and "\n" not in err and "Traceback" not in err, err
    assert f"{data / STORE} is not a job store this server can use (file is not a database)" in err
    assert (data / STORE).read_bytes() == b"not a database, but someone's file" * 100


def test_a_jobs_model_is_stored_and_a_model_no_longer_served_fails_it(pipeline, tiny_set, tmp_path):
    """A job keeps the served model it runs on across a restart; an unfinished one whose model the restarted
    server no longer serves fails in one line, a finished one stays listed with its model's name."""
    data = tmp_path / "data"
    first = JobQueue(pipeline, data, models={"tiny": tiny_set, "gone": tiny_set})
    kept, lost = first.submit(build({"prompt": "a", **SMALL, "seed": 1}), "tiny"), first.submit(
        build({"prompt": "b", **SMALL, "seed": 2}), "gone")
    first.store._db.close()
    done = settings_of(build({"prompt": "c", **SMALL, "seed": 3})) | {"model": "gone"}
    rows(data, ("00000000000000b1", time.time(), "cancelled", json.dumps(done), None, None),
         ("00000000000000b2", time.time(), "queued", json.dumps(done | {"model": 7}), None, None))
    again = JobQueue(pipeline, data, models={"tiny": tiny_set})
    assert again.get(kept.id).state == "queued" and again.get(kept.id).model == "tiny"
    assert again.get(lost.id).state == "failed"
    assert again.get(lost.id).error == "its model 'gone' is not one this server runs now (serve --model)"
    assert again.get("00000000000000b1").model == "gone"  # history keeps its name
    assert again.get("00000000000000b2") is None and state_of(data, "00000000000000b2")[0] == "failed"
