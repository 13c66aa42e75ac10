"""WebUI's own API tests (AUTOMATIC1111/stable-diffusion-webui test/test_txt2img.py, test_img2img.py,
test_utils.py and test_extras.py), rewritten against this server: each posts what WebUI's test posts, and gets
what WebUI answers, or a 400 whose reason is this server's rule (docs/webui-compat.md names each): a picture
made without what was asked for (tiling, face restoration, a script, a sampler this server lacks) would be a
silent lie, and png-info of a picture without parameters has nothing to give."""

from __future__ import annotations

import base64
import io
import json
import threading
import time

import pytest
from PIL import Image
from test_server import MASK, PNG, b64, call, running


# WebUI's simple_txt2img_request, as its test sends it.
TXT2IMG = {"batch_size": 1, "cfg_scale": 7, "denoising_strength": 0, "enable_hr": False, "eta": 0,
           "firstphase_height": 0, "firstphase_width": 0, "height": 64, "n_iter": 1, "negative_prompt": "",
           "prompt": "example prompt", "restore_faces": False, "s_churn": 0, "s_noise": 1, "s_tmax": 0, "s_tmin": 0,
           "sampler_index": "Euler a", "seed": -1, "seed_resize_from_h": -1, "seed_resize_from_w": -1, "steps": 3,
           "styles": [], "subseed": -1, "subseed_strength": 0, "tiling": False, "width": 64}
# WebUI's simple_img2img_request.
IMG2IMG = {"batch_size": 1, "cfg_scale": 7, "denoising_strength": 0.75, "eta": 0, "height": 64,
           "include_init_images": False, "init_images": [b64(PNG)], "inpaint_full_res": False,
           "inpaint_full_res_padding": 0, "inpainting_fill": 0, "inpainting_mask_invert": False, "mask": None,
           "mask_blur": 4, "n_iter": 1, "negative_prompt": "", "override_settings": {}, "prompt": "example prompt",
           "resize_mode": 0, "restore_faces": False, "s_churn": 0, "s_noise": 1, "s_tmax": 0, "s_tmin": 0,
           "sampler_index": "Euler a", "seed": -1, "seed_resize_from_h": -1, "seed_resize_from_w": -1, "steps": 3,
           "styles": [], "subseed": -1, "subseed_strength": 0, "tiling": False, "width": 64}

# (test name in WebUI, route, what the test changes, this server's status, its images or the refusal's words)
CASES = [
    ("txt2img_simple", "txt2img", {}, 200, 1),
    ("txt2img_with_negative_prompt", "txt2img", {"negative_prompt": "example negative prompt"}, 200, 1),
    ("txt2img_with_complex_prompt", "txt2img",
     {"prompt": "((emphasis)), (emphasis1:1.1), [to:1], [from::2], [from:to:0.3], [alt|alt1]"}, 200, 1),
    ("txt2img_not_square_image", "txt2img", {"height": 128}, 200, 1),
    ("txt2img_with_hrfix", "txt2img", {"enable_hr": True}, 200, 1),
    ("txt2img_with_tiling", "txt2img", {"tiling": True}, 400, "seamless tiling is not supported"),
    ("txt2img_with_restore_faces", "txt2img", {"restore_faces": True}, 400, "face restoration is not supported"),
    ("txt2img_with_vanilla_sampler[PLMS]", "txt2img", {"sampler_index": "PLMS"}, 400, "PLMS steps a discrete DDPM"),
    ("txt2img_with_vanilla_sampler[DDIM]", "txt2img", {"sampler_index": "DDIM"}, 200, 1),
    ("txt2img_with_vanilla_sampler[UniPC]", "txt2img", {"sampler_index": "UniPC"}, 200, 1),
    ("txt2img_multiple_batches", "txt2img", {"n_iter": 2}, 200, 2),
    ("txt2img_batch", "txt2img", {"batch_size": 2}, 200, 2),
    ("img2img_simple", "img2img", {}, 200, 1),
    ("inpainting_masked", "img2img", {"mask": b64(MASK)}, 200, 1),
    ("inpainting_with_inverted_masked", "img2img", {"mask": b64(MASK), "inpainting_mask_invert": True}, 200, 1),
    ("img2img_sd_upscale", "img2img", {"script_name": "sd upscale", "script_args": ["", 8, "Lanczos", 2.0]}, 400,
     "scripts is not supported"),
]


