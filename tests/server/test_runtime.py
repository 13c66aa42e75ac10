"""The server's runtime (server/runtime.py) as its route families use it: only by public names, and a wait for a job
that wakes when the job ends, without polling."""

from __future__ import annotations

import ast
import asyncio
import selectors
import threading
import time
from pathlib import Path

import pytest

from anima_rknn.generation.params import build
from anima_rknn.server.runtime import wait_done
from anima_rknn.server.store import Job

SERVER_DIR = Path(__file__).resolve().parents[2] / "anima_rknn" / "server"


def _runtime_names(function: ast.AST) -> set[str]:
    """The names in `function` that hold the runtime or a part of it: a parameter annotated Server (or named
    server), and a name assigned from one of them (queue = server.queue)."""
    names = {arg.arg for arg in (*function.args.args, *function.args.kwonlyargs)
             if arg.arg == "server" or (arg.annotation is not None and "Server" in ast.unparse(arg.annotation))}
    for node in ast.walk(function):  # one level of aliases is what the routes use
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in names:
                names |= {target.id for target in node.targets if isinstance(target, ast.Name)}
    return names


def private_uses(source: str, module: str) -> list[str]:
    """`module:line name.attr` for every underscore attribute reached from the runtime in `source`."""
    found = []
    tree = ast.parse(source)
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        names = _runtime_names(function)
        for node in ast.walk(function):
            if not isinstance(node, ast.Attribute):
                continue
            chain, root = [node.attr], node.value
            while isinstance(root, ast.Attribute):
                chain.append(root.attr)
                root = root.value
            if isinstance(root, ast.Name) and root.id in names and any(part.startswith("_") for part in chain):
                found.append(f"{module}:{node.lineno} {root.id}.{'.'.join(reversed(chain))}")
    return sorted(set(found))


def route_modules() -> list[Path]:
    """The modules of server/ that take the runtime (every route family), but the runtime itself."""
    return [path for path in sorted(SERVER_DIR.glob("*.py"))
            if path.name != "runtime.py" and "server: Server" in path.read_text()]


def test_route_modules_use_only_the_runtimes_public_names():
    modules = route_modules()
    assert {"a1111.py", "openai.py", "native.py"} <= {path.name for path in modules}
    found = [use for path in modules for use in private_uses(path.read_text(), path.name)]
    assert found == [], "route modules call the runtime's private names:\n" + "\n".join(found)


def test_the_private_name_check_can_fail():
    source = ("def routes(server: Server):\n    queue = server.queue\n    server._wait([])\n"
              "    queue._lock\n    server.models.current\n")
    assert private_uses(source, "x.py") == ["x.py:3 server._wait", "x.py:4 queue._lock"]


class CountingSelector(selectors.DefaultSelector):
    """The event loop's selector, counting how often the loop wakes (each pass of the loop selects once)."""

    def __init__(self) -> None:
        super().__init__()
        self.passes = 0

    def select(self, timeout: float | None = None):
        self.passes += 1
        return super().select(timeout)


def _job() -> Job:
    return Job("0123456789abcdef", build({"prompt": "x", "width": 64, "height": 64, "steps": 2}), time.time())


def _waited(jobs: list[Job], end_after: list[float]) -> tuple[float, int]:
    """Seconds a wait for `jobs` took and the loop's passes meanwhile, each job ended from another thread after
    its delay in `end_after` (as the worker ends a job)."""
    selector = CountingSelector()
    loop = asyncio.SelectorEventLoop(selector)
    timers = [threading.Timer(delay, job.mark_done) for job, delay in zip(jobs, end_after, strict=True)]

    async def wait() -> float:
        started = time.monotonic()
        for timer in timers:
            timer.start()
        await wait_done(jobs)
        return time.monotonic() - started

    try:
        return loop.run_until_complete(wait()), selector.passes
    finally:
        loop.close()
        for timer in timers:
            timer.cancel()


def test_a_wait_returns_promptly_when_its_job_ends_and_never_polls():
    job = _job()
    seconds, passes = _waited([job], [1.0])
    assert job.done.is_set() and 1.0 <= seconds < 1.5, seconds
    # A wait that polled every 50 ms would pass through the loop about 20 times in that second; one woken by the
    # job passes a handful of times (start, the wake-up, the end).
    assert passes <= 6, passes


def test_a_wait_for_several_jobs_ending_out_of_order_and_one_ended_already():
    jobs = [_job(), _job(), _job()]
    jobs[2].mark_done()
    seconds, passes = _waited(jobs[:2], [0.6, 0.3])
    assert all(job.done.is_set() for job in jobs) and 0.6 <= seconds < 1.1 and passes <= 8, (seconds, passes)
    assert _waited([jobs[2]], [0.0])[0] < 0.2


