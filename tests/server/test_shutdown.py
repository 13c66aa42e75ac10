"""Stopping the server (SIGTERM or Ctrl-C end in JobQueue.close) while its job is inside a step: close() waits for
the step, however long it takes, and the job keeps its resume state for the next start. A 2048x2048 step takes over
60 s on a CPU; close() used to wait 60 s and return, and the process then aborted with SIGABRT, losing the state."""

from __future__ import annotations

import threading

from test_server import SMALL

from anima_rknn.generation.params import build
from anima_rknn.generation.pipeline import AnimaPipeline
from anima_rknn.generation.resume import default_state_path
from anima_rknn.server.job_queue import JobQueue


def test_close_waits_for_a_long_step_and_the_job_keeps_its_state(tiny_set, tmp_path):
    pipeline = AnimaPipeline(tiny_set)
    queue = JobQueue(pipeline, tmp_path / "data")
    inside, release = threading.Event(), threading.Event()
    on_step = queue.worker.on_step

    def long_step(job, event):
        # The worker's own step callback, held inside the run until the test lets go: a step as long as it wants.
        if event.step == 1:
            inside.set()
            release.wait()
        on_step(job, event)

    queue.worker.on_step = long_step
    # What close() waits with, watched (the real join runs): a wait with a timeout gives up on a step longer than
    # it, and a test cannot afford a step of 60 s to show it.
    waits, join = [], queue.worker._thread.join
    queue.worker._thread.join = lambda *args, **kwargs: waits.append((args, kwargs)) or join(*args, **kwargs)
    queue.start()
    job = queue.submit(build({"prompt": "a cat", **SMALL, "steps": 3, "seed": 7}))
    try:
        assert inside.wait(120), job.error
        closer = threading.Thread(target=queue.close)
        closer.start()
        closer.join(1)
        assert closer.is_alive() and queue.worker.is_alive()  # still waiting for the step, as it should
        assert waits == [((), {})]  # and for as long as the step takes: no timeout
    finally:
        release.set()
    closer.join(60)
    assert not closer.is_alive() and not queue.worker.is_alive()
    # Stopped at the step's end: queued again, with its state (one step done) for the next start to resume.
    state = default_state_path(queue.image_path(job))
    assert job.state == "queued" and state.is_file() and not queue.image_path(job).exists()
    again = JobQueue(pipeline, tmp_path / "data")
    assert again.get(job.id).state == "queued" and again.position(again.get(job.id)) is not None
