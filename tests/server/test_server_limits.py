"""The server's limits under hostile input (issue 46): non-picture entries, pictures whose resizes would explode,
a data folder with links in it, LoRA errors without server paths, a full disk (507), and large bodies beyond
what it reads at once (503 with Retry-After) while /progress keeps answering."""

from __future__ import annotations

import contextlib
import io
import os
import socket
import sys
import threading
import time
import urllib.request
from urllib.parse import urlsplit

import pytest
from PIL import Image
from test_server import IMG2IMG, PNG, SMALL, b64, call, noise_image, png, running

from anima_rknn.errors import AnimaError
from anima_rknn.generation.images import ImageInput
from anima_rknn.generation.pipeline import AnimaPipeline
from anima_rknn.server.job_queue import JobQueue
from anima_rknn.server.requests import MAX_BODY_BYTES, MAX_LARGE_BODIES
from anima_rknn.server.uploads import INPUTS

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "core"))
from test_full_disk import fill, small_disk


@pytest.fixture(scope="module")
def pipeline(tiny_set):
    return AnimaPipeline(tiny_set)


@pytest.fixture(scope="module")
def url(queue):
    with running(queue) as address:
        yield address


def _png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.mark.parametrize("entry", [None, 7, "", {"image": "x"}])
def test_an_init_images_entry_that_is_not_a_picture_is_a_400(url, entry):
    code, answer = call(f"{url}/sdapi/v1/img2img", {**IMG2IMG, "init_images": [entry]})
    assert code == 400 and answer["error"].startswith("init_images[0] must be base64-encoded image bytes, got "), answer


@pytest.mark.parametrize("size, words", [
    ((1, 65535), "has a side over 16384 px, refused before decoding"),
    ((1, 16384), "would make a 128x2097152 picture on the way, over 67108864 pixels"),
])
def test_a_picture_whose_resize_would_explode_is_a_400_naming_the_limit(url, size, words):
    started = time.monotonic()
    code, answer = call(f"{url}/sdapi/v1/img2img", {**IMG2IMG, "width": 128, "init_images": [b64(_png(*size))],
                                                    "resize_mode": 1})
    assert code == 400 and words in answer["error"] and "\n" not in answer["error"], answer
    assert time.monotonic() - started < 10  # refused from the header, not after a decode


def test_a_missing_lora_is_named_without_the_servers_folder(queue, tmp_path):
    lora_dir = tmp_path / "secret-place" / "loras"
    lora_dir.mkdir(parents=True)
    with running(queue, lora_dir=lora_dir) as address:
        code, answer = call(f"{address}/sdapi/v1/txt2img", {"prompt": "x <lora:nope:1>", **SMALL})
    assert code == 400 and "nope.safetensors" in answer["error"] and "secret-place" not in answer["error"], answer


def test_a_linked_inputs_folder_is_refused_at_start_and_never_emptied(pipeline, tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "keep.txt").write_text("mine")
    data = tmp_path / "data"
    JobQueue(pipeline, data)  # a real data folder, then its inputs swapped for a link
    (data / INPUTS).rmdir()
    (data / INPUTS).symlink_to(theirs)
    with pytest.raises(AnimaError, match=r"inputs is a symbolic link; the server follows no links in its data"):
        JobQueue(pipeline, data)
    (data / INPUTS).unlink()
    (data / INPUTS).write_text("a file")
    with pytest.raises(AnimaError, match=r"inputs is not a folder"):
        JobQueue(pipeline, data)
    assert (theirs / "keep.txt").read_text() == "mine"


def test_inputs_replaced_by_a_link_while_serving_are_not_emptied_through_it(pipeline, tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "keep.img").write_text("mine")
    queue = JobQueue(pipeline, tmp_path / "data")
    (queue.uploads.folder).rmdir()
    queue.uploads.folder.symlink_to(theirs)
    queue._remove_unused_inputs()  # what every finished job with an upload runs
    assert (theirs / "keep.img").read_text() == "mine"
    with running(queue) as address:
        code, answer = call(f"{address}/sdapi/v1/img2img", {**IMG2IMG, "init_images": [b64(PNG)]})
    assert code == 503 and "not a plain folder" in answer["error"], answer
    assert sorted(p.name for p in theirs.iterdir()) == ["keep.img"]


