"""A batch's jobs: read from a JSONL file (one generation's settings per line) or a plain list of prompts
crossed with seeds, every job checked as `generate` checks its options, and each named by a hash of its
settings and model files, so that a second run of the same command knows which images it already has.

A job's images (init_image, mask) are file paths, relative to the jobs file's folder (or absolute: the jobs file
is the user's own, read on their machine), read and checked here; the job carries their bytes, so a Ray worker
on another machine needs no copy of them. The same image at another path is the same job: an id hashes an image
by its sha256 alone.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

import torch

from ..checks import shown
from ..core.files import Unreadable, read_small_file
from ..engine.vae_plan import vae_tiles
from ..errors import AnimaError
from ..generation.images import ImageInput
from ..generation.params import (
    IMAGE_SETTINGS,
    RANDOM_SEED,
    SETTINGS,
    GenerationParams,
    build,
    canonical_settings,
    settings_of,
)
from ..generation.pipeline import AnimaPipeline
from ..generation.run_plan import RunPlan

JSONL_SUFFIXES = (".jsonl", ".ndjson")
MAX_JOBS_BYTES = 64 << 20
MAX_JOBS = 100_000
ID_HEX = 16  # 64 bits of sha256: no collision in any batch one person runs


@dataclasses.dataclass
class BatchJob:
    line: int  # where it comes from in the jobs file, 1-based
    params: GenerationParams
    id: str = ""  # job_id(...), set by name_jobs
    plan: RunPlan | None = None  # its run, planned by the driver (prepare_jobs); None: the worker plans it

    @property
    def image(self) -> str:
        return f"{self.id}.png"

    def settings(self) -> dict[str, Any]:
        return settings_of(self.params)


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


class _Images:
    """A jobs file's images, read once each (jobs crossed with seeds, or naming one file twice, share its bytes)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.by_path: dict[str, ImageInput] = {}
        self.by_sha256: dict[str, ImageInput] = {}

    def read(self, key: str, value: object) -> ImageInput:
        """A job's image: a path (relative to the jobs file's folder), or the {"name", "sha256"} a result record
        holds, whose file must still have that sha256."""
        expected = None
        if isinstance(value, dict) and value.keys() == {"name", "sha256"}:
            value, expected = value["name"], value["sha256"]
        if not isinstance(value, str) or not value:
            raise AnimaError(f"{key} must be an image file's path (relative to the jobs file's folder), "
                             f"got {shown(value)}")
        path = os.path.normpath(self.folder / os.path.expanduser(value))
        if path not in self.by_path:
            try:
                image = ImageInput.from_path(path)
            except AnimaError as e:
                raise AnimaError(f"{key}: {e}") from None
            same = self.by_sha256.setdefault(image.sha256, image)
            self.by_path[path] = ImageInput(same.data, image.name, image.sha256)  # one copy of the bytes
        image = self.by_path[path]
        if expected is not None and image.sha256 != expected:
            raise AnimaError(f"{key} {value}: the file's sha256 is {image.sha256[:12]}..., the job's record names "
                             f"{shown(expected, 15)}: the file has changed since")
        return image


def _sized_by_image(settings: dict[str, Any], defaults: GenerationParams,
                    sides_set: Collection[str]) -> dict[str, Any]:
    """A job that names its own init image (or outpainting) is the image's size grown by the outpainting, as in
    generate, in each side neither it nor the command line (`sides_set`) gives."""
    if "init_image" not in settings and "outpaint" not in settings:
        return settings
    image = settings.get("init_image", defaults.init_image)
    if not isinstance(image, ImageInput):
        return settings
    sized = build({"prompt": "", "init_image": image, "outpaint": settings.get("outpaint", defaults.outpaint)})
    return {side: getattr(sized, side) for side in ("width", "height")
            if side not in settings and side not in sides_set} | settings


