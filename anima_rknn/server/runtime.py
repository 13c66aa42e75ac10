"""The server's runtime, shared by every route family (a1111.py, openai.py, native.py, page.py): the `Server` holds the
queue, the served models (models.py) and the current one, the Host/Origin/credential guard (guard.py), limits, LoRA
folder and engine settings, and turns a request into GenerationParams and jobs. app.py wires it to the routes."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

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
from .jobs import Job, JobQueue
from .models import Models, ServedModel
from .requests import MAX_IMAGE_BODY_BYTES, BadRequest, _number, request_values

MAX_IMAGES = 8  # batch_size * n_iter, n
log = logging.getLogger(__name__)


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

    def _submit_many(self, params: GenerationParams, count: int, model: ServedModel | None = None) -> list[Job]:
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

    async def _wait(self, jobs: list[Job]) -> list[Job]:
        for job in jobs:
            while not job.done.is_set():
                await asyncio.sleep(0.05)
        return jobs

    def _png_b64(self, job: Job) -> str:
        return base64.b64encode(self.queue.read_image(job)).decode()  # a plain file of the data folder only
