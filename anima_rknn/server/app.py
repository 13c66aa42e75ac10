"""The HTTP APIs over one JobQueue, one module of routes per API family:

- a1111.py: AUTOMATIC1111's /sdapi/v1/* (txt2img, img2img, progress, interrupt, skip, models, samplers, schedulers,
  upscalers, options, png-info, extras, the listings), with webui_options.py (WebUI's option table) and extras.py
  (png-info, the upscales)
- openai.py: OpenAI's /v1/models, /v1/images/generations and /v1/images/edits
- native.py: the native async jobs, /api/jobs* (and compare with baseline, compare.py)
- page.py: the web page, GET /

runtime.py holds what they share: the `Server` (queue, the served models (models.py) and the current one, WebUI's
options, credentials (guard.py), limits, LoRA folder, engine settings; a request's GenerationParams, its jobs, the
wait and the synchronous calls' run-and-collect), which the families use by its public names only; this module
builds the app that puts the Host and Origin checks, credentials, body size and error answers (one status per
refusal, _error_status) in front of every family. requests.py has the
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

import logging
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from ..checks import shown
from ..errors import AnimaError
from . import a1111, native, openai, page
from .compare import NotReady
from .job_queue import JobBusy, QueueFull
from .requests import (
    BodyTooLarge,
    JobNotFound,
    WrongContentType,
    body_limit,
    error_answer,
    too_large,
)
from .runtime import JobEnded, Server
from .store import ImageGone, StoreError
from .uploads import ServerBusy

log = logging.getLogger(__name__)


def _error_status(e: AnimaError) -> int:
    """The HTTP status of a refusal that reaches the app's handler: 4xx for the request, 5xx for the store."""
    if isinstance(e, (StoreError, JobEnded)):
        return e.status  # 507: a full disk, 503: a store made read-only under the server; a job's end: 500 / 409
    return {QueueFull: 429, ImageGone: 410, JobBusy: 409, NotReady: 409, ServerBusy: 503}.get(type(e), 400)


def build_app(server: Server) -> FastAPI:
    """The app: what every request meets (credentials, body size, errors as one-line JSON), then each
    family's routes."""
    app = FastAPI(title="anima-rknn", docs_url=None, redoc_url=None)

    @app.middleware("http")
    async def guard(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if (refused := server.guard.refused_host(request)) is not None:
            return error_answer(request, refused, 400)
        if (origin := server.guard.foreign_origin(request)) is not None:
            return error_answer(request, f"refused a {request.method} from another site's page (Origin "
                                         f"{shown(origin)}): this server takes writes from its own page and "
                                         "from clients that are not browsers", 403)
        if not server.guard.authorized(request):
            return error_answer(request, "authentication required", 401,
                                headers={"WWW-Authenticate": 'Basic realm="anima-rknn"'})
        try:
            length = int(request.headers.get("content-length") or 0)
        except ValueError:
            return error_answer(request, "bad Content-Length", 400)
        if length > body_limit(request.url.path, request.method):  # refused before a byte of it is read
            return error_answer(request, str(too_large(request.url.path, request.method)), 413)
        return await call_next(request)

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
        app.include_router(family.routes(server))
    return app
