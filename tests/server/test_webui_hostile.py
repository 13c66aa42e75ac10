"""Bad input to the WebUI endpoints of issue 44: options (unknown keys, wrong types, a model not served, a body
that is not an object), png-info (no parameters, not an image, a bomb, a path), the extras (past the size bounds,
unknown upscalers, face restoration, malformed lists), numbers sent as text that are not numbers, a model name
that does not exist anywhere a request can give one. Each is a 4xx in one line, and nothing changed."""

from __future__ import annotations

import json

import pytest
from test_server import PNG, b64, bomb_png, call, running
from test_server_security import send

from anima_rknn.generation.images import MAX_IMAGE_PIXELS
from anima_rknn.server.requests import MAX_BODY_BYTES, MAX_IMAGE_BODY_BYTES


@pytest.fixture(scope="module")
def url(queue):
    with running(queue) as address:
        yield address


def _one_line(answer: dict) -> str:
    message = answer["error"] if isinstance(answer["error"], str) else answer["error"]["message"]
    assert "\n" not in message and "Traceback" not in message
    return message


@pytest.mark.parametrize("body, words", [
    ([1, 2], "must be a JSON object"),
    ({"sd_model_checkpoint": "../../etc/passwd"}, "no such model on this server"),
    ({"sd_model_checkpoint": ["tiny"]}, "must be text"),
    ({"send_seed": 1}, "send_seed: must be bool"),
    ({"jpeg_quality": True}, "jpeg_quality: must be a number"),
    ({"hide_samplers": "Euler"}, "hide_samplers: must be list"),
    ({"__proto__": {}}, "unknown option"),
    ({"x" * 5000: 1}, "unknown option"),
    ({"CLIP_stop_at_last_layers": 12}, "clip skip"),
    ({"eta_noise_seed_delta": 31337}, "seed offset"),
    ({"sd_vae": "vae-ft-mse.safetensors"}, "another VAE"),
])
def test_bad_options_are_refused_whole(url, body, words):
    before = call(f"{url}/sdapi/v1/options")[1]
    payload = body if not isinstance(body, dict) else {"send_seed": not before["send_seed"], **body}
    code, answer = call(f"{url}/sdapi/v1/options", payload)
    assert code == 400 and words in _one_line(answer)
    assert len(_one_line(answer)) < 600  # a huge key is cut when shown
    assert call(f"{url}/sdapi/v1/options")[1] == before


def test_options_body_not_json(url):
    status, answer = send(url, "POST", "/sdapi/v1/options", b"{not json", {"Content-Type": "application/json"})
    assert status == 400 and "not valid JSON" in answer["error"]
    status, answer = send(url, "POST", "/sdapi/v1/options", b"send_seed=1", {"Content-Type": "text/plain"})
    assert status == 415
    before = call(f"{url}/sdapi/v1/options")[1]
    nested = b"[" * 100_000 + b"]" * 100_000  # past the parser's depth, within the body limit
    status, answer = send(url, "POST", "/sdapi/v1/options", nested, {"Content-Type": "application/json"})
    assert status == 400 and "not valid JSON" in _one_line(answer)
    assert call(f"{url}/sdapi/v1/options")[1] == before


def text_bomb_png() -> bytes:
    """A real PNG whose zTXt `parameters` chunk inflates to 16 MiB (Pillow reads at most 1 MiB of one text)."""
    import struct
    import zlib

    body = b"parameters\0\0" + zlib.compress(b"a" * (16 << 20), 9)
    chunk = struct.pack(">I", len(body)) + b"zTXt" + body + struct.pack(">I", zlib.crc32(b"zTXt" + body))
    return PNG[:33] + chunk + PNG[33:]  # after the signature and IHDR


