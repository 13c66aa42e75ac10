"""One running job queue on the tiny model per test module (each module serves it its own way)."""

from __future__ import annotations

import pytest

from anima_rknn.generation.pipeline import AnimaPipeline
from anima_rknn.server.jobs import JobQueue


@pytest.fixture(scope="module")
def queue(tiny_set, tmp_path_factory):
    jobs = JobQueue(AnimaPipeline(tiny_set), tmp_path_factory.mktemp("server") / "data", max_queue=4)
    jobs.start()
    yield jobs
    jobs.close()
