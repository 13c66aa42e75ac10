"""AUTOMATIC1111's API, /sdapi/v1/*: what the WebUI's own clients (webuiapi, its extensions) call.

txt2img and img2img answer only once their images are done, as WebUI's do; /progress and /interrupt act on the
job running now, whichever API submitted it, its progress over all the steps it runs (an img2img job runs
steps x denoising_strength rounded up, a hires one two passes). Samplers go by A1111's display names ("Euler a",
"DPM++ 2M SDE") or ours; a name this server lacks is refused with the list, never replaced by another sampler as
WebUI would.

A1111's request fields become the settings table's in one place, a1111_body: its numbered choices (resize_mode,
inpainting_fill), its 0/1 flags, inpaint_full_res, mask_blur_x / mask_blur_y, and the fields its clients send
on every call whatever they ask for (webuiapi: the hires fields and denoising_strength on every txt2img, the mask
fields on every img2img), which are ignored where they do not apply, as WebUI ignores them. What WebUI would do
that this server cannot is refused with a 400 saying so, never done differently: a latent resize mode, several
init images, an upscaler model, another prompt or sampler for the hires pass.

The model a request runs on is its override_settings' sd_model_checkpoint, else the current one, which POST
/options switches (webui_options.py); docs/webui-compat.md lists every WebUI endpoint with what this server does.
"""

from __future__ import annotations

import base64
import io
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from PIL import Image

from ..checks import is_whole_number
from ..core.tensorfile import read_metadata
from ..errors import AnimaError
from ..generation.images import INPAINT_AREAS, MASKED_CONTENT, RESIZE_MODES
from ..generation.params import (
    HIRES_UPSCALERS,
    REQUEST_FIELDS,
    GenerationParams,
    default,
    option,
)
from ..sampling.samplers import SAMPLERS, call_sigmas, sampler_name
from ..sampling.samplers import sampler_and_scheduler as samplers_and_schedulers
from ..sampling.schedule import (
    A1111_SCHEDULES,
    SCHEDULE_LABELS,
    SCHEDULES,
    flow_sigmas,
    schedule_name,
)
from . import extras
from .models import ServedModel
from .requests import BadRequest, _number, json_body
from .store import Job
from .webui_options import CLIP_SKIP, MODEL, WEBUI_OPTIONS, checked_option

if TYPE_CHECKING:
    from .runtime import Server

def sampler_and_scheduler(sampler: Any, scheduler: Any) -> tuple[str, Any]:
    """A request's sampler_name and scheduler as ours (sampling/samplers.py reads A1111's names, "DDIM", "UniPC"
    and "DPM++ 2M Karras" included, and refuses PLMS with the reason); a refusal is a 400."""
    try:
        return samplers_and_schedulers(sampler, scheduler)
    except AnimaError as e:
        raise BadRequest(str(e)) from None


# A1111's numbered choices (its API takes the numbers; ours are taken too).
RESIZE_MODE_NUMBERS = dict(enumerate(RESIZE_MODES))  # 0 just resize, 1 crop and resize, 2 resize and fill
INPAINTING_FILL_NUMBERS = dict(enumerate(MASKED_CONTENT))  # 0 fill, 1 original, 2 latent noise, 3 latent nothing
# img2img's defaults where WebUI's API differs from the table (StableDiffusionProcessingImg2Img): a client that
# leaves them out gets what WebUI would do. Only with a mask (or an outpainting).
IMG2IMG_MASK_DEFAULTS = {"inpainting_fill": 0, "inpaint_full_res": True, "inpaint_full_res_padding": 0}
# The fields of the hires fix (txt2img with enable_hr) and of a mask: ignored where they do not apply.
HIRES_FIELDS = ("enable_hr", "hr_scale", "hr_resize_x", "hr_resize_y", "hr_second_pass_steps", "hr_upscaler",
                "hr_cache", "hr_prompt", "hr_negative_prompt", "hr_sampler_name", "hr_scheduler", "denoising_strength")
