"""The A1111 API as WebUI's own client (the real webuiapi, with its defaults) meets it: the LoRA list, interrupt
(the image as far as it got), the fields this server does not implement, the model's own size by default."""

from __future__ import annotations

import base64
import io
import json
import re
import threading
import time
import urllib.request

import pytest
from lora_files import comfy, random_pairs, write_lora
from PIL import Image
from test_server import SMALL, call, running

from anima_rknn.core.tensorfile import save_tensors
from anima_rknn.model.io import read_dit_config
from anima_rknn.server.a1111 import IGNORED_HEADER

webuiapi = pytest.importorskip("webuiapi")


def client(url: str) -> webuiapi.WebUIApi:
    host, port = url.removeprefix("http://").split(":")
    return webuiapi.WebUIApi(host=host, port=int(port))


def test_the_lora_list_names_the_files_of_the_lora_folder_never_its_path(queue, tiny_set, tmp_path):
    folder = tmp_path / "secret-folder-name"
    folder.mkdir()
    pairs = comfy(random_pairs(read_dit_config(tiny_set.dit), seed=1, strength=1.0))
    save_tensors(pairs, folder / "style.safetensors", metadata={"ss_output_name": "style-v1"})
    write_lora(folder / "plain.safetensors", pairs)
    (folder / "notes.txt").write_text("not a LoRA")
    (folder / "folder.safetensors").mkdir()  # not a file: a request could not use it either
    with running(queue, lora_dir=folder) as url:
        listed = client(url).get_loras()
    assert listed == [{"name": "plain", "alias": "plain", "path": "plain.safetensors", "metadata": {}},
                      {"name": "style", "alias": "style", "path": "style.safetensors",
                       "metadata": {"ss_output_name": "style-v1"}}]
    assert "secret-folder-name" not in str(listed)
    with running(queue) as url:  # no --lora-dir: none to pick
        assert client(url).get_loras() == []


@pytest.fixture(scope="module")
def server(queue):
    with running(queue) as url:
        yield url


def test_webuiapis_defaults_are_taken_and_the_unused_fields_reported(server):
    result = client(server).txt2img(prompt="a red circle", seed=5, **SMALL)  # every field webuiapi sends
    ignored = result.info["ignored_fields"]
    for field in ("styles", "subseed", "subseed_strength", "restore_faces", "tiling", "s_churn", "save_images",
                  "alwayson_scripts", "script_args"):
        assert field in ignored, field
    for field in ("prompt", "seed", "steps", "enable_hr", "hr_scale", "sampler_name", "eta", "batch_size"):
        assert field not in ignored, field  # read (the hires fields: with enable_hr false, as WebUI)
    request = urllib.request.Request(f"{server}/sdapi/v1/txt2img", method="POST", headers={
        "Content-Type": "application/json"}, data=json.dumps({"prompt": "x", "tiling": False, "colour": "red",
                                                              **SMALL}).encode())
    with urllib.request.urlopen(request, timeout=120) as response:
        assert response.headers[IGNORED_HEADER] == "tiling, colour"  # a misspelt field shows up too
        assert json.loads(json.loads(response.read())["info"])["ignored_fields"] == ["tiling", "colour"]


@pytest.mark.parametrize("fields, named", [
    ({"restore_faces": True}, "restore_faces true: face restoration"),
    ({"subseed_strength": 0.5}, "subseed_strength 0.5: variation seeds"),
    ({"tiling": True}, "tiling true: seamless tiling"),
    ({"styles": ["my style"]}, "styles [\"my style\"]: saved prompt styles"),
    ({"override_settings": {"CLIP_stop_at_last_layers": 2}}, "CLIP_stop_at_last_layers 2: clip skip"),
    ({"override_settings": {"sd_model_checkpoint": "other"}}, "sd_model_checkpoint 'other': no such model"),
    ({"script_name": "x/y/z plot"}, "script_name \"x/y/z plot\": scripts"),
    ({"alwayson_scripts": {"ControlNet": {"args": [{"enabled": True}]}}}, "alwayson_scripts"),
    ({"s_churn": 1.0}, "s_churn 1.0: churn"),
])  # fmt: skip
def test_a_field_asking_for_what_this_server_does_not_do_is_refused_naming_it(server, fields, named):
    with pytest.raises(RuntimeError, match="400") as refused:
        client(server).txt2img(prompt="x", **SMALL, **fields)
    assert named in json.loads(refused.value.args[1])["error"]


@pytest.mark.parametrize("fields, message", [
    ({"batch_size": -1}, "batch_size must be a whole number from 1, got -1"),
    ({"batch_size": 0}, "batch_size must be a whole number from 1, got 0"),
    ({"batch_size": 1.5}, "batch_size must be a whole number from 1, got 1.5"),
    ({"n_iter": "2.5"}, "n_iter must be a whole number from 1, got 2.5"),  # "2" is 2, as in WebUI
    ({"n_iter": "two"}, 'n_iter must be a whole number from 1, got "two"'),
    ({"batch_size": -2, "n_iter": -2}, "batch_size must be a whole number from 1, got -2"),  # product 4
    ({"batch_size": 3, "n_iter": 3}, "at most 8 images"),
    ({"batch_size": 10**12, "n_iter": 10**12}, "at most 8 images"),
])  # fmt: skip
def test_batch_counts_must_be_whole_numbers_from_one(server, fields, message):
    code, answer = call(f"{server}/sdapi/v1/txt2img", {"prompt": "x", **SMALL, **fields})
    assert code == 400 and message in answer["error"], answer


def test_txt2img_without_a_size_makes_the_models_own_size_and_its_preview_is_as_large(queue):
    with running(queue, native_size=64) as url:
        code, answer = call(f"{url}/sdapi/v1/txt2img", {"prompt": "x", "steps": 2})
        assert code == 200 and Image.open(io.BytesIO(base64.b64decode(answer["images"][0]))).size == (64, 64)
        code, job = call(f"{url}/api/jobs", {"prompt": "a cat", "steps": 150})
        while (progress := call(f"{url}/sdapi/v1/progress")[1])["current_image"] is None:
            time.sleep(0.02)
        queue.cancel(queue.get(job["id"]))
    preview = Image.open(io.BytesIO(base64.b64decode(progress["current_image"])))
    assert preview.size == (64, 64)  # the picture's own size (it was 32 px: 4x the 8-px latent)


def test_interrupt_answers_the_call_with_its_picture_as_far_as_it_got(server, queue):
    """As WebUI: the running txt2img returns (no 409, so webuiapi does not raise) with the running job's picture
    after its next step, marked interrupted; the call's job not begun is not made."""
    api, answer = client(server), {}
    call_thread = threading.Thread(target=lambda: answer.update(result=api.txt2img(
        prompt="a cat", seed=5, width=64, height=64, steps=150, n_iter=2)))
    call_thread.start()
    while call(f"{server}/sdapi/v1/progress")[1]["state"]["sampling_step"] < 2:
        time.sleep(0.02)
    api.interrupt()
    call_thread.join(120)
    result = answer["result"]
    assert len(result.images) == 1 and result.images[0].size == (64, 64) and result.info["interrupted"] is True
    step = int(re.search(r"Interrupted: step (\d+)/150", result.info["infotexts"][0]).group(1))
    assert 2 <= step < 150 and result.images[0].info["parameters"] == result.info["infotexts"][0]
    first, second = sorted(queue.recent(2), key=lambda job: job.created)
    assert first.state == "completed" and first.summary["interrupted"] == {"step": step, "total": 150}
    assert second.state == "cancelled" and second.step == 0
