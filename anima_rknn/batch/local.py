"""Local mode: the jobs one after another in this process, on one worker whose model stays loaded.

Each job checkpoints to `DIR/<id>.png.state` (the job runner's checkpoints: after every computed step once a run
is long, or every N steps), so a batch stopped or killed mid-job continues that job where it was."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..generation.resume import Interrupted, default_state_path
from ..sampling.sample import StepCallback
from .jobs_file import BatchJob
from .results import Outcome
from .worker import Task, Worker

Deliver = Callable[[BatchJob, Outcome], None]


class LocalRunner:
    def __init__(self, worker: Worker, folder: Path, *, stop: Callable[[], bool] = lambda: False,
                 on_step: StepCallback | None = None) -> None:
        self.worker, self.folder, self.stop, self.on_step = worker, folder, stop, on_step

    def run(self, jobs: list[BatchJob], publish: Deliver) -> None:
        for job in jobs:
            if self.stop():  # a stop asked for between jobs ends here
                raise Interrupted(None, 0, job.params.steps)
            publish(job, self.worker.run(job, default_state_path(self.folder / job.image), self.on_step, self.stop))

    def run_tasks(self, jobs: list[BatchJob], task: Task, deliver: Deliver) -> None:
        """`task` for each job (Worker.run_task); nothing to resume: a task's result is made whole."""
        for job in jobs:
            deliver(job, self.worker.run_task(job, task, self.on_step))
