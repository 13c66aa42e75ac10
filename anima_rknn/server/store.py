"""The job store: every job's row in SQLite (`data_dir/jobs.sqlite`) and its files in the data folder (the PNG, the
resume state), so a restarted server finds every job again. job_queue.py keeps the jobs in memory over it.

A row read back is checked whole (its id, time, state, settings and record), and one that cannot be a job is
marked failed and skipped, in one line of the log. The store itself is never moved aside: it may hold someone's
jobs, and an empty server that seems to have lost them would be worse than one line saying why it does not start.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import math
import re
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..checks import is_number, shown
from ..core.files import Unreadable, is_temporary, read_small_file
from ..errors import AnimaError
from ..generation.params import SETTINGS, GenerationParams, settings_of
from ..generation.resume import default_state_path

STATES = ("queued", "generating", "completed", "failed", "cancelled")
FINISHED = ("completed", "failed", "cancelled")
STORE = "jobs.sqlite"
COLUMNS = ("id", "created", "state", "params", "summary", "error")
JOB_ID = re.compile(r"[0-9a-f]{16}")  # what a submit makes, secrets.token_hex(8): a row's id must be one
KEEP_JOBS = 1000  # jobs the store keeps by default (serve --keep-jobs)
MAX_PNG_BYTES = 1 << 28  # a job's PNG as served: far above any picture --max-side allows
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
log = logging.getLogger(__name__)


class StoreError(AnimaError):
    """The job store or the data folder could not be written; `status` is the HTTP answer: 507 for a full disk
    (Insufficient Storage), 503 otherwise (a store made read-only under the server)."""

    def __init__(self, message: str, status: int = 503) -> None:
        super().__init__(message)
        self.status = status


class ImageGone(AnimaError):
    """A completed job's PNG is not (or no longer) a plain file in the data folder: a 410."""


class _BadRow(Exception):
    """Why a row of the store cannot be a job."""


def disk_full(e: BaseException | None) -> bool:
    """Whether `e`, or the OSError behind an AnimaError of core.files (raised `from None`: kept as its context),
    is a full disk or quota."""
    while e is not None:
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if isinstance(e, sqlite3.Error) and "full" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def unwritable(e: AnimaError, what: str) -> StoreError:
    """What a client is told when `what` (a file of the data folder) could not be written: 507 for a full disk, 503
    otherwise, without the server's paths; the whole error is logged."""
    log.warning("cannot keep %s: %s", what, e)
    full = disk_full(e)
    return StoreError(f"the server cannot keep {what} now "
                      f"({'the disk is full' if full else 'it cannot write its data folder'})", 507 if full else 503)


def remove_temporaries(folder: Path) -> None:
    """The temporaries of writes that a killed server left in `folder`, one of its own (a kill -9 mid-PNG: never a
    partial PNG, since a file is published whole by a rename, but its hidden temporary stays)."""
    for path in folder.iterdir():
        if is_temporary(path) and path.is_file() and not path.is_symlink():
            path.unlink(missing_ok=True)


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
    done: threading.Event = dataclasses.field(default_factory=threading.Event)  # set by mark_done() only
    model: str | None = None  # the served model it runs on (JobQueue.models); None: the queue's first
    # Called once when the job ends (mark_done), from whichever thread ends it: runtime.Server.wait's wake-ups.
    _on_done: list[Callable[[], None]] = dataclasses.field(default_factory=list, repr=False, compare=False)
    _done_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.total:
            self.total = total_steps(self.params)

    def when_done(self, callback: Callable[[], None]) -> None:
        """`callback()` once the job has ended: now if it has, else from the thread that ends it."""
        with self._done_lock:
            if not self.done.is_set():
                self._on_done.append(callback)
                return
        callback()

    def mark_done(self) -> None:
        """The job has ended (its state is final, or it was read back finished): wake whoever waits for it."""
        with self._done_lock:
            self.done.set()
            callbacks, self._on_done = self._on_done, []
        for callback in callbacks:
            callback()

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


class JobStore:
    """The rows of `data_dir/jobs.sqlite` and each job's PNG and resume state in `data_dir` (a folder of the
    server's own, made by the caller). `engine`: the server's own settings, which a row read back runs with."""

    def __init__(self, data_dir: Path, engine: dict[str, Any]) -> None:
        self.data_dir, self.engine = data_dir, engine
        if (data_dir / STORE).is_symlink():
            raise AnimaError(f"{data_dir / STORE} is a symbolic link; the server follows no links in its data "
                             "folder: remove it")
        self._lock = threading.Lock()  # one connection, used by the worker and the request threads
        self._db = self._open(data_dir / STORE)

    @staticmethod
    def _open(path: Path) -> sqlite3.Connection:
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

    def save(self, *jobs: Job) -> None:
        """The jobs' rows, in one transaction: all are written or none (StoreError)."""
        rows = [(job.id, job.created, job.state, json.dumps(settings_of(job.params) | (
                 {"model": job.model} if job.model else {})), json.dumps(job.summary), job.error) for job in jobs]
        with self._lock:
            try:
                self._db.executemany("INSERT OR REPLACE INTO jobs VALUES (?, ?, ?, ?, ?, ?)", rows)
                self._db.commit()
            except sqlite3.Error as e:
                self._db.rollback()
                full = disk_full(e)
                raise StoreError(f"the server cannot store jobs now ({'the disk is full' if full else e})",
                                 507 if full else 503) from None

    def saved_jobs(self) -> Iterator[Job]:
        """The jobs of an earlier run of the server, oldest first. A row that cannot be a job is marked failed,
        not given, and logged in one line."""
        with self._lock:
            rows = self._db.execute(f"SELECT {', '.join(COLUMNS)} FROM jobs ORDER BY created").fetchall()
        for row in rows:
            try:
                yield self._job_of_row(*row)
            except _BadRow as e:
                log.warning("job store: row %s marked failed and skipped: %s", shown(row[0]), e)
                with self._lock:
                    self._db.execute("UPDATE jobs SET state = 'failed', error = ? WHERE id IS ?",
                                     (f"unreadable in the job store: {e}", row[0]))
                    self._db.commit()

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

    def delete(self, jobs: list[Job]) -> None:
        """The jobs' rows, PNGs and resume states, the rows in one transaction (StoreError: nothing removed)."""
        with self._lock:
            try:
                self._db.executemany("DELETE FROM jobs WHERE id = ?", [(job.id,) for job in jobs])
                self._db.commit()
            except sqlite3.Error as e:
                self._db.rollback()
                raise StoreError(f"the server cannot change its job store now ({e})") from None
        for job in jobs:
            self.image_path(job).unlink(missing_ok=True)
            self.state_path(job).unlink(missing_ok=True)

    def image_path(self, job: Job) -> Path:
        if not JOB_ID.fullmatch(job.id):  # every job's id was checked when it was made or read back
            raise AnimaError(f"job id {shown(job.id)} is not one this server makes")
        return self.data_dir / f"{job.id}.png"

    def state_path(self, job: Job) -> Path:
        """Where the job's resume state is kept while it has one."""
        return default_state_path(self.image_path(job))

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