@pytest.fixture(scope="module")
def url(queue):
    with running(queue) as address:
        yield address


@pytest.mark.parametrize("name, route, change, status, expected", CASES, ids=[case[0] for case in CASES])
def test_generation_case(url, name, route, change, status, expected):
    body = (TXT2IMG if route == "txt2img" else IMG2IMG) | change
    code, answer = call(f"{url}/sdapi/v1/{route}", body)
    assert code == status, answer
    if status != 200:
        assert expected in answer["error"]
        return
    assert len(answer["images"]) == expected
    with Image.open(io.BytesIO(base64.b64decode(answer["images"][0]))) as image:
        width, height = body["width"], body["height"]
        scale = 2 if body.get("enable_hr") else 1  # WebUI's hr_scale default
        assert image.size == (width * scale, height * scale)


def test_hires_fix_at_strength_zero_runs_one_step_as_webui(url):
    """WebUI's hires pass at denoising_strength 0 runs int(steps x 0) + 1 steps, from the schedule's last sigma:
    here the one last step too, over the upscaled first pass."""
    code, answer = call(f"{url}/sdapi/v1/txt2img", TXT2IMG | {"enable_hr": True, "hr_second_pass_steps": 4})
    assert code == 200
    assert json.loads(answer["info"])["denoising_strength"] == pytest.approx(1 / 4)
    code, answer = call(f"{url}/sdapi/v1/img2img", IMG2IMG | {"denoising_strength": 0})
    assert code == 200 and json.loads(answer["info"])["denoising_strength"] == pytest.approx(1 / 3)


def test_options_write(url):
    """WebUI's test_options_write: a key flipped reads back flipped."""
    code, options = call(f"{url}/sdapi/v1/options")
    assert code == 200
    before = options["send_seed"]
    assert call(f"{url}/sdapi/v1/options", {"send_seed": not before})[0] == 200
    assert call(f"{url}/sdapi/v1/options")[1]["send_seed"] == (not before)
    assert call(f"{url}/sdapi/v1/options", {"send_seed": before})[0] == 200


# WebUI's test_get_api_url, and the listings newer WebUI clients call (SillyTavern: sd-vae, sd-modules).
LISTINGS = {"cmd-flags": dict, "samplers": list, "upscalers": list, "sd-models": list, "hypernetworks": list,
            "face-restorers": list, "realesrgan-models": list, "prompt-styles": list, "embeddings": dict,
            "sd-vae": list, "sd-modules": list, "memory": dict, "schedulers": list, "latent-upscale-modes": list,
            "loras": list}


@pytest.mark.parametrize("path", LISTINGS)
def test_get_api_url(url, path):
    code, answer = call(f"{url}/sdapi/v1/{path}")
    assert code == 200 and isinstance(answer, LISTINGS[path])
    if path in ("hypernetworks", "face-restorers", "realesrgan-models", "prompt-styles", "sd-vae", "sd-modules"):
        assert answer == []  # this server has none: listed as none, not made up
    if path == "embeddings":
        assert answer == {"loaded": {}, "skipped": {}}


def test_upscalers_are_the_resizes_this_server_has(url):
    assert [u["name"] for u in call(f"{url}/sdapi/v1/upscalers")[1]] == ["None", "Lanczos"]


