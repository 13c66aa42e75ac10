"""The server on the demo model under mixed load for a set time, stopped twice and restarted (a SIGTERM at a third
of the time, a SIGKILL of the serving process at two thirds): N clients submitting txt2img and img2img with large
pictures (native async jobs and A1111's blocking calls), polling /sdapi/v1/progress, cancelling and interrupting,
on loopback only. Each stop comes once an A1111 call waits for its answer with its job in the store: a SIGTERM
lets the calls in flight finish, a SIGKILL cuts them. Reports jobs accepted / completed / cancelled / failed /
refused (4xx/5xx answers), lost (accepted jobs the server no longer knows or never finished after the restarts:
must be 0), /progress latency p50 / p99, and the server's peak RSS.

A job is accepted when the server stores it. Every request carries its own prompt, and after the run each is
looked up in the store through /api/jobs, whether or not it was answered: an A1111 blocking call cut by the
SIGKILL gets no answer while its job runs after the restart. Each accepted job must end completed, cancelled or
failed; one that does not, or an answer of 200 whose job the store does not know, is lost. A request that got no
answer and has no job in the store was never accepted (cut before its job was stored, or sent while the server
was down); a 4xx/5xx answer without a job is refused.

    python benchmarks/serve_load.py [--seconds 120] [--clients 4] [--picture 2048]

Every loop is bounded by --seconds (plus a drain of at most --drain seconds for the jobs accepted). Prints Markdown.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import io
import itertools
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
from PIL import Image

SMALL = {"width": 64, "height": 64, "steps": 8}
DOWN = -1  # call()'s code for a connection refused: nothing was sent (0: sent, but no answer came)
FINISHED = ("completed", "cancelled", "failed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(url: str, body: object | None = None, method: str | None = None, timeout: float = 300) -> tuple[int, object]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method or ("POST" if data is not None else "GET"),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw, code = response.read(), response.status
    except urllib.error.HTTPError as e:
        raw, code = e.read(), e.code
    except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError, OSError) as e:
        refused = isinstance(getattr(e, "reason", e), ConnectionRefusedError)
        return (DOWN if refused else 0), None  # the server is restarting: no answer
    try:
        return code, json.loads(raw)
    except ValueError:
        return code, raw


class Server:
    """`anima-rknn serve` on the demo model, its peak RSS sampled from /proc."""

    def __init__(self, data_dir: Path, port: int) -> None:
        self.data_dir, self.port, self.url = data_dir, port, f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen | None = None
        self.peak_rss_mib = 0.0
        self.log = open(data_dir.parent / "serve.log", "ab")

    def start(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "anima_rknn", "serve", "--data-dir", str(self.data_dir),
                                         "--port", str(self.port), "--max-queue", "64", "--vae-backend", "torch",
                                         "--max-side", "1024"], stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 300
        while call(f"{self.url}/sdapi/v1/progress", timeout=5)[0] != 200:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the server did not start (see {self.log.name})")
            time.sleep(0.5)

    def sample_rss(self) -> None:
        """The largest peak RSS (VmHWM) of the server's processes (the command and the process it runs the server
        in)."""
        if self.process is None or self.process.poll() is not None:
            return
        pids, seen = [self.process.pid], set()
        while pids:
            pid = pids.pop()
            seen.add(pid)
            try:
                peak = re.search(r"VmHWM:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
                for task in Path(f"/proc/{pid}/task").iterdir():
                    pids += [int(child) for child in (task / "children").read_text().split() if int(child) not in seen]
            except OSError:
                continue
            if peak:
                self.peak_rss_mib = max(self.peak_rss_mib, int(peak[1]) / 1024)

    def stop(self, how: signal.Signals = signal.SIGTERM) -> int:
        """SIGTERM the server (it finishes the requests in flight, a running job keeps its state), or SIGKILL the
        process that serves (the command's watcher forks it: a crash, every request in flight cut)."""
        assert self.process is not None
        self.sample_rss()
        if how == signal.SIGKILL:
            worker = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text().split()[0]
            os.kill(int(worker), signal.SIGKILL)
        else:
            self.process.send_signal(how)
        return self.process.wait(timeout=600)


def picture_b64(side: int, seed: int) -> str:
    pixels = np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG", compress_level=1)
    return base64.b64encode(buffer.getvalue()).decode()


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: dict[str, tuple[str, int]] = {}  # each request's prompt (its own) -> (API, answer's code)
        self.waiting: set[str] = set()  # the prompts of the A1111 calls waiting for their answer now
        self.progress_s: list[float] = []


def client(server: Server, tally: Tally, until: float, seed: int, big: str) -> None:
    rng = random.Random(seed)
    for number in itertools.count():
        if time.monotonic() >= until:
            return
        kind = rng.choice(["native", "native", "img2img", "txt2img", "cancel", "interrupt"])
        body = {"prompt": f"a red circle {seed} {number}", **SMALL, "seed": rng.randrange(1 << 30)}
        if kind == "interrupt":
            call(f"{server.url}/sdapi/v1/interrupt", {})
        else:
            if kind == "img2img":
                body |= {"init_images": [big], "denoising_strength": 0.5}
            api = "native" if kind in ("native", "cancel") else "A1111"
            with tally.lock:
                if api == "A1111":
                    tally.waiting.add(body["prompt"])
            code, answer = call(f"{server.url}/{'api/jobs' if api == 'native' else f'sdapi/v1/{kind}'}", body)
            with tally.lock:
                tally.requests[body["prompt"]] = api, code
                tally.waiting.discard(body["prompt"])
            if kind == "cancel" and code == 200 and isinstance(answer, dict):
                call(f"{server.url}/api/jobs/{answer['id']}/cancel", {})
            if code in (0, DOWN):
                time.sleep(1.0)  # the server is restarting: not a loop of refused connections
        time.sleep(rng.uniform(0.0, 0.5))


def poller(server: Server, tally: Tally, until: float) -> None:
    while time.monotonic() < until:
        started = time.perf_counter()
        code, _ = call(f"{server.url}/sdapi/v1/progress", timeout=60)
        if code == 200:
            with tally.lock:
                tally.progress_s.append(time.perf_counter() - started)
        server.sample_rss()
        time.sleep(0.2)


def call_stored(server: Server, tally: Tally) -> bool:
    """Whether an A1111 call waits for its answer while its job is in the store, queued or running."""
    code, page = call(f"{server.url}/api/jobs?limit=20")
    with tally.lock:
        return code == 200 and isinstance(page, list) and any(
            job["params"]["prompt"] in tally.waiting and job["state"] not in FINISHED for job in page)


def stored_jobs(server: Server) -> dict[str, str]:
    """Every job in the server's store, by its prompt (each call's own): the native API's listing, page by page."""
    jobs: dict[str, str] = {}
    for offset in range(0, 1 << 20, 200):
        code, page = call(f"{server.url}/api/jobs?limit=200&offset={offset}")
        if code != 200 or not isinstance(page, list):
            raise SystemExit(f"cannot list the server's jobs: {code}")
        jobs |= {job["params"]["prompt"]: job["id"] for job in page}
        if len(page) < 200:
            return jobs
    return jobs


def settle(server: Server, job_id: str, deadline: float) -> tuple[int, str | None]:
    """The job's code and state once it is finished, or as it is at `deadline`."""
    while True:
        code, job = call(f"{server.url}/api/jobs/{job_id}")
        state = job.get("state") if code == 200 and isinstance(job, dict) else None
        if state in FINISHED or code != 200 or time.monotonic() > deadline:
            return code, state
        time.sleep(0.5)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--picture", type=int, default=2048, help="side of the img2img clients' noise pictures")
    parser.add_argument("--drain", type=float, default=600, help="the most seconds to wait for accepted jobs")
    args = parser.parse_args()
    big = picture_b64(args.picture, 0)
    with tempfile.TemporaryDirectory() as folder:
        server = Server(Path(folder) / "data", free_port())
        server.start()
        tally = Tally()
        began = time.monotonic()
        until = began + args.seconds
        threads = [threading.Thread(target=client, args=(server, tally, until, seed, big)) for seed in
                   range(args.clients)] + [threading.Thread(target=poller, args=(server, tally, until))]
        for thread in threads:
            thread.start()
        stops = []
        for how, at in ((signal.SIGTERM, 1 / 3), (signal.SIGKILL, 2 / 3)):
            time.sleep(max(0.0, began + args.seconds * at - time.monotonic()))
            while not call_stored(server, tally) and time.monotonic() < until:
                time.sleep(0.2)  # each stop comes while an A1111 call waits for its stored job
            stops.append(f"a {how.name} at {time.monotonic() - began:.0f} s (exit {server.stop(how)})")
            server.start()
        for thread in threads:
            thread.join()
        deadline = time.monotonic() + args.drain
        stored = stored_jobs(server)
        accepted: dict[str, str] = {}  # job id -> the request's API and answer
        unanswered = {"cut, job stored": 0, "cut before stored": 0, "sent while down": 0}
        refused: dict[int, int] = {}
        for prompt, (api, code) in tally.requests.items():
            if prompt in stored:
                accepted[stored[prompt]] = f"{api} answered {code}"
                unanswered["cut, job stored"] += code <= 0
            elif code == 200:  # answered with a job the server no longer knows
                accepted[f"{api} {prompt!r}"] = f"{api} answered 200, its job not in the store"
            elif code > 0:
                refused[code] = refused.get(code, 0) + 1
            else:
                unanswered["cut before stored" if code == 0 else "sent while down"] += 1
        finished = dict.fromkeys(FINISHED, 0)
        lost: list[str] = []
        for job_id, kind in accepted.items():
            code, state = settle(server, job_id, deadline)
            if state in finished:
                finished[state] += 1
            else:
                lost.append(f"{job_id} ({kind}: {code} {state})")
        server.stop()
    flags = " ".join(sorted(set(re.findall(r"\b(avx2|avx512f|avx512_bf16|amx_bf16)\b",
                                           Path("/proc/cpuinfo").read_text()))))
    print(f"{os.cpu_count()} CPUs ({flags}), load average {os.getloadavg()[0]:.1f} at the end; {args.clients} clients "
          f"for {args.seconds:g} s, img2img pictures {args.picture}x{args.picture} noise PNGs "
          f"({len(big) / 2**20:.1f} MiB of base64), {' and '.join(stops)}, each followed by a restart\n")
    print("| accepted (native / A1111) | completed | cancelled | failed | lost | unanswered: cut, job stored / "
          "cut before stored / sent while down | refused | /progress p50 / p99 (n) | peak RSS |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    native = sum(kind.startswith("native") for kind in accepted.values())
    print(f"| {len(accepted)} ({native} / {len(accepted) - native}) | "
          f"{finished['completed']} | {finished['cancelled']} | {finished['failed']} | {len(lost)} | "
          f"{' / '.join(str(count) for count in unanswered.values())} | "
          f"{', '.join(f'{count}x {code}' for code, count in sorted(refused.items())) or '0'} | "
          f"{percentile(tally.progress_s, 0.5) * 1000:.0f} / {percentile(tally.progress_s, 0.99) * 1000:.0f} ms "
          f"({len(tally.progress_s)}) | {server.peak_rss_mib:.0f} MiB |")
    if lost:
        print("\nlost: " + ", ".join(lost[:20]))
    if lost:
        sys.exit(1)


if __name__ == "__main__":
    main()
