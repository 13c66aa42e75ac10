"""What every API does with a request: read its JSON body and fields, find the job it names, refuse it with a 4xx.

Its own module so that app.py and each API family share it without importing one another.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request

from ..checks import is_number
from ..errors import AnimaError
from ..generation.params import REQUEST_FIELDS, option
from .jobs import Job, JobQueue


class BadRequest(AnimaError):
    pass


class JobNotFound(Exception):
    pass


def _number(body: dict[str, Any], key: str, default: Any) -> Any:
    value = body.get(key, default)
    if value is None:
        return default
    if not is_number(value):
        raise BadRequest(f"{key} must be a finite number, got {json.dumps(value)[:40]}")
    return value


def _text(body: dict[str, Any], key: str, default: str) -> str:
    value = body.get(key, default)
    if not isinstance(value, str):
        raise BadRequest(f"{key} must be a string")
    return value


def request_values(body: dict[str, Any]) -> dict[str, Any]:
    """The settings a request gives, by setting name: each field the settings table names for requests
    (generation.params.REQUEST_FIELDS), type-checked; null is not given. Ranges are the settings' own checks
    (GenerationParams.validate); "loras" stays as sent, names for Server._named_loras."""
    values: dict[str, Any] = {}
    for field, name in REQUEST_FIELDS.items():
        if body.get(field) is None:
            continue
        setting = option(name)
        if setting.kind in ("int", "number"):
            number = _number(body, field, None)
            values[name] = int(number) if setting.kind == "int" else float(number)
        elif setting.kind in ("text", "choice"):
            values[name] = _text(body, field, "")
            if setting.kind == "choice" and setting.parse is None and values[name] not in setting.choices:
                raise BadRequest(f"{field} must be one of {', '.join(setting.choices)}")
        elif setting.kind == "cache_options" and not isinstance(body[field], dict):
            raise BadRequest(f"{field} must be an object")
        elif setting.kind == "bool" and not isinstance(body[field], bool):
            raise BadRequest(f"{field} must be true or false")
        else:
            values[name] = body[field]
    return values


async def json_body(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body() or b"{}")
    except (ValueError, RecursionError):
        raise BadRequest("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def job_or_404(queue: JobQueue, job_id: str) -> Job:
    job = queue.get(job_id)
    if job is None:
        raise JobNotFound(job_id)
    return job
