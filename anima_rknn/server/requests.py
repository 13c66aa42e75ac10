"""What every API does with a request: read its body (bounded) and fields, find the job it names, refuse it with
a 4xx.

Its own module so that app.py and each API family share it without importing one another.

Bodies are bounded by route: MAX_BODY_BYTES for every request, MAX_IMAGE_BODY_BYTES for the routes that carry
images (IMAGE_ROUTES), where a body over MAX_BODY_BYTES must hold an image. A declared Content-Length over the
limit is refused before a byte is read (app.py's guard); a body sent without one (chunked) is counted as it
arrives and refused the moment it passes the limit, never parsed. A body is read only by json_body and
form_body, which first require its Content-Type (application/json, multipart/form-data): a browser page of
another site can send a "simple" text/plain POST without asking the server first, never a JSON one.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import json
import re
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.formparsers import MultiPartException, MultiPartParser

from ..checks import is_integer, is_number, is_whole_number, shown
from ..core.files import human_size
from ..errors import AnimaError
from ..generation.images import ImageInput
from ..generation.params import MAX_SIDE, REQUEST_FIELDS, option
from .job_queue import JobQueue
from .store import Job
from .uploads import ServerBusy

MAX_BODY_BYTES = 1 << 20  # a request without images
# A request with images (base64 in JSON, or a multipart upload): an init image and a mask of up to ~36 MiB
# together as base64, which is 4/3 of the bytes. (generation.images.MAX_IMAGE_BYTES bounds one decoded image.)
MAX_IMAGE_BODY_BYTES = 48 << 20
# POST; the native submit when it has images; WebUI's picture tools (server/extras.py)
IMAGE_ROUTES = ("/sdapi/v1/img2img", "/v1/images/edits", "/api/jobs", "/sdapi/v1/png-info",
                "/sdapi/v1/extra-single-image", "/sdapi/v1/extra-batch-images")
# The request fields that carry an image (A1111's too: its tools' image and imageList)
IMAGE_FIELDS = ("init_image", "mask", "init_images", "image", "imageList")
# Large bodies (over MAX_BODY_BYTES: pictures) read and parsed at once, and the bytes they may hold together; a body
# beyond either is a 503 with Retry-After, refused before it is read, so a burst of uploads cannot grow the server
# without bound nor keep the event loop (and /progress) from answering.
MAX_LARGE_BODIES = 2
MAX_BYTES_IN_FLIGHT = 2 * MAX_IMAGE_BODY_BYTES
_DATA_URL = re.compile(r"data:image/[A-Za-z0-9.+-]+(;[^,;]*)*;base64,")
_WHITESPACE = re.compile(rb"\s+")


class BadRequest(AnimaError):
    pass


class BodyTooLarge(Exception):
    """A 413: the request body is over its route's limit."""


class JobNotFound(Exception):
    pass


class WrongContentType(Exception):
    """A 415: the body is not of the media type its route reads."""


@dataclasses.dataclass
class _InFlight:
    bodies: int = 0
    bytes: int = 0


_in_flight = _InFlight()  # touched on the event loop only: no lock


@contextlib.contextmanager
def _large_body_turn(request: Request) -> Any:
    """A turn to read and parse a large body (its declared length, or the route's limit when none is declared),
    or ServerBusy. Small bodies need none."""
    try:
        declared = int(request.headers.get("content-length") or 0)
    except ValueError:
        declared = 0
    size = declared if "content-length" in request.headers else body_limit(request.url.path, request.method)
    if size <= MAX_BODY_BYTES:
        yield
        return
    if _in_flight.bodies >= MAX_LARGE_BODIES or _in_flight.bytes + size > MAX_BYTES_IN_FLIGHT:
        raise ServerBusy(f"the server is reading {_in_flight.bodies} large request bodies "
                         f"({human_size(_in_flight.bytes)}) already; try again shortly")
    _in_flight.bodies, _in_flight.bytes = _in_flight.bodies + 1, _in_flight.bytes + size
    try:
        yield
    finally:
        _in_flight.bodies, _in_flight.bytes = _in_flight.bodies - 1, _in_flight.bytes - size


def _mib(limit: int) -> str:
    return f"{limit >> 20} MiB" if limit % (1 << 20) == 0 else f"{limit} bytes"


def body_limit(path: str, method: str) -> int:
    """The most bytes a request's body may have on this route."""
    return MAX_IMAGE_BODY_BYTES if method == "POST" and path in IMAGE_ROUTES else MAX_BODY_BYTES