def test_a_disk_without_room_for_the_picture_is_a_507_and_the_server_runs_on(pipeline, tmp_path):
    with small_disk(tmp_path / "data", "1m") as data:
        queue = JobQueue(pipeline, data)
        fill(data / "filler", leave=200 << 10)
        with running(queue) as address:
            code, answer = call(f"{address}/sdapi/v1/txt2img", {"prompt": "x", "width": 512, "height": 512,
                                                                  "steps": 1})
            assert code == 507 and answer["error"].startswith("the server's disk is full: 1 job(s) need about "), answer
            assert str(data) not in answer["error"]
            assert call(f"{address}/sdapi/v1/progress")[0] == 200


@contextlib.contextmanager
def _half_sent(address: str, size: int):
    """An img2img request whose headers promise `size` bytes, of which only the first few are sent (held open)."""
    host = urlsplit(address)
    sock = socket.create_connection((host.hostname, host.port))
    sock.sendall((f"POST /sdapi/v1/img2img HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {size}\r\n\r\n" + '{"init_images": ["').encode())
    try:
        yield sock
    finally:
        sock.close()


def test_large_bodies_beyond_the_bound_are_503_with_retry_after_and_progress_stays_fast(url):
    size = 20 << 20
    with contextlib.ExitStack() as stack:
        for _ in range(MAX_LARGE_BODIES):
            stack.enter_context(_half_sent(url, size))
        time.sleep(0.5)  # the server has taken both bodies' turns
        with _half_sent(url, size) as third:  # answered before its body is read
            third.settimeout(30)
            answer = ""
            while "large request bodies" not in answer and (part := third.recv(4096).decode()):
                answer += part
        assert answer.startswith("HTTP/1.1 503") and "retry-after: 2" in answer.lower(), answer
        assert "large request bodies" in answer
        started = time.monotonic()
        assert call(f"{url}/sdapi/v1/progress")[0] == 200
        assert time.monotonic() - started < 1.0
    deadline = time.monotonic() + 10  # the held bodies' turns come back once their clients are gone
    while call(f"{url}/sdapi/v1/img2img", {**IMG2IMG, "init_images": [b64(PNG)], "steps": 1})[0] == 503:
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_progress_answers_while_a_large_bodys_picture_is_decoded(url, monkeypatch):
    """The base64 and sha256 of an upload run off the event loop (issue 46): an img2img whose picture's decode is
    held inside ImageInput.from_bytes (the real one runs, after the test has looked) leaves /progress answering.
    Decoded on the loop, /progress would wait for the decode and the test would fail."""
    large = png(noise_image(1024, 1024))  # a body over requests.MAX_BODY_BYTES: the large bodies' path
    assert len(b64(large)) > MAX_BODY_BYTES
    inside, release = threading.Event(), threading.Event()
    from_bytes = ImageInput.from_bytes.__func__

    def held(cls, data, name="upload"):
        if len(data) == len(large):
            inside.set()
            release.wait(30)
        return from_bytes(cls, data, name)

    monkeypatch.setattr(ImageInput, "from_bytes", classmethod(held))
    answers = []
    sender = threading.Thread(target=lambda: answers.append(call(f"{url}/sdapi/v1/img2img", {
        **IMG2IMG, "init_images": [b64(large)], "steps": 1})))
    sender.start()
    try:
        assert inside.wait(60)
        started = time.monotonic()
        with urllib.request.urlopen(f"{url}/sdapi/v1/progress", timeout=10) as response:
            assert response.status == 200
        assert time.monotonic() - started < 5
    finally:
        release.set()
        sender.join(120)
    assert answers and answers[0][0] == 200, answers