def test_simple_upscaling(url):
    """WebUI's test_extras: extra-single-image with Lanczos at 2x; the picture is PIL's Lanczos resize."""
    body = {"resize_mode": 0, "show_extras_results": True, "gfpgan_visibility": 0, "codeformer_visibility": 0,
            "codeformer_weight": 0, "upscaling_resize": 2, "upscaling_resize_w": 128, "upscaling_resize_h": 128,
            "upscaling_crop": True, "upscaler_1": "Lanczos", "upscaler_2": "None",
            "extras_upscaler_2_visibility": 0, "image": b64(PNG)}
    code, answer = call(f"{url}/sdapi/v1/extra-single-image", body)
    assert code == 200
    with Image.open(io.BytesIO(base64.b64decode(answer["image"]))) as made, Image.open(io.BytesIO(PNG)) as source:
        expected = source.convert("RGB").resize((128, 128), Image.Resampling.LANCZOS)
        assert made.size == (128, 128) and made.tobytes() == expected.tobytes()
    code, answer = call(f"{url}/sdapi/v1/extra-single-image", body | {"resize_mode": 1, "upscaling_resize_w": 96,
                                                                       "upscaling_resize_h": 64})
    with Image.open(io.BytesIO(base64.b64decode(answer["image"]))) as made:
        assert made.size == (96, 64)  # covered then cropped to the box, as WebUI's crop to fit
    code, answer = call(f"{url}/sdapi/v1/extra-single-image", body | {"upscaler_1": "None"})
    with Image.open(io.BytesIO(base64.b64decode(answer["image"]))) as made, Image.open(io.BytesIO(PNG)) as source:
        assert made.tobytes() == source.convert("RGB").tobytes()  # WebUI's None: no resize


def test_batch_upscaling(url):
    body = {"upscaler_1": "Lanczos", "upscaling_resize": 1.5,
            "imageList": [{"data": b64(PNG), "name": "a.png"}, {"data": b64(MASK), "name": "b.png"}]}
    code, answer = call(f"{url}/sdapi/v1/extra-batch-images", body)
    assert code == 200 and len(answer["images"]) == 2
    for data in answer["images"]:
        with Image.open(io.BytesIO(base64.b64decode(data))) as made:
            assert made.size == (96, 96)


def test_png_info(url):
    """WebUI's test_png_info posts a picture without parameters, which WebUI answers with an empty info: here a
    400 says there is nothing in it (the issue's rule); a picture this server made is read back as WebUI parses
    its infotext."""
    code, answer = call(f"{url}/sdapi/v1/png-info", {"image": b64(PNG)})
    assert code == 400 and "holds no generation parameters" in answer["error"]
    made = call(f"{url}/sdapi/v1/txt2img", TXT2IMG | {"negative_prompt": "bad, ugly", "seed": 7})[1]["images"][0]
    code, answer = call(f"{url}/sdapi/v1/png-info", {"image": made})
    assert code == 200
    parsed = answer["parameters"]
    assert parsed["Prompt"] == "example prompt" and parsed["Negative prompt"] == "bad, ugly"
    assert (parsed["Steps"], parsed["Seed"], parsed["Size-1"], parsed["Size-2"]) == ("3", "7", "64", "64")
    assert parsed["Sampler"] == "Euler a" and answer["info"].startswith("example prompt\nNegative prompt: bad, ugly")


def test_skip_and_refresh(url):
    for path in ("skip", "refresh-checkpoints", "refresh-loras"):
        assert call(f"{url}/sdapi/v1/{path}", {}) == (200, None)  # WebUI's null


def test_skip_ends_the_picture_being_made_and_the_call_goes_on(url):
    """WebUI's skip: the running picture stops at its next step and is kept; the call's next picture is made."""
    answers = []
    thread = threading.Thread(target=lambda: answers.append(call(f"{url}/sdapi/v1/txt2img", TXT2IMG | {
        "n_iter": 2, "steps": 30, "seed": 3})))
    thread.start()
    deadline = time.monotonic() + 60
    while call(f"{url}/sdapi/v1/progress")[1]["state"]["sampling_step"] < 1:
        assert time.monotonic() < deadline, "the call did not start"
        time.sleep(0.02)
    assert call(f"{url}/sdapi/v1/skip", {}) == (200, None)
    thread.join(120)
    code, answer = answers[0]
    assert code == 200 and len(answer["images"]) == 2
    infotexts = json.loads(answer["info"])["infotexts"]
    assert "Interrupted: step" in infotexts[0] and "Interrupted" not in infotexts[1]  # the second ran whole
