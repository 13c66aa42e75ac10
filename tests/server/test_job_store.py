"""The job store under hostile and damaged input, and its paging: what jobs.sqlite and the data folder hold is
read back as untrusted input; a bad row fails in one line and the server runs on."""

from __future__ import annotations

import json
import urllib.request

import pytest
from test_server import SMALL, call, running

from anima_rknn.generation.params import build
from anima_rknn.generation.pipeline import AnimaPipeline
from anima_rknn.server.jobs import JobQueue


@pytest.fixture(scope="module")
def pipeline(tiny_set):
    return AnimaPipeline(tiny_set)


@pytest.fixture
def idle(pipeline, tmp_path):
    """A queue whose worker never starts: jobs stay queued, in the order given."""
    return JobQueue(pipeline, tmp_path / "data", max_queue=16)


def test_the_job_list_is_paged_newest_first_with_the_total_in_a_header(idle):
    jobs = [idle.submit(build({"prompt": f"job {i}", **SMALL, "seed": i})) for i in range(5)]
    newest = [job.id for job in reversed(jobs)]
    with running(idle) as url:
        with urllib.request.urlopen(f"{url}/api/jobs?limit=2&offset=1") as response:
            assert response.headers["X-Total-Count"] == "5"
            assert [job["id"] for job in json.loads(response.read())] == newest[1:3]
        assert [job["id"] for job in call(f"{url}/api/jobs")[1]] == newest  # default: the 50 newest
        assert call(f"{url}/api/jobs?offset=5")[1] == []
        for query in ("limit=0", "limit=201", "limit=-1", "limit=2.5", "offset=-1", "offset=x", "limit=",
                      "limit=%EF%BC%93"):  # a full-width digit is no number here
            code, answer = call(f"{url}/api/jobs?{query}")
            assert code == 400 and "must be a whole number" in answer["error"], (query, answer)
