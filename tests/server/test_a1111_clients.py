"""The A1111 API as WebUI's own client (the real webuiapi, with its defaults) meets it: the LoRA list, interrupt
(the image as far as it got), the fields this server does not implement, the model's own size by default."""

from __future__ import annotations

import pytest
from lora_files import comfy, random_pairs, write_lora
from test_server import running

from anima_rknn.core.tensorfile import save_tensors
from anima_rknn.model.io import read_dit_config

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