def read_jobs(path: str | Path, defaults: GenerationParams, seeds: list[int] | None = None,
              lora_dir: Path | None = None, sides_set: Collection[str] = ()) -> list[BatchJob]:
    """Every job of the file, each checked (line number in the message) before anything runs.

    JSONL (.jsonl, .ndjson): each line's settings over `defaults`, with the names `generate --json` and the
    server's jobs report (prompt, negative, width, height, steps, cfg, seed, shift, ...); init_image and mask are
    image files, by a path relative to the jobs file's folder. Any other file: one prompt per line. A job that
    names no seed is made once per `seeds` (default: the defaults' seed). A prompt's <lora:NAME:SCALE> tags add
    LoRAs from `lora_dir`, as in generate. A job with an init image of its own is by default the image's size
    (grown by its outpainting), except in the sides the command line set for every job (`sides_set`: "width",
    "height")."""
    path = Path(path)
    if defaults.threads is None:  # the Python API's "as torch is set": this process's, named in every job's id
        defaults = dataclasses.replace(defaults, threads=torch.get_num_threads())
    # So too the VAE tiles the defaults leave unset, as prepare() will fill them in (the VAE set's, else the engine's
    # default): a job's id hashes those it runs.
    defaults = dataclasses.replace(defaults, **dict(zip(("vae_tile", "vae_overlap"), vae_tiles(defaults))))
    jsonl = path.suffix.lower() in JSONL_SUFFIXES
    jobs: list[BatchJob] = []
    images = _Images(path.parent)
    for number, line in _lines(path):
        settings = _settings_of_line(path, number, line) if jsonl else {"prompt": line.strip()}
        try:
            for key in IMAGE_SETTINGS:
                if settings.get(key) is not None:
                    settings[key] = images.read(key, settings[key])
            settings = _sized_by_image(settings, defaults, sides_set)
        except AnimaError as e:
            raise AnimaError(f"{path} line {number}: {e}") from None
        for seed in ([settings["seed"]] if "seed" in settings else seeds or [defaults.seed]):
            if seed == RANDOM_SEED and not isinstance(seed, bool):
                raise AnimaError(f"{path} line {number}: a batch job needs a fixed seed (a drawn one could not be "
                                 "found again when the batch resumes)")
            try:
                params = build({**settings, "seed": seed}, base=defaults, lora_dir=lora_dir)
                params.validate()
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
    canonical = json.dumps({"settings": canonical_settings(settings), "model": fingerprints}, sort_keys=True,
                           allow_nan=False)
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


def prepare_jobs(jobs: list[BatchJob], pipeline: AnimaPipeline,
                 source: str | None = None) -> list[tuple[GenerationParams, dict[str, str | None]]]:
    """Plan each job's run as generate plans its run (before anything runs; `source`: the jobs file, named with
    the line in errors; the jobs' settings were validated by read_jobs) and name it; returns the model
    fingerprints the workers must have, one entry per set of model files (subgraph sets, LoRAs) in the jobs."""
    prepared: dict[tuple, RunPlan] = {}
    for job in jobs:
        # Jobs that differ only in their seed prepare alike: a seed sweep of one image decodes it once.
        key = (repr(dataclasses.replace(job.params, seed=0, init_image=None, mask=None)),
               *(image.sha256 if image is not None else None for image in (job.params.init_image, job.params.mask)))
        if key not in prepared:
            try:
                prepared[key] = pipeline.prepare(job.params, validated=True)
            except AnimaError as e:
                raise AnimaError(f"{source} line {job.line}: {e}" if source else str(e)) from None
        job.plan = prepared[key].for_settings(job.params)
        job.params = job.plan.params  # with what prepare() filled in, which the job's id hashes
    prints: dict[str, tuple[GenerationParams, dict[str, str | None]]] = {}

    def fingerprints(params: GenerationParams) -> dict[str, str | None]:
        key = repr(dataclasses.replace(params, prompt="", negative="", seed=0))  # all a sweep's jobs share
        if key not in prints:
            prints[key] = (params, pipeline.fingerprints(params))
        return prints[key][1]

    name_jobs(jobs, fingerprints)
    # Kinds of run with the same model files need one check on a worker.
    return list({json.dumps(found, sort_keys=True): (params, found) for params, found in prints.values()}.values())


def one_sweep(jobs: list[BatchJob], max_seeds: int) -> tuple[GenerationParams, list[int]]:
    """The jobs as one prompt's seed sweep, which `bench` compares cache policies over: their shared settings
    and their seeds in order."""
    first, seeds = jobs[0], [job.params.seed for job in jobs]
    for job in jobs[1:]:
        if {**canonical_settings(job.settings()), "seed": 0} != {**canonical_settings(first.settings()), "seed": 0}:
            raise AnimaError(f"line {job.line}: bench takes one prompt's seeds, and this job differs from line "
                             f"{first.line} in more than its seed; run such jobs with batch")
    if len(set(seeds)) != len(seeds):
        raise AnimaError("the jobs name a seed twice")
    if len(seeds) > max_seeds:
        raise AnimaError(f"the jobs make {len(seeds)} seeds; at most {max_seeds} fit one bench report")
    return first.params, seeds
