"""LoRAs over HTTP: picked by name from the server's --lora-dir (WebUI prompt tags or the native "loras"), never
by path; what is not in the folder is a 400 with one line."""

from __future__ import annotations

import pytest
from lora_files import comfy, random_pairs, write_lora
from test_server import SMALL, call, running

from anima_rknn.model.io import read_dit_config

webuiapi = pytest.importorskip("webuiapi")


@pytest.fixture(scope="module")
def lora_server(queue, tiny_set, tmp_path_factory):
    folder = tmp_path_factory.mktemp("loras")
    write_lora(folder / "style.safetensors", comfy(random_pairs(read_dit_config(tiny_set.dit), seed=1, strength=1.0)))
    (folder.parent / "outside.safetensors").write_bytes((folder / "style.safetensors").read_bytes())
    with running(queue, lora_dir=folder) as url:
        yield url


def test_webui_prompt_tags_apply_the_named_lora(lora_server):
    host, port = lora_server.removeprefix("http://").split(":")
    api = webuiapi.WebUIApi(host=host, port=int(port))
    plain = api.txt2img(prompt="a red circle", seed=5, cfg_scale=4, sampler_name="Euler", **SMALL)
    styled = api.txt2img(prompt="a red circle <lora:style:0.7>", seed=5, cfg_scale=4, sampler_name="Euler", **SMALL)
    assert plain.images[0].tobytes() != styled.images[0].tobytes()
    text = styled.images[0].info["parameters"]
    assert text.startswith("a red circle <lora:style:0.7>\n") and 'Lora hashes: "style: ' in text


def test_native_api_takes_loras_by_name_and_never_shows_paths(lora_server):
    code, job = call(f"{lora_server}/api/jobs", {"prompt": "a red circle", "loras": [{"name": "style", "scale": 0.5}],
                                                 **SMALL})
    assert code == 200, job
    assert job["params"]["loras"] == [{"name": "style", "scale": 0.5}]


@pytest.mark.parametrize("body, message", [
    ({"prompt": "x <lora:missing:1>"}, "LoRA 'missing': no missing.safetensors in"),
    ({"prompt": "x <lora:../outside:1>"}, "is not a plain file name"),
    ({"prompt": "x", "loras": [{"name": "/etc/passwd"}]}, "is not a plain file name"),
    ({"prompt": "x", "loras": [{"path": "style.safetensors"}]}, 'loras must be a list of {"name"'),
    ({"prompt": "x", "loras": [{"name": "style", "scale": "strong"}]}, "scale must be a finite number"),
])  # fmt: skip
def test_loras_not_in_the_folder_are_refused(lora_server, body, message):
    code, answer = call(f"{lora_server}/sdapi/v1/txt2img", {**body, **SMALL})
    assert code == 400 and message in str(answer), answer
