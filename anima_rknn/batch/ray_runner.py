"""Ray mode: the same jobs spread over a Ray cluster (a head on a PC, `ray start --address=...` on each board).

One long-lived actor per worker slot (a slot = the resources one actor asks for, e.g. {"npu": 1} on a node that
advertises one NPU) loads the model once and takes one job at a time from the driver, so a fast node simply
takes more jobs. Before its first job each actor compares its model files with the driver's (fingerprints)
and is refused on a difference. Images come back as PNG bytes and only the driver writes the output folder,
so workers need no shared file system. A worker that dies mid-job is restarted by Ray (a bounded number of
times) and its job goes back to the front of the queue: retried, never lost, and published once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..checks import is_number
from ..core.files import cache_dir
from ..core.memory import freeze_long_lived
from ..errors import AnimaError
from ..model.model_set import ModelFiles
from ..sampling.sample import StepCallback
from .jobs_file import BatchJob
from .local import Deliver
from .results import Outcome
from .worker import Expected, Task, Worker, package_version, worker_name

LOCAL = "local"  # --ray local: a private one-machine cluster, started and stopped with the batch
ACTOR_RESTARTS = 3  # a worker that keeps dying is given up after this many restarts
JOB_ATTEMPTS = 3  # a job that kills its worker this many times is recorded as failed, not tried forever
# A worker Ray is restarting answers "temporarily unavailable": it is asked again every RESTART_POLL_S, for
# RESTART_WAIT_S at most (a restart starts a process and reads the model files' headers: seconds, not minutes).
RESTART_WAIT_S, RESTART_POLL_S = 120.0, 0.5
STATES = "batch-states"  # in a worker node's cache folder: the resume states of the jobs running there


def import_ray() -> Any:
    try:
        import ray
    except ModuleNotFoundError:
        raise AnimaError("--ray needs Ray: pip install 'anima-rknn[ray]'") from None
    return ray


def parse_resources(text: str | None, threads: int = 1) -> dict[str, float]:
    """--ray-resources '{"npu": 1}': what each actor asks of its node. Default: as many CPUs as the jobs' threads,
    so that a node runs no more workers than its cores hold (each job runs on its own --threads)."""
    if text is None:
        return {"CPU": float(threads)}
    try:
        resources = json.loads(text)
    except (ValueError, RecursionError):
        raise AnimaError(f"--ray-resources must be a JSON object such as '{{\"npu\": 1}}', got {text!r}") from None
    if not isinstance(resources, dict) or not resources or not all(
            is_number(v) and v > 0
            for v in resources.values()):
        raise AnimaError(f"--ray-resources must map resource names to positive numbers, got {text!r}")
    return {str(k): float(v) for k, v in resources.items()}


def slots(nodes: list[dict[str, Any]], resources: dict[str, float]) -> int:
    """How many actors asking for `resources` the live nodes can hold at once (each node counted alone)."""
    return sum(int(min(node["Resources"].get(name, 0.0) / need for name, need in resources.items()))
               for node in nodes if node.get("Alive"))


def _check_reachable(address: str) -> None:
    """A HOST:PORT head that does not answer is refused at once (Ray itself would retry for minutes)."""
    host, colon, port = address.rpartition(":")
    if not colon or not port.isdigit() or "://" in address:
        return
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
    except OSError as e:
        raise AnimaError(f"cannot reach the Ray head at {address}: {e.strerror or e}") from None


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _actor_options(resources: dict[str, float]) -> dict[str, Any]:
    custom = {k: v for k, v in resources.items() if k not in ("CPU", "GPU", "memory")}
    return {"num_cpus": resources.get("CPU", 0.0), "num_gpus": resources.get("GPU", 0.0),
            **({"memory": resources["memory"]} if "memory" in resources else {}),
            **({"resources": custom} if custom else {}),
            "max_restarts": ACTOR_RESTARTS, "max_task_retries": 0}


class RemoteWorker(Worker):
    """A Worker as a Ray actor: a start that fails (a model file missing on its node) is reported by check() in
    one line, instead of as a dead actor with a traceback. A job checkpoints into its node's cache folder (the
    output folder is the driver's alone), so a job stopped with the batch continues there when the batch is run
    again and the job lands on the same node; elsewhere it starts over."""

    def __init__(self, files: ModelFiles, keep_models: bool, checkpoint_every: int | None = None) -> None:
        self.failed: str | None = None
        try:
            # A state that cannot be written costs the resume, not the job.
            super().__init__(files, keep_models, checkpoint_every=checkpoint_every, warn=lambda e: None)
        except AnimaError as e:
            self.name = worker_name()
            self.failed = f"{self.name}: {e}"
        freeze_long_lived()  # the actor's process has imported what its jobs run

    def check(self, expected: Expected, driver_version: str) -> tuple[str, str | None]:
        return (self.name, self.failed) if self.failed else super().check(expected, driver_version)

    def run(self, job: BatchJob, state: Path | None = None, on_step: StepCallback | None = None,
            stop: Callable[[], bool] = lambda: False) -> Outcome:
        # A node plans its own run: the driver's plan chose the VAE tiles by the driver's free memory, and
        # --vae-backend auto's set lies in the driver's cache folder.
        job = dataclasses.replace(job, plan=None)
        folder = cache_dir() / STATES
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            return super().run(job, on_step=on_step)  # a node that cannot keep states only loses the resume
        return super().run(job, folder / f"{job.id}.state", on_step)


def open_ray_runner(stack: contextlib.ExitStack, address: str | None, resources: str | None, workers: int | None,
                    files: ModelFiles, expected: Expected, keep_models: bool, checkpoint_every: int | None = None,
                    warn: Callable[[str], None] = lambda line: print(line, file=sys.stderr)) -> RayRunner | None:
    """--ray's runner, connected (so a cluster that cannot run the jobs is refused before anything is written)
    and shut down with `stack`; None without --ray."""
    if address is None:
        return None
    threads = max(params.threads for params, _ in expected)  # fixed by the driver (read_jobs): the jobs' own
    return stack.enter_context(RayRunner(address, files, expected, keep_models=keep_models,
                                         resources=parse_resources(resources, threads), max_workers=workers,
                                         checkpoint_every=checkpoint_every, warn=warn))


class RayRunner:
    """`address`: "auto" (the running cluster), a cluster address, or "local". Use as a context manager."""

    def __init__(self, address: str, files: ModelFiles, expected: Expected, *, keep_models: bool,
                 resources: dict[str, float] | None = None, max_workers: int | None = None,
                 local_cpus: int | None = None, checkpoint_every: int | None = None,
                 on_dispatch: Callable[[BatchJob, str], None] | None = None,
                 warn: Callable[[str], None] = lambda line: print(line, file=sys.stderr)) -> None:
        self.ray = import_ray()
        self.address, self.files, self.expected, self.keep_models = address, files, expected, keep_models
        self.resources = resources or parse_resources(None)
        self.max_workers, self.local_cpus, self.on_dispatch, self.warn = max_workers, local_cpus, on_dispatch, warn
        self.checkpoint_every = checkpoint_every
        self.temp_dir: str | None = None  # a local cluster's session folders: ours, removed when it ends

    def __enter__(self) -> RayRunner:
        """Connects and counts the worker slots, so that a cluster that cannot run the batch is refused before
        anything is written."""
        ray = self.ray
        _check_reachable(self.address)
        local = self.address == LOCAL
        if local:  # a short path: Ray's sockets live in it, and a Unix socket's path is at most 107 bytes
            self.temp_dir = tempfile.mkdtemp(prefix="anima-ray-", dir="/tmp" if os.path.isdir("/tmp") else None)
        # Ray's own processes log in C++ to this terminal (SIGTERM notices as the cluster stops): only fatal
        # lines; what happened to a worker is said in this program's own lines.
        os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")
        try:
            ray.init(address=self.address,  # "local" starts a new cluster even where `ray start` runs one
                     num_cpus=self.local_cpus if local else None, _temp_dir=self.temp_dir,
                     include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        except ConnectionError as e:
            self._remove_temp_dir()
            raise AnimaError(f"no Ray cluster at {self.address!r} ({_first_line(e)}): start one with "
                             "`ray start --head`, or pass --ray local") from None
        self.count = min(slots(ray.nodes(), self.resources), self.max_workers or 2**31)
        if self.count == 0:
            self.__exit__()
            raise AnimaError(f"no node of the Ray cluster has the resources {json.dumps(self.resources)} "
                             "for one worker (see `ray status`)")
        return self

    def __exit__(self, *exc: object) -> None:
        self.ray.shutdown()  # the actors belong to this driver: they end with it
        self._remove_temp_dir()

    def _remove_temp_dir(self) -> None:
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.temp_dir = None

    def _start_workers(self) -> list[Any]:
        actor = self.ray.remote(**_actor_options(self.resources))(RemoteWorker)
        return [actor.remote(self.files, self.keep_models, self.checkpoint_every) for _ in range(self.count)]

    def run(self, jobs: list[BatchJob], publish: Deliver, task: Task | None = None) -> None:
        """Every job, published as it comes back; with `task`, each job is that task (Worker.run_task: bench's
        seeds) instead of one image."""
        if not jobs:
            return
        ray = self.ray
        from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError

        version = package_version()
        actors = self._start_workers()
        checking = {actor.check.remote(self.expected, version): actor for actor in actors}
        names: dict[Any, str] = {}  # actor -> its worker name (host:pid), from its check
        idle: list[Any] = []
        pending, running = deque(jobs), {}
        attempts: dict[str, int] = {}
        refused: list[str] = []
        published: set[str] = set()
        restarting: dict[Any, float] = {}  # actor -> until when the batch waits for Ray to restart it
        while pending or running:
            while idle and pending:
                actor, job = idle.pop(), pending.popleft()
                running[actor.run.remote(job) if task is None else actor.run_task.remote(job, task)] = (actor, job)
                if self.on_dispatch is not None:
                    self.on_dispatch(job, names.get(actor, "?"))
            if not running and not checking:
                raise AnimaError("no worker is left to run the batch"
                                 + (": " + "; ".join(refused) if refused else " (every one died)")
                                 + f"; {len(pending)} jobs not done; run the same command again to continue")
            ready, _ = ray.wait([*running, *checking], num_returns=1)
            ref = ready[0]
            if ref in checking:
                actor = checking.pop(ref)
                try:
                    names[actor], problem = ray.get(ref)
                except ActorUnavailableError as e:  # being restarted (it died mid-job): asked again shortly
                    if time.monotonic() < restarting.setdefault(actor, time.monotonic() + RESTART_WAIT_S):
                        time.sleep(RESTART_POLL_S)
                        checking[actor.check.remote(self.expected, version)] = actor
                        continue
                    problem = f"a worker was not back within {RESTART_WAIT_S:g} s of dying: {_first_line(e)}"
                except (RayActorError, RayTaskError) as e:
                    problem = f"a worker could not start: {_first_line(e)}"
                if problem is None:
                    restarting.pop(actor, None)
                    idle.append(actor)
                else:
                    refused.append(problem)
                    self.warn(f"worker refused: {problem}")
                    ray.kill(actor, no_restart=True)
                continue
            actor, job = running.pop(ref)
            try:
                outcome = ray.get(ref)
            except RayActorError:  # the worker died mid-job: the job is run again, on whoever is free first
                attempts[job.id] = attempts.get(job.id, 0) + 1
                self.warn(f"worker {names.get(actor, '?')} died while running job {job.id} (attempt "
                          f"{attempts[job.id]} of {JOB_ATTEMPTS}); "
                          + ("it runs again" if attempts[job.id] < JOB_ATTEMPTS else "it is recorded as failed"))
                if attempts[job.id] < JOB_ATTEMPTS:
                    pending.appendleft(job)
                else:
                    outcome = Outcome(job.id, names.get(actor, "?"), 0.0,
                                      error=f"its worker died {JOB_ATTEMPTS} times while running it")
                    self._publish_once(job, outcome, publish, published)
                # Ray restarts it (model loaded anew); it is checked again before it takes another job.
                checking[actor.check.remote(self.expected, version)] = actor
                continue
            except RayTaskError as e:  # a bug, not a bad job: recorded in one line, the batch goes on
                outcome = Outcome(job.id, names.get(actor, "?"), 0.0,
                                  error=f"internal error: {_first_line(e.cause or e)}")
            self._publish_once(job, outcome, publish, published)
            idle.append(actor)

    @staticmethod
    def _publish_once(job: BatchJob, outcome: Outcome, publish: Deliver, published: set[str]) -> None:
        # One job is on one worker at a time, so each outcome arrives once; this keeps that a fact.
        if job.id in published:
            raise AssertionError(f"job {job.id} finished twice")
        published.add(job.id)
        publish(job, outcome)
