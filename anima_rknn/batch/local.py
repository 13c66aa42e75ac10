"""Local mode: the jobs one after another in this process, on one worker whose model stays loaded.

Each job checkpoints to `DIR/<id>.png.state` (resume.Checkpoints: after every computed step once a run is
long, or every N steps), so a batch stopped or killed mid-job continues that job where it was."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..bench.run import RunCallback, Sweep
from ..errors import AnimaError
from ..generation.resume import Checkpoints, default_state_path
from ..sampling.euler import StepCallback
from .jobs import BatchJob
from .results import Outcome
from .worker import Worker

Publish = Callable[[BatchJob, Outcome], None]


class LocalRunner:
    def __init__(self, worker: Worker, folder: Path, *, checkpoint_every: int | None = None,
                 stop: Callable[[], bool] = lambda: False, on_step: StepCallback | None = None,
                 warn: Callable[[AnimaError], None] | None = None) -> None:
        self.worker, self.folder, self.every, self.stop = worker, folder, checkpoint_every, stop
        self.on_step, self.warn = on_step, warn

    def run(self, jobs: list[BatchJob], publish: Publish) -> None:
        for job in jobs:
            checkpoints = Checkpoints(default_state_path(self.folder / job.image), self.every, self.stop, self.warn)
            checkpoints.stop_before_denoising(job.params.steps)  # a stop asked for between jobs ends here
            publish(job, self.worker.run(job, checkpoints, self.on_step))
            checkpoints.remove()  # published (or failed, to be run afresh): nothing left to resume

    def bench(self, jobs: list[BatchJob], sweep: Sweep, publish: Publish, on_run: RunCallback | None = None) -> None:
        """Each job as one seed of a bench sweep (Worker.bench); nothing to resume: a report is made whole."""
        for job in jobs:
            publish(job, self.worker.bench(job, sweep, on_run, self.on_step))
