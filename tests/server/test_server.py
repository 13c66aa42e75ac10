"""`anima-rknn serve` as its clients meet it: the real `webuiapi` and `openai` packages, and plain HTTP."""

from __future__ import annotations

import base64
import contextlib
import http.client
import io
import json
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
import zlib

import numpy as np
import pytest
import uvicorn
from PIL import Image

from anima_rknn.server.app import build_app
from anima_rknn.server.job_queue import JobQueue
from anima_rknn.server.runtime import Server

webuiapi = pytest.importorskip("webuiapi")
openai = pytest.importorskip("openai")

SMALL = {"width": 64, "height": 64, "steps": 2}
SQUARE = (24, 24, 40, 40)  # square_mask's white square: left, top, right, bottom (exclusive)


# ---- images a request may carry (test_server_img2img.py uses them too) ----------------------------------

def png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def noise_image(width: int = 64, height: int = 64, seed: int = 0) -> Image.Image:
    """Noise over a gradient: every pixel its own, so 'unchanged' means unchanged."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 200, width, dtype=np.float32)[None, :, None]
    return Image.fromarray(np.clip(ramp + rng.integers(0, 56, (height, width, 3)), 0, 255).astype(np.uint8))


def square_mask(size: int = 64) -> Image.Image:
    """An inpainting mask: white (repaint) in SQUARE, black elsewhere."""
    mask = Image.new("L", (size, size), 0)
    mask.paste(255, SQUARE)
    return mask


def bomb_png() -> bytes:
    """A tiny real PNG whose header claims 30000 x 30000 pixels (its CRC made right): a decompression bomb."""
    data = bytearray(png(Image.new("RGB", (8, 8))))
    data[16:24] = struct.pack(">II", 30000, 30000)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


PNG, MASK = png(noise_image()), png(square_mask())
IMG2IMG = {"prompt": "x", **SMALL}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running(queue: JobQueue, **options):
    """A real uvicorn server on 127.0.0.1 for `queue`, stopped on leaving."""
    config = uvicorn.Config(build_app(Server(queue, model_name="tiny", **options)), host="127.0.0.1", port=_free_port(),
                            log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{config.port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture(scope="module")
def server(queue):
    with running(queue) as url:
        yield url, queue


def call(url: str, body: object | None = None, method: str | None = None) -> tuple[int, object]:
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    request = urllib.request.Request(url, data=data, method=method or ("POST" if data is not None else "GET"),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            raw, code, kind = response.read(), response.status, response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        raw, code, kind = e.read(), e.code, e.headers.get("Content-Type", "")
    return code, json.loads(raw) if "json" in kind else raw


def test_webuiapi_client_generates_an_image(server):
    url, _ = server
    host, port = url.removeprefix("http://").split(":")
    api = webuiapi.WebUIApi(host=host, port=int(port))
    result = api.txt2img(prompt="a red circle", negative_prompt="", seed=5, cfg_scale=4, sampler_name="Euler",
                         batch_size=2, **SMALL)
    assert len(result.images) == 2 and result.images[0].size == (64, 64)
    assert result.info["all_seeds"] == [5, 6] and "Seed: 5," in result.info["infotexts"][0]
    assert result.info["infotexts"] == [image.info["parameters"] for image in result.images]  # what the PNGs say
    assert [m["model_name"] for m in api.get_sd_models()] == ["tiny"]


def test_a1111_schedule_types_are_listed_and_honoured(server):
    url, _ = server
    code, schedulers = call(f"{url}/sdapi/v1/schedulers")
    assert code == 200 and [(s["name"], s["label"]) for s in schedulers] == [
        ("simple", "Simple"), ("normal", "Normal"), ("karras", "Karras"), ("exponential", "Exponential"),
        ("sgm_uniform", "SGM Uniform"), ("beta", "Beta"), ("linear_quadratic", "Linear Quadratic")]
    host, port = url.removeprefix("http://").split(":")
    api = webuiapi.WebUIApi(host=host, port=int(port))
    result = api.txt2img(prompt="a red circle", seed=5, sampler_name="Euler", scheduler="Karras", **SMALL)
    assert "Schedule type: Karras," in result.info["infotexts"][0] and result.info["scheduler"] == "karras"


def test_openai_client_generates_an_image(server):
    url, _ = server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="not-needed")
    assert [m.id for m in client.models.list()] == ["tiny"]
    result = client.images.generate(model="tiny", prompt="a blue square", size="64x64", n=1,
                                    response_format="b64_json", extra_body={"steps": 2})
    image = Image.open(io.BytesIO(base64.b64decode(result.data[0].b64_json)))
    assert image.size == (64, 64) and "a blue square" in image.info["parameters"]


def test_the_settings_a_request_may_give_come_from_the_table_with_the_servers_defaults(queue):
    from anima_rknn.generation.params import REQUEST_FIELDS

    with running(queue, default_cache="spectrum", native_size=64, max_steps=30) as url:
        code, settings = call(f"{url}/api/settings")
        by_field = {s["field"]: s for s in settings}
        assert code == 200 and set(by_field) == set(REQUEST_FIELDS) - {"loras", "cache_options"}
        assert (by_field["width"]["default"], by_field["steps"]["high"], by_field["cache"]["default"],
                by_field["seed"]["default"], by_field["cfg_scale"]["setting"]) == (64, 30, "spectrum", -1, "cfg")
        # A request that names no size gets the model's (the demo model's 64 px, not a flat 512 x 512 field).
        code, status = call(f"{url}/api/jobs", {"prompt": "a red circle", "steps": 2})
        assert code == 200 and (status["params"]["width"], status["params"]["height"]) == (64, 64)
        assert status["params"]["cache"] == "spectrum"
        queue.cancel(queue.get(status["id"]))


def test_a_job_is_validated_and_prepared_once_at_submission(server, run_counts):
    """The request's settings are validated, the job's run planned when it is submitted (a bad request is a 400),
    and the worker runs that plan (generation/run_plan.py)."""
    url, queue = server
    code, job = call(f"{url}/api/jobs", {"prompt": "a cat", **SMALL, "seed": 4})
    assert code == 200 and queue.get(job["id"]).done.wait(120) and queue.get(job["id"]).state == "completed"
    assert run_counts == {"validate": 1, "prepare": 1}


def test_native_jobs_queue_run_and_report(server):
    url, _ = server
    code, job = call(f"{url}/api/jobs", {"prompt": "a cat", **SMALL, "seed": 3, "cache": "spectrum"})
    assert code == 200 and job["state"] in ("queued", "generating")
    deadline = time.monotonic() + 120
    while job["state"] not in ("completed", "failed", "cancelled"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
        code, job = call(f"{url}/api/jobs/{job['id']}")
    assert job["state"] == "completed" and job["step"] == 2 and job["result"]["computed_steps"] == [1, 2]
    code, png = call(f"{url}/api/jobs/{job['id']}/image")
    assert code == 200 and Image.open(io.BytesIO(png)).size == (64, 64)
    code, events = call(f"{url}/api/jobs/{job['id']}/events")
    assert code == 200 and b'"state": "completed"' in events
    code, listed = call(f"{url}/api/jobs")
    assert job["id"] in [j["id"] for j in listed]


def test_cancel_stops_a_long_job_at_a_step_boundary(server):
    url, queue = server
    code, job = call(f"{url}/api/jobs", {"prompt": "a cat", "width": 64, "height": 64, "steps": 150})
    while call(f"{url}/api/jobs/{job['id']}")[1]["step"] < 1:
        time.sleep(0.05)
    code, progress = call(f"{url}/sdapi/v1/progress")
    assert code == 200 and progress["state"]["sampling_steps"] == 150 and progress["current_image"]
    call(f"{url}/sdapi/v1/interrupt", {})
    deadline = time.monotonic() + 60
    while (status := call(f"{url}/api/jobs/{job['id']}")[1])["state"] not in ("cancelled", "completed"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert status["state"] == "cancelled" and status["step"] < 150
    assert not (queue.data_dir / f"{job['id']}.png").exists()


@pytest.mark.parametrize("path, body, code, pattern", [
    ("/sdapi/v1/txt2img", {"prompt": "x", "sampler_name": "DPM2 a", **SMALL}, 400,
     "unknown sampler 'DPM2 a'; choose one of euler (Euler), euler_ancestral (Euler a), heun (Heun)"),
    ("/sdapi/v1/txt2img", {"prompt": "x", "width": 4096, "height": 64, "steps": 2}, 400, "width and height"),
    ("/sdapi/v1/txt2img", {"prompt": "x", "steps": 151, "width": 64, "height": 64}, 400, "steps must be"),
    ("/sdapi/v1/txt2img", {"prompt": "x", "cfg_scale": "high", **SMALL}, 400, "cfg_scale must be a finite"),
    ("/sdapi/v1/txt2img", b'{"prompt": "x", "cfg_scale": NaN}', 400, "cfg_scale must be a finite"),
    ("/sdapi/v1/txt2img", b"{not json", 400, "not valid JSON"),
    ("/sdapi/v1/txt2img", [1, 2], 400, "must be a JSON object"),
    ("/sdapi/v1/txt2img", {"prompt": "(" * 200 + "x", **SMALL, "cache": "bogus"}, 400, "cache must be one of"),
    ("/sdapi/v1/txt2img", {"prompt": "x", "batch_size": 9, **SMALL}, 400, "at most 8 images"),
    ("/sdapi/v1/txt2img", {"prompt": "x", "scheduler": "Align Your Steps", **SMALL}, 400,
     "unknown schedule 'Align Your Steps': choose one of simple, normal, karras"),
    # The fields every API takes from the settings table, each checked as the CLI checks its flag.
    ("/sdapi/v1/txt2img", {"prompt": "x", "scheduler": 5, **SMALL}, 400, "scheduler must be a string"),
    ("/api/jobs", {"prompt": "x", "shift": "big", **SMALL}, 400, "shift must be a finite number"),
    ("/api/jobs", {"prompt": "x", "shift": 1e308, **SMALL}, 400, "shift must be a finite number from 0.001 to 100"),
    ("/api/jobs", {"prompt": "x", "vae_tile": 12, **SMALL}, 400, "VAE tile size must be an integer from 64"),
    ("/api/jobs", {"prompt": "x", "vae_tiling": "maybe", **SMALL}, 400, "vae_tiling must be one of auto, on, off"),
    ("/api/jobs", {"prompt": "x", "lora_ignore_unmatched": "yes", **SMALL}, 400, "must be true or false"),
    ("/v1/images/generations", {"prompt": "x", "size": "huge"}, 400, "size must be WIDTHxHEIGHT"),
    ("/v1/images/generations", {"prompt": "x", "size": "64x64", "response_format": "url"}, 400, "b64_json"),
    ("/api/jobs", {"prompt": 5, **SMALL}, 400, "prompt must be a string"),
    ("/api/jobs", {"prompt": "x", "seed": 2**64, **SMALL}, 400, "seed must be an integer"),
    ("/api/jobs/nope", None, 404, "no job"),
    # Images: their bytes only, checked whole before a job is made.
    ("/sdapi/v1/img2img", {**IMG2IMG, "init_images": [b64(b"this is no image at all")]}, 400, "not an image"),
    ("/sdapi/v1/img2img", {**IMG2IMG, "init_images": [b64(PNG[: len(PNG) // 2])]}, 400, "truncated or corrupt"),
    ("/sdapi/v1/img2img", {**IMG2IMG, "init_images": [b64(bomb_png())]}, 400, "refused before decoding"),
    ("/sdapi/v1/img2img", {**IMG2IMG, "init_images": ["/etc/passwd"]}, 400, "the server never opens a path"),
    ("/sdapi/v1/img2img", {**IMG2IMG, "init_images": ["C:\\x.png"]}, 400, "the server never opens a path"),
    ("/sdapi/v1/img2img", {**IMG2IMG, "init_images": ["file:///etc/passwd"]}, 400, "never opens a path"),
    ("/sdapi/v1/img2img", {**IMG2IMG, "init_images": [5]}, 400, "must be base64-encoded image bytes"),
    ("/sdapi/v1/img2img", {**IMG2IMG, "init_images": []}, 400, "init_images must be a list holding one"),
    ("/sdapi/v1/img2img", {**IMG2IMG, "init_images": [b64(PNG)] * 2}, 400, "takes one per request"),
    ("/sdapi/v1/img2img", {**IMG2IMG, "init_images": [b64(PNG)], "mask": b64(png(square_mask(32)))}, 400,
     "the mask is 32x32 px, the init image 64x64"),
    ("/sdapi/v1/img2img", {**IMG2IMG, "init_images": [b64(PNG)], "mask": b64(png(Image.new("L", (64, 64))))},
     400, "the mask is empty"),
    ("/sdapi/v1/img2img", {**IMG2IMG, "init_images": [b64(PNG)], "denoising_strength": 1.5}, 400,
     "strength must be a finite number from 0 to 1"),
    ("/sdapi/v1/img2img", {**IMG2IMG, "init_images": [b64(PNG)], "denoising_strength": -1}, 400,
     "strength must be a finite number from 0 to 1"),
    ("/sdapi/v1/img2img", {**IMG2IMG, "init_images": [b64(PNG)], "denoising_strength": "NaN"}, 400,
     "denoising_strength must be a finite number"),
    ("/sdapi/v1/img2img", {**IMG2IMG, "init_images": [b64(PNG)], "resize_mode": 3}, 400,
     "resize_mode 3 (just resize, latent upscale) is not supported here; use 0 (just resize), 1 (crop and resize)"),
    ("/sdapi/v1/img2img", {**IMG2IMG, "init_images": [b64(PNG)], "mask": b64(MASK), "inpainting_fill": 7}, 400,
     "inpainting_fill must be one of 0 (fill), 1 (original)"),
    ("/sdapi/v1/txt2img", {**IMG2IMG, "width": 256, "height": 256, "enable_hr": True, "hr_scale": 8}, 400,
     "the hires fix would make a 2048x2048 picture; this server's largest side is 1024 px"),
    ("/sdapi/v1/txt2img", {**IMG2IMG, "enable_hr": True, "hr_upscaler": "R-ESRGAN 4x+"}, 400,
     "unknown hires upscaler"),
    ("/sdapi/v1/txt2img", {**IMG2IMG, "enable_hr": True, "hr_prompt": "another"}, 400, "hr_prompt: the hires pass"),
    ("/sdapi/v1/txt2img", {**IMG2IMG, "enable_hr": True, "hr_second_pass_steps": 151}, 400,
     "hr_second_pass_steps must be from 0 (as steps) to 150"),
    ("/api/jobs", {**IMG2IMG, "init_image": "/etc/passwd"}, 400,
     "init_image must be base64-encoded image bytes (plain or a data:image/...;base64, URL); the server never opens"),
    ("/api/jobs", {**IMG2IMG, "init_image": b64(PNG), "outpaint": [1, 2, 3]}, 400, "outpaint must be a list of four"),
    ("/api/jobs", {**IMG2IMG, "init_image": b64(PNG), "outpaint": [0, -1, 0, 0]}, 400, "outpaint must be a list"),
    ("/api/jobs", {**IMG2IMG, "mask": b64(MASK)}, 400, "a mask needs an init image"),
    ("/api/jobs", {**IMG2IMG, "init_image": b64(PNG), "inpainting_fill": 0}, 400, "inpainting_fill must be a string"),
    ("/api/jobs", {"prompt": "x", "init_image": b64(png(noise_image(1040, 16)))}, 400,
     "width and height (the init image's size, grown by the outpainting, unless given) must be from 16 to 1024"),
    ("/api/jobs", {**IMG2IMG, "init_image": b64(PNG), "denoising_strength": 0}, 400, "strength 0.0 runs no step of 2"),
    ("/api/jobs", {**SMALL, "prompt": "x", "padding": "x" * (1 << 20)}, 413, "over 1 MiB without an image in it"),
])
def test_bad_requests_get_a_4xx_with_one_line(server, path, body, code, pattern):
    """Each refused with one line, and nothing left behind: no job, no kept upload."""
    url, queue = server
    before = len(queue.recent(10_000))
    got, answer = call(f"{url}{path}", body)
    assert got == code, answer
    message = error_message(path, answer)
    assert pattern in message and "\n" not in message and "Traceback" not in message
    assert len(queue.recent(10_000)) == before and not list(queue.uploads.folder.iterdir())


def error_message(path: str, answer: dict) -> str:
    """A refusal's one line: {"error": LINE}, or under /v1/ OpenAI's {"error": {"message": LINE, "type": ...}}."""
    if path.startswith("/v1/"):
        assert answer["error"]["type"] == "invalid_request_error", answer
        return answer["error"]["message"]
    return answer["error"]


@pytest.mark.parametrize("path", ["/sdapi/v1/txt2img", "/v1/images/generations", "/api/jobs/x/cancel"])
def test_a_huge_body_is_refused_before_it_is_read(server, path):
    """1 MiB on every route that takes no image (those that do: test_server_img2img.py)."""
    url, _ = server
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.putrequest("POST", path)
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", str(2 << 20))
    connection.endheaders()  # the 2 MiB never follow: the answer must not wait for them
    response = connection.getresponse()
    message = error_message(path, json.loads(response.read()))
    assert response.status == 413 and message.startswith("request body over 1 MiB (48 MiB on the routes that take")
    connection.close()


def _serve(model_dir, data_dir, port, log, *options):
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-m", "anima_rknn", "serve", "--model", str(model_dir), "--data-dir",
                             str(data_dir), "--port", str(port), "--checkpoint-every", "5", "--max-steps", "1000",
                             "--dtype", "fp32", *map(str, options)],  # fp32 as the in-process reference server
                            stderr=log)


def _wait_until(check, seconds=120):
    deadline = time.monotonic() + seconds
    while True:
        try:
            if check():
                return
        except (OSError, urllib.error.URLError):
            pass
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])  # a crash or power cut; a clean shutdown
def test_a_job_running_when_the_server_dies_resumes_after_a_restart(tiny_set, tmp_path, server, how):
    import signal

    url, _ = server
    request = {"prompt": "a cat", "width": 64, "height": 64, "steps": 150, "seed": 11}
    model_dir, data_dir, port = tiny_set.dit.parents[2], tmp_path / "data", _free_port()
    with open(tmp_path / "log.txt", "wb") as log:
        first = _serve(model_dir, data_dir, port, log)
        base = f"http://127.0.0.1:{port}"
        _wait_until(lambda: call(f"{base}/api/jobs")[0] == 200)
        job = call(f"{base}/api/jobs", request)[1]
        _wait_until(lambda: call(f"{base}/api/jobs/{job['id']}")[1]["step"] >= 12)
        first.send_signal(getattr(signal, how))
        first.wait(timeout=60)
        assert list(data_dir.glob("*.state")), "no checkpoint was left to resume from"
        second = _serve(model_dir, data_dir, port, log)
        try:
            _wait_until(lambda: call(f"{base}/api/jobs/{job['id']}")[1]["state"] == "completed", 300)
        finally:
            second.terminate()
            second.wait(timeout=60)
    # Bit-identical to the same job run without a break (on the module's own server).
    reference = call(f"{url}/api/jobs", request)[1]
    _wait_until(lambda: call(f"{url}/api/jobs/{reference['id']}")[1]["state"] == "completed", 300)
    resumed = Image.open(data_dir / f"{job['id']}.png")
    assert resumed.tobytes() == Image.open(io.BytesIO(call(f"{url}/api/jobs/{reference['id']}/image")[1])).tobytes()
    assert not list(data_dir.glob("*.state"))


def test_serve_runs_requests_on_the_subgraph_set_it_was_given(tiny_set, tmp_path):
    """serve --backend onnx --subgraphs DIR: the jobs run on that set (the record says so), one 64x64 request."""
    pytest.importorskip("onnxscript")
    from anima_rknn.export.onnx import export_subgraphs

    export_subgraphs(tiny_set.dit, 64, 64, tmp_path / "onnx", progress=False, overwrite=True)
    port = _free_port()
    with open(tmp_path / "log.txt", "wb") as log:
        process = _serve(tiny_set.dit.parents[2], tmp_path / "data", port, log, "--backend", "onnx",
                         "--subgraphs", tmp_path / "onnx")
        base = f"http://127.0.0.1:{port}"
        try:
            _wait_until(lambda: call(f"{base}/api/jobs")[0] == 200)
            job = call(f"{base}/api/jobs", {"prompt": "a cat", "width": 64, "height": 64, "steps": 3, "seed": 1})[1]
            _wait_until(lambda: call(f"{base}/api/jobs/{job['id']}")[1]["state"] in ("completed", "failed"), 300)
            status = call(f"{base}/api/jobs/{job['id']}")[1]
        finally:
            process.terminate()
            process.wait(timeout=60)
    assert status["state"] == "completed", status
    assert status["result"]["backend"] == "onnx" and status["result"]["finite"]


def test_with_credentials_every_api_needs_them(queue):
    with running(queue, api_key="s3cret", api_auth="ann:pw") as url:
        host, port = url.removeprefix("http://").split(":")
        assert call(f"{url}/api/jobs")[0] == 401
        assert call(f"{url}/sdapi/v1/txt2img", {"prompt": "x", **SMALL})[0] == 401
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{url}/v1", api_key="wrong").models.list()
        assert [m.id for m in openai.OpenAI(base_url=f"{url}/v1", api_key="s3cret").models.list()] == ["tiny"]
        api = webuiapi.WebUIApi(host=host, port=int(port))
        api.set_auth("ann", "pw")
        assert api.txt2img(prompt="x", seed=1, sampler_name="Euler", **SMALL).images[0].size == (64, 64)


def test_fifty_concurrent_mixed_requests_are_each_answered_once(server):
    """Bounded load on 127.0.0.1: every request gets a 200 or a 429, no job is lost or run twice, memory stays
    bounded and the server still works afterwards."""
    from concurrent.futures import ThreadPoolExecutor

    from anima_rknn.core.memory import status_bytes

    url, _ = server
    kinds = [("/api/jobs", {"prompt": "a cat", **SMALL}), ("/sdapi/v1/txt2img", {"prompt": "a dog", **SMALL}),
             ("/v1/images/generations", {"prompt": "a fox", "size": "64x64", "steps": 2})]
    before = status_bytes("VmRSS")
    with ThreadPoolExecutor(max_workers=50) as pool:
        answers = list(pool.map(lambda i: (i % 3, *call(f"{url}{kinds[i % 3][0]}", kinds[i % 3][1])), range(50)))
    assert {code for _, code, _ in answers} <= {200, 429} and any(code == 429 for _, code, _ in answers)
    submitted = [body["id"] for kind, code, body in answers if kind == 0 and code == 200]
    assert len(submitted) == len(set(submitted))
    for job_id in submitted:
        _wait_until(lambda job_id=job_id: call(f"{url}/api/jobs/{job_id}")[1]["state"] == "completed")
    assert all(len(body["images"]) == 1 for kind, code, body in answers if kind == 1 and code == 200)
    assert all(len(body["data"]) == 1 for kind, code, body in answers if kind == 2 and code == 200)
    assert status_bytes("VmRSS") - before < 512 * 2**20
    assert call(f"{url}/sdapi/v1/txt2img", {"prompt": "still here", "seed": 1, **SMALL})[0] == 200


def test_a_batch_that_does_not_fit_the_queue_is_refused_whole(queue):
    before = len(queue.recent(10_000))
    with running(queue) as url:
        code, answer = call(f"{url}/sdapi/v1/txt2img", {"prompt": "x", "batch_size": 5, **SMALL})  # queue holds 4
    assert code == 429 and "5 asked for" in answer["error"]
    assert len(queue.recent(10_000)) == before  # nothing of it was queued
