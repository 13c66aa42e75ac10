"""Image to image through the server, as its clients meet it: webuiapi's img2img (with and without a mask) and
txt2img's hires fix, the openai client's images.edit, the native API's base64 fields; progress over the steps a
job runs; a queued or stopped img2img job across a restart; bad edits and bodies over the image routes' limit.
(The bad images of the JSON APIs are in test_server.py's table of bad requests, each a 4xx with one line and no
job or upload left behind.)"""

from __future__ import annotations

import base64
import hashlib
import http.client
import io
import json
import threading
import time

import numpy as np
import pytest
from PIL import Image
from test_server import (
    MASK,
    PNG,
    SQUARE,
    _free_port,
    _serve,
    _wait_until,
    b64,
    bomb_png,
    call,
    error_message,
    noise_image,
    png,
    running,
    square_mask,
)

from anima_rknn.generation.params import build
from anima_rknn.generation.pipeline import AnimaPipeline
from anima_rknn.server.job_queue import JobQueue
from anima_rknn.server.requests import MAX_IMAGE_BODY_BYTES

webuiapi = pytest.importorskip("webuiapi")
openai = pytest.importorskip("openai")

SIZE = 64
BLUR = 4
FAR = 3 * BLUR + 2  # pixels this far from the square are untouched by its blurred edge


@pytest.fixture(scope="module")
def server(queue):
    with running(queue) as url:
        yield url, queue


def _api(url: str):
    host, port = url.removeprefix("http://").split(":")
    return webuiapi.WebUIApi(host=host, port=int(port))


def _far_from_square(size: int = SIZE) -> np.ndarray:
    """True where a pixel is farther than FAR from the mask's square."""
    ys, xs = np.mgrid[0:size, 0:size]
    left, top, right, bottom = SQUARE
    return (xs < left - FAR) | (xs >= right + FAR) | (ys < top - FAR) | (ys >= bottom + FAR)


def _decoded(text: str) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(text)))


def _keeps_outside(result: Image.Image, init: Image.Image, inside: bool = True) -> None:
    """Far from the mask the result is the init image exactly; inside it something was repainted."""
    got, want = np.asarray(result.convert("RGB")), np.asarray(init)
    far = _far_from_square(init.width)
    assert far.sum() > 1000 and (got[far] == want[far]).all()
    left, top, right, bottom = SQUARE
    if inside:
        assert (got[top:bottom, left:right] != want[top:bottom, left:right]).any()


def _wait_done(url: str, job_id: str, seconds: float = 120) -> dict:
    deadline = time.monotonic() + seconds
    while (status := call(f"{url}/api/jobs/{job_id}")[1])["state"] not in ("completed", "failed", "cancelled"):
        assert time.monotonic() < deadline, status
        time.sleep(0.05)
    return status


# ---- A1111 -------------------------------------------------------------------------------------------------

def test_webuiapi_img2img_runs_the_strengths_share_of_the_steps(server):
    url, queue = server
    init = noise_image()
    result = _api(url).img2img(images=[init], prompt="a red circle", denoising_strength=0.5, seed=3, steps=4,
                               cfg_scale=4, sampler_name="Euler", width=SIZE, height=SIZE)
    image = result.images[0]
    assert image.size == (SIZE, SIZE) and result.info["denoising_strength"] == 0.5
    text = image.info["parameters"]
    assert "Denoising strength: 0.5" in text and "Mask blur" not in text  # no mask: its fields are ignored
    assert result.parameters["init_images"] is None  # as WebUI answers: not the upload back
    job = queue.recent(1)[0]
    assert len(job.summary["passes"]) == 1
    assert (job.summary["passes"][0]["steps"], job.summary["passes"][0]["steps_run"]) == (4, 2)
    assert job.params.mask is None and job.params.init_image.sha256 == hashlib.sha256(png(init)).hexdigest()


@pytest.mark.parametrize("fill, full_res, content", [(1, False, "original"), (0, True, "fill"),
                                                     (2, True, "latent noise"), (3, False, "latent nothing")])
def test_webuiapi_inpainting_keeps_every_pixel_outside_the_mask(server, fill, full_res, content):
    url, _ = server
    init = noise_image()
    result = _api(url).img2img(images=[init], mask_image=square_mask(), inpainting_fill=fill, inpaint_full_res=full_res,
                               inpaint_full_res_padding=8, mask_blur=BLUR, prompt="a blue square",
                               denoising_strength=0.5, seed=4, steps=4, sampler_name="Euler", width=SIZE,
                               height=SIZE)
    image = result.images[0]
    assert image.size == (SIZE, SIZE)
    _keeps_outside(image, init)
    text = image.info["parameters"]
    assert "Denoising strength: 0.5" in text and f"Mask blur: {BLUR}" in text
    assert f"Masked content: {content}" in text
    assert ("Inpaint area: Only masked" in text) == full_res