def too_large(path: str, method: str) -> BodyTooLarge:
    limit = body_limit(path, method)
    where = "" if limit == MAX_IMAGE_BODY_BYTES else f" ({_mib(MAX_IMAGE_BODY_BYTES)} on the routes that take images)"
    return BodyTooLarge(f"request body over {_mib(limit)}{where}")


def _number(body: dict[str, Any], key: str, default: Any) -> Any:
    value = body.get(key, default)
    if value is None:
        return default
    if not is_number(value):
        raise BadRequest(f"{key} must be a finite number, got {json.dumps(value)[:40]}")
    return value


def _whole(body: dict[str, Any], key: str, default: Any) -> Any:
    """A field that counts something (pixels, steps, images): a whole number, never truncated (64.9 is refused,
    64.0 is 64)."""
    value = _number(body, key, default)
    if value is default:
        return value
    if not is_whole_number(value):
        raise BadRequest(f"{key} must be a whole number, got {shown(value)}")
    return int(value)


def _text(body: dict[str, Any], key: str, default: str) -> str:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise BadRequest(f"{key} must be a string")
    return value


def decode_image(field: str, value: Any) -> ImageInput:
    """A request's image: base64 of the file's bytes, plain or as a data:image/...;base64, URL (line breaks
    allowed, nothing else outside the base64 alphabet). A path, a URL or anything else is refused: the server
    never opens a file or fetches anything a request names. The bytes are read as an image by the pipeline's
    checks at submit (a truncated file or a bomb is a 400 then)."""
    refused = BadRequest(f"{field} must be base64-encoded image bytes (plain or a data:image/...;base64, URL); the "
                         "server never opens a path")
    if isinstance(value, ImageInput):  # an upload a route has read already (multipart); never from JSON
        return value
    if not isinstance(value, str):
        raise refused
    prefix = _DATA_URL.match(value)
    text = value[prefix.end():] if prefix else value
    try:
        data = base64.b64decode(_WHITESPACE.sub(b"", text.encode("ascii")), validate=True)
    except (UnicodeEncodeError, binascii.Error, ValueError):
        raise refused from None
    if not data:
        raise refused
    return ImageInput.from_bytes(data, field)


def _outpaint(field: str, value: Any) -> tuple[int, int, int, int]:
    if not (isinstance(value, list) and len(value) == 4 and all(is_integer(v) and 0 <= v <= MAX_SIDE
                                                                 for v in value)):
        raise BadRequest(f"{field} must be a list of four pixel counts from 0 to {MAX_SIDE}: [left, top, right, "
                         "bottom]")
    return tuple(int(v) for v in value)


def request_values(body: dict[str, Any]) -> dict[str, Any]:
    """The settings a request gives, by setting name: each field the settings table names for requests
    (generation.params.REQUEST_FIELDS), type-checked; null is not given. Ranges are the settings' own checks
    (GenerationParams.validate); "loras" stays as sent, names for Server._named_loras. Images are base64
    (decode_image), outpaint a list of four pixel counts."""
    values: dict[str, Any] = {}
    for field, name in REQUEST_FIELDS.items():
        if body.get(field) is None:
            continue
        setting = option(name)
        if setting.kind == "int":
            values[name] = _whole(body, field, None)
        elif setting.kind == "number":
            values[name] = float(_number(body, field, None))
        elif setting.kind in ("text", "choice"):
            values[name] = _text(body, field, "")
            if setting.kind == "choice" and setting.parse is None and values[name] not in setting.choices:
                raise BadRequest(f"{field} must be one of {', '.join(setting.choices)}")
        elif setting.kind == "cache_options" and not isinstance(body[field], dict):
            raise BadRequest(f"{field} must be an object")
        elif setting.kind == "bool" and not isinstance(body[field], bool):
            raise BadRequest(f"{field} must be true or false")
        elif setting.kind == "image":
            values[name] = decode_image(field, body[field])
        elif setting.kind == "outpaint":
            values[name] = _outpaint(field, body[field])
        else:
            values[name] = body[field]
    return values


async def _bounded(request: Request) -> AsyncIterator[bytes]:
    """The body's chunks as they arrive, refused once they pass the route's limit (a body without a
    Content-Length is not trusted to be small)."""
    limit, seen = body_limit(request.url.path, request.method), 0
    async for chunk in request.stream():
        seen += len(chunk)
        if seen > limit:
            raise too_large(request.url.path, request.method)
        yield chunk


