"""The HTTP APIs over one JobQueue, one module of routes per API family:

- a1111.py: AUTOMATIC1111's /sdapi/v1/* (txt2img, img2img, progress, interrupt, skip, models, samplers, schedulers,
  upscalers, options, png-info, extras, the listings), with webui_options.py (WebUI's option table) and extras.py
  (png-info, the upscales)
- openai.py: OpenAI's /v1/models, /v1/images/generations and /v1/images/edits
- native.py: the native async jobs, /api/jobs* (and compare with baseline, compare.py)
- page.py: the web page, GET /

This module holds what they share: the `Server` (queue, the served models (models.py) and the current one,
credentials, limits, LoRA folder, engine settings; a request's GenerationParams), and the app that puts the Host
and Origin checks, credentials, body size and error answers in front of every family. requests.py has the
request helpers they all use; a family imports no other family.

A server on a person's own machine is reachable from every web page they open, so before anything else:
- the Host header must be one of this server's names (loopback, the bound address, `serve --allowed-hosts`):
  a page of another site whose name was re-pointed at 127.0.0.1 (DNS rebinding) sends its own name, and is
  refused with a 400. Bound to every address (0.0.0.0, ::), any IP address is taken too: the machine's own
  change with its networks and cannot be listed, and a rebound page never sends an address, only its name.
- a write (any method but GET, HEAD, OPTIONS) whose Origin (or, without one, Referer) is another site's is
  refused with a 403, with or without credentials: a browser attaches HTTP basic credentials it has cached to a
  cross-site form post. Clients that send neither header (webuiapi, openai, curl) are not browsers and pass.
  The server sends no CORS headers, so a page of another site can never read an answer, nor send a JSON body.

Every API only translates a request into GenerationParams and a job, and a job into its answer: the checks,
the queue and the pictures are the layer below. A bad request is a 4xx with a one-line message, never a 500 or a
traceback; no request field names a file on the server: images come as their bytes (base64 or an upload).
Bodies are bounded by route (requests.py: 1 MiB, 48 MiB where images come), refused with a 413 unread. The
routes carry no return annotation: FastAPI would take it for a response model and re-check every answer.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hmac
import ipaddress
import logging
import re
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from ..checks import shown
from ..errors import AnimaError
from ..generation.images import IMAGE_FORMATS, MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS
from ..generation.params import REQUEST_FIELDS, GenerationParams, build, default, option
from ..model.lora import LoraRef, named_lora
from . import a1111, native, openai, page
from .compare import NotReady
from .jobs import ImageGone, Job, JobBusy, JobQueue, QueueFull, ServerBusy, StoreError
from .models import Models, ServedModel
from .requests import (
    MAX_IMAGE_BODY_BYTES,
    BadRequest,
    BodyTooLarge,
    JobNotFound,
    WrongContentType,
    _number,
    body_limit,
    error_answer,
    request_values,
    too_large,
)

PUBLIC_PATHS = ("/",)  # the page itself; everything it calls needs the credentials
MAX_IMAGES = 8  # batch_size * n_iter, n
FAR_FROM_TRAINED = 2  # a side over this many times (or under 1/this of) the size a model was trained at is warned of
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")  # what a Host header may always name
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")  # the methods that change nothing: any site's page may send them
_DEFAULT_PORTS = {"http": 80, "https": 443}
# A Host header: a name or an address, an IPv6 one in brackets, then an optional port; nothing else (no userinfo).
_HOST = re.compile(r"(\[[0-9a-f:.]+\]|[a-z0-9_.-]+)(?::([0-9]{1,5}))?", re.IGNORECASE)
log = logging.getLogger(__name__)


def host_name(name: str) -> str:
    """A host name as compared: lowercased, without IPv6 brackets or a trailing dot."""
    return name.strip().lower().removeprefix("[").removesuffix("]").rstrip(".")


def _host_and_port(header: str) -> tuple[str, int | None] | None:
    """A Host header's name and port (None: no port), or None for a malformed one."""
    match = _HOST.fullmatch(header)
    return (host_name(match[1]), int(match[2]) if match[2] else None) if match else None


