"""What every API does with a request: read its JSON body and fields, find the job it names, refuse it with a 4xx.

Its own module so that app.py and each API family share it without importing one another.
"""

from __future__ import annotations

import json
import math
from typing import Any

from fastapi import Request

from ..errors import AnimaError
from .jobs import Job, JobQueue


class BadRequest(AnimaError):
    pass


class JobNotFound(Exception):
    pass


def _number(body: dict[str, Any], key: str, default: Any) -> Any:
    value = body.get(key, default)
    if value is None:
        return default
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or isinstance(value, float) and not math.isfinite(value)):
        raise BadRequest(f"{key} must be a finite number, got {json.dumps(value)[:40]}")
    return value


def _text(body: dict[str, Any], key: str, default: str) -> str:
    value = body.get(key, default)
    if not isinstance(value, str):
        raise BadRequest(f"{key} must be a string")
    return value


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
