"""The server's runtime, shared by every route family (a1111.py, openai.py, native.py, page.py): the `Server` holds the
queue, the served models (models.py) and the current one, WebUI's options (webui_options.py, kept in the data
folder), the Host/Origin/credential guard (guard.py), limits, LoRA folder and engine settings; it turns a request
into GenerationParams and jobs, waits for them without polling, and runs the synchronous APIs' calls (A1111's
txt2img / img2img, OpenAI's images) through one run-and-collect with one failure mapping. app.py wires it to the
routes, which use only its public names (a test reads them)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from starlette.concurrency import run_in_threadpool

from ..errors import AnimaError
from ..generation.images import IMAGE_FORMATS, MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS
from ..generation.params import (
    REQUEST_FIELDS,
    GenerationParams,
    build,
    default,
    option,
    size_warning,
)
from ..model.lora import LoraRef, named_lora
from .guard import Guard
from .job_queue import JobQueue
from .models import Models, ServedModel
from .requests import (
    MAX_IMAGE_BODY_BYTES,
    BadRequest,
    _number,
    has_image,
    request_values,
)
from .store import Job
from .webui_options import MODEL, Options

MAX_IMAGES = 8  # batch_size * n_iter, n
log = logging.getLogger(__name__)
T = TypeVar("T")


class JobEnded(AnimaError):
    """A synchronous call's job ended without its picture: `status` 500 when it failed (its error is the message),
    409 when it was cancelled (by the native API's cancel, or an /interrupt of a job no call waits for)."""

    def __init__(self, job: Job) -> None:
        super().__init__(job.error or f"job {job.state}")
        self.status = 500 if job.state == "failed" else 409


@dataclasses.dataclass
class Collected:
    """What a synchronous call made: its settings, its jobs (completed) and their PNGs, in order."""
    params: GenerationParams
    jobs: list[Job]
    pngs: list[bytes]


def _wake(loop: asyncio.AbstractEventLoop, future: asyncio.Future[None]) -> None:
    """Resolve `future` on its loop from any thread (a loop closed meanwhile has no one left to wake)."""
    def resolve() -> None:
        if not future.done():
            future.set_result(None)
    try:
        loop.call_soon_threadsafe(resolve)
    except RuntimeError:
        pass


async def wait_done(jobs: list[Job]) -> list[Job]:
    """`jobs` once each has ended, awaited without polling: each job wakes its waiter when it ends (Job.when_done,
    from the worker's thread, through the loop's call_soon_threadsafe)."""
    loop = asyncio.get_running_loop()
    for job in jobs:
        future: asyncio.Future[None] = loop.create_future()
        job.when_done(lambda future=future: _wake(loop, future))
        await future
    return jobs


def _kind_details(kind: str) -> dict[str, Any]:
    """What a client must know to send a setting of this kind beyond its range: how an image is encoded and bounded,
    what outpaint's list holds."""
    if kind == "image":
        # An image rides in a body of at most MAX_IMAGE_BODY_BYTES, as base64 (4 characters per 3 bytes).
        return {"encoding": "base64 of the file's bytes, or a data:image/...;base64, URL",
                "max_bytes": min(MAX_IMAGE_BYTES, MAX_IMAGE_BODY_BYTES * 3 // 4),
                "max_pixels": MAX_IMAGE_PIXELS, "max_body_bytes": MAX_IMAGE_BODY_BYTES,
                "formats": list(IMAGE_FORMATS)}
    if kind == "outpaint":
        return {"items": ["left", "top", "right", "bottom"]}
    return {}


class Server:
    """Holds the queue, the guard and the server-wide defaults; app.py builds the FastAPI app over it."""

    def __init__(self, queue: JobQueue, *, default_cache: str = "none", max_side: int = 1024, max_steps: int = 150,
                 model_name: str = "anima", engine: dict[str, Any] | None = None, api_key: str | None = None,
                 api_auth: str | None = None, lora_dir: Path | None = None, native_size: int | None = None,
                 bind_host: str = "127.0.0.1", allowed_hosts: Iterable[str] = ()) -> None:
        self.queue, self.default_cache = queue, default_cache
        self.guard = Guard(bind_host, allowed_hosts, api_key, api_auth)
        self.engine = dict(engine or {})  # SERVER_SETTINGS (backend, dtype, ...): the server's, never a request's
        # The served models: the queue's (serve given several), else its one pipeline's, named model_name.
        if not queue.models:
            queue.models[model_name] = queue.pipeline.files  # the worker's table too: updated, not replaced
        self.models = Models([ServedModel.of(name, files) for name, files in queue.models.items()])
        self.given_size = native_size  # a request's default size for every model; None: each model's own
        self.max_side, self.max_steps = max_side, max_steps
        self.lora_dir = lora_dir  # requests pick LoRAs in it by name (<lora:NAME:SCALE> or "loras"), never by path
        # WebUI's options as last written, kept in the data folder; the current model is one of them.
        self.options = Options.kept_in(queue.data_dir)
        if self.options.model is not None:
            try:
                self.models.current = self.models.find(self.options.model)
            except BadRequest:
                log.warning("the current model in the saved options, %s, is not served now: %s is", self.options.model,
                            self.models.current.title)
        self.calls: list[list[Job]] = []  # each pending synchronous call's jobs: an /interrupt ends the whole call

    # ---- models -------------------------------------------------------------------------------------------

    @property
    def model_name(self) -> str:
        """The model a request that names none runs on (WebUI's sd_model_checkpoint)."""
        return self.models.current.name

    def model_for(self, asked: Any, field: str) -> ServedModel:
        """The model a request names in `field` (any of WebUI's names for it); none named: the current one."""
        return self.models.current if asked in (None, "") else self.models.find(asked, field)

    def native_size(self, model: ServedModel | None = None) -> int:
        """A request's default size on `model`: the size it was trained at where it records one, else 512."""
        return self.given_size or (model or self.models.current).trained_size or default("width")

    def size_warning(self, params: GenerationParams, model: ServedModel) -> str | None:
        """A warning for a picture far from the size `model` records it was trained at (every client's default is
        512x512; the demo model's is 64): such a run draws a flat or broken field."""
        trained = model.trained_size
        if size_warning(params, trained) is None:  # the one rule (generation.params), in the server's words
            return None
        return (f"{params.width}x{params.height} is far from the {trained}x{trained} px {model.name} was trained at: "
                f"expect a flat or broken picture; ask for about {trained}x{trained}")

    # ---- requests -> params -------------------------------------------------------------------------------

    def request_defaults(self, model: ServedModel | None = None) -> dict[str, Any]:
        """What this server gives a request that leaves a setting out, where the table's request default is not
        it: the model's size and the server's cache (and the table's drawn seed)."""
        size = self.native_size(model)
        return {"width": size, "height": size, "steps": default("steps"),
                "seed": default("seed", "request"), "cache": self.default_cache}

    def limits(self) -> dict[str, int]:
        """This server's bounds, tighter than the table's (--max-side, --max-steps); the hires fix's size and steps
        count too."""
        return {"width": self.max_side, "height": self.max_side, "steps": self.max_steps,
                "hires_width": self.max_side, "hires_height": self.max_side, "hires_steps": self.max_steps}

    def params(self, body: dict[str, Any], model: ServedModel | None = None) -> GenerationParams:
        """A request's settings: its fields as the settings table names them (generation.params.REQUEST_FIELDS),
        over request_defaults(), with the server's own settings (SERVER_SETTINGS), which no request chooses.
        With an init image, a width or height not given is the image's (as build() makes it), then bounded as a
        given one; the hires size and an only-masked inpainting's output (the init image's size) are too."""
        given = request_values(body)
        defaults = self.request_defaults(model)
        if given.get("init_image") is not None:
            defaults = {key: value for key, value in defaults.items() if key not in ("width", "height")}
        values = defaults | given
        if not 1 <= values["steps"] <= self.max_steps:
            raise BadRequest(f"steps must be from 1 to {self.max_steps}")
        if not 0 <= values.get("hires_steps", 0) <= self.max_steps:
            raise BadRequest(f"hr_second_pass_steps must be from 0 (as steps) to {self.max_steps}")
        values["loras"] = self._named_loras(values.get("loras") or [])
        params = build(values | self.engine, native_size=self.native_size(model), lora_dir=self.lora_dir)
        if not all(isinstance(side, int) and 16 <= side <= self.max_side for side in (params.width, params.height)):
            size = (" (the init image's size, grown by the outpainting, unless given)"
                    if params.init_image is not None else "")
            raise BadRequest(f"width and height{size} must be from 16 to {self.max_side}, got {params.width}x"
                             f"{params.height}")
        params.validate()
        self._check_output_size(params)
        return params

    def _check_output_size(self, params: GenerationParams) -> None:
        """Neither the hires pass nor an only-masked inpainting (which keeps the whole init image) makes a picture
        with a side over this server's --max-side."""
        if params.hires:
            width, height = params.hires_size()
            if max(width, height) > self.max_side:
                raise BadRequest(f"the hires fix would make a {width}x{height} picture; this server's largest side "
                                 f"is {self.max_side} px: lower hr_scale, or hr_resize_x / hr_resize_y")
        if params.init_image is not None and params.inpaint_area == "masked" and (
                params.mask is not None or params.outpaint is not None):
            width, height = params.init_image.size()
            if params.outpaint is not None:
                width, height = width + params.outpaint[0] + params.outpaint[2], height + params.outpaint[1] + \
                    params.outpaint[3]
            if max(width, height) > self.max_side:
                raise BadRequest(f"inpainting only the masked area keeps the init image's size, {width}x{height}; this "
                                 f"server's largest side is {self.max_side} px: inpaint the whole picture "
                                 "(inpaint_area whole) or send a smaller image")

    def request_settings(self, model: ServedModel | None = None) -> list[dict[str, Any]]:
        """The settings a request may give, as this server applies them: the table's entries (generation.params)
        with this server's defaults (on `model`, else the current one) and limits, for clients that build a form
        (the page)."""
        defaults, limits = self.request_defaults(model), self.limits()
        return [{"field": field, "setting": name, "kind": setting.kind, "help": setting.help,
                 "default": defaults.get(name, default(name, "request")), "low": setting.low,
                 "high": limits.get(name, setting.high), "choices": list(setting.choices)} | _kind_details(setting.kind)
                for field, name in REQUEST_FIELDS.items() for setting in [option(name)]
                if setting.kind not in ("loras", "cache_options")]

    def _named_loras(self, value: Any) -> list[LoraRef]:
        """The native API's "loras": [{"name": NAME, "scale": SCALE}, ...], names from the server's LoRA folder."""
        if not isinstance(value, list) or not all(isinstance(item, dict) and set(item) <= {"name", "scale"}
                                                  for item in value):
            raise BadRequest('loras must be a list of {"name": NAME, "scale": SCALE} objects')
        return [named_lora(item.get("name"), _number(item, "scale", 1.0), self.lora_dir) for item in value]

    def write_options(self, body: Any) -> None:
        """WebUI's POST /options: every option checked (a 400 names the first refused), then all kept (the
        options file first: StoreError, nothing changed), sd_model_checkpoint switching the current model."""
        changes = self.options.checked(body)
        model = self.model_for(changes.pop(MODEL, None), MODEL)
        self.options.write(changes, model.title)
        self.models.current = model

    def set_current(self, model: ServedModel) -> None:
        """The model requests that name none run on from now on, kept with the options for the next start."""
        self.options.write({}, model.title)
        self.models.current = model

    # ---- submitting and waiting ---------------------------------------------------------------------------

    async def decoding(self, work: Callable[..., T], *args: Any) -> T:
        """`work(*args)` off the event loop in a turn of the queue's decodes (at most uploads.MAX_DECODES at once;
        beyond, ServerBusy: a 503 with Retry-After): decoding a picture's base64, its sha256 and its pixels takes
        a large one a second, and /progress must answer meanwhile."""
        def in_turn() -> T:
            with self.queue.decodes.turn():
                return work(*args)
        return await run_in_threadpool(in_turn)

    def _params_and_jobs(self, values: dict[str, Any], count: int,
                         model: ServedModel) -> tuple[GenerationParams, list[Job]]:
        params = self.params(values, model)
        return params, self.submit(params, count, model)

    async def submit_request(self, values: dict[str, Any], count: int,
                             model: ServedModel) -> tuple[GenerationParams, list[Job]]:
        """A request's settings (params) and its `count` jobs (submit), made off the event loop: a request with an
        image in a decode turn (its base64 decoded and hashed, then checked by the submit, in that one turn)."""
        if has_image(values):
            return await self.decoding(self._params_and_jobs, values, count, model)
        return await run_in_threadpool(self._params_and_jobs, values, count, model)

    def submit(self, params: GenerationParams, count: int = 1, model: ServedModel | None = None) -> list[Job]:
        """`count` jobs on `model` (None: the current one), consecutive seeds as WebUI does for a batch; a size far
        from the model's trained one is logged."""
        if not 1 <= count <= MAX_IMAGES:
            raise BadRequest(f"at most {MAX_IMAGES} images per request")
        model = model or self.models.current
        jobs = self.queue.submit_all([dataclasses.replace(params, seed=(params.seed + i) % 2**64)
                                      for i in range(count)], model.name, validated=True)  # by params()
        if (warning := self.size_warning(params, model)) is not None:
            log.warning("job %s: %s", jobs[0].id, warning)
        return jobs

    def job_status(self, job: Job) -> dict[str, Any]:
        """A job's status as the native API answers it, with the warnings of its settings (the page shows them)."""
        model = next((served for served in self.models.all if served.name == job.model), None)
        warning = None if model is None else self.size_warning(job.params, model)
        return job.status(self.queue.position(job)) | {"warnings": [warning] if warning else []}

    async def run_and_collect(self, values: dict[str, Any], count: int, model: ServedModel) -> Collected:
        """A synchronous call (A1111's txt2img / img2img, OpenAI's generations / edits): submit its `count` jobs,
        wait for them, and read their PNGs. The one failure mapping of these calls (docs/server-api.md):
        a refused request raises as the app maps it (400, 429 queue full, 503 busy, 507 disk full); a job that
        failed or was cancelled is JobEnded (500 / 409); a PNG gone since is ImageGone (410). An /interrupt
        (interrupt_call) ends the call with the pictures made, the interrupted one too, as WebUI's does."""
        params, jobs = await self.submit_request(values, count, model)
        self.calls.append(jobs)
        try:
            await wait_done(jobs)
        finally:
            self.calls.remove(jobs)
        if any(job.interrupt.is_set() for job in jobs):
            jobs = [job for job in jobs if job.state != "cancelled"]
        if (ended := next((job for job in jobs if job.state != "completed"), None)) is not None:
            raise JobEnded(ended)
        return Collected(params, jobs, [self.queue.read_image(job) for job in jobs])

    def interrupt_call(self) -> None:
        """WebUI's interrupt: the synchronous call whose job is running answers with its pictures as far as they
        got (the running job's after its next step) and makes no more; a running job no call waits for (the
        native API's) is cancelled."""
        current = self.queue.current
        if current is None:
            return
        call = next((jobs for jobs in self.calls if current in jobs), None)
        if call is None:
            self.queue.cancel(current)
            return
        for job in call:
            self.queue.interrupt(job)