def _address(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def _error_status(e: AnimaError) -> int:
    """The HTTP status of a refusal that reaches the app's handler: 4xx for the request, 5xx for the store."""
    if isinstance(e, StoreError):
        return e.status  # 507: a full disk, 503: a store made read-only under the server
    return {QueueFull: 429, ImageGone: 410, JobBusy: 409, ServerBusy: 503}.get(type(e), 400)


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
    """Holds the queue and the server-wide defaults; builds the FastAPI app."""

    def __init__(self, queue: JobQueue, *, default_cache: str = "none", max_side: int = 1024, max_steps: int = 150,
                 model_name: str = "anima", engine: dict[str, Any] | None = None, api_key: str | None = None,
                 api_auth: str | None = None, lora_dir: Path | None = None, native_size: int | None = None,
                 bind_host: str = "127.0.0.1", allowed_hosts: Iterable[str] = ()) -> None:
        self.queue, self.default_cache = queue, default_cache
        # The names a Host header may give (the module's docstring says why): loopback, the bound address and the
        # --allowed-hosts names, which an Origin may name too (a reverse proxy's public name); "*" takes any Host.
        self.named_hosts = {host_name(name) for name in allowed_hosts} - {"*"}
        self.any_host = "*" in allowed_hosts
        self.hosts = {*LOOPBACK_NAMES, host_name(bind_host), *self.named_hosts}
        bound = _address(host_name(bind_host))
        self.any_address = bound is not None and bound.is_unspecified
        # What an Authorization header must be, exactly: a Bearer token (OpenAI clients) or HTTP basic (WebUI's).
        self.credentials = [f"Bearer {api_key}"] if api_key else []
        if api_auth:
            self.credentials.append("Basic " + base64.b64encode(api_auth.encode()).decode())
        self.engine = dict(engine or {})  # SERVER_SETTINGS (backend, dtype, ...): the server's, never a request's
        # The served models: the queue's (serve given several), else its one pipeline's, named model_name.
        if not queue.models:
            queue.models = {model_name: queue.pipeline.files}
        self.models = Models([ServedModel.of(name, files) for name, files in queue.models.items()])
        self.given_size = native_size  # a request's default size for every model; None: each model's own
        self.max_side, self.max_steps = max_side, max_steps
        self.lora_dir = lora_dir  # requests pick LoRAs in it by name (<lora:NAME:SCALE> or "loras"), never by path

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
        sides = (params.width, params.height, *(params.hires_size() if params.hires else ()))
        if trained is None or all(trained / FAR_FROM_TRAINED <= side <= trained * FAR_FROM_TRAINED for side in sides):
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

    def _submit_many(self, params: GenerationParams, count: int, model: ServedModel | None = None) -> list[Job]:
        """`count` jobs on `model` (None: the current one), consecutive seeds as WebUI does for a batch; a size far
        from the model's trained one is logged."""
        if not 1 <= count <= MAX_IMAGES:
            raise BadRequest(f"at most {MAX_IMAGES} images per request")
        model = model or self.models.current
        jobs = self.queue.submit_all([dataclasses.replace(params, seed=(params.seed + i) % 2**64)
                                      for i in range(count)], model.name)
        if (warning := self.size_warning(params, model)) is not None:
            log.warning("job %s: %s", jobs[0].id, warning)
        return jobs

    def job_status(self, job: Job) -> dict[str, Any]:
        """A job's status as the native API answers it, with the warnings of its settings (the page shows them)."""
        model = next((served for served in self.models.all if served.name == job.model), None)
        warning = None if model is None else self.size_warning(job.params, model)
        return job.status(self.queue.position(job)) | {"warnings": [warning] if warning else []}

    async def _wait(self, jobs: list[Job]) -> list[Job]:
        for job in jobs:
            while not job.done.is_set():
                await asyncio.sleep(0.05)
        return jobs

    def _png_b64(self, job: Job) -> str:
        return base64.b64encode(self.queue.read_image(job)).decode()  # a plain file of the data folder only

    # ---- the app ------------------------------------------------------------------------------------------

    def _refused_host(self, request: Request) -> str | None:
        """Why the request's Host header is not one of this server's names (None: it is)."""
        header = request.headers.get("host", "")
        parsed = _host_and_port(header)
        if parsed is None:
            return f"malformed Host header {shown(header)}" if header else "a Host header is required"
        name = parsed[0]
        if self.any_host or name in self.hosts or (self.any_address and _address(name) is not None):
            return None
        return (f"refused Host {shown(header)}: not a name of this server (a guard against DNS rebinding); "
                "serve --allowed-hosts NAME adds one")

    def _foreign_origin(self, request: Request) -> str | None:
        """The Origin (without one, the Referer) of a write sent by another site's page; None for a safe method,
        this server's own page, or a client that sends neither (not a browser)."""
        if request.method in SAFE_METHODS:
            return None
        source = request.headers.get("origin") or request.headers.get("referer")
        if not source:
            return None
        host, port = _host_and_port(request.headers["host"])  # checked by _refused_host
        try:
            parts = urlsplit(source)
            scheme_port = _DEFAULT_PORTS.get(parts.scheme)
            name, given_port = host_name(parts.hostname or ""), parts.port
        except ValueError:  # a port that is not one
            return source
        if scheme_port is None or not name:  # "null" (a sandboxed frame, a file), or no web origin at all
            return source
        # The scheme may differ (a TLS proxy in front); the name and port are the page's own.
        same = (name, given_port or scheme_port) == (host, port or scheme_port)
        return None if same or name in self.named_hosts else source

    def app(self) -> FastAPI:
        """The app: what every request meets (credentials, body size, errors as one-line JSON), then each
        family's routes."""
        app = FastAPI(title="anima-rknn", docs_url=None, redoc_url=None)

        @app.middleware("http")
        async def guard(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
            if (refused := self._refused_host(request)) is not None:
                return error_answer(request, refused, 400)
            if (origin := self._foreign_origin(request)) is not None:
                return error_answer(request, f"refused a {request.method} from another site's page (Origin "
                                             f"{shown(origin)}): this server takes writes from its own page and "
                                             "from clients that are not browsers", 403)
            given = request.headers.get("authorization", "")
            if self.credentials and request.url.path not in PUBLIC_PATHS and not any(
                    hmac.compare_digest(given.encode(), expected.encode()) for expected in self.credentials):
                return error_answer(request, "authentication required", 401,
                                    headers={"WWW-Authenticate": 'Basic realm="anima-rknn"'})
            try:
                length = int(request.headers.get("content-length") or 0)
            except ValueError:
                return error_answer(request, "bad Content-Length", 400)
            if length > body_limit(request.url.path, request.method):  # refused before a byte of it is read
                return error_answer(request, str(too_large(request.url.path, request.method)), 413)
            return await call_next(request)

        # Starlette answers with the handler of the nearest class in the error's MRO: NotReady, an AnimaError, is a 409.
        @app.exception_handler(AnimaError)
        async def anima_error(request: Request, e: AnimaError) -> JSONResponse:
            status = _error_status(e)
            # A 503 (busy, or a store that cannot be written now) passes: the client is told when to try again.
            return error_answer(request, str(e), status, headers={"Retry-After": "2"} if status == 503 else None)

        @app.exception_handler(RequestValidationError)
        async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
            first = e.errors()[0] if e.errors() else {}
            return error_answer(request, f"invalid request: {first.get('msg', 'malformed')}", 422)

        @app.exception_handler(BodyTooLarge)
        async def body_too_large(request: Request, e: BodyTooLarge) -> JSONResponse:
            return error_answer(request, str(e), 413)

        @app.exception_handler(JobNotFound)
        async def not_found(request: Request, e: JobNotFound) -> JSONResponse:
            return error_answer(request, f"no job {e.args[0][:40]!r}", 404)

        @app.exception_handler(NotReady)
        async def not_ready(request: Request, e: NotReady) -> JSONResponse:
            return error_answer(request, str(e), 409)

        @app.exception_handler(WrongContentType)
        async def wrong_content_type(request: Request, e: WrongContentType) -> JSONResponse:
            return error_answer(request, str(e), 415)

        # A route that does not exist, a method it does not take: one line too (under /v1/, OpenAI's shape).
        @app.exception_handler(HTTPException)
        async def http_error(request: Request, e: HTTPException) -> Response:
            return error_answer(request, str(e.detail), e.status_code, headers=e.headers)

        # A client gone before its body was read whole: nobody is left to answer, one line in the log says so
        # (not the traceback of every layer the exception crossed).
        @app.exception_handler(ClientDisconnect)
        async def client_gone(request: Request, e: ClientDisconnect) -> Response:
            log.warning("%s %s: the client disconnected before its request body was read", request.method,
                        request.url.path)
            return Response(status_code=400)

        # A bug: the traceback goes to the log (Starlette logs it after this answer), the client gets one line.
        @app.exception_handler(Exception)
        async def server_error(request: Request, e: Exception) -> JSONResponse:
            return error_answer(request, "internal server error (the server's log has the details)", 500)

        for family in (a1111, openai, native, page):
            app.include_router(family.routes(self))
        return app
