"""The job queue under every HTTP API: one generation at a time, FIFO, persisted, cancellable, resumable.

Jobs live in SQLite (`data_dir/jobs.sqlite`) and their images and resume states in `data_dir`, so a restarted
server finds every job again: queued ones run, and the one that was running resumes from its last checkpoint.
The worker is one thread: one NPU, one set of CPU cores. Every job runs through the one job runner
(jobs.runner.JobRunner) with its step events (progress, ETA, a live preview) and its checkpoints (cancel = a stop
at the next step boundary).

An uploaded init image or mask is kept beside them, content-addressed (`data_dir/inputs/<sha256>.img`, written
before the job is queued), because the job's saved settings hold only its fingerprint: a queued or stopped
img2img job is given its bytes again after a restart, and one whose input has gone fails with that reason. An
input is removed once no unfinished job needs it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import secrets
import sqlite3
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from ..core.files import Unreadable, output_folder, read_small_file, write_bytes
from ..errors import AnimaError
from ..generation.images import MAX_IMAGE_BYTES, ImageInput
from ..generation.params import IMAGE_SETTINGS, SETTINGS, GenerationParams, settings_of
from ..generation.pipeline import AnimaPipeline
from ..generation.resume import Interrupted, default_state_path
from ..jobs.runner import JobRunner, saved_state
from ..sampling.sample import StepEvent
from ..vae.preview import projection_for

STATES = ("queued", "generating", "completed", "failed", "cancelled")
FINISHED = ("completed", "failed", "cancelled")
INPUTS = "inputs"  # the folder of data_dir that holds the jobs' uploaded images


class QueueFull(AnimaError):
    """The queue holds its maximum of waiting jobs."""


@dataclasses.dataclass
class Job:
    id: str
    params: GenerationParams
    created: float
    state: str = "queued"
    step: int = 0  # steps done, over all the passes of the run
    total: int = 0  # the steps the run makes over all its passes (img2img: fewer than params.steps); from params
    eta_s: float | None = None
    error: str | None = None
    summary: dict[str, Any] | None = None  # computed/skipped steps, passes, timings: once completed
    preview: bytes | None = None  # PNG of the latest step's x0 while generating
    cancel: threading.Event = dataclasses.field(default_factory=threading.Event)
    done: threading.Event = dataclasses.field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        if not self.total:
            self.total = total_steps(self.params)

    def status(self, position: int | None) -> dict[str, Any]:
        # "steps": what "step" counts up to, the steps of every pass (the setting itself is params.steps).
        return {"id": self.id, "state": self.state, "queue_position": position, "step": self.step,
                "steps": self.total, "eta_s": self.eta_s, "error": self.error, "created": self.created,
                "seed": self.params.seed, "params": settings_of(self.params) | {"loras": [
                    {"name": ref.name, "scale": ref.scale} for ref in self.params.loras]},  # not the server's paths
                "result": self.summary}


def total_steps(params: GenerationParams) -> int:
    """The steps a run makes over all its passes, as its step events count them."""
    try:
        return sum(p.steps_run for p in params.passes())
    except AnimaError:  # a job loaded with settings this version cannot schedule: it fails when run
        return params.steps


def without_bytes(params: GenerationParams) -> GenerationParams:
    """`params` with its images kept by fingerprint only."""
    images = {image_name: ImageInput(None, image.name, image.sha256) for image_name in IMAGE_SETTINGS
              if (image := getattr(params, image_name)) is not None and image.data is not None}
    return dataclasses.replace(params, **images) if images else params


def image_inputs(params: GenerationParams) -> list[ImageInput]:
    return [image for name in IMAGE_SETTINGS if (image := getattr(params, name)) is not None]


class JobQueue:
    def __init__(self, pipeline: AnimaPipeline, data_dir: Path, *, max_queue: int = 16,
                 checkpoint_every: int | None = None, engine: dict[str, Any] | None = None) -> None:
        self.pipeline, self.max_queue = pipeline, max_queue
        # A periodic checkpoint that cannot be written costs the resume, not the job.
        self.runner = JobRunner(pipeline, checkpoint_every=checkpoint_every, warn=lambda e: None)
        # How this server runs the model (subgraph set, NPU options, VAE backend): not part of a job's saved
        # settings, so a job found again after a restart takes them from here.
        self.engine = {key: value for key, value in (engine or {}).items() if key not in SETTINGS}
        self.data_dir = output_folder(data_dir, overwrite=False, holds="other files", resumable="jobs.sqlite")
        self.projection = projection_for(pipeline.files.vae)
        self._lock = threading.Condition()
        self._jobs: dict[str, Job] = {}
        self._waiting: deque[Job] = deque()
        self.current: Job | None = None
        self._db = sqlite3.connect(self.data_dir / "jobs.sqlite", check_same_thread=False)
        self._db.execute("CREATE TABLE IF NOT EXISTS jobs (id TEXT PRIMARY KEY, created REAL, state TEXT, "
                         "params TEXT, summary TEXT, error TEXT)")
        self._db.commit()  # jobs.sqlite marks the folder as this server's before anything else goes in
        self.inputs = self.data_dir / INPUTS
        self.inputs.mkdir(exist_ok=True)
        self._load()
        self._stopping = False
        self._worker = threading.Thread(target=self._work, name="anima-jobs", daemon=True)

    # ---- persistence --------------------------------------------------------------------------------------

    def _save(self, job: Job) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO jobs VALUES (?, ?, ?, ?, ?, ?)", (
                job.id, job.created, job.state, json.dumps(settings_of(job.params)),
                json.dumps(job.summary), job.error))
            self._db.commit()

    def _load(self) -> None:
        """Jobs of an earlier run of the server: finished ones are listed, the others queued again in order, their
        uploaded images read back (one whose image has gone fails, saying so)."""
        for job_id, created, state, params, summary, error in self._db.execute(
                "SELECT id, created, state, params, summary, error FROM jobs ORDER BY created").fetchall():
            job = Job(job_id, GenerationParams(**json.loads(params), **self.engine), created, state, error=error,
                      summary=json.loads(summary) if summary else None)
            self._jobs[job_id] = job
            if state in FINISHED:
                job.done.set()
                continue
            try:
                job.params = self.with_inputs(job.params)
            except AnimaError as e:
                job.state, job.error = "failed", str(e)
                default_state_path(self.image_path(job)).unlink(missing_ok=True)  # nothing can resume it
                self._save(job)
                job.done.set()
                continue
            job.state = "queued"
            self._waiting.append(job)
        self._remove_unused_inputs()

    def _input_path(self, image: ImageInput) -> Path:
        return self.inputs / f"{image.sha256}.img"

    def _keep_inputs(self, params: GenerationParams) -> None:
        """The job's uploaded images on disk, by sha256 (an image already there is the same bytes)."""
        for image in image_inputs(params):
            if not self._input_path(image).is_file():
                write_bytes(self._input_path(image), image.data, overwrite=True)

    def with_inputs(self, params: GenerationParams) -> GenerationParams:
        """`params` with its fingerprint-only images given their bytes from the inputs folder."""
        found = {}
        for name in IMAGE_SETTINGS:
            image = getattr(params, name)
            if image is None or image.data is not None:
                continue
            label = name.replace("_", " ")
            try:
                data = read_small_file(self._input_path(image), MAX_IMAGE_BYTES)
            except Unreadable as e:
                raise AnimaError(f"the job's {label} (sha256 {image.sha256[:12]}...) is gone from the server's "
                                 f"{INPUTS} folder ({e}): submit the job again") from None
            if hashlib.sha256(data).hexdigest() != image.sha256:
                raise AnimaError(f"the job's {label} in the server's {INPUTS} folder is not the image it was given "
                                 f"(sha256 {image.sha256[:12]}...): submit the job again")
            found[name] = ImageInput(data, image.name, image.sha256)
        return dataclasses.replace(params, **found) if found else params

    def _remove_unused_inputs(self) -> None:
        """Every input that no unfinished job needs, nor a recent completed one (whose twin a compare may queue);
        finished jobs keep their images by fingerprint only, in memory and in their records."""
        with self._lock:
            recent = {job.id for job in self.recent() if job.state == "completed"}
            needed = {self._input_path(image).name for job in self._jobs.values()
                      if job.state not in FINISHED or job.id in recent for image in image_inputs(job.params)}
            for path in self.inputs.iterdir():
                if path.name not in needed:
                    path.unlink(missing_ok=True)

    # ---- the API ------------------------------------------------------------------------------------------

    def start(self) -> None:
        self._worker.start()

    def close(self) -> None:
        with self._lock:
            self._stopping = True
            if self.current is not None:
                self.current.cancel.set()
            self._lock.notify_all()
        self._worker.join(timeout=60)

    def submit(self, params: GenerationParams) -> Job:
        return self.submit_all([params])[0]

    def submit_all(self, batch: list[GenerationParams]) -> list[Job]:
        """Queue every job of a request, or none: a batch that does not fit is refused whole."""
        checked: list[GenerationParams] = []  # a request's jobs differ in their seeds: its images are read once
        for params in batch:
            if (unseeded := dataclasses.replace(params, seed=0)) not in checked:
                self.pipeline.prepare(params)  # every setting checked now: a bad request is a 400, not a failed job
                checked.append(unseeded)
        jobs = [Job(secrets.token_hex(8), params, time.time()) for params in batch]
        with self._lock:
            if len(self._waiting) + len(jobs) > self.max_queue:
                raise QueueFull(f"the queue is full ({len(self._waiting)} of {self.max_queue} jobs waiting, "
                                f"{len(jobs)} asked for); try again later")
            for params in batch:  # under the lock: a job finishing now cannot remove what these need
                self._keep_inputs(params)
            for job in jobs:
                self._jobs[job.id] = job
                self._waiting.append(job)
                self._save(job)
            self._lock.notify_all()
        return jobs

    def get(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id)

    def position(self, job: Job) -> int | None:
        """0 = running, 1 = next, ...; None once finished."""
        with self._lock:
            if job is self.current:
                return 0
            return next((i + 1 for i, waiting in enumerate(self._waiting) if waiting is job), None)

    def cancel(self, job: Job) -> None:
        """A waiting job is dropped; a running one stops at its next step boundary."""
        with self._lock:
            if job in self._waiting:
                self._waiting.remove(job)
                self._finish(job, "cancelled")
            elif job is self.current:
                job.cancel.set()

    def recent(self, limit: int = 50, offset: int = 0) -> list[Job]:
        """Jobs newest first: `limit` of them after the `offset` newest."""
        with self._lock:
            jobs = list(self._jobs.values())
        return sorted(jobs, key=lambda j: j.created, reverse=True)[offset:offset + limit]

    def count(self) -> int:
        """Every job in the store, finished ones included."""
        return len(self._jobs)

    def image_path(self, job: Job) -> Path:
        return self.data_dir / f"{job.id}.png"

    # ---- the worker ---------------------------------------------------------------------------------------

    def _finish(self, job: Job, state: str, error: str | None = None) -> None:
        job.state, job.error, job.preview = state, error, None
        job.params = without_bytes(job.params)  # up to tens of MiB per upload: a finished job needs its sha256 only
        self._save(job)
        if image_inputs(job.params):
            self._remove_unused_inputs()
        job.done.set()

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._waiting and not self._stopping:
                    self._lock.wait()
                if self._stopping:
                    return
                job = self.current = self._waiting.popleft()
                job.state = "generating"
            self._save(job)
            try:
                self._run(job)
            finally:
                with self._lock:
                    self.current = None

    def _on_step(self, job: Job, event: StepEvent) -> None:
        job.step, job.total, job.eta_s = event.step, event.total, event.eta_s
        image = self.projection.to_image(event.x0, 4)
        buffer = io.BytesIO()
        image.save(buffer, format="PNG", compress_level=1)
        job.preview = buffer.getvalue()

    def _run(self, job: Job) -> None:
        state = default_state_path(self.image_path(job))
        try:
            published = self.runner.run(job.params, state=state, to=self.image_path(job), overwrite=True,
                                        image=f"/api/jobs/{job.id}/image", resume=saved_state(state),
                                        on_step=lambda event: self._on_step(job, event), stop=job.cancel.is_set)
            job.summary = published.record
            self._finish(job, "completed")
        except Interrupted:
            if self._stopping:  # the server is shutting down: the job waits for the next start, state kept
                job.state = "queued"
                self._save(job)
                return
            state.unlink(missing_ok=True)
            self._finish(job, "cancelled")
        except AnimaError as e:  # a failed job is not run again: its state has nothing left to give
            state.unlink(missing_ok=True)
            self._finish(job, "failed", str(e))
        except Exception as e:  # the server keeps serving; the job says what went wrong, in one line
            self._finish(job, "failed", f"internal error: {type(e).__name__}: {e}".splitlines()[0])
