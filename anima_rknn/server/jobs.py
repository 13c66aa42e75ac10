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
import errno
import hashlib
import io
import json
import logging
import math
import os
import re
import secrets
import sqlite3
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from ..checks import is_number, shown
from ..core.files import (
    Unreadable,
    free_space,
    human_size,
    is_temporary,
    output_folder,
    read_small_file,
    write_bytes,
)
from ..errors import AnimaError
from ..generation.images import MAX_IMAGE_BYTES, ImageInput
from ..generation.params import IMAGE_SETTINGS, SETTINGS, GenerationParams, settings_of
from ..generation.pipeline import AnimaPipeline
from ..generation.resume import Interrupted, default_state_path
from ..generation.run_plan import RunPlan
from ..jobs.runner import JobRunner, saved_state
from ..model.model_set import ModelFiles
from ..sampling.sample import StepEvent
from ..vae.preview import projection_for

STATES = ("queued", "generating", "completed", "failed", "cancelled")
FINISHED = ("completed", "failed", "cancelled")
INPUTS = "inputs"  # the folder of data_dir that holds the jobs' uploaded images
STORE = "jobs.sqlite"
COLUMNS = ("id", "created", "state", "params", "summary", "error")
JOB_ID = re.compile(r"[0-9a-f]{16}")  # what submit makes, secrets.token_hex(8): a row's id must be one
KEEP_JOBS = 1000  # jobs the store keeps by default (serve --keep-jobs)
MAX_PNG_BYTES = 1 << 28  # a job's PNG as served: far above any picture --max-side allows
PREVIEW_SIDE = 256  # a live preview is the picture's size up to this many pixels a side
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
log = logging.getLogger(__name__)


class QueueFull(AnimaError):
    """The queue holds its maximum of waiting jobs."""


class ServerBusy(AnimaError):
    """A 503 with Retry-After: the server is reading or decoding as many large bodies as it takes at once."""


# Pictures checked (decoded whole) at once by submits: each holds its decoded pixels, up to 256 MiB for the largest.
MAX_DECODES = 2
DECODE_WAIT_S = 10.0  # how long a submit waits for a turn before it is told to come back


class StoreError(AnimaError):
    """The job store or the data folder could not be written; `status` is the HTTP answer: 507 for a full disk
    (Insufficient Storage), 503 otherwise (a store made read-only under the server)."""

    def __init__(self, message: str, status: int = 503) -> None:
        super().__init__(message)
        self.status = status


class ImageGone(AnimaError):
    """A completed job's PNG is not (or no longer) a plain file in the data folder: a 410."""


class JobBusy(AnimaError):
    """The job is queued or running: it cannot be deleted (cancel it first): a 409."""


class _BadRow(Exception):
    """Why a row of the store cannot be a job."""


def _disk_full(e: BaseException | None) -> bool:
    """Whether `e`, or the OSError behind an AnimaError of core.files (raised `from None`: kept as its context),
    is a full disk or quota."""
    while e is not None:
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if isinstance(e, sqlite3.Error) and "full" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def _is_own_folder(path: Path) -> bool:
    """A folder itself, not a link to one."""
    return path.is_dir() and not path.is_symlink()


def _own_folder(path: Path) -> None:
    """`path` as a folder of the data folder's own, made if missing; a link (never followed) or a file there is
    refused in one line."""
    if path.is_symlink():
        raise AnimaError(f"{path} is a symbolic link; the server follows no links in its data folder: remove it")
    if path.exists() and not path.is_dir():
        raise AnimaError(f"{path} is not a folder; the server keeps its uploads there: move it away")
    try:
        path.mkdir(exist_ok=True)
    except OSError as e:
        raise AnimaError(f"cannot create {path}: {e.strerror or e}") from None


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
    interrupt: threading.Event = dataclasses.field(default_factory=threading.Event)  # end with the picture so far
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    model: str | None = None  # the served model it runs on (JobQueue.models); None: the queue's first

    def __post_init__(self) -> None:
        if not self.total:
            self.total = total_steps(self.params)

    def status(self, position: int | None) -> dict[str, Any]:
        # "steps": what "step" counts up to, the steps of every pass (the setting itself is params.steps).
        return {"id": self.id, "state": self.state, "queue_position": position, "step": self.step,
                "steps": self.total, "eta_s": self.eta_s, "error": self.error, "created": self.created,
                "seed": self.params.seed, "params": settings_of(self.params) | {"loras": [
                    {"name": ref.name, "scale": ref.scale} for ref in self.params.loras]},  # not the server's paths
                "result": self.summary, "model": self.model}


