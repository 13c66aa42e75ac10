"""AUTOMATIC1111's API, /sdapi/v1/*: what the WebUI's own clients (webuiapi, its extensions) call.

txt2img answers only once its images are done, as WebUI's does; /progress and /interrupt act on the job running
now, whichever API submitted it.
"""

from __future__ import annotations

import base64
import json
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ..sampling.schedule import A1111_SCHEDULES, SCHEDULE_LABELS, SCHEDULES
from .requests import BadRequest, _number, json_body

if TYPE_CHECKING:
    from .app import Server

SAMPLERS = ("Euler", "euler", "k_euler", "Euler (flow)", "euler_flow")  # one sampler, its usual spellings


def routes(server: Server) -> APIRouter:
    router = APIRouter()
    queue = server.queue

    @router.post("/sdapi/v1/txt2img")
    async def txt2img(request: Request):
        body = await json_body(request)
        sampler = body.get("sampler_name") or body.get("sampler_index") or "Euler"
        if sampler not in SAMPLERS:
            raise BadRequest(f"unknown sampler {str(sampler)[:40]!r}; this server has: {', '.join(SAMPLERS)}")
        params = server.params(body)
        count = int(_number(body, "batch_size", 1)) * int(_number(body, "n_iter", 1))
        jobs = await server._wait(server._submit_many(params, count))
        failed = next((job for job in jobs if job.state != "completed"), None)
        if failed is not None:
            return JSONResponse({"error": failed.error or f"job {failed.state}"}, status_code=500
                                if failed.state == "failed" else 409)
        infotexts = [server._infotext(job) for job in jobs]
        seeds = [job.params.seed for job in jobs]
        info = {"prompt": params.prompt, "negative_prompt": params.negative, "seed": seeds[0], "all_seeds": seeds,
                "width": params.width, "height": params.height, "steps": params.steps,
                "cfg_scale": params.cfg, "sampler_name": "Euler", "scheduler": params.scheduler, "infotexts": infotexts,
                "sd_model_name": server.model_name, "cache": params.cache}
        return {"images": [server._png_b64(job) for job in jobs], "parameters": body, "info": json.dumps(info)}

    @router.get("/sdapi/v1/progress")
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

    @router.post("/sdapi/v1/interrupt")
    async def interrupt():
        if queue.current is not None:
            queue.cancel(queue.current)
        return {}

    @router.get("/sdapi/v1/sd-models")
    async def sd_models():
        return [{"title": server.model_name, "model_name": server.model_name, "filename": server.model_name}]

    @router.get("/sdapi/v1/samplers")
    async def samplers():
        return [{"name": "Euler", "aliases": list(SAMPLERS[1:]), "options": {}}]

    @router.get("/sdapi/v1/schedulers")
    async def schedulers():
        # A1111's fields; a request's `scheduler` may be any name, label or alias listed.
        return [{"name": name, "label": SCHEDULE_LABELS[name],
                 "aliases": sorted({text for text, ours in A1111_SCHEDULES.items() if ours == name}
                                   - {name, SCHEDULE_LABELS[name]}) or None,
                 "default_rho": 7.0 if name == "karras" else -1, "need_inner_model": False} for name in SCHEDULES]

    @router.get("/sdapi/v1/options")
    async def options():
        return {"sd_model_checkpoint": server.model_name}

    return router