async def read_body(request: Request) -> bytearray:
    # Grown in place: the chunks are not held beside their join (a body costs its size once), and a large body
    # is one mapping, given back whole when freed (a refused one's many small chunks stayed in the heap).
    body = bytearray()
    async for chunk in _bounded(request):
        body += chunk
    return body


def require_content_type(request: Request, media_type: str, sent_as: str) -> None:
    """Refuse (415) a body that is not `media_type`, before a byte of it is read."""
    given = request.headers.get("content-type", "")
    if given.split(";", 1)[0].strip().lower() != media_type:
        got = shown(given) if given else "no Content-Type"
        raise WrongContentType(f"send this request as {media_type} ({sent_as}), got {got}")


def has_image(body: dict[str, Any]) -> bool:
    """Whether a request (or its settings) carries a picture in any of IMAGE_FIELDS."""
    return any(body.get(field) not in (None, "", []) for field in IMAGE_FIELDS)


async def json_body(request: Request) -> dict[str, Any]:
    require_content_type(request, "application/json", "a JSON object")
    with _large_body_turn(request):
        return await _parsed(request)


def _load_json(raw: bytearray) -> Any:
    try:
        return json.loads(raw or b"{}")
    except (ValueError, RecursionError):
        raise BadRequest("the request body is not valid JSON") from None


async def _parsed(request: Request) -> dict[str, Any]:
    raw = await read_body(request)
    # A large body must name an image field before it is parsed: tens of MiB of JSON without one could expand to
    # gigabytes of Python objects. (After parsing, the field must also hold an image.)
    if len(raw) > MAX_BODY_BYTES and not any(f'"{field}"'.encode() in raw for field in IMAGE_FIELDS):
        raise BodyTooLarge(f"request body over {_mib(MAX_BODY_BYTES)} without an image in it")
    # A large body is parsed off the event loop (a 48 MiB one takes a second): /progress answers meanwhile.
    body = await run_in_threadpool(_load_json, raw) if len(raw) > MAX_BODY_BYTES else _load_json(raw)
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    _check_image_lists(body)
    if len(raw) > MAX_BODY_BYTES and not has_image(body):  # the image routes' limit is for images
        raise BodyTooLarge(f"request body over {_mib(MAX_BODY_BYTES)} without an image in it")
    return body


def _check_image_lists(body: dict[str, Any]) -> None:
    """Every entry of a list of pictures (A1111's init_images) is one: a null among them is a 400, never read as
    no picture (a txt2img run)."""
    images = body.get("init_images")
    if isinstance(images, list):
        for index, image in enumerate(images):
            if not isinstance(image, str) or not image:
                raise BadRequest(f"init_images[{index}] must be base64-encoded image bytes, got "
                                 f"{json.dumps(image)[:40]}")


async def form_body(request: Request, *, max_files: int = 4, max_fields: int = 64) -> FormData:
    """A multipart/form-data body (OpenAI's uploads), read within the route's limit: files are spooled to disk
    past 1 MiB, a text field is at most 1 MiB."""
    from starlette import formparsers

    if formparsers.multipart is None:
        raise BadRequest("this server cannot read uploads: install python-multipart (pip install python-multipart)")
    require_content_type(request, "multipart/form-data", "the image as a file part")
    try:
        with _large_body_turn(request):
            return await MultiPartParser(request.headers, _bounded(request), max_files=max_files,
                                         max_fields=max_fields).parse()
    except MultiPartException as e:
        raise BadRequest(f"the request body is not valid multipart/form-data: {e.message}") from None


def error_answer(request: Request, message: str, status: int, headers: dict[str, str] | None = None) -> JSONResponse:
    """A refused request's answer: {"error": "one line"}, or under /v1/ OpenAI's shape, {"error": {"message": ...,
    "type": ...}}, the one whose message the openai client shows (it shows only the status for any other)."""
    if request.url.path.startswith("/v1/"):
        kind = "server_error" if status >= 500 else "rate_limit_error" if status == 429 else "invalid_request_error"
        error: Any = {"message": message, "type": kind, "param": None, "code": None}
    else:
        error = message
    return JSONResponse({"error": error}, status_code=status, headers=headers)


def job_or_404(queue: JobQueue, job_id: str) -> Job:
    job = queue.get(job_id)
    if job is None:
        raise JobNotFound(job_id)
    return job
