"""The HTTP APIs over one JobQueue: AUTOMATIC1111's /sdapi/v1, OpenAI's /v1/images, and native async jobs.

Every API only translates a request into GenerationParams and a job, and a job into its answer: the checks,
the queue and the pictures are the layer below. A bad request is a 4xx with a one-line message, never a 500 or a
traceback; no request field names a file on the server.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import math
from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from PIL import Image

from ..errors import AnimaError
from ..generation.pipeline import GenerationParams, png_parameters
from ..model.lora import LoraRef, named_lora, prompt_loras
from ..sampling.caches import CACHE_NAMES
from .compare import NotReady, difference_png, measure, twin_of
from .jobs import FINISHED, Job, JobQueue, QueueFull

SAMPLERS = ("Euler", "euler", "k_euler", "Euler (flow)", "euler_flow")  # one sampler, its usual spellings
MAX_BODY_BYTES = 1 << 20
PUBLIC_PATHS = ("/",)  # the page itself; everything it calls needs the credentials
MAX_IMAGES = 8  # batch_size * n_iter, n
# The page is inline HTML, CSS and JS: it may load nothing from elsewhere, nor be framed by another site.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                               "img-src 'self' blob:; connect-src 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}


class BadRequest(AnimaError):
    pass


def _number(body: dict[str, Any], key: str, default: Any) -> Any:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or isinstance(value, float) and not math.isfinite(value):
        raise BadRequest(f"{key} must be a finite number, got {json.dumps(value)[:40]}")
    return value


def _text(body: dict[str, Any], key: str, default: str) -> str:
    value = body.get(key, default)
    if not isinstance(value, str):
        raise BadRequest(f"{key} must be a string")
    return value


def _cache(body: dict[str, Any], default: str) -> tuple[str, dict[str, Any]]:
    cache = _text(body, "cache", default)
    if cache not in CACHE_NAMES:
        raise BadRequest(f"cache must be one of {', '.join(CACHE_NAMES)}")
    options = body.get("cache_options") or {}
    if not isinstance(options, dict):
        raise BadRequest("cache_options must be an object")
    return cache, options


class Server:
    """Holds the queue and the server-wide defaults; builds the FastAPI app."""

    def __init__(self, queue: JobQueue, *, default_cache: str = "none", max_side: int = 1024, max_steps: int = 150,
                 model_name: str = "anima", engine: dict[str, Any] | None = None, api_key: str | None = None,
                 api_auth: str | None = None, lora_dir: Path | None = None) -> None:
        self.queue, self.default_cache = queue, default_cache
        # What an Authorization header must be, exactly: a Bearer token (OpenAI clients) or HTTP basic (WebUI's).
        self.credentials = [f"Bearer {api_key}"] if api_key else []
        if api_auth:
            self.credentials.append("Basic " + base64.b64encode(api_auth.encode()).decode())
        self.engine = dict(engine or {})  # backend, subgraphs, dtype, rknn: the server's, never a request's
        self.max_side, self.max_steps, self.model_name = max_side, max_steps, model_name
        self.lora_dir = lora_dir  # requests pick LoRAs in it by name (<lora:NAME:SCALE> or "loras"), never by path

    # ---- requests -> params -------------------------------------------------------------------------------

    def params(self, body: dict[str, Any], *, prompt_key: str = "prompt") -> GenerationParams:
        width, height = int(_number(body, "width", 512)), int(_number(body, "height", 512))
        steps = int(_number(body, "steps", 20))
        if not (16 <= width <= self.max_side and 16 <= height <= self.max_side):
            raise BadRequest(f"width and height must be from 16 to {self.max_side}")
        if not 1 <= steps <= self.max_steps:
            raise BadRequest(f"steps must be from 1 to {self.max_steps}")
        cache, options = _cache(body, self.default_cache)
        prompt, loras = prompt_loras(_text(body, prompt_key, ""), self.lora_dir)
        params = GenerationParams(
            prompt=prompt, negative=_text(body, "negative_prompt", GenerationParams.negative),
            width=width, height=height, steps=steps, cfg=float(_number(body, "cfg_scale", 4.0)),
            seed=int(_number(body, "seed", -1)), cache=cache, cache_options=options,
            loras=loras + self._named_loras(body.get("loras") or []), **self.engine)
        params.validate()
        return params

    def _named_loras(self, value: Any) -> list[LoraRef]:
        """The native API's "loras": [{"name": NAME, "scale": SCALE}, ...], names from the server's LoRA folder."""
        if not isinstance(value, list) or not all(isinstance(item, dict) and set(item) <= {"name", "scale"}
                                                  for item in value):
            raise BadRequest('loras must be a list of {"name": NAME, "scale": SCALE} objects')
        return [named_lora(item.get("name"), _number(item, "scale", 1.0), self.lora_dir) for item in value]

    def _submit_many(self, params: GenerationParams, count: int) -> list[Job]:
        """`count` jobs, consecutive seeds as WebUI does for a batch."""
        if not 1 <= count <= MAX_IMAGES:
            raise BadRequest(f"at most {MAX_IMAGES} images per request")
        return self.queue.submit_all([GenerationParams(**{**vars(params), "seed": (params.seed + i) % 2**64})
                                      for i in range(count)])

    async def _wait(self, jobs: list[Job]) -> list[Job]:
        for job in jobs:
            while not job.done.is_set():
                await asyncio.sleep(0.05)
        return jobs

    def _png_b64(self, job: Job) -> str:
        return base64.b64encode(self.queue.image_path(job).read_bytes()).decode()

    # ---- the app ------------------------------------------------------------------------------------------

    def app(self) -> FastAPI:
        app = FastAPI(title="anima-rknn", docs_url=None, redoc_url=None)
        queue = self.queue

        @app.middleware("http")
        async def guard(request: Request, call_next):
            given = request.headers.get("authorization", "")
            if self.credentials and request.url.path not in PUBLIC_PATHS and not any(
                    hmac.compare_digest(given.encode(), expected.encode()) for expected in self.credentials):
                return JSONResponse({"error": "authentication required"}, status_code=401,
                                    headers={"WWW-Authenticate": 'Basic realm="anima-rknn"'})
            try:
                length = int(request.headers.get("content-length") or 0)
            except ValueError:
                return JSONResponse({"error": "bad Content-Length"}, status_code=400)
            if length > MAX_BODY_BYTES:
                return JSONResponse({"error": f"request body over {MAX_BODY_BYTES} bytes"}, status_code=413)
            return await call_next(request)

        @app.exception_handler(AnimaError)
        async def anima_error(request: Request, e: AnimaError):
            return JSONResponse({"error": str(e)}, status_code=429 if isinstance(e, QueueFull) else 400)

        @app.exception_handler(RequestValidationError)
        async def invalid(request: Request, e: RequestValidationError):
            first = e.errors()[0] if e.errors() else {}
            return JSONResponse({"error": f"invalid request: {first.get('msg', 'malformed')}"}, status_code=422)

        async def json_body(request: Request) -> dict[str, Any]:
            try:
                body = json.loads(await request.body() or b"{}")
            except (ValueError, RecursionError):
                raise BadRequest("the request body is not valid JSON") from None
            if not isinstance(body, dict):
                raise BadRequest("the request body must be a JSON object")
            return body

        def job_or_404(job_id: str) -> Job:
            job = queue.get(job_id)
            if job is None:
                raise JobNotFound(job_id)
            return job

        @app.exception_handler(JobNotFound)
        async def not_found(request: Request, e: JobNotFound):
            return JSONResponse({"error": f"no job {e.args[0][:40]!r}"}, status_code=404)

        # -- AUTOMATIC1111 ----------------------------------------------------------------------------------
        @app.post("/sdapi/v1/txt2img")
        async def txt2img(request: Request):
            body = await json_body(request)
            sampler = body.get("sampler_name") or body.get("sampler_index") or "Euler"
            if sampler not in SAMPLERS:
                raise BadRequest(f"unknown sampler {str(sampler)[:40]!r}; this server has: {', '.join(SAMPLERS)}")
            params = self.params(body)
            count = int(_number(body, "batch_size", 1)) * int(_number(body, "n_iter", 1))
            jobs = await self._wait(self._submit_many(params, count))
            failed = next((job for job in jobs if job.state != "completed"), None)
            if failed is not None:
                return JSONResponse({"error": failed.error or f"job {failed.state}"}, status_code=500
                                    if failed.state == "failed" else 409)
            infotexts = [self._infotext(job) for job in jobs]
            seeds = [job.params.seed for job in jobs]
            info = {"prompt": params.prompt, "negative_prompt": params.negative, "seed": seeds[0], "all_seeds": seeds,
                    "width": params.width, "height": params.height, "steps": params.steps,
                    "cfg_scale": params.cfg, "sampler_name": "Euler", "infotexts": infotexts,
                    "sd_model_name": self.model_name, "cache": params.cache}
            return {"images": [self._png_b64(job) for job in jobs], "parameters": body, "info": json.dumps(info)}

        @app.get("/sdapi/v1/progress")
        async def progress():
            job = queue.current
            if job is None:
                return {"progress": 0.0, "eta_relative": 0.0, "current_image": None, "textinfo": None,
                        "state": {"sampling_step": 0, "sampling_steps": 0, "job_count": 0, "interrupted": False}}
            return {"progress": job.step / job.params.steps, "eta_relative": job.eta_s or 0.0,
                    "current_image": base64.b64encode(job.preview).decode() if job.preview else None,
                    "textinfo": None,
                    "state": {"sampling_step": job.step, "sampling_steps": job.params.steps,
                              "job_count": 1 + len([j for j in queue.recent() if j.state == "queued"]),
                              "interrupted": job.cancel.is_set(), "job": job.id}}

        @app.post("/sdapi/v1/interrupt")
        async def interrupt():
            if queue.current is not None:
                queue.cancel(queue.current)
            return {}

        @app.get("/sdapi/v1/sd-models")
        async def sd_models():
            return [{"title": self.model_name, "model_name": self.model_name, "filename": self.model_name}]

        @app.get("/sdapi/v1/samplers")
        async def samplers():
            return [{"name": "Euler", "aliases": list(SAMPLERS[1:]), "options": {}}]

        @app.get("/sdapi/v1/schedulers")
        async def schedulers():
            return [{"name": "simple", "label": "Simple"}]

        @app.get("/sdapi/v1/options")
        async def options():
            return {"sd_model_checkpoint": self.model_name}

        # -- OpenAI -----------------------------------------------------------------------------------------
        @app.get("/v1/models")
        async def models():
            return {"object": "list", "data": [{"id": self.model_name, "object": "model", "owned_by": "anima-rknn"}]}

        @app.post("/v1/images/generations")
        async def images(request: Request):
            body = await json_body(request)
            size = _text(body, "size", "512x512")
            try:
                width, height = (int(side) for side in size.lower().split("x"))
            except ValueError:
                raise BadRequest(f"size must be WIDTHxHEIGHT, got {size[:20]!r}") from None
            if body.get("response_format", "b64_json") != "b64_json":
                raise BadRequest("response_format must be b64_json (this server keeps no public URLs)")
            params = self.params({**body, "width": width, "height": height})
            jobs = await self._wait(self._submit_many(params, int(_number(body, "n", 1))))
            failed = next((job for job in jobs if job.state != "completed"), None)
            if failed is not None:
                return JSONResponse({"error": {"message": failed.error or f"job {failed.state}"}}, status_code=500)
            return {"created": int(jobs[0].created), "data": [{"b64_json": self._png_b64(job),
                                                              "revised_prompt": job.params.prompt} for job in jobs]}

        # -- native jobs ------------------------------------------------------------------------------------
        @app.post("/api/jobs")
        async def submit(request: Request):
            job = queue.submit(self.params(await json_body(request)))
            return job.status(queue.position(job))

        @app.get("/api/jobs")
        async def recent():
            return [job.status(queue.position(job)) for job in queue.recent()]

        @app.get("/api/jobs/{job_id}")
        async def status(job_id: str):
            job = job_or_404(job_id)
            return job.status(queue.position(job))

        @app.post("/api/jobs/{job_id}/cancel")
        async def cancel(job_id: str):
            job = job_or_404(job_id)
            queue.cancel(job)
            return job.status(queue.position(job))

        @app.get("/api/jobs/{job_id}/image")
        async def image(job_id: str):
            job = job_or_404(job_id)
            if job.state != "completed":
                return JSONResponse({"error": f"job is {job.state}"}, status_code=409)
            return Response(self.queue.image_path(job).read_bytes(), media_type="image/png")

        @app.get("/api/jobs/{job_id}/preview")
        async def preview(job_id: str):
            job = job_or_404(job_id)
            if job.preview is None:
                return JSONResponse({"error": "no preview yet"}, status_code=404)
            return Response(job.preview, media_type="image/png")

        @app.get("/api/jobs/{job_id}/events")
        async def events(job_id: str):
            job = job_or_404(job_id)

            async def stream():
                last = None
                while True:
                    status = job.status(queue.position(job))
                    snapshot = (status["state"], status["step"], status["queue_position"])
                    if snapshot != last:
                        last = snapshot
                        yield f"data: {json.dumps(status)}\n\n"
                    if job.state in FINISHED:
                        return
                    await asyncio.sleep(0.1)

            return StreamingResponse(stream(), media_type="text/event-stream")

        # -- compare with baseline ------------------------------------------------------------------------
        @app.exception_handler(NotReady)
        async def not_ready(request: Request, e: NotReady):
            return JSONResponse({"error": str(e)}, status_code=409)

        @app.post("/api/jobs/{job_id}/compare")
        async def compare(job_id: str):
            twin = twin_of(queue, job_or_404(job_id))
            return twin.status(queue.position(twin))

        # Plain def: FastAPI runs these in a worker thread, so SSIM of a large image never stalls other requests.
        @app.get("/api/jobs/{job_id}/compare/{twin_id}")
        def comparison(job_id: str, twin_id: str):
            job, twin = job_or_404(job_id), job_or_404(twin_id)
            measured = measure(queue, job, twin)
            return {"ready": measured is not None, "job": job.status(queue.position(job)),
                    "twin": twin.status(queue.position(twin)), **(measured or {})}

        @app.get("/api/jobs/{job_id}/compare/{twin_id}/difference")
        def difference(job_id: str, twin_id: str):
            job, twin = job_or_404(job_id), job_or_404(twin_id)
            return Response(difference_png(queue, job, twin), media_type="image/png")

        # -- the web page ---------------------------------------------------------------------------------
        page = resources.files(__package__).joinpath("page.html").read_text(encoding="utf-8")

        @app.get("/", include_in_schema=False)
        async def index():
            return HTMLResponse(page, headers=PAGE_HEADERS)

        return app

    def _infotext(self, job: Job) -> str:
        """The `parameters` text of the job's PNG, which alone knows what ran (computed steps, the VAE backend
        auto chose, the error estimate); the request's own where the PNG has none."""
        with Image.open(self.queue.image_path(job)) as image:
            text = image.info.get("parameters")
        return text if isinstance(text, str) else png_parameters(job.params, self.model_name)


class JobNotFound(Exception):
    pass