MASK_FIELDS = ("mask_blur", "mask_blur_x", "mask_blur_y", "inpainting_mask_invert", "inpainting_fill",
               "inpaint_full_res", "inpaint_full_res_padding", "inpaint_area")
IMAGE_REQUEST_FIELDS = ("init_image", "mask", "outpaint")  # the table's own; A1111's img2img sends init_images
# A1111's upscalers this server has: "None" resizes the picture with Lanczos in WebUI (images.resize_image).
UPSCALER_LABELS = {"None": "lanczos", "Lanczos": "lanczos"}
LATENT_UPSCALE_MODES = ("Latent", "Latent (bicubic)", "Latent (nearest-exact)")
# A1111's fields read here beside the settings table's (REQUEST_FIELDS) and the hires and mask fields.
A1111_FIELDS = ("batch_size", "n_iter", "init_images", "sampler_index", "override_settings",
                "override_settings_restore_afterwards", "hr_checkpoint_name", "clip_skip")
# WebUI's numeric fields besides the table's: its API (pydantic) reads a number sent as a JSON string ("seed":
# "12345", SDAI's) as that number, and so does this server, in every numeric field.
A1111_NUMBERS = ("batch_size", "n_iter", "subseed", "subseed_strength", "seed_resize_from_h", "seed_resize_from_w",
                 "mask_blur_x", "mask_blur_y", "s_churn", "s_tmin", "s_tmax", "image_cfg_scale",
                 "initial_noise_multiplier", "clip_skip")
_NUMBER_TEXT = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*")
IGNORED_HEADER = "X-Ignored-Fields"  # the answer's list of the request's fields this server did not use


def _off(value: Any) -> bool:
    """WebUI's "no effect" for a flag, a number, a list or an object: false, 0, empty."""
    return value in (False, 0, "", [], {})


def _no_script(value: Any) -> bool:
    """alwayson_scripts holding only switched-off scripts, as webuiapi sends them when it found the extension
    ({"ControlNet": {"args": []}}, {"ADetailer": {"args": [False]}})."""
    return isinstance(value, dict) and all(isinstance(entry, dict) and entry.get("args") in ([], [False], None)
                                           for entry in value.values())


# WebUI fields this server does not implement, each with the test of WebUI's no-effect value. webuiapi sends every
# one of them on every call at that value, so a request holding it is taken (and the field is listed in the
# answer's info "ignored_fields" and the X-Ignored-Fields header); a value that asks for the effect is refused with
# a 400 naming the field: a picture made without what was asked, with HTTP 200, would be a silent lie.
UNIMPLEMENTED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "restore_faces": (_off, "face restoration"),
    "tiling": (_off, "seamless tiling"),
    "subseed_strength": (_off, "variation seeds"),
    "seed_resize_from_h": (lambda v: v in (0, -1), "seed resize"),
    "seed_resize_from_w": (lambda v: v in (0, -1), "seed resize"),
    "styles": (_off, "saved prompt styles"),
    "script_name": (lambda v: v in ("", None) or (isinstance(v, str) and v.casefold() == "none"), "scripts"),
    "alwayson_scripts": (_no_script, "extension scripts"),
    "s_churn": (_off, "churn (s_churn)"),
    "initial_noise_multiplier": (lambda v: v == 1, "an initial noise multiplier"),
    "refiner_checkpoint": (lambda v: v in ("", None) or (isinstance(v, str) and v.casefold() == "none"),
                           "a refiner model"),
    "disable_extra_networks": (_off, "prompts with extra-network tags left as text"),
}
# Every other field WebUI has changes nothing in the picture here: how WebUI files or returns its outputs
# (do_not_save_samples, save_images, send_images, include_init_images...), what only applies with a field above
# (subseed without subseed_strength, s_tmin / s_tmax without s_churn, script_args without a script), or to a kind
# of model this server does not run (image_cfg_scale: instruct-pix2pix). Taken whatever they hold, and listed as
# ignored, as is a field no WebUI has (a misspelt one shows up there).
def request_model(server: Server, body: dict[str, Any]) -> ServedModel:
    """The model a request runs on: override_settings' sd_model_checkpoint, else the current one. Every WebUI
    option it overrides is checked as /options checks it (clip skip 2 is refused, naming the field); a key WebUI
    has not (an extension's) is listed as ignored. hr_checkpoint_name may only name the same model. With
    override_settings_restore_afterwards false, the model stays the current one after the request, as in WebUI."""
    overrides = body.get("override_settings")
    if overrides is not None and not isinstance(overrides, dict):
        raise BadRequest("override_settings must be an object")
    overrides = overrides or {}
    for key, value in overrides.items():
        if key in WEBUI_OPTIONS:
            checked_option(key, value, "override_settings")
    if body.get("clip_skip") is not None:  # SD.Next's and some clients' own field for WebUI's clip skip
        checked_option(CLIP_SKIP, body["clip_skip"], "clip_skip")
    model = server.model_for(overrides.get(MODEL), f"override_settings {MODEL}")
    second = body.get("hr_checkpoint_name")
    same = second in (None, "") or (isinstance(second, str) and second.casefold() in ("none", "use same checkpoint"))
    if not same and server.model_for(second, "hr_checkpoint_name") is not model:
        raise BadRequest("hr_checkpoint_name: the hires pass here runs on the first pass's model; leave it empty")
    restore = body.get("override_settings_restore_afterwards")
    if restore is False and MODEL in overrides and model is not server.models.current:
        server.set_current(model)
    return model