@pytest.mark.parametrize("image, words", [
    (b64(PNG), "holds no generation parameters"),
    (b64(b"GIF89a not really"), "image"),
    (b64(bomb_png()), "pixels"),
    (b64(text_bomb_png()), "Decompressed data too large"),  # a 16 MiB `parameters` in 16 KiB of zTXt
    ("/etc/passwd", "never opens a path"),
    ("", "base64"),
    (None, "base64"),
    (12, "base64"),
])
def test_png_info_refuses(url, image, words):
    code, answer = call(f"{url}/sdapi/v1/png-info", {"image": image})
    assert code == 400 and words in _one_line(answer)
    assert call(f"{url}/sdapi/v1/progress")[0] == 200  # the server goes on


@pytest.mark.parametrize("change, words", [
    ({"upscaling_resize": 9}, "upscaling_resize must be a finite number from 1 to 8"),
    ({"upscaling_resize": 0}, "upscaling_resize must be a finite number from 1 to 8"),
    ({"upscaling_resize": "2"}, "upscaling_resize must be a finite number"),
    ({"upscaling_resize": float("nan")}, "upscaling_resize must be a finite number"),
    ({"resize_mode": 1, "upscaling_resize_w": 9000, "upscaling_resize_h": 9000}, f"bound of {MAX_IMAGE_PIXELS}"),
    ({"resize_mode": 1, "upscaling_resize_w": 0}, "upscaling_resize_w must be a finite number from 1"),
    ({"resize_mode": 2}, "resize_mode must be 0"),
    ({"upscaler_1": "R-ESRGAN 4x+"}, "this server's upscalers are None, Lanczos"),
    ({"upscaler_1": ["Lanczos"]}, "upscaler_1"),
    ({"gfpgan_visibility": 0.5}, "face restoration (GFPGAN) is not supported"),
    ({"codeformer_visibility": 1}, "face restoration (CodeFormer) is not supported"),
    ({"extras_upscaler_2_visibility": 0.3}, "a second upscaler is not supported"),
    ({"image": "not base64!"}, "base64"),
    ({"image": b64(bomb_png())}, "pixels"),
])
def test_extras_refuse(url, change, words):
    body = {"upscaler_1": "Lanczos", "upscaling_resize": 2, "image": b64(PNG)} | change
    code, answer = call(f"{url}/sdapi/v1/extra-single-image", json.loads(json.dumps(body).replace("NaN", "1e999")))
    assert code == 400 and words in _one_line(answer), answer


def test_upscale_past_the_pixel_bound_is_refused_before_it_is_made(url):
    """8x of a 1100-px square would be 8800x8800 (77 M pixels): refused from the sizes, nothing resized."""
    from test_server import noise_image, png

    big = b64(png(noise_image(1100, 1100)))
    code, answer = call(f"{url}/sdapi/v1/extra-single-image", {"upscaler_1": "Lanczos", "upscaling_resize": 8,
                                                               "image": big})
    assert code == 400 and "8800x8800" in _one_line(answer)


@pytest.mark.parametrize("body, words", [
    ({}, "imageList must be a list"),
    ({"imageList": []}, "imageList must be a list of 1 to 16"),
    ({"imageList": [{"name": "a.png"}]}, "imageList must be a list"),
    ({"imageList": [{"data": b64(PNG)}] * 17}, "imageList must be a list of 1 to 16"),
    ({"imageList": "abc"}, "imageList must be a list"),
    ({"imageList": [{"data": "###"}]}, "imageList[0] must be base64"),
])
def test_batch_extras_refuse(url, body, words):
    code, answer = call(f"{url}/sdapi/v1/extra-batch-images", body | {"upscaler_1": "Lanczos"})
    assert code == 400 and words in _one_line(answer)


