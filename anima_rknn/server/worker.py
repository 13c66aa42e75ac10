"""The worker: one thread that runs the queue's jobs one at a time (one NPU, one set of CPU cores), each through
the one job runner (jobs.runner.JobRunner) with its step events (progress, ETA, a live preview) and its
checkpoints (cancel = a stop at the next step boundary; a server shutting down keeps the state for the next start).

It also holds the served models' pipelines: the one running now, and for the others one that has read their
files' headers only; the worker switches when the next job names another model, the model it ran before dropped
whole. The queue (job_queue.py) hands it jobs and takes their ends through the `Jobs` protocol below.
"""

from __future__ import annotations

import io
import math
import threading
from pathlib import Path
from typing import Protocol

from ..checks import shown
from ..errors import AnimaError
from ..generation.pipeline import AnimaPipeline
from ..generation.resume import Interrupted
from ..generation.run_plan import RunPlan
from ..jobs.runner import JobRunner, saved_state
from ..model.model_set import ModelFiles
from ..sampling.sample import StepEvent
from ..vae.preview import projection_for
from .store import Job

PREVIEW_SIDE = 256  # a live preview is the picture's size up to this many pixels a side


class Jobs(Protocol):
    """What the worker needs of the queue."""

    @property
    def stopping(self) -> bool: ...

    def next_job(self) -> Job | None:
        """The next job, marked generating (blocks until there is one); None once the server stops."""

    def started(self, job: Job) -> None:
        """The job's row says generating (StoreError: it cannot run now)."""

    def finish(self, job: Job, state: str, error: str | None = None) -> None: ...

    def plan(self, job: Job) -> RunPlan | None:
        """The run planned for the job at its submission; None when it must be planned again."""

    def requeue(self, job: Job) -> None:
        """The job stopped by a shutdown waits for the next start."""

    def ended(self, job: Job) -> None:
        """The job the worker was running is no longer running (whatever became of it): old jobs may go."""

    def image_path(self, job: Job) -> Path: ...

    def state_path(self, job: Job) -> Path: ...


class Worker:
    """Runs `jobs`' jobs on `pipeline` (the first served model) or, for a job naming another of `models`, on that
    model's pipeline. `checkpoint_every`: steps between a running job's resume states."""

    def __init__(self, jobs: Jobs, pipeline: AnimaPipeline, models: dict[str, ModelFiles],
                 checkpoint_every: int | None) -> None:
        self.jobs, self.pipeline, self.models = jobs, pipeline, models
        self.checkpoint_every = checkpoint_every
        # A periodic checkpoint that cannot be written costs the resume, not the job.
        self.runner = JobRunner(pipeline, checkpoint_every=checkpoint_every, warn=lambda e: None)
        self.projection = projection_for(pipeline.files.vae)
        self._idle: dict[str, AnimaPipeline] = {}  # pipelines of models not running now: headers read, nothing loaded
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._work, name="anima-jobs", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        # No timeout: the running job stops at its next step boundary and writes its state, however long a step
        # takes; a process that left with the worker still inside torch would abort (SIGABRT) and lose the state.
        if self._thread.is_alive():
            self._thread.join()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def pipeline_for(self, model: str | None) -> AnimaPipeline:
        """The pipeline of a served model: the one running now, or one that has read its files' headers only."""
        with self._lock:
            if model is not None and model not in self.models:
                raise AnimaError(f"model {shown(model)} is not one this server runs")
            if model is None or self.models[model] == self.pipeline.files:
                return self.pipeline
            idle, keep = self._idle.get(model), self.pipeline.keep_dit
        if idle is None:  # made outside the lock: it reads the files' headers and the tokenizers
            idle = AnimaPipeline(self.models[model], keep_dit=keep)
            with self._lock:
                idle = self._idle.setdefault(model, idle)
        return idle

    def _switch_to(self, model: str | None) -> None:
        """The worker runs `model` from now on; the model it ran before is dropped whole (its kept DiT freed)."""
        pipeline = self.pipeline_for(model)
        if pipeline is not self.pipeline:
            with self._lock:
                self._idle.pop(model, None)
                self.pipeline = pipeline
            self.runner = JobRunner(pipeline, checkpoint_every=self.checkpoint_every, warn=lambda e: None)
            self.projection = projection_for(pipeline.files.vae)

    def _work(self) -> None:
        while (job := self.jobs.next_job()) is not None:
            try:
                self.jobs.started(job)
                self._switch_to(job.model)
                self._run(job)
            except AnimaError as e:  # the worker outlives any job: this one ends failed, the next one runs
                if not job.done.is_set():
                    self.jobs.finish(job, "failed", str(e))
            except Exception as e:
                if not job.done.is_set():
                    self.jobs.finish(job, "failed", f"internal error: {type(e).__name__}: {e}".splitlines()[0])
            finally:
                self.jobs.ended(job)

    def _preview_upscale(self, latent_side: int) -> int:
        """How much a live preview enlarges the latent: to the picture's own size up to PREVIEW_SIDE px (a 64-px
        picture's preview is 64 px, not a 32-px smudge), and never less than 4x, as before, for large pictures."""
        side = min(latent_side * self.pipeline.vae_config.scale_factor, PREVIEW_SIDE)
        return max(4, math.ceil(side / latent_side))

    def on_step(self, job: Job, event: StepEvent) -> None:
        """A step of the running job: its progress and live preview."""
        image = self.projection.to_image(event.x0, self._preview_upscale(max(event.x0.shape[-2:])))
        buffer = io.BytesIO()
        image.save(buffer, format="PNG", compress_level=1)
        # The preview first: a client that sees step N also finds that step's picture (/progress read between
        # the two answered a step with no current_image).
        job.preview = buffer.getvalue()
        job.step, job.total, job.eta_s = event.step, event.total, event.eta_s

    def _run(self, job: Job) -> None:
        state, to = self.jobs.state_path(job), self.jobs.image_path(job)
        try:
            # The plan made at submission; a job read back from the store after a restart is a new run, planned now
            # (its settings were validated when it was read).
            plan = self.jobs.plan(job) or self.pipeline.prepare(job.params, validated=True)
            published = self.runner.run(plan, state=state, to=to, overwrite=True,
                                        image=f"/api/jobs/{job.id}/image", resume=saved_state(state),
                                        on_step=lambda event: self.on_step(job, event), stop=job.cancel.is_set,
                                        interrupt=job.interrupt.is_set)
            job.summary = published.record
            self.jobs.finish(job, "completed")
        except Interrupted:
            if self.jobs.stopping:  # the server is shutting down: the job waits for the next start, state kept
                self.jobs.requeue(job)
                return
            state.unlink(missing_ok=True)
            self.jobs.finish(job, "cancelled")
        except AnimaError as e:  # a failed job is not run again: its state has nothing left to give
            state.unlink(missing_ok=True)
            self.jobs.finish(job, "failed", str(e).splitlines()[0] if str(e) else type(e).__name__)
        except Exception as e:  # the server keeps serving; the job says what went wrong, in one line
            self.jobs.finish(job, "failed", f"internal error: {type(e).__name__}: {e}".splitlines()[0])