def unimplemented_fields(body: dict[str, Any]) -> list[str]:
    """The request's fields this server does not implement that it holds at WebUI's no-effect value (the rule
    above UNIMPLEMENTED), in the body's order; one that asks for an effect is refused, naming it."""
    for field, (no_effect, what) in UNIMPLEMENTED.items():
        if body.get(field) is not None and not no_effect(body[field]):
            raise BadRequest(f"{field} {json.dumps(body[field])[:40]}: {what} is not supported by this server; "
                             f"leave {field} out (or at WebUI's default)")
    overrides = body.get("override_settings") or {}
    read = {*REQUEST_FIELDS, *A1111_FIELDS, *HIRES_FIELDS, *MASK_FIELDS}
    if body.get("sampler_name"):  # sampler_name wins, as in WebUI
        read.discard("sampler_index")
    ignored = [field for field, value in body.items() if value is not None and field not in read]
    return ignored + [f"override_settings.{key}" for key in overrides if key != MODEL]


def _choice(body: dict[str, Any], field: str, numbers: dict[int, str],
            refused: dict[int, str] | None = None) -> str | None:
    """A numbered choice as ours: A1111's number, or our name; None when not given. `refused`: A1111's numbers
    this server lacks, with what they mean."""
    value = body.get(field)
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value in numbers:
        return numbers[value]
    if isinstance(value, str) and value in numbers.values():
        return value
    listed = ", ".join(f"{number} ({name.replace('_', ' ')})" for number, name in numbers.items())
    if isinstance(value, int) and value in (refused or {}):
        raise BadRequest(f"{field} {value} ({refused[value]}) is not supported here; use {listed}")
    raise BadRequest(f"{field} must be one of {listed}, got {json.dumps(value)[:40]}")


def _flag(body: dict[str, Any], field: str) -> bool | None:
    """A1111's bool, which its clients send as true/false or 0/1; None when not given."""
    value = body.get(field)
    if value is None or isinstance(value, bool):
        return value
    if value in (0, 1) and isinstance(value, int):
        return bool(value)
    raise BadRequest(f"{field} must be true or false (or 0 / 1), got {json.dumps(value)[:40]}")


