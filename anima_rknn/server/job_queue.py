"""The job queue under every HTTP API: one generation at a time, FIFO, persisted, cancellable, resumable.

The queue holds the jobs in memory (waiting, running, finished) over three parts of its own: the job store
(store.py: the SQLite rows, the PNGs and resume states), the uploads store (uploads.py: the init images and masks
by sha256) and the worker (worker.py: the thread that runs them). A restarted server finds every job again: queued
ones run, and the one that was running resumes from its last checkpoint.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from ..checks import shown
from ..core.files import free_space, human_size, output_folder
from ..errors import AnimaError
from ..generation.params import SETTINGS, GenerationParams
from ..generation.pipeline import AnimaPipeline
from ..generation.run_plan import RunPlan
from ..model.model_set import ModelFiles
from .store import (
    FINISHED,
    KEEP_JOBS,
    STORE,
    Job,
    JobStore,
    StoreError,
    remove_temporaries,
)
from .uploads import DecodeTurns, Uploads, image_inputs, without_bytes
from .worker import Worker

log = logging.getLogger(__name__)


class QueueFull(AnimaError):
    """The queue holds its maximum of waiting jobs."""


class JobBusy(AnimaError):
    """The job is queued or running: it cannot be deleted (cancel it first): a 409."""


class JobQueue:
    """`max_side` / `max_steps`: the server's bounds (serve --max-side, --max-steps), which jobs read back from the
    store are held to as requests are; `keep_jobs`: how many jobs the store keeps (older finished ones go).
    `models`: the model sets a job may name (serve given several, by name; `pipeline` runs the first): one is
    loaded at a time, the worker switching when the next job names another."""

    def __init__(self, pipeline: AnimaPipeline, data_dir: Path, *, max_queue: int = 16,
                 checkpoint_every: int | None = None, engine: dict[str, Any] | None = None,
                 max_side: int | None = None, max_steps: int | None = None, keep_jobs: int = KEEP_JOBS,
                 models: dict[str, ModelFiles] | None = None) -> None:
        self.max_queue, self.max_side, self.max_steps, self.keep_jobs = max_queue, max_side, max_steps, keep_jobs
        self.models = dict(models or {})
        # How this server runs the model (subgraph set, NPU options, VAE backend): not part of a job's saved
        # settings, so a job found again after a restart takes them from here.
        self.engine = {key: value for key, value in (engine or {}).items() if key not in SETTINGS}
        self.data_dir = output_folder(data_dir, overwrite=False, holds="other files", resumable=STORE)
        self._lock = threading.Condition()
        self.decodes = DecodeTurns()
        self._jobs: dict[str, Job] = {}
        self._plans: dict[str, RunPlan] = {}  # a waiting job's run, planned at submission (submit_all)
        self._waiting: deque[Job] = deque()
        self.current: Job | None = None
        self._stopping = False
        self.store = JobStore(self.data_dir, self.engine)
        self.uploads = Uploads(self.data_dir)
        remove_temporaries(self.data_dir)
        self.worker = Worker(self, pipeline, self.models, checkpoint_every)
        self._load()
        self._prune()

    @property
    def pipeline(self) -> AnimaPipeline:
        """The pipeline of the model the worker runs now."""
        return self.worker.pipeline

    @property
    def stopping(self) -> bool:
        return self._stopping

    # ---- what a restart finds -------------------------------------------------------------------------------

    def _load(self) -> None:
        """Jobs of an earlier run of the server: finished ones are listed, the others queued again in order, their
        uploaded images read back (one whose image has gone, or whose settings this server refuses, fails, saying
        so)."""
        for job in self.store.saved_jobs():
            self._jobs[job.id] = job
            if job.state in FINISHED:
                job.mark_done()
                continue
            try:
                self._check_limits(job.params, job.model)
                job.params = self.uploads.with_inputs(job.params)
            except AnimaError as e:
                self.store.state_path(job).unlink(missing_ok=True)  # nothing can resume it
                self.finish(job, "failed", str(e), tidy=False)  # the rows not read yet may need its inputs
                continue
            job.state = "queued"
            self._waiting.append(job)
        self._remove_unused_inputs()

    def _check_limits(self, params: GenerationParams, model: str | None = None) -> None:
        """A job read back is held to this server's --max-side / --max-steps, as a request is, and must name a
        model it serves."""
        if model is not None and self.models and model not in self.models:
            raise AnimaError(f"its model {shown(model)} is not one this server runs now (serve --model)")
        sides = [params.width, params.height, *(params.hires_size() if params.hires else ())]
        if self.max_side is not None and max(sides) > self.max_side:
            raise AnimaError(f"its picture ({max(sides)} px a side) is over this server's --max-side {self.max_side}")
        if self.max_steps is not None and max(params.steps, params.hires_steps or 0) > self.max_steps:
            raise AnimaError(f"its steps are over this server's --max-steps {self.max_steps}")

    # ---- submitting -----------------------------------------------------------------------------------------

    def _check_space(self, batch: list[GenerationParams]) -> None:
        """Refuse (507) jobs whose pictures, uploads and resume states the data folder has no room for now: at most
        3 bytes a pixel for a PNG, and a state's float latent and noise (16 channels a 8 x 8 patch, 4 bytes each)."""
        needed = 0
        for params in batch:
            last = params.passes()[-1]
            needed += last.width * last.height * (3 + 2) + sum(len(image.data or b"") for image in image_inputs(params))
        free = free_space(self.data_dir)
        if needed > free:
            raise StoreError(f"the server's disk is full: {len(batch)} job(s) need about {human_size(needed)}, and "
                             f"{human_size(free)} is free", 507)

    def submit(self, params: GenerationParams, model: str | None = None) -> Job:
        return self.submit_all([params], model)[0]

    def pipeline_for(self, model: str | None) -> AnimaPipeline:
        """The pipeline of a served model: the one running now, or one that has read its files' headers only."""
        return self.worker.pipeline_for(model)

    def submit_all(self, batch: list[GenerationParams], model: str | None = None, *,
                   validated: bool = False) -> list[Job]:
        """Queue every job of a request, or none: a batch that does not fit is refused whole. `model`: the
        served model they run on (None: the queue's first); `validated`: the settings went through validate()
        (a request's, Server.params), so preparing them does not validate them again."""
        self._check_space(batch)  # first: checking a request may take seconds (a VAE probe)
        model = model if model is not None or not self.models else next(iter(self.models))
        pipeline = self.pipeline_for(model)
        # Each job's run is planned now and kept until the worker runs it; a request's jobs differ in their seeds,
        # so its setting is prepared once (its images read once).
        prepared: list[tuple[GenerationParams, RunPlan]] = []
        runs: list[RunPlan] = []
        for params in batch:
            unseeded = dataclasses.replace(params, seed=0)
            plan = next((plan for seen, plan in prepared if seen == unseeded), None)
            if plan is None:
                plan = self._checked(pipeline, params, validated)
                prepared.append((unseeded, plan))
            runs.append(plan.for_settings(params))
        jobs = [Job(secrets.token_hex(8), run.params, time.time(), model=model) for run in runs]
        with self._lock:
            if len(self._waiting) + len(jobs) > self.max_queue:
                raise QueueFull(f"the queue is full ({len(self._waiting)} of {self.max_queue} jobs waiting, "
                                f"{len(jobs)} asked for); try again later")
            try:  # stored first, then queued: a job the store refused (a full disk) is never run
                for params in batch:  # under the lock: a job finishing now cannot remove what these need
                    self.uploads.keep(params)
                self.store.save(*jobs)
            except StoreError:
                self._remove_unused_inputs()
                raise
            for job, run in zip(jobs, runs):
                self._jobs[job.id] = job
                self._plans[job.id] = run
                self._waiting.append(job)
            self._lock.notify_all()
        self._prune()
        return jobs

    def _checked(self, pipeline: AnimaPipeline, params: GenerationParams, validated: bool) -> RunPlan:
        """The job's plan: every setting checked now (a bad request is a 400, not a failed job), its pictures decoded in a turn of
        the decodes (uploads.DecodeTurns: ServerBusy when none comes)."""
        if not image_inputs(params):
            return pipeline.prepare(params, validated=validated)
        with self.decodes.turn():
            return pipeline.prepare(params, validated=validated)

    # ---- the jobs -------------------------------------------------------------------------------------------

    def plan(self, job: Job) -> RunPlan | None:
        """The run planned for `job` at its submission (taken: a job runs its plan once); None for a job read
        back from the store after a restart, which is a new run and is planned again."""
        with self._lock:
            return self._plans.pop(job.id, None)

    def get(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id)

    def position(self, job: Job) -> int | None:
        """0 = running, 1 = next, ...; None once finished."""
        with self._lock:
            if job.state in FINISHED:  # the worker clears `current` just after a job finishes: not "running"
                return None
            if job is self.current:
                return 0
            return next((i + 1 for i, waiting in enumerate(self._waiting) if waiting is job), None)

    def cancel(self, job: Job) -> None:
        """A waiting job is dropped; a running one stops at its next step boundary."""
        with self._lock:
            if job in self._waiting:
                self._waiting.remove(job)
                self.finish(job, "cancelled")
            elif job is self.current:
                job.cancel.set()

    def interrupt(self, job: Job) -> None:
        """WebUI's interrupt: a running job ends after its next step (one at least) and completes with its
        picture as far as it got, its record saying where; a waiting one is dropped, as cancel() drops it."""
        with self._lock:
            if job is self.current:
                job.interrupt.set()
            else:
                self.cancel(job)

    def recent(self, limit: int = 50, offset: int = 0) -> list[Job]:
        """Jobs newest first: `limit` of them after the `offset` newest."""
        with self._lock:
            jobs = list(self._jobs.values())
        return sorted(jobs, key=lambda j: j.created, reverse=True)[offset:offset + limit]

    def count(self) -> int:
        """Every job in the store, finished ones included."""
        return len(self._jobs)

    def image_path(self, job: Job) -> Path:
        return self.store.image_path(job)

    def state_path(self, job: Job) -> Path:
        return self.store.state_path(job)

    def read_image(self, job: Job) -> bytes:
        """The completed job's PNG (store.JobStore.read_image: a plain PNG file of the data folder, or ImageGone)."""
        return self.store.read_image(job)

    def with_inputs(self, params: GenerationParams) -> GenerationParams:
        """`params` with its fingerprint-only images given their bytes from the uploads."""
        return self.uploads.with_inputs(params)

    def delete(self, job: Job) -> None:
        """A finished job, gone with its files: its row, PNG and resume state (and inputs no one else needs).
        A queued or running job is JobBusy."""
        with self._lock:
            if job.state not in FINISHED:
                raise JobBusy(f"job {job.id} is {job.state}: cancel it first")
            self._remove([job])

    def _remove(self, jobs: list[Job]) -> None:
        with self._lock:
            self.store.delete(jobs)
            for job in jobs:
                del self._jobs[job.id]
        if any(image_inputs(job.params) for job in jobs):
            self._remove_unused_inputs()

    def _prune(self) -> None:
        """Keep the newest `keep_jobs` jobs: the oldest finished ones go first, never a queued or running one."""
        with self._lock:
            excess = len(self._jobs) - self.keep_jobs
            if excess <= 0:
                return
            finished = sorted((job for job in self._jobs.values() if job.state in FINISHED), key=lambda j: j.created)
            try:
                self._remove(finished[:excess])
            except StoreError as e:  # the store is kept as it is; the next finished job tries again
                log.warning("old jobs not removed: %s", e)

    def _remove_unused_inputs(self) -> None:
        """Every input that no unfinished job needs, nor a recent completed one (whose twin a compare may queue);
        finished jobs keep their images by fingerprint only, in memory and in their records."""
        with self._lock:
            recent = {job.id for job in self.recent() if job.state == "completed"}
            self.uploads.keep_only(image for job in self._jobs.values()
                                   if job.state not in FINISHED or job.id in recent for image in image_inputs(job.params))

    # ---- the worker's side (worker.Jobs) --------------------------------------------------------------------

    def start(self) -> None:
        self.worker.start()

    def close(self) -> None:
        with self._lock:
            self._stopping = True
            if self.current is not None:
                self.current.cancel.set()
            self._lock.notify_all()
        self.worker.join()

    def next_job(self) -> Job | None:
        with self._lock:
            while not self._waiting and not self._stopping:
                self._lock.wait()
            if self._stopping:
                return None
            job = self.current = self._waiting.popleft()
            job.state = "generating"
            return job

    def started(self, job: Job) -> None:
        self.store.save(job)

    def requeue(self, job: Job) -> None:
        job.state = "queued"
        try:
            self.store.save(job)
        except StoreError as e:  # its row says generating: the next start queues it all the same
            log.warning("job %s: %s", job.id, e)

    def ended(self, job: Job) -> None:
        with self._lock:
            self.current = None
        self._prune()

    def _public(self, job: Job, message: str) -> str:
        """`message` as clients see it: the server's folders (data, LoRAs, model files, subgraph sets) cut out,
        the files' names kept."""
        folders = {self.data_dir, self.uploads.folder, *(ref.path.parent for ref in job.params.loras),
                   *(Path(path).parent for path in dataclasses.astuple(self.pipeline.files) if path is not None),
                   *(Path(folder) for name in ("subgraphs", "hires_subgraphs", "vae_subgraphs")
                     if (folder := getattr(job.params, name, None)) is not None)}
        texts = {text for folder in folders for text in (str(folder), str(folder.resolve())) if len(text) > 1}
        for text in sorted(texts, key=len, reverse=True):  # the deepest first: /data/inputs before /data
            message = message.replace(text + os.sep, "").replace(text, Path(text).name)
        return message

    def finish(self, job: Job, state: str, error: str | None = None, *, tidy: bool = True) -> None:
        """The job ends in `state`. An error is logged whole and kept without the server's folders. A store that
        cannot be written now (a full disk) costs the record, not the server: the job is finished in memory.
        `tidy`: remove the inputs no job needs any more (not while the store is read: _load does it once after)."""
        if error is not None:
            log.warning("job %s %s: %s", job.id, state, error)
            error = self._public(job, error)
        job.state, job.error, job.preview = state, error, None
        with self._lock:
            self._plans.pop(job.id, None)
        job.params = without_bytes(job.params)  # up to tens of MiB per upload: a finished job needs its sha256 only
        try:
            self.store.save(job)
        except StoreError as e:
            log.warning("job %s: %s; it is %s until the server restarts", job.id, e, state)
        if tidy and image_inputs(job.params):
            self._remove_unused_inputs()
        job.mark_done()
