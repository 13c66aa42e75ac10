"""Local mode through its parts: the output folder's records, skipping finished jobs, redoing damaged ones,
refusing another batch's folder, and a job stopped mid-way continued from its resume state."""

import dataclasses
import json

import pytest
import torch

from anima_rknn.batch.jobs_file import name_jobs, read_jobs
from anima_rknn.batch.local import LocalRunner
from anima_rknn.batch.results import MAX_RECORD_BYTES, RESULTS, Results
from anima_rknn.batch.worker import Worker
from anima_rknn.errors import AnimaError
from anima_rknn.generation.params import GenerationParams
from anima_rknn.generation.pipeline import AnimaPipeline
from anima_rknn.generation.resume import Interrupted

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def worker(tiny_set):
    return Worker(tiny_set, keep_models=True)


def _jobs(tmp_path, tiny_set, prompts=("a red circle", "a blue square"), seeds=(1, 2), steps=3):
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(prompts) + "\n")
    jobs = read_jobs(path, GenerationParams(prompt="", width=64, height=64, steps=steps), list(seeds))
    pipeline = AnimaPipeline(tiny_set)
    name_jobs(jobs, pipeline.fingerprints)
    return jobs


def _run(worker, jobs, folder, **runner_options):
    results = Results(folder, jobs, overwrite=False)
    todo = [job for job in jobs if not results.done(job)]
    LocalRunner(worker, results.folder, **runner_options).run(todo, results.add)
    return todo


def _records(folder):
    return [json.loads(line) for line in (folder / RESULTS).read_text().splitlines()]


def test_records_in_job_order_then_nothing_left_to_do(tmp_path, tiny_set, worker):
    jobs = _jobs(tmp_path, tiny_set)
    out = tmp_path / "out"
    assert len(_run(worker, jobs, out)) == 4
    records = _records(out)
    assert [r["job"] for r in records] == [j.id for j in jobs]
    assert all(r["finite"] and r["image"] == f"{r['job']}.png" and (out / r["image"]).is_file() for r in records)
    assert records[1]["params"]["seed"] == 2 and records[1]["worker"] == worker.name
    assert {"encode_s", "denoise_s", "decode_s", "total_s", "job_s"} <= set(records[0]["timings"])
    assert _run(worker, jobs, out) == []  # everything done: the second run does nothing
    assert _records(out) == records


def test_a_damaged_or_missing_image_is_made_again(tmp_path, tiny_set, worker):
    jobs = _jobs(tmp_path, tiny_set, prompts=("cat",), seeds=(1, 2, 3))
    out = tmp_path / "out"
    _run(worker, jobs, out)
    originals = {j.id: (out / j.image).read_bytes() for j in jobs}
    (out / jobs[0].image).write_bytes(originals[jobs[0].id][:100])  # truncated
    (out / jobs[2].image).unlink()
    assert [j.id for j in _run(worker, jobs, out)] == [jobs[0].id, jobs[2].id]
    assert {j.id: (out / j.image).read_bytes() for j in jobs} == originals  # the same images again


def test_extending_the_sweep_runs_only_the_new_jobs(tmp_path, tiny_set, worker):
    out = tmp_path / "out"
    _run(worker, _jobs(tmp_path, tiny_set, prompts=("cat",), seeds=(1,)), out)
    more = _jobs(tmp_path, tiny_set, prompts=("cat",), seeds=(1, 2))
    assert [j.params.seed for j in _run(worker, more, out)] == [2]


def test_another_batch_s_folder_is_refused_until_overwrite(tmp_path, tiny_set, worker):
    out = tmp_path / "out"
    _run(worker, _jobs(tmp_path, tiny_set, prompts=("cat",), seeds=(1,)), out)
    other = _jobs(tmp_path, tiny_set, prompts=("dog",), seeds=(1,))
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(AnimaError, match="holds another batch's results"):
        Results(out, other, overwrite=False)
    assert sorted(p.name for p in out.iterdir()) == before
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "notes.txt").write_text("mine")
    with pytest.raises(AnimaError, match="is not empty"):
        Results(tmp_path / "elsewhere", other, overwrite=False)
    assert Results(out, other, overwrite=True).records == {}