def _same_or_empty(body: dict[str, Any], field: str, first: Any, what: str,
                   parse: Callable[[Any], Any] = lambda value: value) -> None:
    """A hires field that may only repeat the first pass's setting `first` (as the request resolved it), by
    `parse` (A1111: empty or "Use same ...", the same)."""
    value = body.get(field)
    if value in (None, "") or (isinstance(value, str) and value.casefold().startswith("use same")):
        return
    try:
        same = parse(value) == parse(first)
    except AnimaError:
        same = False
    if not same:
        raise BadRequest(f"{field}: the hires pass here runs with the first pass's {what}; leave it empty")


def _hires(body: dict[str, Any], values: dict[str, Any]) -> None:
    """txt2img's hires fix: with enable_hr its fields are the table's, else all are ignored (webuiapi sends them,
    and denoising_strength 0.7, on every call)."""
    if not _flag(body, "enable_hr"):
        for field in HIRES_FIELDS:
            values.pop(field, None)
        return
    values["enable_hr"] = True
    upscaler = body.get("hr_upscaler")
    if isinstance(upscaler, str) and upscaler in UPSCALER_LABELS:
        values["hr_upscaler"] = UPSCALER_LABELS[upscaler]
    elif upscaler is not None and not isinstance(upscaler, str):
        raise BadRequest(f"hr_upscaler must be a name: one of {', '.join(HIRES_UPSCALERS)} or A1111's Latent, "
                         "Latent (bicubic), Latent (nearest-exact), Lanczos, None")
    scheduler = values.get("scheduler")
    if scheduler is None or (isinstance(scheduler, str) and scheduler.casefold() == "automatic"):
        scheduler = default("scheduler")
    _same_or_empty(body, "hr_prompt", body.get("prompt"), "prompt")
    _same_or_empty(body, "hr_negative_prompt", body.get("negative_prompt"), "negative prompt")
    _same_or_empty(body, "hr_sampler_name", values["sampler_name"], "sampler", sampler_name)
    _same_or_empty(body, "hr_scheduler", scheduler, "schedule", schedule_name)
    for field in ("hr_prompt", "hr_negative_prompt", "hr_sampler_name", "hr_scheduler"):
        values.pop(field, None)


def _img2img(body: dict[str, Any], values: dict[str, Any]) -> None:
    """img2img's fields as the table's: init_images (one), resize_mode, and with a mask (or our outpaint) the
    inpainting fields with WebUI's defaults; without one those are ignored (webuiapi sends them on every call)."""
    images = body.get("init_images")
    if not (isinstance(images, list) and images):
        raise BadRequest("init_images must be a list holding one base64-encoded image")
    if len(images) > 1:
        raise BadRequest(f"init_images holds {len(images)} images; this server takes one per request (WebUI spreads "
                         "several over a batch): send one request per image")
    for field in (*HIRES_FIELDS, "init_images"):
        if field != "denoising_strength":  # img2img's own
            values.pop(field, None)
    values["init_image"] = images[0]
    resize = _choice(body, "resize_mode", RESIZE_MODE_NUMBERS, {3: "just resize, latent upscale"})
    if resize is not None:
        values["resize_mode"] = resize
    if body.get("mask") in (None, "") and body.get("outpaint") is None:
        for field in (*MASK_FIELDS, "mask"):
            values.pop(field, None)
        return
    given = IMG2IMG_MASK_DEFAULTS | {key: value for key, value in body.items() if value is not None}
    blurs = [_number(given, field, None) for field in ("mask_blur", "mask_blur_x", "mask_blur_y")]
    if blurs[0] is None and any(blur is not None for blur in blurs[1:]):  # mask_blur sets both, as in WebUI
        values["mask_blur"] = max(blur for blur in blurs[1:] if blur is not None)  # one blur here: the larger
    for field in ("mask_blur_x", "mask_blur_y", "inpaint_full_res"):
        values.pop(field, None)
    values["inpainting_fill"] = _choice(given, "inpainting_fill", INPAINTING_FILL_NUMBERS)
    values["inpainting_mask_invert"] = _flag(given, "inpainting_mask_invert")
    values["inpaint_full_res_padding"] = given["inpaint_full_res_padding"]
    if "inpaint_full_res" in body or "inpaint_area" not in body:
        values["inpaint_area"] = INPAINT_AREAS[int(_flag(given, "inpaint_full_res"))]