def test_webuiapi_default_img2img_call_with_a_mask_is_webuis_only_masked_fill(server):
    """webuiapi's defaults (inpaint_full_res True, padding 0, fill 0, mask_blur 4, resize_mode 0, eta...) are taken."""
    url, queue = server
    init = noise_image(seed=1)
    result = _api(url).img2img(images=[init], mask_image=square_mask(), prompt="x", steps=2, width=SIZE, height=SIZE)
    _keeps_outside(result.images[0], init)
    params = queue.recent(1)[0].params
    assert (params.inpaint_area, params.masked_content, params.inpaint_padding, params.mask_blur,
            params.strength, params.sampler) == ("masked", "fill", 0, 4, 0.75, "euler_ancestral")


def test_webuiapi_hires_fix_doubles_the_size(server):
    url, queue = server
    result = _api(url).txt2img(prompt="a red circle", seed=5, steps=2, cfg_scale=4, sampler_name="Euler",
                               width=SIZE, height=SIZE, enable_hr=True, hr_scale=2, hr_upscaler="Latent",
                               denoising_strength=0.5)
    image = result.images[0]
    assert image.size == (2 * SIZE, 2 * SIZE)
    text = image.info["parameters"]
    assert "Denoising strength: 0.5" in text and "Hires upscale: 2" in text and "Hires upscaler: Latent" in text
    record = queue.recent(1)[0].summary
    assert [(p["width"], p["steps_run"]) for p in record["passes"]] == [(SIZE, 2), (2 * SIZE, 1)]
    # Its default call sends the hires fields and denoising_strength 0.7 without enable_hr: ignored.
    plain = _api(url).txt2img(prompt="a red circle", seed=5, steps=2, sampler_name="Euler", width=SIZE, height=SIZE)
    assert plain.images[0].size == (SIZE, SIZE) and "Denoising strength" not in plain.images[0].info["parameters"]
    assert queue.recent(1)[0].params.strength == 0.75  # the table's, not the 0.7 webuiapi sent


def test_a1111_lists_the_upscalers_it_has(server):
    url, _ = server
    assert [u["name"] for u in call(f"{url}/sdapi/v1/upscalers")[1]] == ["None", "Lanczos"]
    assert [m["name"] for m in call(f"{url}/sdapi/v1/latent-upscale-modes")[1]] == [
        "Latent", "Latent (bicubic)", "Latent (nearest-exact)"]
    code, answer = call(f"{url}/sdapi/v1/txt2img", {"prompt": "x", "seed": 1, "steps": 2, "width": SIZE,
                                                    "height": SIZE, "enable_hr": True, "hr_upscaler": "None",
                                                    "hr_resize_x": 96, "hr_resize_y": 80})
    assert code == 200, answer
    image = _decoded(answer["images"][0])
    assert image.size == (96, 80) and "Hires upscaler: Lanczos" in image.info["parameters"]


def test_progress_counts_the_steps_an_img2img_job_runs(server, monkeypatch):
    """steps 8 at strength 0.5 run 4: /progress says 4 sampling steps and reaches 1.0 on the last."""
    url, queue = server
    last, release = threading.Event(), threading.Event()
    original = queue.worker.on_step

    def on_step(job, event):
        original(job, event)
        if event.step == event.total:  # hold the job at its last step until the test has looked
            last.set()
            release.wait(30)

    monkeypatch.setattr(queue.worker, "on_step", on_step)
    code, job = call(f"{url}/api/jobs", {"prompt": "x", "init_image": b64(png(noise_image())), "steps": 8,
                                         "denoising_strength": 0.5, "seed": 2})
    assert code == 200 and job["steps"] == 4, job
    try:
        assert last.wait(60)
        code, progress = call(f"{url}/sdapi/v1/progress")
        assert code == 200 and progress["progress"] == 1.0
        assert (progress["state"]["sampling_step"], progress["state"]["sampling_steps"]) == (4, 4)
    finally:
        release.set()
    status = _wait_done(url, job["id"])
    assert status["state"] == "completed" and (status["step"], status["steps"]) == (4, 4)


