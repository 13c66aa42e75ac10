"""The call sequences of WebUI clients that do not install from PyPI, replayed as their sources make them:
SillyTavern (src/endpoints/stable-diffusion.js and its extension's request body), the Android app SDAI
(StableDiffusionWebUiAutomaticRestApi and its TextToImageRequest), Open WebUI (its images router, the
automatic1111 engine). Each step checks what the client reads from the answer."""

from __future__ import annotations

import base64
import io
import json
import urllib.request

from PIL import Image
from test_server import call

FIRST, SECOND = "anima-tiny-random", "anima-second"  # conftest's `two` serves both


def _image_size(b64: str) -> tuple[int, int]:
    with Image.open(io.BytesIO(base64.b64decode(b64))) as image:
        return image.size


def _set_model_sillytavern(url: str, title: str) -> None:
    """SillyTavern's /set-model: POST options (any status but 2xx is "Could not update SD WebUI model"), then
    poll /progress until progress 0 and job_count 0."""
    assert call(f"{url}/sdapi/v1/options", {"sd_model_checkpoint": title})[0] == 200
    progress = call(f"{url}/sdapi/v1/progress")[1]
    assert progress["progress"] == 0.0 and progress["state"]["job_count"] == 0


def test_sillytavern(two):
    url, _ = two
    assert call(f"{url}/sdapi/v1/options")[0] == 200  # /ping
    upscalers = [u["name"] for u in call(f"{url}/sdapi/v1/upscalers")[1]]
    latent = [m["name"] for m in call(f"{url}/sdapi/v1/latent-upscale-modes")[1]]
    assert upscalers[0] == "None" and latent  # "0 = None, then Latent Upscalers, then Upscalers"
    vaes = call(f"{url}/sdapi/v1/sd-vae")  # /vaes: sd-vae or Forge's sd-modules, whichever answers an array
    assert vaes == (200, []) and call(f"{url}/sdapi/v1/sd-modules") == (200, [])
    samplers = [s["name"] for s in call(f"{url}/sdapi/v1/samplers")[1]]
    schedulers = [s["name"] for s in call(f"{url}/sdapi/v1/schedulers")[1]]
    assert samplers and schedulers
    models = [{"value": m["title"], "text": m["title"]} for m in call(f"{url}/sdapi/v1/sd-models")[1]]
    assert call(f"{url}/sdapi/v1/options")[1]["sd_model_checkpoint"] == models[0]["value"]  # /get-model
    _set_model_sillytavern(url, models[1]["value"])
    try:
        # /generate: reads the options (Forge or not), then posts the extension's body with SillyTavern's own
        # url and auth in it, at its defaults (DDIM, normal schedule, 512x512 here scaled to the tiny model).
        assert "forge_preset" not in call(f"{url}/sdapi/v1/options")[1]
        body = {"url": url, "auth": "", "prompt": "a cat", "negative_prompt": "blurry", "sampler_name": "DDIM",
                "scheduler": "normal", "steps": 2, "cfg_scale": 7, "width": 64, "height": 64,
                "restore_faces": False, "enable_hr": False, "hr_scale": 2, "hr_upscaler": "Latent",
                "hr_second_pass_steps": 0, "denoising_strength": 0.7, "seed": 5,
                "override_settings": {"CLIP_stop_at_last_layers": 1, "sd_vae": ""},
                "override_settings_restore_afterwards": True, "clip_skip": 1, "save_images": True,
                "send_images": True, "do_not_save_grid": False, "do_not_save_samples": False}
        code, answer = call(f"{url}/sdapi/v1/txt2img", body)
        assert code == 200 and _image_size(answer["images"][0]) == (64, 64)
        info = json.loads(answer["info"])
        assert info["sd_model_name"] == SECOND and info["sampler_name"] == "Euler"  # DDIM runs as euler
        code, answer = call(f"{url}/sdapi/v1/txt2img", body | {"clip_skip": 2, "override_settings": {
            "CLIP_stop_at_last_layers": 2}})
        assert code == 400 and "CLIP_stop_at_last_layers 2: clip skip" in answer["error"]
    finally:
        _set_model_sillytavern(url, models[0]["value"])


def test_sdai(two):
    url, _ = two
    with urllib.request.urlopen(f"{url}/", timeout=30) as response:  # its health check: GET /
        assert response.status == 200
    configuration = call(f"{url}/sdapi/v1/options")[1]
    models = call(f"{url}/sdapi/v1/sd-models")[1]
    assert configuration["sd_model_checkpoint"] in [m["title"] for m in models]
    assert call(f"{url}/sdapi/v1/samplers")[0] == 200 and call(f"{url}/sdapi/v1/loras")[0] == 200
    assert call(f"{url}/sdapi/v1/hypernetworks") == (200, [])
    assert call(f"{url}/sdapi/v1/embeddings") == (200, {"loaded": {}, "skipped": {}})
    assert call(f"{url}/sdapi/v1/options", {"sd_model_checkpoint": models[0]["title"]})[0] == 200
    # TextToImageRequest, serialized with its nulls; seed and subseed are strings.
    body = {"prompt": "a cat", "negative_prompt": "", "steps": 2, "cfg_scale": 7.0, "distilled_cfg_scale": None,
            "width": 64, "height": 64, "restore_faces": False, "seed": "12345", "subseed": "-1",
            "subseed_strength": 0.0, "sampler_index": "Euler a", "scheduler": None, "alwayson_scripts": None}
    code, answer = call(f"{url}/sdapi/v1/txt2img", body)
    assert code == 200 and json.loads(answer["info"])["seed"] == 12345
    assert call(f"{url}/sdapi/v1/txt2img", body | {"seed": "12345x"})[0] == 400  # not a number: refused
    # ImageToImageRequest: the same fields and an init image.
    body = body | {"init_images": [answer["images"][0]], "denoising_strength": 0.5, "include_init_images": False,
                   "mask": None}
    code, answer = call(f"{url}/sdapi/v1/img2img", body)
    assert code == 200 and _image_size(answer["images"][0]) == (64, 64)


def test_open_webui(two):
    """Open WebUI's automatic1111 engine: the models as id = title, the current one from options, a switch by
    posting back the whole options object it read, then txt2img with its few fields."""
    url, _ = two
    models = [{"id": m["title"], "name": m["model_name"]} for m in call(f"{url}/sdapi/v1/sd-models")[1]]
    assert [m["name"] for m in models] == [FIRST, SECOND]
    options = call(f"{url}/sdapi/v1/options")[1]
    wanted = models[1]["id"]
    assert options["sd_model_checkpoint"] != wanted
    options["sd_model_checkpoint"] = wanted
    assert call(f"{url}/sdapi/v1/options", options)[0] == 200
    try:
        assert call(f"{url}/sdapi/v1/options")[1]["sd_model_checkpoint"] == wanted
        body = {"prompt": "a cat", "batch_size": 2, "width": 64, "height": 64, "steps": 2, "cfg_scale": 7,
                "negative_prompt": "", "sampler_name": "Euler a", "scheduler": "Automatic"}
        code, answer = call(f"{url}/sdapi/v1/txt2img", body)
        assert code == 200 and len(answer["images"]) == 2
        assert json.loads(answer["info"])["sd_model_name"] == SECOND
        code, answer = call(f"{url}/sdapi/v1/img2img", {"init_images": [answer["images"][0]], "prompt": "a dog",
                                                       "batch_size": 1, "width": 64, "height": 64, "steps": 2})
        assert code == 200 and len(answer["images"]) == 1
    finally:
        options["sd_model_checkpoint"] = models[0]["id"]
        call(f"{url}/sdapi/v1/options", options)