def numbers_from_text(body: dict[str, Any]) -> dict[str, Any]:
    """The body with every numeric field sent as a JSON string of a number read as that number (a whole number
    as an int), as WebUI's API reads it; any other text is left for the field's check to refuse."""
    numeric = {*A1111_NUMBERS, *(field for field, name in REQUEST_FIELDS.items()
                                 if option(name).kind in ("int", "number"))}
    found = {}
    for field in numeric & body.keys():
        value = body[field]
        if isinstance(value, str) and _NUMBER_TEXT.fullmatch(value):
            number = float(value)
            found[field] = int(number) if number.is_integer() and abs(number) < 2**64 else number
    return body | found


def _zero_strength(body: dict[str, Any], values: dict[str, Any], steps_field: str) -> None:
    """denoising_strength 0, which WebUI takes for img2img and the hires fix: WebUI then runs one step, from the
    last sigma of the schedule (int(steps x 0) steps, plus its one); so does this server (1 / steps)."""
    if body.get("denoising_strength") == 0:
        steps = body.get(steps_field) or body.get("steps") or default("steps")
        values["denoising_strength"] = 1 / steps if is_whole_number(steps) and steps >= 1 else 0


def a1111_body(body: dict[str, Any], route: str = "txt2img") -> dict[str, Any]:
    """The request as the settings table reads it, for txt2img or img2img. sampler_name wins over the older
    sampler_index, as in WebUI. eta and s_noise are dropped for a sampler that has none, as WebUI ignores them
    there: its clients send them on every call (webuiapi: eta 1, s_noise 1, whatever the sampler). The native API
    refuses them instead. Fields WebUI has and this server ignores (styles, subseed, restore_faces, tiling,
    image_cfg_scale, initial_noise_multiplier, include_init_images, scripts...) are read by no one."""
    given = body.get("sampler_name") or body.get("sampler_index")
    sampler, scheduler = sampler_and_scheduler(default("sampler") if given is None else given, body.get("scheduler"))
    values = {key: value for key, value in body.items() if key != "sampler_index"}
    values |= {"sampler_name": sampler, "scheduler": scheduler}
    for name in ("eta", "s_noise"):
        if not getattr(SAMPLERS[sampler], f"takes_{name}"):
            values.pop(name, None)
    if route == "img2img":
        _img2img(body, values)
        _zero_strength(body, values, "steps")
    else:
        for field in IMAGE_REQUEST_FIELDS:  # txt2img has no image (img2img has its own route)
            values.pop(field, None)
        _hires(body, values)
        if values.get("enable_hr"):
            _zero_strength(body, values, "hr_second_pass_steps")
    return values