def test_the_records_are_read_a_bounded_line_at_a_time(tmp_path, tiny_set):
    """A results.jsonl line longer than any record is refused at that line, read no further than the bound (a
    200 MiB file of newlines read whole peaked at 2.2 GB; read a line at a time, at the process's own size)."""
    jobs = _jobs(tmp_path, tiny_set, prompts=("cat",), seeds=(1,))
    out = tmp_path / "out"
    out.mkdir()
    record = json.dumps({"job": jobs[0].id, "line": 1}).encode()
    (out / RESULTS).write_bytes(record + b"\n" + b" " * (MAX_RECORD_BYTES + 1) + b"\n" + record + b"\n")
    with pytest.raises(AnimaError, match=f"^{out / RESULTS} line 2 is longer than 1 MiB, which no record is"):
        Results(out, jobs, overwrite=False)
    (out / RESULTS).write_bytes(b"\n" * 1000)
    with pytest.raises(AnimaError, match=f"^{out / RESULTS} line 1 is not valid JSON"):
        Results(out, jobs, overwrite=False)
    (out / RESULTS).write_bytes(record + b"\n" + record)  # the last line need not end in a newline
    assert list(Results(out, jobs, overwrite=False).records) == [jobs[0].id]


def test_a_stopped_job_continues_from_its_state(tmp_path, tiny_set, worker):
    """The resume seam: a stop mid-job keeps the job's state; the next run continues it, same image."""
    jobs = _jobs(tmp_path, tiny_set, prompts=("cat",), seeds=(1, 2), steps=6)
    reference = tmp_path / "reference"
    _run(worker, jobs, reference)
    out, steps_seen = tmp_path / "out", []
    checkpointing = Worker(tiny_set, keep_models=True, checkpoint_every=1)

    def stop() -> bool:  # asked after each step: stop the second job after its third step
        return len(steps_seen) == 6 + 3

    with pytest.raises(Interrupted) as stopped:
        _run(checkpointing, jobs, out, stop=stop, on_step=lambda e: steps_seen.append(e.step))
    state = out / f"{jobs[1].image}.state"
    assert stopped.value.path == state and state.is_file() and (stopped.value.step, stopped.value.total) == (3, 6)
    assert [r["job"] for r in _records(out)] == [jobs[0].id]  # the first job published, the second not

    steps_seen.clear()
    assert _run(checkpointing, jobs, out, on_step=lambda e: steps_seen.append(e.step)) == [jobs[1]]
    assert steps_seen == [4, 5, 6]  # continued, not started over
    assert not state.exists()
    assert all((out / j.image).read_bytes() == (reference / j.image).read_bytes() for j in jobs)


def test_a_bench_sweep_job_by_job_equals_run_bench(tmp_path, tiny_set, worker):
    """bench's seeds as batch jobs (Worker.run_task with bench's SweepTask): each seed's runs are those of the
    in-process run_bench, and the worker encodes the prompt once for the seeds of one setting."""
    from anima_rknn.bench.run import Sweep, SweepTask, merge, run_bench

    jobs = _jobs(tmp_path, tiny_set, prompts=("a red circle",), seeds=(3, 4), steps=6)
    sweep = Sweep(("spectrum",), {"warmup": 2})
    published = []
    LocalRunner(worker, tmp_path).run_tasks(jobs, SweepTask(sweep), lambda job, outcome: published.append(outcome))
    assert [o.result.seeds[0].seed for o in published] == [3, 4] and all(o.error is None for o in published)
    assert published[0].result.conditioning is published[1].result.conditioning  # encoded once
    assert all(o.worker == worker.name for o in published)
    merged = merge([o.result for o in published])
    alone = run_bench(AnimaPipeline(tiny_set, keep_dit=True), jobs[0].params, ["spectrum"], {"warmup": 2}, [3, 4])
    for ours, theirs in zip(merged.seeds, alone.seeds, strict=True):
        assert ours.worker is None and theirs.worker is None  # cli/bench names the worker of each outcome
        for side, policy in (("baseline", ours.baseline), ("spectrum", ours.cached["spectrum"])):
            reference = theirs.baseline if side == "baseline" else theirs.cached["spectrum"]
            assert policy.first.denoised.sample.computed_steps == reference.first.denoised.sample.computed_steps
            assert torch.equal(torch.as_tensor(policy.first.denoised.sample.latent),
                               torch.as_tensor(reference.first.denoised.sample.latent))
    other = dataclasses.replace(jobs[0].params, cfg=2.0)
    assert worker.kept.takes(jobs[1].params, sweep) and not worker.kept.takes(other, sweep)
    assert not worker.kept.takes(jobs[1].params, Sweep(("reuse",)))
