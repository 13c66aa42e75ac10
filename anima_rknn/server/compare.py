"""Compare with baseline: a cached job against its uncached twin (same settings and seed, cache "none").

The twin runs through the queue like any job. Once both are completed, the two PNGs are measured with the
benchmark's own metrics (PSNR, SSIM, difference map), and the summaries give the denoise speedup.
"""

from __future__ import annotations

import io
import math
from typing import Any

from PIL import Image

from ..bench.metrics import difference_map, psnr, ssim
from ..checks import is_number
from ..errors import AnimaError
from ..generation.params import GenerationParams, settings_of, uncached
from .job_queue import JobQueue
from .store import ImageGone, Job

GIVEN_UP = ("failed", "cancelled")
DIFFERENCE_COLOURS = "inferno"  # black where equal, through red to pale yellow at the largest difference


class NotComparable(AnimaError):
    """The request names a job without a cache, or a twin that is not the job's twin."""


class NotReady(AnimaError):
    """One of the two jobs failed or was cancelled (or is still running, for the difference map)."""


def twin_params(job: Job) -> GenerationParams:
    twin = uncached(job.params)
    if twin == job.params:
        raise NotComparable(f"job {job.id} ran without a cache: it is its own baseline")
    return twin


def twin_of(queue: JobQueue, job: Job) -> Job:
    """The job's uncached twin: one already queued, running or done is reused, so a second click costs nothing.
    A finished job keeps its images by fingerprint; the twin gets their bytes back from the queue's inputs."""
    wanted = queue.with_inputs(twin_params(job))
    if job.state in GIVEN_UP:
        raise NotReady(f"job {job.id} {job.state}: there is nothing to compare")
    settings = settings_of(wanted)
    reused = next((other for other in queue.recent() if other.state not in GIVEN_UP
                   and settings_of(other.params) == settings and other.model == job.model), None)
    return reused or queue.submit(wanted, job.model)  # on the job's model


def _check(job: Job, twin: Job) -> bool:
    """Whether both are completed; refuses a twin that is not the job's and a pair that will never be."""
    if settings_of(twin.params) != settings_of(twin_params(job)):
        raise NotComparable(f"job {twin.id} is not the uncached twin of job {job.id}")
    for one in (job, twin):
        if one.state in GIVEN_UP:
            raise NotReady(f"job {one.id} {one.state}: there is nothing to compare")
    return job.state == twin.state == "completed"


def _image(queue: JobQueue, job: Job) -> Image.Image:
    try:
        with Image.open(io.BytesIO(queue.read_image(job))) as image:
            return image.convert("RGB")
    except (ImageGone, OSError) as e:  # gone, or not a picture PIL can read
        raise NotReady(f"the image of job {job.id} cannot be read: {e}") from None


def measure(queue: JobQueue, job: Job, twin: Job) -> dict[str, Any] | None:
    """PSNR (dB; None when the images are identical), SSIM, the largest pixel difference (of 255), denoise
    speedup and computed steps; None while either job has still to finish."""
    if not _check(job, twin):
        return None
    cached, baseline = _image(queue, job), _image(queue, twin)
    decibels = psnr(baseline, cached)
    cached_s, baseline_s = _denoise_s(job), _denoise_s(twin)
    return {"psnr_db": decibels if math.isfinite(decibels) else None, "ssim": ssim(baseline, cached),
            "difference_max": float(difference_map(baseline, cached).max()),
            "speedup": baseline_s / cached_s if cached_s > 0 else None,
            "denoise_s": {"cached": cached_s, "baseline": baseline_s},
            "computed_steps": {"cached": _computed(job), "baseline": _computed(twin)}}


def _denoise_s(job: Job) -> float:
    """The job's denoise seconds from its record (one read back from the store may lack them: NotReady)."""
    seconds = ((job.summary or {}).get("timings") or {}).get("denoise_s")
    if not (is_number(seconds) and seconds >= 0):
        raise NotReady(f"the record of job {job.id} has no denoise time")
    return float(seconds)


def _computed(job: Job) -> int:
    steps = (job.summary or {}).get("computed_steps")
    if not isinstance(steps, list):
        raise NotReady(f"the record of job {job.id} has no computed steps")
    return len(steps)


def difference_png(queue: JobQueue, job: Job, twin: Job) -> bytes:
    """The difference map in DIFFERENCE_COLOURS, from equal to the largest difference: where the pictures
    differ, however little (measure() says how much)."""
    from matplotlib import colormaps  # here, not at the top: the server starts without loading matplotlib

    if not _check(job, twin):
        raise NotReady(f"jobs {job.id} and {twin.id} are not both completed yet")
    cached, baseline = _image(queue, job), _image(queue, twin)
    difference = difference_map(baseline, cached)
    scaled = difference / max(float(difference.max()), 1.0)  # equal pictures stay black
    buffer = io.BytesIO()
    Image.fromarray(colormaps[DIFFERENCE_COLOURS](scaled, bytes=True)[..., :3]).save(buffer, format="PNG")
    return buffer.getvalue()
