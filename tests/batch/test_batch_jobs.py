"""The jobs file: JSONL and prompt lists, --seeds, the checks generate makes (line numbers in the message), ids."""

import dataclasses
import json
import re

import pytest

from anima_rknn.batch.jobs_file import job_id, name_jobs, read_jobs
from anima_rknn.errors import AnimaError
from anima_rknn.generation.params import GenerationParams

DEFAULTS = GenerationParams(prompt="", width=64, height=64, steps=4, seed=7)


def _file(tmp_path, name: str, lines: list) -> str:
    path = tmp_path / name
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return str(path)


def test_prompt_list_crossed_with_seeds(tmp_path):
    jobs = read_jobs(_file(tmp_path, "p.txt", ["a red circle", "", "  a blue square  "]), DEFAULTS, [3, 4])
    assert [(j.line, j.params.prompt, j.params.seed) for j in jobs] == [
        (1, "a red circle", 3), (1, "a red circle", 4), (3, "a blue square", 3), (3, "a blue square", 4)]
    assert all(j.params.steps == 4 and j.params.width == 64 for j in jobs)
    assert [j.params.seed for j in read_jobs(_file(tmp_path, "q.txt", ["cat"]), DEFAULTS)] == [7]


def test_jsonl_settings_over_defaults_seeds_only_where_none_given(tmp_path):
    path = _file(tmp_path, "j.jsonl", [{"prompt": "cat", "steps": 2, "cfg": 1, "cache_options": {}},
                                       {"prompt": "dog", "seed": 99, "negative": "blurry", "shift": 2.5}])
    jobs = read_jobs(path, DEFAULTS, [1, 2])
    assert [(j.line, j.params.prompt, j.params.seed, j.params.steps) for j in jobs] == [
        (1, "cat", 1, 2), (1, "cat", 2, 2), (2, "dog", 99, 4)]
    assert jobs[2].params.negative == "blurry" and jobs[2].params.shift == 2.5 and jobs[0].params.cfg == 1


def test_a_result_record_s_params_are_a_job_line(tmp_path):
    """The names of `generate --json`, the server's job status and results.jsonl's params are the jobs' names."""
    settings = read_jobs(_file(tmp_path, "a.jsonl", [{"prompt": "cat", "seed": 5}]), DEFAULTS)[0].settings()
    again = read_jobs(_file(tmp_path, "b.jsonl", [settings]), GenerationParams(prompt=""))[0]
    assert again.settings() == settings


@pytest.mark.parametrize("line, message", [
    ("{not json", "line 2: not valid JSON"),
    ('["cat"]', "line 2: a job is a JSON object, got list"),
    ('{"prompt": "cat", "colour": "red"}', "line 2: unknown key 'colour'; a job takes prompt, negative"),
    ('{"negative": "x"}', "line 2: the job has no prompt"),
    ('{"prompt": "cat", "steps": 0}', "line 2: steps must be an integer from 1 to 1000, got 0"),
    ('{"prompt": "cat", "width": 65}', "line 2: width and height must be positive multiples of 16"),
    ('{"prompt": "cat", "cfg": "high"}', "line 2: cfg must be a finite number"),
    ('{"prompt": "cat", "seed": -1}', "line 2: a batch job needs a fixed seed"),
    ('{"prompt": "cat", "cache": "spectrum", "cache_options": {"w": "x"}}', "line 2:"),
    ('{"prompt": 5}', "line 2: the prompt must be text, got int"),
])
def test_bad_lines_are_named_by_number(tmp_path, line, message):
    path = _file(tmp_path, "bad.jsonl", ['{"prompt": "fine"}', line])
    with pytest.raises(AnimaError, match="^" + re.escape(path) + ".*" + re.escape(message)):
        read_jobs(path, DEFAULTS)


def test_empty_or_unreadable_jobs_files(tmp_path):
    with pytest.raises(AnimaError, match="holds no job"):
        read_jobs(_file(tmp_path, "e.txt", ["", "   "]), DEFAULTS)
    with pytest.raises(AnimaError, match="not a regular file"):
        read_jobs(str(tmp_path / "missing.jsonl"), DEFAULTS)
    (tmp_path / "bin.txt").write_bytes(b"caf\xe9\n")
    with pytest.raises(AnimaError, match="not UTF-8"):
        read_jobs(str(tmp_path / "bin.txt"), DEFAULTS)


def test_ids_follow_settings_and_model_files_and_duplicates_are_refused(tmp_path):
    jobs = read_jobs(_file(tmp_path, "p.txt", ["cat", "dog"]), DEFAULTS, [1, 2])
    prints = {"dit": "a", "text_encoder": "b", "vae": "c", "subgraphs": None}
    name_jobs(jobs, lambda params: prints)
    assert len({j.id for j in jobs}) == 4 and all(len(j.id) == 16 for j in jobs)
    assert jobs[0].id == job_id(jobs[0].settings(), prints)
    assert job_id(jobs[0].settings(), {**prints, "dit": "other"}) != jobs[0].id  # another model: another job
    # The same options in another order are the same job.
    reordered = dataclasses.replace(jobs[0].params, cache_options={"b": 1, "a": 2})
    ordered = dataclasses.replace(jobs[0].params, cache_options={"a": 2, "b": 1})
    jobs[0].params, jobs[1].params = reordered, ordered
    assert job_id(jobs[0].settings(), prints) == job_id(jobs[1].settings(), prints)
    # A setting newer than job ids, at the value earlier versions meant, leaves the id as those versions made it:
    # a batch folder made before it is still found done.
    earlier = {name: value for name, value in jobs[2].settings().items() if name != "scheduler"}
    assert job_id(earlier, prints) == jobs[2].id
    assert job_id({**earlier, "scheduler": "karras"}, prints) != jobs[2].id
    twice = read_jobs(_file(tmp_path, "t.txt", ["cat", "dog", "cat"]), DEFAULTS)
    with pytest.raises(AnimaError, match="line 3 repeats the job of line 1"):
        name_jobs(twice, lambda params: prints)


def test_a_job_at_another_thread_count_is_another_job(tmp_path, one_thread):
    """The picture's last bits may depend on the threads, so the id holds them: the defaults' (the Python API's
    None: this process's torch threads, fixed here so that every worker runs them), or a line's own."""
    path = _file(tmp_path, "j.jsonl", [{"prompt": "cat"}, {"prompt": "cat", "threads": 2}])
    one, two = read_jobs(path, DEFAULTS)
    assert DEFAULTS.threads is None and (one.params.threads, two.params.threads) == (1, 2)
    prints = {"dit": "a", "text_encoder": "b", "vae": "c", "subgraphs": None}
    assert job_id(one.settings(), prints) != job_id(two.settings(), prints)
    on_two = read_jobs(_file(tmp_path, "p.txt", ["cat"]), dataclasses.replace(DEFAULTS, threads=2))[0]
    assert job_id(on_two.settings(), prints) == job_id(two.settings(), prints)
    with pytest.raises(AnimaError, match="line 1: threads must be an integer from 0 to 1024, got -1"):
        read_jobs(_file(tmp_path, "bad.jsonl", [{"prompt": "cat", "threads": -1}]), DEFAULTS)