# ---- OpenAI ------------------------------------------------------------------------------------------------

def _rgba_mask(size: int = SIZE) -> Image.Image:
    """OpenAI's mask: transparent where to edit (the square), opaque elsewhere."""
    mask = Image.new("RGBA", (size, size), (0, 0, 0, 255))
    mask.paste((0, 0, 0, 0), SQUARE)
    return mask


def test_openai_client_edits_inside_the_transparent_area_only(server, tmp_path):
    url, queue = server
    init = noise_image(seed=2)
    (tmp_path / "image.png").write_bytes(png(init))
    (tmp_path / "mask.png").write_bytes(png(_rgba_mask()))
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="not-needed")
    with open(tmp_path / "image.png", "rb") as image, open(tmp_path / "mask.png", "rb") as mask:
        result = client.images.edit(image=image, mask=mask, prompt="a blue square", size=f"{SIZE}x{SIZE}",
                                    response_format="b64_json", extra_body={"steps": 3, "seed": 7})
    edited = _decoded(result.data[0].b64_json)
    assert edited.size == (SIZE, SIZE) and result.data[0].revised_prompt == "a blue square"
    _keeps_outside(edited, init)
    params = queue.recent(1)[0].params
    assert (params.steps, params.seed, params.strength) == (3, 7, 1.0)  # a masked edit repaints from noise


def test_openai_client_edits_an_images_own_transparent_area_without_a_mask(server, tmp_path):
    url, queue = server
    init = noise_image(seed=5)
    holed = init.convert("RGBA")
    holed.paste((0, 0, 0, 0), SQUARE)  # as OpenAI's edits read it: the transparent area is what to edit
    (tmp_path / "holed.png").write_bytes(png(holed))
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="not-needed")
    with open(tmp_path / "holed.png", "rb") as image:
        result = client.images.edit(image=image, prompt="a blue square", size=f"{SIZE}x{SIZE}",
                                    response_format="b64_json", extra_body={"steps": 3, "seed": 7})
    _keeps_outside(_decoded(result.data[0].b64_json), init)
    params = queue.recent(1)[0].params
    assert params.mask is not None and params.strength == 1.0


def test_openai_client_edits_a_whole_image_at_its_own_size(server, tmp_path):
    url, queue = server
    (tmp_path / "wide.png").write_bytes(png(noise_image(80, 48)))
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="not-needed")
    with open(tmp_path / "wide.png", "rb") as image:
        result = client.images.edit(image=[image], prompt="a cat", size="auto", response_format="b64_json",
                                    n=2, extra_body={"steps": 2, "denoising_strength": 0.5})
    assert [_decoded(item.b64_json).size for item in result.data] == [(80, 48)] * 2
    params = queue.recent(1)[0].params
    assert params.mask is None and params.strength == 0.5


def test_openai_edit_with_a_mask_of_another_size_is_refused(server, tmp_path):
    url, _ = server
    (tmp_path / "image.png").write_bytes(png(noise_image()))
    (tmp_path / "mask.png").write_bytes(png(_rgba_mask(32)))
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="not-needed", max_retries=0)
    with open(tmp_path / "image.png", "rb") as image, open(tmp_path / "mask.png", "rb") as mask:
        with pytest.raises(openai.BadRequestError, match="the mask is 32x32 but the image is 64x64"):
            client.images.edit(image=image, mask=mask, prompt="x", response_format="b64_json")


# ---- native ------------------------------------------------------------------------------------------------

def test_native_api_takes_base64_images_and_the_images_size(server):
    url, queue = server
    init = noise_image(seed=3)
    before = len(queue.recent(10_000))
    code, job = call(f"{url}/api/jobs", {"prompt": "a blue square", "init_image": "data:image/png;base64," +
                                         b64(png(init)), "mask": b64(png(square_mask())), "denoising_strength": 0.5,
                                         "inpainting_fill": "fill", "mask_blur": BLUR, "steps": 4, "seed": 1})
    assert code == 200, job
    assert (job["params"]["width"], job["params"]["height"], job["steps"]) == (SIZE, SIZE, 2)  # the image's size
    assert set(job["params"]["init_image"]) == {"name", "sha256"}  # a status never carries the bytes
    assert _wait_done(url, job["id"])["state"] == "completed"
    code, picture = call(f"{url}/api/jobs/{job['id']}/image")
    _keeps_outside(Image.open(io.BytesIO(picture)), init)
    assert len(queue.recent(10_000)) == before + 1
    # A finished job keeps its images by fingerprint alone (the bytes leave memory); the upload stays on disk while
    # the job is recent, for a compare with its baseline.
    finished = queue.get(job["id"]).params
    assert finished.init_image.data is None and finished.mask.data is None
    assert (queue.uploads.folder / f"{job['params']['init_image']['sha256']}.img").is_file()


