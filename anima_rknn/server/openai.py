"""OpenAI's image API, /v1/models and /v1/images/generations: what the `openai` client calls.

Images come back as b64_json only: the server keeps no public URLs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from .requests import BadRequest, _number, _text, json_body

if TYPE_CHECKING:
    from .app import Server


def routes(server: Server) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": server.model_name, "object": "model", "owned_by": "anima-rknn"}]}

    @router.post("/v1/images/generations")
    async def images(request: Request):
        body = await json_body(request)
        size = _text(body, "size", f"{server.native_size}x{server.native_size}")  # the model's size, as generate
        try:
            width, height = (int(side) for side in size.lower().split("x"))
        except ValueError:
            raise BadRequest(f"size must be WIDTHxHEIGHT, got {size[:20]!r}") from None
        if body.get("response_format", "b64_json") != "b64_json":
            raise BadRequest("response_format must be b64_json (this server keeps no public URLs)")
        params = server.params({**body, "width": width, "height": height})
        jobs = await server._wait(server._submit_many(params, int(_number(body, "n", 1))))
        failed = next((job for job in jobs if job.state != "completed"), None)
        if failed is not None:
            return JSONResponse({"error": {"message": failed.error or f"job {failed.state}"}}, status_code=500)
        return {"created": int(jobs[0].created), "data": [{"b64_json": server._png_b64(job),
                                                          "revised_prompt": job.params.prompt} for job in jobs]}

    return router