@pytest.mark.parametrize("change, words", [
    ({"seed": "12345x"}, "seed must be"),
    ({"seed": "nan"}, "seed must be"),
    ({"steps": "1e400"}, "steps"),
    ({"width": "64.5"}, "width must be a whole number"),
    ({"sampler_name": "PLMS"}, "PLMS steps a discrete DDPM"),
    ({"override_settings": {"sd_model_checkpoint": "missing.safetensors"}}, "'missing.safetensors': no such model"),
    ({"override_settings": {"CLIP_stop_at_last_layers": 2}}, "override_settings CLIP_stop_at_last_layers 2"),
    ({"override_settings": {"CLIP_stop_at_last_layers": "2"}}, "must be a number"),
    ({"override_settings": []}, "override_settings must be an object"),
    ({"clip_skip": 2}, "clip_skip CLIP_stop_at_last_layers 2"),
    ({"hr_checkpoint_name": "other", "enable_hr": True}, "hr_checkpoint_name 'other': no such model"),
    # prompt editing that does not close, a 'when' past the run, an empty alternation (docs/prompt-editing.md)
    ({"prompt": "a [red:blue:0.5 cat"}, "the prompt: the '[' at character 3 is never closed"),
    ({"negative_prompt": "[a:b:2]"}, "the negative prompt: prompt editing [..:2]: the 'when' must be a step"),
    ({"prompt": "[a:b:2.5]", "enable_hr": True, "denoising_strength": 0.5}, "share of the steps from 0 to 2"),
    ({"prompt": "[|]"}, "the prompt: an alternation [a|b] needs at least one option"),
    ({"prompt": "[a:" * 120 + "x" + ":1]" * 120}, "nest more than 100"),
])
def test_bad_generation_fields(url, queue, change, words):
    before = len(queue.recent(10_000))
    code, answer = call(f"{url}/sdapi/v1/txt2img", {"prompt": "x", "width": 64, "height": 64, "steps": 1} | change)
    assert code == 400 and words in _one_line(answer), answer
    assert len(queue.recent(10_000)) == before  # nothing queued


@pytest.mark.parametrize("path, body", [
    ("/api/jobs", {"prompt": "a [red:blue:0.5 cat"}),
    ("/v1/images/generations", {"prompt": "a [red:blue:0.5 cat", "size": "64x64"}),
])
def test_bad_prompt_editing_on_the_other_apis(url, queue, path, body):
    before = len(queue.recent(10_000))
    code, answer = call(f"{url}{path}", body)
    assert code == 400 and "the prompt: the '[' at character 3 is never closed" in _one_line(answer), answer
    assert len(queue.recent(10_000)) == before


def test_bad_model_names_elsewhere(url, queue):
    before = len(queue.recent(10_000))
    code, answer = call(f"{url}/api/jobs", {"prompt": "x", "model": {"name": "tiny"}})
    assert code == 400 and "model {'name': 'tiny'}: no such model" in _one_line(answer)
    code, answer = call(f"{url}/v1/images/generations", {"prompt": "x", "model": "sd-xl", "size": "64x64"})
    assert code == 400 and "model 'sd-xl': no such model" in _one_line(answer)
    assert call(f"{url}/v1/models/sd-xl")[0] == 404
    assert len(queue.recent(10_000)) == before


@pytest.mark.parametrize("path, limit", [("/sdapi/v1/extra-single-image", MAX_IMAGE_BODY_BYTES),
                                         ("/sdapi/v1/extra-batch-images", MAX_IMAGE_BODY_BYTES),
                                         ("/sdapi/v1/png-info", MAX_IMAGE_BODY_BYTES),
                                         ("/sdapi/v1/options", MAX_BODY_BYTES)])
def test_bodies_past_their_route_limit_are_refused_unread(url, path, limit):
    status, answer = send(url, "POST", path, b"{}", {"Content-Type": "application/json",
                                                     "Content-Length": str(limit + 1)})
    assert status == 413 and "request body over" in answer["error"]


def test_a_large_body_without_an_image_is_refused(url):
    """The picture routes take 48 MiB for pictures; options or text alone past 1 MiB is refused."""
    code, answer = call(f"{url}/sdapi/v1/png-info", {"image": None, "pad": "x" * (MAX_BODY_BYTES + 10)})
    assert code == 413 and "without an image in it" in answer["error"]