def test_a_finished_cached_img2img_job_compares_with_its_uncached_twin(server):
    url, queue = server
    init = noise_image(seed=8)
    code, job = call(f"{url}/api/jobs", {"prompt": "a red square", "init_image": b64(png(init)), "steps": 12,
                                         "denoising_strength": 0.8, "cache": "spectrum", "hr_cache": "none",
                                         "seed": 2})
    assert code == 200 and _wait_done(url, job["id"])["state"] == "completed"
    code, twin = call(f"{url}/api/jobs/{job['id']}/compare", {})
    assert code == 200, twin
    assert _wait_done(url, twin["id"])["state"] == "completed"
    assert twin["params"]["cache"] == "none" and twin["params"]["init_image"] == job["params"]["init_image"]
    code, compared = call(f"{url}/api/jobs/{job['id']}/compare/{twin['id']}")
    assert code == 200 and compared["ready"], compared
    # 10 of the 12 steps run (strength 0.8); Spectrum computes 1-4, 6, 8 and 10 of them.
    assert compared["computed_steps"] == {"cached": 7, "baseline": 10}


def test_settings_describe_the_image_fields(server):
    url, _ = server
    by_field = {s["field"]: s for s in call(f"{url}/api/settings")[1]}
    image = by_field["init_image"]
    assert (image["kind"], image["setting"], image["max_body_bytes"]) == ("image", "init_image", MAX_IMAGE_BODY_BYTES)
    assert image["max_bytes"] > 0 and "PNG" in image["formats"] and by_field["mask"]["kind"] == "image"
    assert by_field["outpaint"]["items"] == ["left", "top", "right", "bottom"]
    assert by_field["inpainting_fill"]["labels"]["latent_noise"] == "Latent noise"
    assert by_field["hr_resize_x"]["high"] == 1024 and by_field["hr_second_pass_steps"]["high"] == 150


# ---- bad input ---------------------------------------------------------------------------------------------

def test_bad_openai_edits_get_a_4xx_with_one_line(server):
    url, _ = server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="not-needed", max_retries=0)
    blank = png(Image.new("RGBA", (SIZE, SIZE), (0, 0, 0, 255)))
    for files, pattern in [({"image": b"not an image"}, "not an image"),
                           ({"image": PNG, "mask": MASK}, "the mask must have an alpha channel"),
                           ({"image": PNG, "mask": blank}, "the mask has no fully transparent pixel"),
                           ({"image": bomb_png()}, "refused before decoding")]:
        with pytest.raises(openai.BadRequestError) as refused:
            client.images.edit(prompt="x", response_format="b64_json",
                               **{name: (f"{name}.png", data, "image/png") for name, data in files.items()})
        message = refused.value.body["message"]  # the client's view of the answer's "error"
        assert pattern in message and "\n" not in message, message
    with pytest.raises(openai.BadRequestError, match="response_format must be b64_json"):
        client.images.edit(image=("i.png", PNG, "image/png"), prompt="x", response_format="url")
    code, answer = call(f"{url}/v1/images/edits", {"prompt": "x"})  # JSON, not an upload
    assert code == 415 and "multipart/form-data" in error_message("/v1/", answer)


@pytest.mark.parametrize("path", ["/sdapi/v1/img2img", "/v1/images/edits", "/api/jobs"])
def test_an_image_body_over_its_limit_is_refused_before_it_is_read(server, path):
    url, _ = server
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.putrequest("POST", path)
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", str(MAX_IMAGE_BODY_BYTES + 1))
    connection.endheaders()  # the body never follows: the answer must not wait for it
    response = connection.getresponse()
    assert response.status == 413 and error_message(path, json.loads(response.read())) == "request body over 48 MiB"
    connection.close()


