"""Ray mode on a real local Ray cluster (2 CPUs, so two worker processes) with the tiny model: the same images
as local mode, a worker killed mid-job, a worker with other model files refused. Skipped without Ray."""

import dataclasses
import json
import os
import signal
from pathlib import Path

import pytest

pytest.importorskip("ray")

from anima_rknn.batch.jobs_file import name_jobs, read_jobs  # noqa: E402
from anima_rknn.batch.local import LocalRunner  # noqa: E402
from anima_rknn.batch.ray_runner import LOCAL, RayRunner, parse_resources, slots  # noqa: E402
from anima_rknn.batch.results import RESULTS, Results  # noqa: E402
from anima_rknn.batch.worker import Worker  # noqa: E402
from anima_rknn.demo.tiny_set import write_model_set  # noqa: E402
from anima_rknn.errors import AnimaError  # noqa: E402
from anima_rknn.generation.params import GenerationParams
from anima_rknn.generation.pipeline import AnimaPipeline  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
CPUS = 2


@pytest.fixture(scope="module")
def sweep(tiny_set, tmp_path_factory):
    """Four jobs, their local-mode images (one thread, as each Ray worker has one CPU), and what workers must have."""
    folder = tmp_path_factory.mktemp("sweep")
    (folder / "prompts.txt").write_text("a red circle\na blue square\n")
    jobs = read_jobs(folder / "prompts.txt", GenerationParams(prompt="", width=64, height=64, steps=3), [1, 2])
    pipeline = AnimaPipeline(tiny_set)
    name_jobs(jobs, pipeline.fingerprints)
    expected = [(jobs[0].params, pipeline.fingerprints(jobs[0].params))]
    results = Results(folder / "local", jobs, overwrite=False)
    LocalRunner(Worker(tiny_set, keep_models=True), results.folder).run(jobs, results.add)
    images = {job.id: (results.folder / job.image).read_bytes() for job in jobs}
    return jobs, expected, images


def _ray_batch(tiny_set, jobs, expected, out, warn=lambda line: None, **options):
    results = Results(out, jobs, overwrite=False)
    with RayRunner(LOCAL, tiny_set, expected, keep_models=True, local_cpus=CPUS, warn=warn, **options) as runner:
        session = Path(runner.temp_dir)
        assert any(session.iterdir())  # the local cluster's session folders are in a folder of ours
        runner.run(jobs, results.add)
    assert not session.exists()  # and gone with it
    return [json.loads(line) for line in (out / RESULTS).read_text().splitlines()]


def test_ray_workers_make_the_local_images(tiny_set, sweep, tmp_path):
    jobs, expected, images = sweep
    records = _ray_batch(tiny_set, jobs, expected, tmp_path / "out")
    assert [r["job"] for r in records] == [j.id for j in jobs]
    assert {j.id: (tmp_path / "out" / j.image).read_bytes() for j in jobs} == images
    assert all(r["worker"] != "?" and r["finite"] for r in records)
    # Each ran on its job's threads (the driver's, in its id), not on the actor's OMP_NUM_THREADS=1 from Ray.
    assert [r["threads"] for r in records] == [j.params.threads for j in jobs] and jobs[0].params.threads >= 1


def test_a_worker_killed_mid_job_costs_a_retry_not_a_job(tiny_set, sweep, tmp_path):
    """With one worker: the batch waits for Ray to restart it (RESTART_WAIT_S at most) rather than give up."""
    jobs, expected, images = sweep
    killed: list[tuple[str, str]] = []

    def kill_first(job, worker: str) -> None:  # the first job handed out: its worker dies before it ends
        if not killed:
            killed.append((job.id, worker))
            os.kill(int(worker.rsplit(":", 1)[1]), signal.SIGKILL)

    lines: list[str] = []
    records = _ray_batch(tiny_set, jobs, expected, tmp_path / "out", on_dispatch=kill_first, max_workers=1,
                         warn=lines.append)
    assert lines == [f"worker {killed[0][1]} died while running job {killed[0][0]} (attempt 1 of 3); it runs again"]
    assert sorted(r["job"] for r in records) == sorted(j.id for j in jobs)  # every job, each once
    assert {j.id: (tmp_path / "out" / j.image).read_bytes() for j in jobs} == images
    job_id, dead = killed[0]
    assert next(r for r in records if r["job"] == job_id)["worker"] != dead  # finished by another process


def test_a_worker_with_other_or_missing_model_files_is_refused(tiny_set, sweep, tmp_path):
    jobs, _, _ = sweep
    other = write_model_set(tmp_path / "other", "tiny", seed=1)  # the driver's files differ from the workers'
    driver = [(jobs[0].params, AnimaPipeline(other).fingerprints(jobs[0].params))]
    with pytest.raises(AnimaError, match="no worker is left to run the batch: .* has another dit file, text encoder "
                                         "file, vae file than the driver"):
        _ray_batch(tiny_set, jobs, driver, tmp_path / "out", max_workers=1)
    assert (tmp_path / "out" / RESULTS).read_text() == ""  # nothing was made
    missing = dataclasses.replace(tiny_set, vae=tmp_path / "not-on-this-node.safetensors")
    results = Results(tmp_path / "out2", jobs, overwrite=False)
    with pytest.raises(AnimaError, match=r"no worker is left to run the batch: [^:]+:\d+: vae file not found"):
        with RayRunner(LOCAL, missing, driver, keep_models=True, local_cpus=1, warn=lambda line: None) as runner:
            runner.run(jobs, results.add)


def test_slots_count_each_node_alone_and_resources_are_checked():
    nodes = [{"Alive": True, "Resources": {"CPU": 8.0, "npu": 1.0}}, {"Alive": True, "Resources": {"CPU": 1.5}},
             {"Alive": True, "Resources": {"CPU": 1.5}}, {"Alive": False, "Resources": {"CPU": 64.0, "npu": 1.0}}]
    assert slots(nodes, {"CPU": 1.0}) == 8 + 1 + 1
    assert slots(nodes, {"npu": 1.0}) == 1
    assert slots(nodes, {"npu": 1.0, "CPU": 4.0}) == 1
    assert parse_resources(None) == {"CPU": 1.0} and parse_resources('{"npu": 1}') == {"npu": 1.0}
    assert parse_resources(None, threads=4) == {"CPU": 4.0}  # a worker per --threads cores: no oversubscription
    for bad in ('{"npu": 0}', "[1]", "{}", "npu", '{"npu": true}'):
        with pytest.raises(AnimaError, match="--ray-resources"):
            parse_resources(bad)
