"""A batch's jobs: read from a JSONL file (one generation's settings per line) or a plain list of prompts
crossed with seeds, every job checked as `generate` checks its options, and each named by a hash of its
settings and model files, so that a second run of the same command knows which images it already has.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..core.files import Unreadable, read_small_file
from ..errors import AnimaError
from ..generation.pipeline import MAX_SEED, RANDOM_SEED, GenerationParams
from ..generation.resume import SETTINGS, settings_of
from ..model.lora import prompt_loras

JSONL_SUFFIXES = (".jsonl", ".ndjson")
MAX_JOBS_BYTES = 64 << 20
MAX_JOBS = 100_000
MAX_SEEDS = 10_000
ID_HEX = 16  # 64 bits of sha256: no collision in any batch one person runs


@dataclasses.dataclass
class BatchJob:
    line: int  # where it comes from in the jobs file, 1-based
    params: GenerationParams
    id: str = ""  # job_id(...), set by name_jobs

    @property
    def image(self) -> str:
        return f"{self.id}.png"

    def settings(self) -> dict[str, Any]:
        return settings_of(self.params)


def parse_seeds(text: str) -> list[int]:
    """"1-8" or "1,5,9-12": seeds in the order given, each at most once."""
    seeds: list[int] = []
    for item in text.split(","):
        low, dash, high = item.strip().partition("-")
        try:
            first, last = int(low), int(high if dash else low)
        except ValueError:
            raise AnimaError(f"--seeds takes seeds and ranges such as 1-8 or 1,5,9-12, got {text!r}") from None
        if not 0 <= first <= last <= MAX_SEED:
            raise AnimaError(f"--seeds: {item.strip()!r} is not a seed or a rising range of seeds from 0 to {MAX_SEED}")
        if len(seeds) + last - first + 1 > MAX_SEEDS:
            raise AnimaError(f"--seeds names more than {MAX_SEEDS} seeds")
        seeds.extend(range(first, last + 1))
    if len(set(seeds)) != len(seeds):
        raise AnimaError(f"--seeds names a seed twice: {text!r}")
    return seeds


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """The file's non-blank lines with their numbers."""
    try:
        data = read_small_file(path, MAX_JOBS_BYTES)
    except Unreadable as e:
        raise AnimaError(f"jobs file {path}: {e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise AnimaError(f"jobs file {path} is not UTF-8 text") from None
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            yield number, line


def _settings_of_line(path: Path, number: int, line: str) -> dict[str, Any]:
    try:
        settings = json.loads(line)
    except (ValueError, RecursionError) as e:
        raise AnimaError(f"{path} line {number}: not valid JSON ({e})") from None
    if not isinstance(settings, dict):
        raise AnimaError(f"{path} line {number}: a job is a JSON object, got {type(settings).__name__}")
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise AnimaError(f"{path} line {number}: unknown key {unknown[0]!r}; a job takes {', '.join(SETTINGS)}")
    if "prompt" not in settings:
        raise AnimaError(f"{path} line {number}: the job has no prompt")
    return settings


def read_jobs(path: str | Path, defaults: GenerationParams, seeds: list[int] | None = None,
              lora_dir: Path | None = None) -> list[BatchJob]:
    """Every job of the file, each checked (line number in the message) before anything runs.

    JSONL (.jsonl, .ndjson): each line's settings over `defaults`, with the names `generate --json` and the
    server's jobs report (prompt, negative, width, height, steps, cfg, seed, shift, ...). Any other file: one
    prompt per line. A job that names no seed is made once per `seeds` (default: the defaults' seed). A prompt's
    <lora:NAME:SCALE> tags add LoRAs from `lora_dir`, as in generate."""
    path = Path(path)
    jsonl = path.suffix.lower() in JSONL_SUFFIXES
    jobs: list[BatchJob] = []
    for number, line in _lines(path):
        settings = _settings_of_line(path, number, line) if jsonl else {"prompt": line.strip()}
        for seed in ([settings["seed"]] if "seed" in settings else seeds or [defaults.seed]):
            if seed == RANDOM_SEED and not isinstance(seed, bool):
                raise AnimaError(f"{path} line {number}: a batch job needs a fixed seed (a drawn one could not be "
                                 "found again when the batch resumes)")
            try:
                params = dataclasses.replace(defaults, **{**settings, "seed": seed})
                params.validate()
                prompt, tagged = prompt_loras(params.prompt, lora_dir)
                params = dataclasses.replace(params, prompt=prompt, loras=[*params.loras, *tagged])
            except AnimaError as e:
                raise AnimaError(f"{path} line {number}: {e}") from None
            jobs.append(BatchJob(number, params))
            if len(jobs) > MAX_JOBS:
                raise AnimaError(f"{path} makes more than {MAX_JOBS} jobs; split it")
    if not jobs:
        raise AnimaError(f"jobs file {path} holds no job")
    return jobs


def job_id(settings: dict[str, Any], fingerprints: dict[str, str | None]) -> str:
    """A hash of everything that makes the picture: the settings and the model files' fingerprints."""
    canonical = json.dumps({"settings": settings, "model": fingerprints}, sort_keys=True, allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:ID_HEX]


def name_jobs(jobs: list[BatchJob], fingerprints: Callable[[GenerationParams], dict[str, str | None]]) -> None:
    """Set each job's id; two jobs that would make the same picture are refused (the second adds nothing)."""
    seen: dict[str, BatchJob] = {}
    for job in jobs:
        job.id = job_id(job.settings(), fingerprints(job.params))
        if job.id in seen:
            raise AnimaError(f"line {job.line} repeats the job of line {seen[job.id].line} "
                             f"(seed {job.params.seed}): same settings, same image")
        seen[job.id] = job


def one_sweep(jobs: list[BatchJob], max_seeds: int) -> tuple[GenerationParams, list[int]]:
    """The jobs as one prompt's seed sweep, which `bench` compares cache policies over: their shared settings
    and their seeds in order."""
    first, seeds = jobs[0], [job.params.seed for job in jobs]
    for job in jobs[1:]:
        if {**job.settings(), "seed": 0} != {**first.settings(), "seed": 0}:
            raise AnimaError(f"line {job.line}: bench takes one prompt's seeds, and this job differs from line "
                             f"{first.line} in more than its seed; run such jobs with batch")
    if len(set(seeds)) != len(seeds):
        raise AnimaError("the jobs name a seed twice")
    if len(seeds) > max_seeds:
        raise AnimaError(f"the jobs make {len(seeds)} seeds; at most {max_seeds} fit one bench report")
    return first.params, seeds