def routes(server: Server) -> APIRouter:
    router = APIRouter()
    queue = server.queue

    async def generate(request: Request, route: str):
        body = numbers_from_text(await json_body(request))
        ignored = unimplemented_fields(body)
        model = request_model(server, body)
        # Decoding an upload (base64, sha256, its pixels) runs off the event loop, in a decode turn: /progress
        # answers meanwhile. A failure is the runtime's one mapping (Server.run_and_collect).
        made = await server.run_and_collect(a1111_body(body, route), _images_asked(body), model)
        if route == "img2img":  # as WebUI answers without include_init_images: the parameters without the images
            body = body | {"init_images": None, "mask": None}
        warning = server.size_warning(made.params, model)
        info = _info(model, made.params, made.jobs, made.pngs) | {"ignored_fields": ignored,
                                                                  "warnings": [warning] if warning else []}
        return JSONResponse({"images": [base64.b64encode(png).decode() for png in made.pngs], "parameters": body,
                             "info": json.dumps(info)}, headers={IGNORED_HEADER: ", ".join(ignored)})

    @router.post("/sdapi/v1/txt2img")
    async def txt2img(request: Request):
        return await generate(request, "txt2img")

    @router.post("/sdapi/v1/img2img")
    async def img2img(request: Request):
        return await generate(request, "img2img")

    @router.get("/sdapi/v1/progress")
    async def progress():
        job = queue.current
        if job is None:
            return {"progress": 0.0, "eta_relative": 0.0, "current_image": None, "textinfo": None,
                    "state": {"sampling_step": 0, "sampling_steps": 0, "job_count": 0, "interrupted": False}}
        return {"progress": min(1.0, job.step / max(1, job.total)), "eta_relative": job.eta_s or 0.0,
                "current_image": base64.b64encode(job.preview).decode() if job.preview else None,
                "textinfo": None,
                "state": {"sampling_step": job.step, "sampling_steps": job.total,
                          "job_count": 1 + len([j for j in queue.recent() if j.state == "queued"]),
                          "interrupted": job.cancel.is_set() or job.interrupt.is_set(), "job": job.id}}

    @router.post("/sdapi/v1/interrupt")
    async def interrupt():
        # As WebUI's: the running call answers with its pictures as far as they got (the running job's after its
        # next step) and makes no more; a job that no synchronous call waits for is cancelled.
        server.interrupt_call()
        return {}

    @router.post("/sdapi/v1/skip")
    async def skip():
        # WebUI's skip: the picture being made ends at its next step, as far as it got (kept, as /interrupt keeps
        # it), and the call goes on with its next picture; the jobs queued after it run.
        if (current := queue.current) is not None:
            queue.interrupt(current)
        return None  # WebUI answers null

    @router.get("/sdapi/v1/sd-models")
    async def sd_models():
        return [model.sd_model() for model in server.models.all]

    @router.post("/sdapi/v1/refresh-checkpoints")
    async def refresh_checkpoints():
        return None  # the models are serve's --model arguments, read at start: nothing to look for again

    @router.post("/sdapi/v1/refresh-loras")
    async def refresh_loras():
        return None  # /loras reads the --lora-dir folder on every call: it is always fresh

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

    @router.get("/sdapi/v1/upscalers")
    async def upscalers():
        # A1111's fields; the hires fix's hr_upscaler may be any of these or of latent-upscale-modes.
        return [{"name": name, "model_name": None, "model_path": None, "model_url": None, "scale": 4}
                for name in UPSCALER_LABELS]

    @router.get("/sdapi/v1/latent-upscale-modes")
    async def latent_upscale_modes():
        return [{"name": name} for name in LATENT_UPSCALE_MODES]

    @router.get("/sdapi/v1/loras")
    async def loras():
        return await run_in_threadpool(lora_list, server.lora_dir)  # reads each file's header: off the event loop

    @router.get("/sdapi/v1/options")
    async def read_options():
        return server.options.values | {MODEL: server.models.current.title}

    @router.post("/sdapi/v1/options")
    async def write_options(request: Request):
        # All checked first (an unknown key, a wrong type, a model not served: a 400), then all kept (a file
        # written whole: off the event loop).
        await run_in_threadpool(server.write_options, await json_body(request))
        return None  # WebUI answers null

    @router.get("/sdapi/v1/cmd-flags")
    async def cmd_flags():
        return {}  # WebUI's launch flags; this server's are serve's, and a client has no use for them

    @router.get("/sdapi/v1/memory")
    async def memory():
        # WebUI's shape; this server does not measure its memory for clients: every figure is absent.
        return {"ram": {"error": "not measured by this server"}, "cuda": {"error": "no CUDA device"}}

    def empty() -> list[Any]:
        return []

    # What WebUI lists and this server has none of: hypernetworks, textual inversions, face restorers,
    # Real-ESRGAN models, saved prompt styles, VAEs to swap in (each model runs its own), Forge's modules.
    for path in ("hypernetworks", "face-restorers", "realesrgan-models", "prompt-styles", "sd-vae", "sd-modules"):
        router.add_api_route(f"/sdapi/v1/{path}", empty, methods=["GET"])

    @router.get("/sdapi/v1/embeddings")
    async def embeddings():
        return {"loaded": {}, "skipped": {}}  # WebUI's shape: no textual inversion is loaded here

    @router.post("/sdapi/v1/png-info")
    async def png_info(request: Request):
        body = await json_body(request)
        return await run_in_threadpool(extras.png_info, body.get("image"))  # decoding: off the event loop

    @router.post("/sdapi/v1/extra-single-image")
    async def extra_single_image(request: Request):
        body = await json_body(request)
        png = await run_in_threadpool(extras.upscale, body, body.get("image"))
        return {"html_info": "", "image": base64.b64encode(png).decode()}

    @router.post("/sdapi/v1/extra-batch-images")
    async def extra_batch_images(request: Request):
        body = await json_body(request)
        pngs = [await run_in_threadpool(extras.upscale, body, image, f"imageList[{index}]")
                for index, image in enumerate(extras.batch_images(body))]
        return {"html_info": "", "images": [base64.b64encode(png).decode() for png in pngs]}

    return router


