"""OpenAI's image API, /v1/models, /v1/images/generations and /v1/images/edits: what the `openai` client calls.

Images come back as b64_json only: the server keeps no public URLs. Every error under /v1/ comes in OpenAI's
shape, {"error": {"message": "one line", "type", "param", "code"}} (requests.error_answer; the app's handlers
route a refused Host, Origin, credential, body, a missing route and a bug through it), whose message the openai
client shows. A generation without `size` (or with `auto`) is the model's own size, as generate's default.

An edit is a multipart upload, as OpenAI's: `image` (or one `image[]`), an optional `mask` of the image's size
whose fully transparent pixels are repainted (OpenAI's convention; inpainting at denoising_strength 1 unless
given, the rest kept exactly), else img2img of the whole picture at the table's strength; `size` WIDTHxHEIGHT or
auto (the image's size in multiples of 16, scaled down to the server's largest side). Other settings of the
table come as form fields (the client's extra_body), numbers and booleans as their JSON text.

`model` names one of the served models (/v1/models lists them); OpenAI's own model names, which its clients send by
default, and no model at all mean the server's current one.
"""

from __future__ import annotations

import base64
import io
import json
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from starlette.datastructures import FormData, UploadFile

from ..checks import shown
from ..errors import AnimaError
from ..generation.images import MAX_IMAGE_BYTES, ImageInput, mask_from_alpha
from ..generation.params import REQUEST_FIELDS, option
from .models import ServedModel
from .requests import BadRequest, _text, _whole, error_answer, form_body, json_body

if TYPE_CHECKING:
    from .runtime import Server

EDIT_MASK_STRENGTH = 1.0  # an edit with a mask repaints its transparent area from noise, as OpenAI's edits do
# OpenAI's own model names, which its clients send by default: they mean this server's current model.
OPENAI_MODEL_PREFIXES = ("dall-e", "gpt-image")
_PARSED_KINDS = ("int", "number", "bool")  # a form field of these kinds is read as JSON text ("2", "0.5", "true")


def _size(size: str) -> tuple[int, int]:
    try:
        width, height = (int(side) for side in size.lower().split("x"))
    except ValueError:
        raise BadRequest(f"size must be WIDTHxHEIGHT, got {size[:20]!r}") from None
    return width, height


def _check_format(body: dict[str, Any]) -> None:
    if body.get("response_format", "b64_json") not in (None, "b64_json"):
        raise BadRequest("response_format must be b64_json (this server keeps no public URLs)")


