"""AUTOMATIC1111's API, /sdapi/v1/*: what the WebUI's own clients (webuiapi, its extensions) call.

txt2img answers only once its images are done, as WebUI's does; /progress and /interrupt act on the job running
now, whichever API submitted it. Samplers go by A1111's display names ("Euler a", "DPM++ 2M SDE") or ours; a name
this server lacks is refused with the list, never replaced by another sampler as WebUI would.
"""

from __future__ import annotations

import base64
import json
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ..errors import AnimaError
from ..generation.params import default
from ..sampling.samplers import SAMPLERS, call_sigmas, sampler_name
from ..sampling.schedule import (
    A1111_SCHEDULES,
    SCHEDULE_LABELS,
    SCHEDULES,
    flow_sigmas,
    schedule_name,
)
from .requests import BadRequest, _number, json_body

if TYPE_CHECKING:
    from .app import Server

# Every spelling of a schedule that may end an old A1111 sampler name ("DPM++ 2M Karras"), longest first.
_SCHEDULE_SUFFIXES = sorted({*SCHEDULES, *SCHEDULE_LABELS.values(), *A1111_SCHEDULES}, key=len, reverse=True)


def sampler_and_scheduler(sampler: Any, scheduler: Any) -> tuple[str, Any]:
    """A request's sampler_name and scheduler as ours: A1111's display names and ours are taken, and A1111's older
    names with a schedule after the sampler ("DPM++ 2M Karras", "DPM++ 2M SDE Exponential") mean that sampler and
    schedule, unless the request names a schedule itself ("automatic", webuiapi's default, names none)."""
    try:
        return sampler_name(sampler), scheduler
    except AnimaError as unknown:
        if isinstance(sampler, str):
            for suffix in _SCHEDULE_SUFFIXES:
                if sampler.casefold().endswith(" " + suffix.casefold()):
                    try:
                        ours = sampler_name(sampler[: -len(suffix) - 1])
                    except AnimaError:
                        break
                    named = scheduler is not None and not (isinstance(scheduler, str) and
                                                           scheduler.casefold() == "automatic")
                    return ours, scheduler if named else schedule_name(suffix)
        raise BadRequest(str(unknown)) from None


def a1111_body(body: dict[str, Any]) -> dict[str, Any]:
    """The request as the settings table reads it. sampler_name wins over the older sampler_index, as in WebUI.
    eta and s_noise are dropped for a sampler that has none, as WebUI ignores them there: its clients send them on
    every call (webuiapi: eta 1, s_noise 1, whatever the sampler). The native API refuses them instead."""
    given = body.get("sampler_name") or body.get("sampler_index")
    sampler, scheduler = sampler_and_scheduler(default("sampler") if given is None else given, body.get("scheduler"))
    values = {key: value for key, value in body.items() if key != "sampler_index"}
    values |= {"sampler_name": sampler, "scheduler": scheduler}
    for name in ("eta", "s_noise"):
        if not getattr(SAMPLERS[sampler], f"takes_{name}"):
            values.pop(name, None)
    return values


def routes(server: Server) -> APIRouter:
    router = APIRouter()
    queue = server.queue

    @router.post("/sdapi/v1/txt2img")
    async def txt2img(request: Request):
        body = await json_body(request)
        params = server.params(a1111_body(body))
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
                "cfg_scale": params.cfg, "sampler_name": SAMPLERS[params.sampler].label, "scheduler": params.scheduler,
                "infotexts": infotexts,
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
        # A1111's fields: name is the display name; a request's sampler_name may be it or any alias listed.
        # options: "second_order" as A1111 marks a sampler that calls the model twice a step.
        sigmas = flow_sigmas(4, default("shift"), "simple")
        return [{"name": s.label, "aliases": [s.name, *s.aliases],
                 "options": {"second_order": True} if len(call_sigmas(s, sigmas)) > len(sigmas) - 1 else {}}
                for s in SAMPLERS.values()]

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
