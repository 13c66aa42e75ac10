"""Image-to-image jobs in a batch: init_image / mask keys as paths relative to the jobs file, read once and carried
with the job (a Ray worker gets the bytes), a bad image failing its line, the same image at another path being
the same job, and `anima-rknn batch` making them as `generate` does."""

from __future__ import annotations

import hashlib
import json
import pickle
import re
import shutil
import sys

import numpy as np
import pytest
from PIL import Image

from anima_rknn.batch.jobs_file import name_jobs, prepare_jobs, read_jobs
from anima_rknn.batch.results import RESULTS, Outcome, Results
from anima_rknn.cli import main
from anima_rknn.errors import AnimaError
from anima_rknn.generation.params import GenerationParams
from anima_rknn.generation.pipeline import AnimaPipeline

DEFAULTS = GenerationParams(prompt="", width=64, height=64, steps=4, seed=7)
PRINTS = {"dit": "a", "text_encoder": "b", "vae": "c", "subgraphs": None}


def _picture(path, width=64, height=64, seed=0):
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def _mask(path, width=64, height=64):
    mask = Image.new("L", (width, height), 0)
    mask.paste(255, (0, 0, width // 2, height))
    mask.save(path)
    return path


def _jobs_file(path, lines) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def test_image_paths_are_relative_to_the_jobs_file_not_the_working_folder(tmp_path, monkeypatch):
    image = _picture(tmp_path / "jobs" / "pictures" / "a.png")
    elsewhere = _picture(tmp_path / "elsewhere" / "b.png", seed=1)
    path = _jobs_file(tmp_path / "jobs" / "j.jsonl", [{"prompt": "cat", "init_image": "pictures/a.png"},
                                                      {"prompt": "cat", "init_image": str(elsewhere),
                                                       "mask": str(_mask(tmp_path / "m.png"))}])
    monkeypatch.chdir(tmp_path / "elsewhere")
    first, second = read_jobs(path, DEFAULTS)
    assert first.params.init_image.name == str(image) and first.params.init_image.data == image.read_bytes()
    assert second.params.init_image.data == elsewhere.read_bytes()  # absolute paths are taken as they are
    assert second.params.mask.sha256 == hashlib.sha256((tmp_path / "m.png").read_bytes()).hexdigest()
    assert first.settings()["init_image"] == {"name": str(image),
                                              "sha256": hashlib.sha256(image.read_bytes()).hexdigest()}


def test_one_copy_of_an_image_s_bytes_for_every_job_that_uses_it(tmp_path):
    _picture(tmp_path / "a.png")
    shutil.copy(tmp_path / "a.png", tmp_path / "copy.png")
    path = _jobs_file(tmp_path / "j.jsonl", [{"prompt": "cat", "init_image": "a.png"},
                                             {"prompt": "dog", "init_image": "./a.png"},
                                             {"prompt": "cow", "init_image": "copy.png"}])
    jobs = read_jobs(path, DEFAULTS, [1, 2])
    assert len(jobs) == 6 and len({id(job.params.init_image.data) for job in jobs}) == 1
    assert jobs[-1].params.init_image.name == str(tmp_path / "copy.png")  # each named by its own path


@pytest.mark.parametrize("line, message", [
    ({"init_image": "missing.png"}, "line 2: init_image: image {folder}/missing.png: no such file"),
    ({"init_image": "."}, "line 2: init_image: image {folder}: a folder, not a file"),
    ({"init_image": 5}, "line 2: init_image must be an image file's path (relative to the jobs file's folder), "
                        "got 5"),
    ({"init_image": ""}, "line 2: init_image must be an image file's path"),
    ({"init_image": "a.png", "mask": ["m.png"]}, "line 2: mask must be an image file's path"),
    ({"init_image": {"name": "a.png", "sha256": "0" * 64}}, "line 2: init_image a.png: the file's sha256 is "),
    ({"mask": "a.png"}, "line 2: a mask needs an init image (--init-img)"),
    ({"init_image": "a.png", "strength": 2}, "line 2: strength must be a finite number from 0 to 1"),
])
def test_a_bad_image_fails_its_line(tmp_path, line, message):
    _picture(tmp_path / "a.png")
    path = _jobs_file(tmp_path / "j.jsonl", [{"prompt": "fine"}, {"prompt": "cat", **line}])
    with pytest.raises(AnimaError, match="^" + re.escape(f"{path} {message.format(folder=tmp_path)}")):
        read_jobs(path, DEFAULTS)


def test_a_file_that_is_no_picture_fails_its_line_before_anything_runs(tmp_path, tiny_set):
    (tmp_path / "notes.png").write_text("no picture")
    _picture(tmp_path / "small.png", 32, 32)
    path = _jobs_file(tmp_path / "j.jsonl", [{"prompt": "cat", "init_image": "small.png"},
                                             {"prompt": "cat", "init_image": "small.png", "mask": "notes.png"}])
    jobs = read_jobs(path, DEFAULTS)
    with pytest.raises(AnimaError, match=f"^{path} line 2: image {tmp_path}/notes.png: not an image"):
        prepare_jobs(jobs, AnimaPipeline(tiny_set), path)


def test_the_same_image_at_another_path_is_the_same_job(tmp_path):
    _picture(tmp_path / "one" / "a.png")
    _picture(tmp_path / "two" / "deeper" / "b.png")  # the same bytes (seed 0)
    _picture(tmp_path / "two" / "c.png", seed=5)
    first = read_jobs(_jobs_file(tmp_path / "one" / "j.jsonl", [{"prompt": "cat", "init_image": "a.png"}]),
                      DEFAULTS)
    second = read_jobs(_jobs_file(tmp_path / "two" / "j.jsonl", [{"prompt": "cat", "init_image": "deeper/b.png"},
                                                                 {"prompt": "cat", "init_image": "c.png"}]), DEFAULTS)
    name_jobs(first, lambda params: PRINTS)
    name_jobs(second, lambda params: PRINTS)
    assert first[0].id == second[0].id != second[1].id
    assert first[0].settings()["init_image"]["name"] != second[0].settings()["init_image"]["name"]
    # A folder made by the first batch has the second's job done.
    results = Results(tmp_path / "out", first, overwrite=False)
    results.add(first[0], Outcome(first[0].id, "here", 1.0, png=b"a picture", summary={"image": first[0].image}))
    assert Results(tmp_path / "out", second, overwrite=False).done(second[0])
    # Twice in one file, it is refused as every repeated job is.
    twice = read_jobs(_jobs_file(tmp_path / "t.jsonl", [{"prompt": "cat", "init_image": "one/a.png"},
                                                        {"prompt": "cat", "init_image": "two/deeper/b.png"}]),
                      DEFAULTS)
    with pytest.raises(AnimaError, match="line 2 repeats the job of line 1"):
        name_jobs(twice, lambda params: PRINTS)


def test_a_record_s_params_are_a_job_line_again_while_the_file_is_unchanged(tmp_path):
    image = _picture(tmp_path / "a.png")
    path = _jobs_file(tmp_path / "j.jsonl", [{"prompt": "cat", "init_image": "a.png", "seed": 3}])
    settings = read_jobs(path, DEFAULTS)[0].settings()
    again = read_jobs(_jobs_file(tmp_path / "again.jsonl", [settings]), GenerationParams(prompt=""))[0]
    assert again.settings() == settings
    _picture(image, seed=9)  # changed since
    with pytest.raises(AnimaError, match="the file has changed since"):
        read_jobs(str(tmp_path / "again.jsonl"), GenerationParams(prompt=""))


def test_a_job_with_its_own_init_image_is_its_size_unless_the_command_line_says(tmp_path):
    _picture(tmp_path / "wide.png", 72, 40)
    path = _jobs_file(tmp_path / "j.jsonl", [{"prompt": "cat", "init_image": "wide.png"},
                                             {"prompt": "cat", "init_image": "wide.png", "outpaint": [16, 0, 16, 8]},
                                             {"prompt": "cat", "init_image": "wide.png", "width": 32},
                                             {"prompt": "cat"}])
    sizes = [(job.params.width, job.params.height) for job in read_jobs(path, DEFAULTS)]
    assert sizes == [(64, 32), (96, 48), (32, 32), (64, 64)]  # multiples of 16; the last without an image
    fixed = [(job.params.width, job.params.height) for job in read_jobs(path, DEFAULTS, sides_set=["width"])]
    assert fixed == [(64, 32), (64, 48), (32, 32), (64, 64)]


def test_a_job_travels_with_its_image_s_bytes(tmp_path):
    """Ray pickles a job to send it to a worker, maybe on a machine without the file."""
    _picture(tmp_path / "a.png")
    _mask(tmp_path / "m.png")
    (job,) = read_jobs(_jobs_file(tmp_path / "j.jsonl", [{"prompt": "cat", "init_image": "a.png", "mask": "m.png"}]),
                       DEFAULTS)
    name_jobs([job], lambda params: PRINTS)
    (tmp_path / "a.png").unlink()
    sent = pickle.loads(pickle.dumps(job))
    assert sent.params == job.params and sent.id == job.id
    assert sent.params.init_image.data == job.params.init_image.data and sent.params.mask.data is not None
    assert sent.params.init_image.open().size == (64, 64)


# ---- the command --------------------------------------------------------------------------------------------

@pytest.fixture
def run_cli(capsys, monkeypatch):
    """`anima-rknn ARGS` in this process through the real entry point: (exit code, stderr)."""

    def run(*args):
        monkeypatch.setattr(sys, "argv", ["anima-rknn", *map(str, args)])
        try:
            main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        return code, capsys.readouterr().err

    return run


@pytest.fixture
def model_dir(tiny_set):
    return tiny_set.dit.parents[2]

def test_batch_makes_image_to_image_jobs_as_generate_does(run_cli, model_dir, tmp_path, monkeypatch, one_thread):
    folder = tmp_path / "jobs"
    _picture(folder / "pictures" / "a.png", 32, 32)
    _mask(folder / "pictures" / "m.png", 32, 32)
    jobs = _jobs_file(folder / "jobs.jsonl", [
        {"prompt": "a red circle", "init_image": "pictures/a.png", "strength": 0.5, "seed": 1},
        {"prompt": "a red circle", "init_image": "pictures/a.png", "mask": "pictures/m.png", "seed": 2},
    ])
    monkeypatch.chdir(tmp_path)  # not the jobs file's folder
    code, err = run_cli("batch", jobs, "--model", model_dir, "--steps", "4", "--out", "out")
    assert code == 0, err
    records = [json.loads(line) for line in (tmp_path / "out" / RESULTS).read_text().splitlines()]
    assert [(r["seed"], r["image_size"], r["passes"][0]["steps_run"]) for r in records] == [
        (1, [32, 32], 2), (2, [32, 32], 3)]
    assert records[0]["init_image"]["name"] == str(folder / "pictures" / "a.png")
    assert records[1]["mask"]["sha256"] == hashlib.sha256((folder / "pictures" / "m.png").read_bytes()).hexdigest()
    with Image.open(tmp_path / "out" / records[0]["image"]) as image:
        assert image.size == (32, 32) and "Denoising strength: 0.5" in image.text["parameters"]
    with Image.open(tmp_path / "out" / records[1]["image"]) as image:
        assert "Mask blur: 4" in image.text["parameters"]
    alone = run_cli("generate", "--model", model_dir, "-p", "a red circle", "--steps", "4", "--seed", "1",
                    "--init-img", folder / "pictures" / "a.png", "--strength", "0.5", "-o", tmp_path / "alone.png")
    assert alone[0] == 0, alone[1]
    assert (tmp_path / "out" / records[0]["image"]).read_bytes() == (tmp_path / "alone.png").read_bytes()
    # Moved elsewhere, the same pictures are the same jobs: nothing to do.
    shutil.move(folder, tmp_path / "moved")
    again = run_cli("batch", tmp_path / "moved" / "jobs.jsonl", "--model", model_dir, "--steps", "4", "--out", "out")
    assert again[0] == 0 and "2 jobs: 2 done before, 0 to run" in again[1]


def test_batch_refuses_a_bad_image_path_in_one_line_and_writes_nothing(run_cli, model_dir, tmp_path):
    _picture(tmp_path / "a.png", 32, 32)
    jobs = _jobs_file(tmp_path / "jobs.jsonl", [{"prompt": "cat", "init_image": "a.png"},
                                                {"prompt": "cat", "init_image": "b.png"}])
    code, err = run_cli("batch", jobs, "--model", model_dir, "--steps", "4", "--out", tmp_path / "out")
    assert code == 1 and "Traceback" not in err
    assert err.strip() == f"error: {jobs} line 2: init_image: image {tmp_path}/b.png: no such file"
    assert not (tmp_path / "out").exists()
