"""One running job queue on the tiny model per test module (each module serves it its own way)."""

from __future__ import annotations

import pytest

from anima_rknn.generation.pipeline import AnimaPipeline
from anima_rknn.server.job_queue import JobQueue


@pytest.fixture(scope="module")
def queue(tiny_set, tmp_path_factory):
    jobs = JobQueue(AnimaPipeline(tiny_set), tmp_path_factory.mktemp("server") / "data", max_queue=4)
    jobs.start()
    yield jobs
    jobs.close()


@pytest.fixture(scope="session")
def second_set(tmp_path_factory):
    """Another tiny model set (other weights), its DiT named anima-second and recording that it was trained at
    64x64, as the demo model's does: the second model of a server that serves two."""
    from safetensors.torch import load_file

    from anima_rknn.core.tensorfile import read_metadata, save_tensors
    from anima_rknn.demo.tiny_set import write_model_set
    from anima_rknn.model.io import IMAGE_SIZE_KEY
    from anima_rknn.model.model_set import resolve

    files = write_model_set(tmp_path_factory.mktemp("models") / "second", "tiny", seed=1)
    renamed = files.dit.with_name("anima-second.safetensors")
    save_tensors(load_file(files.dit), renamed, read_metadata(files.dit, "DiT") | {IMAGE_SIZE_KEY: "64"})
    files.dit.unlink()
    return resolve(files.dit.parents[2])


@pytest.fixture(scope="module")
def two(tiny_set, second_set, tmp_path_factory):
    """A running server of two models, anima-tiny-random (the first, the default) and anima-second."""
    from test_server import running

    jobs = JobQueue(AnimaPipeline(tiny_set), tmp_path_factory.mktemp("two") / "data", max_queue=8,
                    models={"anima-tiny-random": tiny_set, "anima-second": second_set})
    jobs.start()
    with running(jobs) as url:
        yield url, jobs
    jobs.close()