def test_the_runtime_waits_without_sleeping():
    """No asyncio.sleep loop behind the wait (the old _wait polled an event every 50 ms)."""
    tree = ast.parse((SERVER_DIR / "runtime.py").read_text())
    sleeps = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr == "sleep"]
    assert sleeps == []


# ---- one run-and-collect, one failure mapping (docs/server-api.md) ---------------------------------------------

SYNCHRONOUS = {"a1111": ("/sdapi/v1/txt2img", {"width": 64, "height": 64, "steps": 2}),
               "openai": ("/v1/images/generations", {"size": "64x64", "steps": 2})}


@pytest.fixture(scope="module")
def served(queue, tmp_path_factory):
    from test_server import running

    loras = tmp_path_factory.mktemp("loras")
    with running(queue, lora_dir=loras) as url:
        yield url, loras, queue


def _message(answer: dict) -> str:
    return answer["error"] if isinstance(answer["error"], str) else answer["error"]["message"]


def _behind_a_blocker(served, path: str, body: dict, while_queued, monkeypatch) -> tuple[int, dict]:
    """A synchronous call queued behind a native job held at its first step: `while_queued(job_id)` runs while the
    call's job waits, then the blocker is cancelled and let go, and the call's answer returned."""
    from test_server import call

    url, _, queue = served
    held, release, on_step = threading.Event(), threading.Event(), queue.worker.on_step

    def hold(job, event):
        on_step(job, event)
        if job.params.prompt == "a blocker":
            held.set()
            release.wait(60)

    monkeypatch.setattr(queue.worker, "on_step", hold)
    code, blocker = call(f"{url}/api/jobs", {"prompt": "a blocker", "width": 64, "height": 64, "steps": 2})
    assert code == 200 and held.wait(60), blocker
    prompt = body["prompt"].split(" <lora:")[0]  # as the job's settings hold it, its LoRA tag read
    answers = []
    sender = threading.Thread(target=lambda: answers.append(call(f"{url}{path}", body)))
    sender.start()
    try:
        deadline = time.monotonic() + 60
        while not (found := [job["id"] for job in call(f"{url}/api/jobs")[1]
                             if job["params"]["prompt"] == prompt and job["state"] == "queued"]):
            assert time.monotonic() < deadline and sender.is_alive(), answers
            time.sleep(0.05)
        while_queued(found[0])
    finally:
        call(f"{url}/api/jobs/{blocker['id']}/cancel", method="POST")
        release.set()
        sender.join(120)
    return answers[0]


@pytest.mark.parametrize("api", SYNCHRONOUS)
def test_a_synchronous_calls_cancelled_job_is_a_409_in_both_apis(served, api, monkeypatch):
    from test_server import call

    url = served[0]
    path, body = SYNCHRONOUS[api]
    body = {**body, "prompt": f"cancelled by another client ({api})"}
    code, answer = _behind_a_blocker(served, path, body,
                                     lambda job: call(f"{url}/api/jobs/{job}/cancel", method="POST"), monkeypatch)
    assert code == 409 and _message(answer) == "job cancelled", answer


@pytest.mark.parametrize("api", SYNCHRONOUS)
def test_a_synchronous_calls_failed_job_is_a_500_in_both_apis(served, tiny_set, api, monkeypatch):
    from lora_files import comfy, random_pairs, write_lora

    from anima_rknn.model.io import read_dit_config

    loras = served[1]
    lora = write_lora(loras / f"gone-{api}.safetensors", comfy(random_pairs(read_dit_config(tiny_set.dit), seed=1)))
    path, body = SYNCHRONOUS[api]
    body = {**body, "prompt": f"a failing cat ({api}) <lora:gone-{api}:1>"}
    # The LoRA is gone before the job runs.
    code, answer = _behind_a_blocker(served, path, body, lambda job: lora.unlink(), monkeypatch)
    assert code == 500 and f"gone-{api}.safetensors" in _message(answer), answer
    assert str(loras) not in _message(answer)


def test_decode_turns_are_bounded_and_a_thread_holding_one_takes_no_second():
    from anima_rknn.server.uploads import DecodeTurns, ServerBusy

    turns, outcomes = DecodeTurns(count=1, wait_s=0.2), []

    def decode() -> None:
        try:
            with turns.turn():
                outcomes.append("decoded")
        except ServerBusy as e:
            outcomes.append(str(e))

    with turns.turn(), turns.turn():  # a request's decode, then its submit's checks, in one turn
        other = threading.Thread(target=decode)
        other.start()
        other.join(5)
    assert outcomes == ["the server is decoding 1 pictures already; try again shortly"]
    decode()  # the turn is back
    assert outcomes[-1] == "decoded"