def lora_list(folder: Path | None) -> list[dict[str, Any]]:
    """The LoRAs a request may name, in A1111's fields: every NAME.safetensors in the server's --lora-dir (what
    named_lora finds), its `path` the file name alone (a client never learns the server's folders), its
    `metadata` the file's safetensors metadata (kohya's ss_* training notes), {} where its header is unreadable:
    such a file is listed, and refused with its reason when a request names it."""
    if folder is None:
        return []
    found = []
    for path in sorted(Path(folder).glob("*.safetensors")):
        if not path.is_file():
            continue
        try:
            metadata = read_metadata(path, "LoRA")
        except AnimaError:
            metadata = {}
        name = path.name.removesuffix(".safetensors")
        found.append({"name": name, "alias": name, "path": path.name, "metadata": metadata})
    return found


def _images_asked(body: dict[str, Any]) -> int:
    """batch_size x n_iter: each a whole number from 1 (never truncated). Their product is bounded where every
    API's is (Server.submit: at most MAX_IMAGES, a 400; more than the queue has room for now, a 429)."""
    counts = []
    for field in ("batch_size", "n_iter"):
        value = body.get(field, 1)
        if value is None:
            value = 1
        if not is_whole_number(value) or value < 1:
            raise BadRequest(f"{field} must be a whole number from 1, got {json.dumps(value)[:40]}")
        counts.append(int(value))
    return counts[0] * counts[1]


def _infotext(png: bytes) -> str:
    """The `parameters` text of a job's PNG (the publisher wrote it), which alone knows what ran (computed steps,
    the VAE backend auto chose, the error estimate)."""
    with Image.open(io.BytesIO(png)) as image:
        text = image.info.get("parameters")
    return text if isinstance(text, str) else ""


def _info(model: ServedModel, params: GenerationParams, jobs: list[Job], pngs: list[bytes]) -> dict[str, Any]:
    """The answer's `info`, in WebUI's keys (webuiapi reads it as the result's info)."""
    seeds = [job.params.seed for job in jobs]
    used = params.init_image is not None or params.hires
    return {"prompt": params.prompt, "negative_prompt": params.negative, "seed": seeds[0], "all_seeds": seeds,
            "width": params.width, "height": params.height, "steps": params.steps, "cfg_scale": params.cfg,
            "sampler_name": SAMPLERS[params.sampler].label, "scheduler": params.scheduler,
            "denoising_strength": params.strength if used else None,
            "infotexts": [_infotext(png) for png in pngs], "sd_model_name": model.name,
            "sd_model_hash": model.hash[:10],
            "cache": params.cache,
            # ours: whether /interrupt ended the call (each picture's record says where: "interrupted")
            "interrupted": any((job.summary or {}).get("interrupted") for job in jobs)}