def _auto_size(width: int, height: int, max_side: int) -> tuple[int, int]:
    """An image's size as a generation size: scaled down to fit `max_side` if larger, in multiples of 16."""
    scale = min(1.0, max_side / max(width, height))
    return max(16, int(width * scale) // 16 * 16), max(16, int(height * scale) // 16 * 16)


async def _upload(form: FormData, names: tuple[str, ...], what: str) -> bytes | None:
    """The bytes of the one file uploaded under any of `names` (None: none given)."""
    parts = [part for name in names for part in form.getlist(name)]
    if not parts:
        return None
    if len(parts) > 1:
        raise BadRequest(f"{len(parts)} files came as {what}; this server edits one image per request")
    if not isinstance(parts[0], UploadFile):
        raise BadRequest(f"{what} must be an uploaded image file (a multipart file part); the server never opens a "
                         "path")
    return await parts[0].read(MAX_IMAGE_BYTES + 1)


def _form_fields(form: FormData) -> dict[str, Any]:
    """The text fields as a request body: a setting of the table that is a number or a flag read as JSON."""
    body: dict[str, Any] = {}
    for key, value in form.multi_items():
        if isinstance(value, UploadFile) or key in ("image", "image[]", "mask"):
            continue
        if key in body:
            raise BadRequest(f"the field {key[:40]!r} came twice")
        setting = REQUEST_FIELDS.get(key)
        if key == "n" or (setting is not None and option(setting).kind in _PARSED_KINDS):
            try:
                value = json.loads(value)
            except ValueError:
                pass  # left as text: the settings' checks refuse it, naming the field
        elif setting is not None and option(setting).kind in ("image", "outpaint", "cache_options", "loras"):
            raise BadRequest(f"{key} is not taken by edits: the image and mask come as files")
        body[key] = value
    return body


def _edit_images(image_data: bytes, mask_data: bytes | None) -> tuple[ImageInput, ImageInput | None, tuple[int, int]]:
    """The init image, the mask as the table's (white = repaint, from the mask's fully transparent pixels, or
    without a mask the image's own) and the image's size; one 400 line for an image that is not one, a mask of
    another size or with nothing to edit."""
    image = ImageInput.from_bytes(image_data, "image")
    opened = image.open()  # every check now: the mask is compared with what it will be laid over
    if mask_data is None:
        # As OpenAI's edits: without a mask, the image's own fully transparent pixels are what is edited; an
        # image without any is varied as a whole.
        try:
            mask = mask_from_alpha(opened)
        except AnimaError:  # no alpha channel
            return image, None, opened.size
        if mask.getbbox() is None:
            return image, None, opened.size
    else:
        mask_image = ImageInput.from_bytes(mask_data, "mask").open()
        if mask_image.size != opened.size:
            raise BadRequest(f"the mask is {mask_image.width}x{mask_image.height} but the image is {opened.width}x"
                             f"{opened.height}; they must be the same size")
        mask = mask_from_alpha(mask_image)
        if mask.getbbox() is None:
            raise BadRequest("the mask has no fully transparent pixel: nothing would be edited")
    buffer = io.BytesIO()  # an input of the run, not a result: the mask as the table takes it
    mask.save(buffer, format="PNG")
    return image, ImageInput.from_bytes(buffer.getvalue(), "mask"), opened.size


def routes(server: Server) -> APIRouter:
    router = APIRouter()

    async def answer(values: dict[str, Any], body: dict[str, Any], model: ServedModel):
        # A failure is the runtime's one mapping (Server.run_and_collect), in OpenAI's error shape.
        made = await server.run_and_collect(values, _whole(body, "n", 1), model)
        return {"created": int(made.jobs[0].created), "data": [
            {"b64_json": base64.b64encode(png).decode(), "revised_prompt": job.params.prompt}
            for job, png in zip(made.jobs, made.pngs, strict=True)]}

    def listed(model: ServedModel) -> dict[str, Any]:
        return {"id": model.name, "object": "model", "owned_by": "anima-rknn"}

    def asked_model(body: dict[str, Any]) -> ServedModel:
        """The request's `model`: a served model's name; none, or OpenAI's own model names that clients send by
        default (dall-e-2, gpt-image-1...), the current one."""
        asked = body.get("model")
        if isinstance(asked, str) and asked.startswith(OPENAI_MODEL_PREFIXES):
            asked = None
        return server.model_for(asked, "model")

    @router.get("/v1/models")
    async def models():
        return {"object": "list", "data": [listed(model) for model in server.models.all]}

    @router.get("/v1/models/{name}")
    async def one_model(request: Request, name: str):
        found = next((model for model in server.models.all if model.name == name), None)
        if found is None:
            names = ", ".join(model.name for model in server.models.all)
            return error_answer(request, f"no model {shown(name)}; this server has {names}", 404)
        return listed(found)

    @router.post("/v1/images/generations")
    async def images(request: Request):
        body = await json_body(request)
        given = _text(body, "size", "auto")
        model = asked_model(body)
        width, height = (server.native_size(model),) * 2 if given == "auto" else _size(given)  # as generate
        _check_format(body)
        for field in ("init_image", "mask", "outpaint"):  # an image is an edit's
            body.pop(field, None)
        return await answer({**body, "width": width, "height": height}, body, model)

    @router.post("/v1/images/edits")
    async def edits(request: Request):
        form = await form_body(request)
        try:
            body = _form_fields(form)
            _check_format(body)
            image_data = await _upload(form, ("image", "image[]"), "image")
            if image_data is None:
                raise BadRequest("image is required: the picture to edit, as a file")
            mask_data = await _upload(form, ("mask",), "mask")
            # Off the event loop, in a decode turn: the images' sha256 and pixels.
            image, mask, size = await server.decoding(_edit_images, image_data, mask_data)
        finally:
            await form.close()  # the spooled files
        given = _text(body, "size", "auto")
        width, height = _auto_size(*size, server.max_side) if given == "auto" else _size(given)
        values = {**body, "init_image": image, "mask": mask, "width": width, "height": height}
        if mask is not None:
            values.setdefault("denoising_strength", EDIT_MASK_STRENGTH)
        return await answer(values, body, asked_model(body))

    return router