def test_a_chunked_image_body_is_cut_off_at_the_limit(server):
    """Without a Content-Length the body is counted as it comes: base64 over the limit is a 413, never parsed."""
    url, queue = server
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    head = json.dumps({"prompt": "x", "steps": 2, "init_images": ["A" * 8]})[:-3].encode()
    chunk = b"A" * (1 << 20)

    def body():
        yield head
        for _ in range(MAX_IMAGE_BODY_BYTES // len(chunk) + 1):
            yield chunk
        yield b'"]}'

    before = len(queue.recent(10_000))
    try:
        connection.request("POST", "/sdapi/v1/img2img", body=body(), encode_chunked=True,
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 413 and "request body over 48 MiB" in json.loads(response.read())["error"]
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server may close the connection before all of it was sent
    connection.close()
    assert len(queue.recent(10_000)) == before


# ---- restarts ----------------------------------------------------------------------------------------------

def _img2img_params(seed: int, **extra):
    from anima_rknn.generation.images import ImageInput

    return build({"prompt": "a red circle", "steps": 4, "seed": seed, "init_image": ImageInput.from_bytes(PNG),
                  "mask": ImageInput.from_bytes(MASK), "strength": 0.5, **extra})


def test_a_queued_img2img_job_survives_a_restart(tiny_set, tmp_path, server):
    url, reference_queue = server
    data_dir = tmp_path / "data"
    first = JobQueue(AnimaPipeline(tiny_set), data_dir)  # never started: the server died before running it
    kept, lost = first.submit(_img2img_params(9)), first.submit(_img2img_params(10, mask=None))
    assert sorted(p.name for p in first.uploads.folder.iterdir()) == sorted(
        f"{hashlib.sha256(data).hexdigest()}.img" for data in (PNG, MASK))
    first.store._db.close()
    # The mask's file goes missing: its job cannot run (and says why), the plain img2img one can.
    (first.uploads.folder / f"{hashlib.sha256(MASK).hexdigest()}.img").unlink()
    second = JobQueue(AnimaPipeline(tiny_set), data_dir)
    failed = second.get(kept.id)
    assert failed.state == "failed" and "mask" in failed.error and "gone from the server's inputs folder" in \
        failed.error
    again = second.get(lost.id)
    assert again.state == "queued" and again.params.init_image.data == PNG  # its bytes given back
    second.start()
    try:
        assert again.done.wait(120) and again.state == "completed", again.error
    finally:
        second.close()
    # Only what a compare of the recent completed job needs is left (the failed job's image went with it).
    assert [p.name for p in second.uploads.folder.iterdir()] == [f"{hashlib.sha256(PNG).hexdigest()}.img"]
    # The same job on the module's server: the same picture.
    reference = reference_queue.submit(_img2img_params(10, mask=None))
    assert reference.done.wait(120) and reference.state == "completed"
    assert Image.open(second.image_path(again)).tobytes() == Image.open(
        reference_queue.image_path(reference)).tobytes()


def test_an_inpainting_job_stopped_by_a_shutdown_resumes_after_a_restart(tiny_set, tmp_path, server):
    """A clean shutdown mid-run (SIGTERM): the next server finds the job and its upload, and finishes it from its
    checkpoint with the picture an unbroken run makes."""
    import signal

    url, _ = server
    # 150 steps (the server's most): seconds of work left when the signal comes, as test_server.py's SIGTERM test.
    request = {"prompt": "a cat", "steps": 150, "cfg_scale": 1, "seed": 11, "init_image": b64(PNG),
               "mask": b64(MASK), "denoising_strength": 1.0}
    model_dir, data_dir, port = tiny_set.dit.parents[2], tmp_path / "data", _free_port()
    base = f"http://127.0.0.1:{port}"
    with open(tmp_path / "log.txt", "wb") as log:
        first = _serve(model_dir, data_dir, port, log)
        _wait_until(lambda: call(f"{base}/api/jobs")[0] == 200)
        job = call(f"{base}/api/jobs", request)[1]
        _wait_until(lambda: call(f"{base}/api/jobs/{job['id']}")[1]["step"] >= 6)  # a checkpoint at 5
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=60)
        assert list(data_dir.glob("*.state")) and len(list((data_dir / "inputs").iterdir())) == 2
        second = _serve(model_dir, data_dir, port, log)
        try:
            _wait_until(lambda: call(f"{base}/api/jobs/{job['id']}")[1]["state"] == "completed", 300)
        finally:
            second.terminate()
            second.wait(timeout=60)
    assert len(list((data_dir / "inputs").iterdir())) == 2  # kept while the completed job is recent (compare)
    reference = call(f"{url}/api/jobs", request)[1]
    assert _wait_done(url, reference["id"], 300)["state"] == "completed"
    resumed = Image.open(data_dir / f"{job['id']}.png")
    assert resumed.tobytes() == Image.open(io.BytesIO(call(f"{url}/api/jobs/{reference['id']}/image")[1])).tobytes()
