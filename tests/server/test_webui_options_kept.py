"""WebUI's options kept in the server's data folder (issue 44): written through the atomic writer, the current
model with them, and read back at the next start; an options file the server cannot take (issue 46's hostile
input) is one warning line, moved aside, and the server starts from WebUI's defaults."""

from __future__ import annotations

import json
import logging

import pytest
from test_server import call, running

from anima_rknn.generation.pipeline import AnimaPipeline
from anima_rknn.server.job_queue import JobQueue
from anima_rknn.server.runtime import Server
from anima_rknn.server.store import StoreError
from anima_rknn.server.webui_options import (
    MAX_OPTIONS_BYTES,
    MODEL,
    OPTIONS_FILE,
    WEBUI_OPTIONS,
)

FIRST, SECOND = "anima-tiny-random", "anima-second"


@pytest.fixture(scope="module")
def pipeline(tiny_set):
    return AnimaPipeline(tiny_set)


@pytest.fixture()
def start(pipeline, tiny_set, second_set, tmp_path):
    """A server's start over one data folder (a new queue and runtime each call, as a restart makes them)."""
    def started() -> Server:
        queue = JobQueue(pipeline, tmp_path / "data", models={FIRST: tiny_set, SECOND: second_set})
        return Server(queue)
    return started


def test_options_and_the_current_model_are_kept_for_the_next_start(start):
    server = start()
    with running(server.queue) as url:  # through the API, as a client writes them
        assert call(f"{url}/sdapi/v1/options", {"send_seed": False, "jpeg_quality": 95,
                                                 MODEL: SECOND}) == (200, None)
    kept = json.loads((server.queue.data_dir / OPTIONS_FILE).read_text())
    assert kept["send_seed"] is False and kept[MODEL].startswith(f"{SECOND}.safetensors [")
    again = start()
    assert again.models.current.name == SECOND and again.options.values["send_seed"] is False
    assert again.options.values["jpeg_quality"] == 95 and again.options.values["samples_format"] == "png"


def test_a_request_that_keeps_its_model_is_kept_too(start):
    server = start()
    server.set_current(server.models.find(SECOND))
    assert start().models.current.name == SECOND


def test_a_saved_model_no_longer_served_starts_on_the_first_in_one_line(start, tmp_path, caplog):
    start()
    (tmp_path / "data" / OPTIONS_FILE).write_text(json.dumps({MODEL: "gone.safetensors [0123456789]",
                                                              "send_seed": False}))
    with caplog.at_level(logging.WARNING, "anima_rknn.server.runtime"):
        server = start()
    assert server.models.current.name == FIRST and server.options.values["send_seed"] is False
    assert [r.getMessage() for r in caplog.records if "not served now" in r.getMessage()] != []
    assert (tmp_path / "data" / OPTIONS_FILE).is_file()  # a model not served now is no fault of the file


def test_an_options_file_that_cannot_be_written_changes_nothing(start, tmp_path):
    server = start()
    (tmp_path / "data" / OPTIONS_FILE).mkdir()  # in the way of the rename that publishes the file
    with pytest.raises(StoreError, match="cannot keep its options now") as refused:
        server.write_options({"send_seed": False, MODEL: SECOND})
    assert str(tmp_path) not in str(refused.value)
    assert server.options.values["send_seed"] is True and server.models.current.name == FIRST


HOSTILE = {
    "not JSON": b"{\"send_seed\": fal",
    "not UTF-8": b"\xff\xfe{}",
    "an array": b"[1, 2]",
    "an unknown key": b'{"__proto__": {"x": 1}}',
    "a wrong type": b'{"send_seed": "yes"}',
    "NaN": b'{"jpeg_quality": NaN}',
    "a refused value": b'{"CLIP_stop_at_last_layers": 2}',
    "a model that is not text": b'{"sd_model_checkpoint": ["x"]}',
    "too deep": b"[" * 100_000 + b"]" * 100_000,
    "too large": b'{"samples_filename_pattern": "' + b"x" * MAX_OPTIONS_BYTES + b'"}',
}


@pytest.mark.parametrize("content", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_options_file_is_one_line_moved_aside_and_defaults_are_used(start, tmp_path, caplog, content):
    start()
    path = tmp_path / "data" / OPTIONS_FILE
    path.write_bytes(content)
    with caplog.at_level(logging.WARNING, "anima_rknn.server.webui_options"):
        server = start()
    lines = [r.getMessage() for r in caplog.records if OPTIONS_FILE in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0] and "moved to webui-options.json.bad" in lines[0], lines
    assert server.options.values == {key: value for key, value in WEBUI_OPTIONS.items() if key != MODEL}
    assert server.models.current.name == FIRST and not path.exists()
    assert path.with_name(OPTIONS_FILE + ".bad").read_bytes() == content
    server.write_options({"send_seed": False})  # and the next write keeps the options again
    assert start().options.values["send_seed"] is False


def test_an_options_file_that_is_a_link_is_never_followed(start, tmp_path, caplog):
    start()
    theirs = tmp_path / "theirs.json"
    theirs.write_text(json.dumps({"send_seed": False}))
    (tmp_path / "data" / OPTIONS_FILE).symlink_to(theirs)
    with caplog.at_level(logging.WARNING, "anima_rknn.server.webui_options"):
        server = start()
    assert server.options.values["send_seed"] is True and "not a regular file" in caplog.text
    server.write_options({"jpeg_quality": 90})
    assert json.loads(theirs.read_text()) == {"send_seed": False}  # the link's target is untouched
    assert (tmp_path / "data" / (OPTIONS_FILE + ".bad")).is_symlink()
