"""One worker slot: a pipeline loaded once, generating jobs one after another and handing back PNG bytes and
the result record. The same class runs in the driver's process (local mode) and as a Ray actor, so both
modes make the same images by the same code."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

from typing import Any, Protocol

from ..errors import AnimaError
from ..generation.params import GenerationParams
from ..generation.pipeline import AnimaPipeline
from ..jobs.runner import JobRunner, saved_state
from ..model.model_set import ModelFiles
from ..sampling.sample import StepCallback
from .jobs_file import BatchJob
from .results import Outcome

# Model expectations the driver sends: for each kind of run in the batch, its settings and the fingerprints
# the driver's own files have (pipeline.fingerprints).
Expected = list[tuple[GenerationParams, dict[str, str | None]]]
WHAT = {"subgraphs": "subgraph set", "loras": "set of LoRA files"}  # fingerprints' names, in words


class Task(Protocol):
    """Work a worker runs for a job instead of making its image (bench's seeds: bench.run.SweepTask). `kept` is
    what this worker's last task returned to keep (None at first), so a task can reuse its set-up across jobs."""

    def run(self, pipeline: AnimaPipeline, params: GenerationParams, kept: Any,
            on_step: StepCallback | None) -> tuple[Any, Any]:
        """(the job's result, what to keep for this worker's next task)."""


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def package_version() -> str:
    from importlib.metadata import version

    return version("anima-rknn")


class Worker:
    def __init__(self, files: ModelFiles, keep_models: bool, *, checkpoint_every: int | None = None,
                 warn: Callable[[AnimaError], None] | None = None) -> None:
        """`checkpoint_every` and `warn`: the job runner's (jobs.runner.JobRunner). Each job runs on its own
        threads (its settings', fixed by the driver: a Ray actor's OMP_NUM_THREADS=1 does not count), so a job
        makes the same image here as in the driver's process."""
        self.pipeline = AnimaPipeline(files.check(), keep_dit=keep_models)
        self.runner = JobRunner(self.pipeline, checkpoint_every=checkpoint_every, warn=warn)
        self.name = worker_name()
        self.kept: Any = None  # what the last task kept (Task.run)

    def check(self, expected: Expected, driver_version: str) -> tuple[str, str | None]:
        """(this worker's name, None) when it would make the driver's images: the same package version, and
        model files with the driver's fingerprints; else (name, what differs, in words)."""
        if package_version() != driver_version:
            return self.name, f"{self.name} runs anima-rknn {package_version()}, the driver {driver_version}"
        for params, prints in expected:
            try:
                mine = self.pipeline.fingerprints(params)
            except AnimaError as e:
                return self.name, f"{self.name}: {e}"
            differ = [name for name in prints if mine.get(name) != prints[name]]
            if differ:
                files = ", ".join(WHAT.get(name, name.replace("_", " ") + " file") for name in differ)
                return self.name, f"{self.name} has another {files} than the driver under the same path"
        return self.name, None

    def run(self, job: BatchJob, state: Path | None = None, on_step: StepCallback | None = None,
            stop: Callable[[], bool] = lambda: False) -> Outcome:
        """One job, its PNG as bytes for the driver to write. With `state`, a state left there by an interrupted
        run of this job is continued, and a stop asked for ends the run with resume.Interrupted (its state kept
        for the next time)."""
        start = time.perf_counter()
        try:
            # The driver's plan (prepare_jobs); without one the job is planned here, its settings validated by the
            # driver's read_jobs.
            plan = job.plan or self.pipeline.prepare(job.params, validated=True)
            published = self.runner.run(plan, state=state, image=job.image, resume=saved_state(state),
                                        on_step=on_step, stop=stop)
        except AnimaError as e:
            return Outcome(job.id, self.name, time.perf_counter() - start, error=str(e))
        return Outcome(job.id, self.name, time.perf_counter() - start, png=published.png, summary=published.record)

    def run_task(self, job: BatchJob, task: Task, on_step: StepCallback | None = None) -> Outcome:
        """`task` for the job, on this worker's pipeline; its result in the Outcome."""
        start = time.perf_counter()
        try:
            result, self.kept = task.run(self.pipeline, job.params, self.kept, on_step)
        except AnimaError as e:
            return Outcome(job.id, self.name, time.perf_counter() - start, error=str(e))
        return Outcome(job.id, self.name, time.perf_counter() - start, result=result)
