"""The native API, /api/jobs*: asynchronous jobs (submit, list, status, cancel, image, live preview, server-sent
events) and compare with baseline (compare.py), which the page and scripts call; /api/settings, the settings a
request may give with this server's defaults (the page builds its form from it).

Its requests are judged strictly, as every setting is: an unknown sampler is a 400 that lists the samplers, and
eta or s_noise given to a sampler without them is a 400 too (the A1111 API drops those two, as WebUI does).
Choices go by our names (resize_mode just_resize, inpainting_fill original, ...), not A1111's numbers.

A job may start from an image: `init_image` and `mask` are base64 of the files' bytes (or data: URLs), `outpaint`
[left, top, right, bottom]; without width and height the init image's size is used (in multiples of 16). Such a
body may be up to requests.MAX_IMAGE_BODY_BYTES; one without an image, 1 MiB.

A submit answers at once with the job's status; the client then polls it or follows its events.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ..checks import shown
from ..sampling.samplers import SAMPLERS
from .compare import difference_png, measure, twin_of
from .job_queue import JobBusy
from .requests import BadRequest, error_answer, job_or_404, json_body
from .store import FINISHED, ImageGone, StoreError

if TYPE_CHECKING:
    from .runtime import Server

# Settings whose choices have display names a form may show beside ours: the samplers' (A1111's, "Euler a"), and
# the image-to-image ones as WebUI's form names them.
CHOICE_LABELS = {
    "sampler": {name: sampler.label for name, sampler in SAMPLERS.items()},
    "resize_mode": {"just_resize": "Just resize", "crop_and_resize": "Crop and resize",
                    "resize_and_fill": "Resize and fill"},
    "masked_content": {"fill": "Fill", "original": "Original", "latent_noise": "Latent noise",
                       "latent_nothing": "Latent nothing"},
    "inpaint_area": {"whole": "Whole picture", "masked": "Only masked"},
    "hires_upscaler": {"latent": "Latent", "latent-bicubic": "Latent (bicubic)",
                       "latent-nearest-exact": "Latent (nearest-exact)", "lanczos": "Lanczos"},
}


DEFAULT_PAGE, MAX_PAGE = 50, 200  # GET /api/jobs: jobs per page unless ?limit= says, and at most


def _query_int(request: Request, name: str, default: int, low: int, high: int) -> int:
    """A query parameter that must be a whole number from `low` to `high` (digits only: no sign, no fraction)."""
    text = request.query_params.get(name)
    if text is None:
        return default
    if not (text.isascii() and text.isdigit() and len(text) <= 19 and low <= int(text) <= high):
        raise BadRequest(f"{name} must be a whole number from {low} to {high}, got {shown(text)}")
    return int(text)


def routes(server: Server) -> APIRouter:
    router = APIRouter()
    queue = server.queue

    @router.post("/api/jobs")
    async def submit(request: Request):
        body = await json_body(request)
        model = server.model_for(body.pop("model", None), "model")  # a served model's name; none: the current one
        _, jobs = await server.submit_request(body, 1, model)  # off the event loop (an image: in a decode turn)
        return server.job_status(jobs[0])

    @router.get("/api/settings")
    async def settings(request: Request):
        # ?model=NAME: the defaults a request on that served model gets (its size); none: the current model's.
        model = server.model_for(request.query_params.get("model"), "model")
        return [entry | ({"labels": CHOICE_LABELS[entry["setting"]]} if entry["setting"] in CHOICE_LABELS else {})
                for entry in server.request_settings(model)]

    @router.get("/api/jobs")
    async def recent(request: Request):
        # Paged, newest first; X-Total-Count is every job in the store, so a client can draw its page links.
        limit = _query_int(request, "limit", DEFAULT_PAGE, 1, MAX_PAGE)
        offset = _query_int(request, "offset", 0, 0, 1 << 62)
        jobs = [server.job_status(job) for job in queue.recent(limit, offset)]
        return JSONResponse(jobs, headers={"X-Total-Count": str(queue.count())})

    @router.get("/api/jobs/{job_id}")
    async def status(job_id: str):
        job = job_or_404(queue, job_id)
        return server.job_status(job)

    @router.delete("/api/jobs/{job_id}")
    async def delete(request: Request, job_id: str):
        job = job_or_404(queue, job_id)
        try:
            await run_in_threadpool(queue.delete, job)
        except JobBusy as e:
            return error_answer(request, str(e), 409)
        except StoreError as e:
            return error_answer(request, str(e), e.status)
        return {"id": job.id, "deleted": True}

    @router.post("/api/jobs/{job_id}/cancel")
    async def cancel(job_id: str):
        job = job_or_404(queue, job_id)
        queue.cancel(job)
        return server.job_status(job)

    @router.get("/api/jobs/{job_id}/image")
    async def image(request: Request, job_id: str):
        job = job_or_404(queue, job_id)
        if job.state != "completed":
            return JSONResponse({"error": f"job is {job.state}"}, status_code=409)
        try:
            return Response(queue.read_image(job), media_type="image/png")
        except ImageGone as e:
            return error_answer(request, str(e), 410)

    @router.get("/api/jobs/{job_id}/preview")
    async def preview(job_id: str):
        job = job_or_404(queue, job_id)
        if job.preview is None:
            return JSONResponse({"error": "no preview yet"}, status_code=404)
        return Response(job.preview, media_type="image/png")

    @router.get("/api/jobs/{job_id}/events")
    async def events(job_id: str):
        job = job_or_404(queue, job_id)

        async def stream():
            last = None
            while True:
                status = server.job_status(job)
                snapshot = (status["state"], status["step"], status["queue_position"])
                if snapshot != last:
                    last = snapshot
                    yield f"data: {json.dumps(status)}\n\n"
                if job.state in FINISHED:
                    return
                await asyncio.sleep(0.1)

        return StreamingResponse(stream(), media_type="text/event-stream")

    # -- compare with baseline ----------------------------------------------------------------------------
    @router.post("/api/jobs/{job_id}/compare")
    async def compare(job_id: str):
        twin = twin_of(queue, job_or_404(queue, job_id))
        return server.job_status(twin)

    # Plain def: FastAPI runs these in a worker thread, so SSIM of a large image never stalls other requests.
    @router.get("/api/jobs/{job_id}/compare/{twin_id}")
    def comparison(job_id: str, twin_id: str):
        job, twin = job_or_404(queue, job_id), job_or_404(queue, twin_id)
        measured = measure(queue, job, twin)
        return {"ready": measured is not None, "job": server.job_status(job),
                "twin": server.job_status(twin), **(measured or {})}

    @router.get("/api/jobs/{job_id}/compare/{twin_id}/difference")
    def difference(job_id: str, twin_id: str):
        job, twin = job_or_404(queue, job_id), job_or_404(queue, twin_id)
        return Response(difference_png(queue, job, twin), media_type="image/png")

    return router