def total_steps(params: GenerationParams) -> int:
    """The steps a run makes over all its passes, as its step events count them."""
    try:
        return params.steps_run()
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
    """`max_side` / `max_steps`: the server's bounds (serve --max-side, --max-steps), which jobs read back from the
    store are held to as requests are; `keep_jobs`: how many jobs the store keeps (older finished ones go).
    `models`: the model sets a job may name (serve given several, by name; `pipeline` runs the first): one is
    loaded at a time, the worker switching when the next job names another."""

    def __init__(self, pipeline: AnimaPipeline, data_dir: Path, *, max_queue: int = 16,
                 checkpoint_every: int | None = None, engine: dict[str, Any] | None = None,
                 max_side: int | None = None, max_steps: int | None = None, keep_jobs: int = KEEP_JOBS,
                 models: dict[str, ModelFiles] | None = None) -> None:
        self.pipeline, self.max_queue = pipeline, max_queue
        self.max_side, self.max_steps, self.keep_jobs = max_side, max_steps, keep_jobs
        self.models = dict(models or {})
        self._idle: dict[str, AnimaPipeline] = {}  # pipelines of models not running now: headers read, nothing loaded
        # A periodic checkpoint that cannot be written costs the resume, not the job.
        self.checkpoint_every = checkpoint_every
        self.runner = JobRunner(pipeline, checkpoint_every=checkpoint_every, warn=lambda e: None)
        # How this server runs the model (subgraph set, NPU options, VAE backend): not part of a job's saved
        # settings, so a job found again after a restart takes them from here.
        self.engine = {key: value for key, value in (engine or {}).items() if key not in SETTINGS}
        self.data_dir = output_folder(data_dir, overwrite=False, holds="other files", resumable=STORE)
        self.projection = projection_for(pipeline.files.vae)
        self._lock = threading.Condition()
        self._decodes = threading.BoundedSemaphore(MAX_DECODES)
        self._jobs: dict[str, Job] = {}
        self._plans: dict[str, RunPlan] = {}  # a waiting job's run, planned at submission (submit_all)
        self._waiting: deque[Job] = deque()
        self.current: Job | None = None
        if (self.data_dir / STORE).is_symlink():
            raise AnimaError(f"{self.data_dir / STORE} is a symbolic link; the server follows no links in its data "
                             "folder: remove it")
        self._db = self._open_store(self.data_dir / STORE)
        self.inputs = self.data_dir / INPUTS
        _own_folder(self.inputs)
        self._remove_temporaries()
        self._load()
        self._prune()
        self._stopping = False
        self._worker = threading.Thread(target=self._work, name="anima-jobs", daemon=True)

    # ---- persistence --------------------------------------------------------------------------------------

    @staticmethod
    def _open_store(path: Path) -> sqlite3.Connection:
        """The store at `path` (created if new), checked whole: a file that is not SQLite (random bytes, truncated,
        damaged), a table that is not this server's, or a store this user cannot write is refused in one line and
        left as it is: it may hold someone's jobs, and moving it aside would start an empty server that seems to
        have lost them."""
        try:
            db = sqlite3.connect(path, check_same_thread=False)
            db.execute(f"CREATE TABLE IF NOT EXISTS jobs ({COLUMNS[0]} TEXT PRIMARY KEY, {COLUMNS[1]} REAL, "
                       f"{COLUMNS[2]} TEXT, {COLUMNS[3]} TEXT, {COLUMNS[4]} TEXT, {COLUMNS[5]} TEXT)")
            db.commit()  # jobs.sqlite marks the folder as this server's before anything else goes in
            (check,) = db.execute("PRAGMA quick_check").fetchone()
            if check != "ok":
                raise sqlite3.DatabaseError(f"damaged: {check}")
            columns = tuple(row[1] for row in db.execute("PRAGMA table_info(jobs)"))
            if columns != COLUMNS:
                raise sqlite3.DatabaseError(f"its jobs table has the columns {', '.join(columns)}, not this server's")
            # Can this user write it? A read-only file fails here, not mid-job (rolled back: the file is unchanged).
            db.execute("BEGIN IMMEDIATE")
            db.execute("PRAGMA user_version = 0")
            db.rollback()
        except sqlite3.Error as e:
            raise AnimaError(f"{path} is not a job store this server can use ({str(e).splitlines()[0]}); it was "
                             "left as it is: move it away or serve with another --data-dir") from None
        return db

    def _save(self, *jobs: Job) -> None:
        """The jobs' rows, in one transaction: all are written or none (StoreError)."""
        rows = [(job.id, job.created, job.state, json.dumps(settings_of(job.params) | (
                 {"model": job.model} if job.model else {})), json.dumps(job.summary), job.error) for job in jobs]
        with self._lock:
            try:
                self._db.executemany("INSERT OR REPLACE INTO jobs VALUES (?, ?, ?, ?, ?, ?)", rows)
                self._db.commit()
            except sqlite3.Error as e:
                self._db.rollback()
                full = _disk_full(e)
                raise StoreError(f"the server cannot store jobs now ({'the disk is full' if full else e})",
                                 507 if full else 503) from None

    def _load(self) -> None:
        """Jobs of an earlier run of the server: finished ones are listed, the others queued again in order, their
        uploaded images read back (one whose image has gone, or whose settings this server refuses, fails, saying
        so). A row that cannot be a job is marked failed, not listed, and logged in one line."""
        for row in self._db.execute(f"SELECT {', '.join(COLUMNS)} FROM jobs ORDER BY created").fetchall():
            try:
                job = self._job_of_row(*row)
            except _BadRow as e:
                log.warning("job store: row %s marked failed and skipped: %s", shown(row[0]), e)
                self._db.execute("UPDATE jobs SET state = 'failed', error = ? WHERE id IS ?",
                                 (f"unreadable in the job store: {e}", row[0]))
                self._db.commit()
                continue
            self._jobs[job.id] = job
            if job.state in FINISHED:
                job.done.set()
                continue
            try:
                self._check_limits(job.params, job.model)
                job.params = self.with_inputs(job.params)
            except AnimaError as e:
                default_state_path(self.image_path(job)).unlink(missing_ok=True)  # nothing can resume it
                self._finish(job, "failed", str(e), tidy=False)  # the rows not read yet may need its inputs
                continue
            job.state = "queued"
            self._waiting.append(job)
        self._remove_unused_inputs()

    def _job_of_row(self, job_id: Any, created: Any, state: Any, params: Any, summary: Any, error: Any) -> Job:
        """A row of the store as a job, every field checked: an id that is not one submit makes (a path such as
        '../x' would put the job's files outside the folder), a time that is not a number, settings that are not
        this version's (unknown, malformed, out of range, NaN) and a record that is not strict JSON are refused."""
        if not (isinstance(job_id, str) and JOB_ID.fullmatch(job_id)):
            raise _BadRow("its id is not one this server makes")
        if not (is_number(created) and math.isfinite(created)):
            raise _BadRow(f"its created time {shown(created)} is not a number")
        if state not in STATES:
            raise _BadRow(f"its state {shown(state)} is not one of {', '.join(STATES)}")
        if error is not None and not isinstance(error, str):
            raise _BadRow("its error is not text")
        try:
            settings = json.loads(params)
            record = json.loads(summary) if summary is not None else None
            json.dumps(record, allow_nan=False)  # a record answered to clients must be strict JSON
        except (TypeError, ValueError, RecursionError) as e:
            raise _BadRow(f"its settings or record are not valid JSON ({type(e).__name__})") from None
        if not isinstance(settings, dict):
            raise _BadRow("its settings are not a JSON object")
        model = settings.pop("model", None)  # a finished job keeps the name of a model no longer served
        if model is not None and not isinstance(model, str):
            raise _BadRow("its model is not a name")
        if not (record is None or isinstance(record, dict)) or (state == "completed" and record is None):
            raise _BadRow("its record is not a JSON object")
        unknown = sorted(set(settings) - set(SETTINGS) - {"loras"})
        if unknown:
            raise _BadRow(f"its settings name what this version does not know: {shown(', '.join(unknown))}")
        try:
            job_params = GenerationParams(**settings, **self.engine)
            job_params.validate()
        except Exception as e:  # any setting's own check, or a value of the wrong type that trips one
            raise _BadRow(f"its settings are refused: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
                          ) from None
        return Job(job_id, job_params, float(created), state, error=error, summary=record, model=model)

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

    def _input_path(self, image: ImageInput) -> Path:
        return self.inputs / f"{image.sha256}.img"

    def _keep_inputs(self, params: GenerationParams) -> None:
        """The job's uploaded images on disk, by sha256 (an image already there is the same bytes)."""
        if image_inputs(params) and not _is_own_folder(self.inputs):
            raise StoreError(f"the server's data folder holds a {INPUTS} that is not a plain folder (a link?): it "
                             "keeps no uploads there", 503)
        for image in image_inputs(params):
            if not self._input_path(image).is_file():
                try:
                    write_bytes(self._input_path(image), image.data, overwrite=True)
                except AnimaError as e:
                    log.warning("cannot keep an uploaded image: %s", e)
                    full = _disk_full(e)
                    raise StoreError("the server cannot keep the uploaded image now ("
                                     f"{'the disk is full' if full else 'it cannot write its data folder'})",
                                     507 if full else 503) from None

    def _remove_temporaries(self) -> None:
        """The temporaries of writes that a killed server left (a kill -9 mid-PNG: never a partial PNG, since a file
        is published whole by a rename, but its hidden temporary stays): the data folder is the server's own."""
        for folder in (self.data_dir, self.inputs):
            for path in folder.iterdir():
                if is_temporary(path) and path.is_file() and not path.is_symlink():
                    path.unlink(missing_ok=True)

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
        finished jobs keep their images by fingerprint only, in memory and in their records. An inputs folder
        replaced by a link (or anything but a folder) since the start is left alone: never emptied through it."""
        if not _is_own_folder(self.inputs):
            log.warning("the data folder's %s is no longer a plain folder: nothing removed from it", INPUTS)
            return
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
        # No timeout: the running job stops at its next step boundary and writes its state, however long a step
        # takes; a process that left with the worker still inside torch would abort (SIGABRT) and lose the state.
        self._worker.join()

    def submit(self, params: GenerationParams, model: str | None = None) -> Job:
        return self.submit_all([params], model)[0]

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
                    self._keep_inputs(params)
                self._save(*jobs)
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
        """The job's plan: every setting checked now (a bad request is a 400, not a failed job), its pictures
        decoded with at most MAX_DECODES others; a submit that finds no turn within DECODE_WAIT_S is ServerBusy."""
        if not image_inputs(params):
            return pipeline.prepare(params, validated=validated)
        if not self._decodes.acquire(timeout=DECODE_WAIT_S):
            raise ServerBusy(f"the server is decoding {MAX_DECODES} pictures already; try again shortly")
        try:
            return pipeline.prepare(params, validated=validated)
        finally:
            self._decodes.release()

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
        if not JOB_ID.fullmatch(job.id):  # every job's id was checked when it was made or read back
            raise AnimaError(f"job id {shown(job.id)} is not one this server makes")
        return self.data_dir / f"{job.id}.png"

    def read_image(self, job: Job) -> bytes:
        """The completed job's PNG, only if it is a plain PNG file of the data folder itself: a link is never
        followed (O_NOFOLLOW), a folder, a FIFO or a file with other names (a hard link) is not read, and what is
        read must be a PNG. Anything else is ImageGone, in one line."""
        path = self.image_path(job)
        gone = ImageGone(f"the image of job {job.id} is no longer on the server")
        if path.parent.resolve() != self.data_dir.resolve():
            raise gone
        try:
            data = read_small_file(path, MAX_PNG_BYTES, no_links=True)
        except Unreadable:
            raise gone from None
        if not data.startswith(PNG_SIGNATURE):
            raise gone
        return data

    def delete(self, job: Job) -> None:
        """A finished job, gone with its files: its row, PNG and resume state (and inputs no one else needs).
        A queued or running job is JobBusy."""
        with self._lock:
            if job.state not in FINISHED:
                raise JobBusy(f"job {job.id} is {job.state}: cancel it first")
            self._remove([job])

    def _remove(self, jobs: list[Job]) -> None:
        with self._lock:
            try:
                self._db.executemany("DELETE FROM jobs WHERE id = ?", [(job.id,) for job in jobs])
                self._db.commit()
            except sqlite3.Error as e:
                self._db.rollback()
                raise StoreError(f"the server cannot change its job store now ({e})") from None
            for job in jobs:
                del self._jobs[job.id]
                self.image_path(job).unlink(missing_ok=True)
                default_state_path(self.image_path(job)).unlink(missing_ok=True)
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

    # ---- the worker ---------------------------------------------------------------------------------------

    def _public(self, job: Job, message: str) -> str:
        """`message` as clients see it: the server's folders (data, LoRAs, model files, subgraph sets) cut out,
        the files' names kept."""
        folders = {self.data_dir, self.inputs, *(ref.path.parent for ref in job.params.loras),
                   *(Path(path).parent for path in dataclasses.astuple(self.pipeline.files) if path is not None),
                   *(Path(folder) for name in ("subgraphs", "hires_subgraphs", "vae_subgraphs")
                     if (folder := getattr(job.params, name, None)) is not None)}
        texts = {text for folder in folders for text in (str(folder), str(folder.resolve())) if len(text) > 1}
        for text in sorted(texts, key=len, reverse=True):  # the deepest first: /data/inputs before /data
            message = message.replace(text + os.sep, "").replace(text, Path(text).name)
        return message

    def _finish(self, job: Job, state: str, error: str | None = None, *, tidy: bool = True) -> None:
        """The job ends in `state`. An error is logged whole and kept without the server's folders. A store that
        cannot be written now (a full disk) costs the record, not the server: the job is finished in memory.
        `tidy`: remove the inputs no job needs any more (not while the store is read: _load does it once after)."""
        if error is not None:
            log.warning("job %s %s: %s", job.id, state, error)
            error = self._public(job, error)
        job.state, job.error, job.preview = state, error, None
        self._plans.pop(job.id, None)
        job.params = without_bytes(job.params)  # up to tens of MiB per upload: a finished job needs its sha256 only
        try:
            self._save(job)
        except StoreError as e:
            log.warning("job %s: %s; it is %s until the server restarts", job.id, e, state)
        if tidy and image_inputs(job.params):
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
            try:
                self._save(job)
                self._switch_to(job.model)
                self._run(job)
                self._prune()
            except AnimaError as e:  # the worker outlives any job: this one ends failed, the next one runs
                if not job.done.is_set():
                    self._finish(job, "failed", str(e))
            except Exception as e:
                if not job.done.is_set():
                    self._finish(job, "failed", f"internal error: {type(e).__name__}: {e}".splitlines()[0])
            finally:
                with self._lock:
                    self.current = None

    def _preview_upscale(self, latent_side: int) -> int:
        """How much a live preview enlarges the latent: to the picture's own size up to PREVIEW_SIDE px (a 64-px
        picture's preview is 64 px, not a 32-px smudge), and never less than 4x, as before, for large pictures."""
        side = min(latent_side * self.pipeline.vae_config.scale_factor, PREVIEW_SIDE)
        return max(4, math.ceil(side / latent_side))

    def _on_step(self, job: Job, event: StepEvent) -> None:
        job.step, job.total, job.eta_s = event.step, event.total, event.eta_s
        image = self.projection.to_image(event.x0, self._preview_upscale(max(event.x0.shape[-2:])))
        buffer = io.BytesIO()
        image.save(buffer, format="PNG", compress_level=1)
        job.preview = buffer.getvalue()

    def _run(self, job: Job) -> None:
        state = default_state_path(self.image_path(job))
        try:
            # The plan made at submission; a job read back from the store after a restart is a new run, planned now
            # (its settings were validated when it was read).
            plan = self._plans.pop(job.id, None) or self.pipeline.prepare(job.params, validated=True)
            published = self.runner.run(plan, state=state, to=self.image_path(job), overwrite=True,
                                        image=f"/api/jobs/{job.id}/image", resume=saved_state(state),
                                        on_step=lambda event: self._on_step(job, event), stop=job.cancel.is_set,
                                        interrupt=job.interrupt.is_set)
            job.summary = published.record
            self._finish(job, "completed")
        except Interrupted:
            if self._stopping:  # the server is shutting down: the job waits for the next start, state kept
                job.state = "queued"
                try:
                    self._save(job)
                except StoreError as e:  # its row says generating: the next start queues it all the same
                    log.warning("job %s: %s", job.id, e)
                return
            state.unlink(missing_ok=True)
            self._finish(job, "cancelled")
        except AnimaError as e:  # a failed job is not run again: its state has nothing left to give
            state.unlink(missing_ok=True)
            self._finish(job, "failed", str(e).splitlines()[0] if str(e) else type(e).__name__)
        except Exception as e:  # the server keeps serving; the job says what went wrong, in one line
            self._finish(job, "failed", f"internal error: {type(e).__name__}: {e}".splitlines()[0])
