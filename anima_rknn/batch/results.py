"""The batch's output folder: one PNG per job (named by its id) and `results.jsonl`, one record per finished
job in the jobs file's order. Only the driver writes here, each file whole (files.py), the PNG before its
record, so a record always stands for a complete image; a job counts as done when its record and PNG are
there and agree (settings and the PNG's sha256), and is run again otherwise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..core.files import (
    Unreadable,
    held_folder,
    json_text,
    open_small_file,
    output_folder,
    sha256_file,
    write_bytes,
    write_text,
)
from ..errors import AnimaError
from ..generation.params import canonical_settings
from .jobs_file import MAX_JOBS, BatchJob

RESULTS = "results.jsonl"
MAX_RESULTS_BYTES = MAX_JOBS * (16 << 10)  # records are about 1 KiB; long prompts make them longer
# One record names its prompt and negative prompt twice (params and the result's summary), each up to 20,000
# characters, 6 bytes apiece when JSON escapes them: 480 KB, so 1 MiB holds any record this program writes.
MAX_RECORD_BYTES = 1 << 20


@dataclasses.dataclass
class Outcome:
    """What a worker hands back for one job: the PNG's bytes and its record, or why it failed."""

    job_id: str
    worker: str
    job_s: float  # wall time on the worker, loading included
    png: bytes | None = None
    summary: dict[str, Any] | None = None  # GenerationResult.summary
    error: str | None = None
    result: Any = None  # a task's (Worker.run_task): bench's, one seed's runs


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


class Results:
    """The folder and its records. Opening it checks that it holds nothing but this batch's own work."""

    def __init__(self, folder: str | Path, jobs: list[BatchJob], *, overwrite: bool) -> None:
        self.folder = output_folder(folder, overwrite=overwrite, holds="other files", resumable=RESULTS,
                                    names=[RESULTS, *(job.image for job in jobs)])
        self.jobs = jobs
        self._order = {job.id: index for index, job in enumerate(jobs)}
        self.records: dict[str, dict[str, Any]] = {} if overwrite else self._read()
        self._write()  # the folder's marker from the start, so that a batch killed in its first job resumes

    def _read(self) -> dict[str, dict[str, Any]]:
        path = self.folder / RESULTS
        if not path.exists():
            return {}
        records = {}
        # Read a line at a time, each bounded: the file is refused at its first bad line, and holding it whole (or
        # its lines as a list: 200 MiB of newlines peaked at 2.2 GB) is never needed.
        try:
            with open_small_file(path, MAX_RESULTS_BYTES) as f:
                for number, line in enumerate(iter(lambda: f.readline(MAX_RECORD_BYTES + 1), b""), 1):
                    if len(line) > MAX_RECORD_BYTES:
                        raise AnimaError(f"{path} line {number} is longer than {MAX_RECORD_BYTES >> 20} MiB, which "
                                         "no record is; pass --overwrite to start over")
                    records.update(self._record(line, number))
                    if f.tell() > MAX_RESULTS_BYTES:  # it grew since it was opened
                        raise AnimaError(f"{path} grew past {MAX_RESULTS_BYTES} bytes while it was read")
        except Unreadable as e:
            raise AnimaError(f"{path}: {e}") from None
        except OSError as e:
            raise AnimaError(f"{path}: cannot read it: {e.strerror or e}") from None
        return records

    def _record(self, line: bytes, number: int) -> dict[str, dict[str, Any]]:
        """{job id: record} of one line of results.jsonl."""
        try:
            record = json.loads(line.decode("utf-8"))
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            raise AnimaError(f"{self.folder / RESULTS} line {number} is not valid JSON; pass --overwrite to start "
                             "over") from None
        job_id = record.get("job") if isinstance(record, dict) else None
        if job_id not in self._order:
            raise AnimaError(f"{self.folder} holds another batch's results ({RESULTS} line {number} is no job "
                             "of these jobs with these model files); use another --out, or --overwrite")
        return {job_id: record}

    def _write(self) -> None:
        # Rewritten whole (atomic_path) after each job rather than appended to: never a torn last line, and the
        # cost, milliseconds for thousands of records, is nothing next to a job.
        lines = [json_text(self.records[job.id]) for job in self.jobs if job.id in self.records]
        write_text(self.folder / RESULTS, "".join(line + "\n" for line in lines), overwrite=True)

    def done(self, job: BatchJob) -> bool:
        """Its record says it finished with these settings, and its PNG is the one the record names."""
        record, png = self.records.get(job.id), self.folder / job.image
        return (record is not None and record.get("error") is None and isinstance(record.get("params"), dict)
                and _same(canonical_settings(record["params"]), canonical_settings(job.settings()))
                and png.is_file() and sha256_file(png) == record.get("png_sha256"))

    def add(self, job: BatchJob, outcome: Outcome) -> dict[str, Any]:
        """Publish a job's PNG, then its record (a failure is recorded too: it is run again next time)."""
        record: dict[str, Any] = {"job": job.id, "line": job.line}
        if outcome.png is not None and outcome.summary is not None:
            # Replaced if there: a file of this name can only be this job's image, left by a run killed
            # between the PNG and its record.
            write_bytes(self.folder / job.image, outcome.png, overwrite=True)
            record.update(outcome.summary, png_sha256=hashlib.sha256(outcome.png).hexdigest())
        else:
            record["error"] = outcome.error
        record.update(params=job.settings(), worker=outcome.worker)
        record.setdefault("timings", {})["job_s"] = round(outcome.job_s, 4)
        self.records[job.id] = record
        self._write()
        return record


@contextlib.contextmanager
def locked_results(folder: str | Path, jobs: list[BatchJob], *, overwrite: bool) -> Iterator[Results]:
    """Results for a batch that has the folder to itself while it runs (files.held_folder): another batch into it,
    whose records would replace these, is refused in one line before it reads or writes anything there."""
    with held_folder(lambda: output_folder(folder, overwrite=overwrite, holds="other files", resumable=RESULTS,
                                           names=[RESULTS])) as held:
        yield Results(held, jobs, overwrite=overwrite)
