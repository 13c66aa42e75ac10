"""The server on the demo model under mixed load for a set time, with a SIGTERM and a restart in the middle:
N clients submitting txt2img and img2img with large pictures (native async jobs and A1111's blocking calls),
polling /sdapi/v1/progress, cancelling and interrupting, on loopback only. Reports jobs accepted / completed /
cancelled / failed / refused (4xx/5xx answers), lost (accepted jobs the server no longer knows or never finished
after the restart: must be 0), /progress latency p50 / p99, and the server's peak RSS.

    python benchmarks/serve_load.py [--seconds 120] [--clients 4] [--picture 2048]

Every loop is bounded by --seconds (plus a drain of at most --drain seconds for the jobs accepted). Prints Markdown.
"""

from __future__ import annotations

import argparse
import base64
import io
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
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return 0, None  # the server is restarting: no answer
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

    def stop(self) -> int:
        assert self.process is not None
        self.sample_rss()
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=600)


def picture_b64(side: int, seed: int) -> str:
    pixels = np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG", compress_level=1)
    return base64.b64encode(buffer.getvalue()).decode()


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.accepted: dict[str, str] = {}  # job id -> what was asked (run / cancel)
        self.refused: dict[int, int] = {}
        self.blocking = {"completed": 0, "no answer": 0}
        self.progress_s: list[float] = []

    def refuse(self, code: int) -> None:
        with self.lock:
            self.refused[code] = self.refused.get(code, 0) + 1


def client(server: Server, tally: Tally, until: float, seed: int, big: str) -> None:
    rng = random.Random(seed)
    while time.monotonic() < until:
        kind = rng.choice(["native", "native", "img2img", "txt2img", "cancel", "interrupt"])
        body = {"prompt": f"a red circle {seed}", **SMALL, "seed": rng.randrange(1 << 30)}
        if kind in ("native", "cancel"):
            code, answer = call(f"{server.url}/api/jobs", body)
            if code == 200 and isinstance(answer, dict):
                with tally.lock:
                    tally.accepted[answer["id"]] = kind
                if kind == "cancel":
                    call(f"{server.url}/api/jobs/{answer['id']}/cancel", {})
            elif code:
                tally.refuse(code)
        elif kind in ("img2img", "txt2img"):
            if kind == "img2img":
                body |= {"init_images": [big], "denoising_strength": 0.5}
            code, _ = call(f"{server.url}/sdapi/v1/{kind}", body)
            with tally.lock:
                if code == 200:
                    tally.blocking["completed"] += 1
                elif code == 0:
                    tally.blocking["no answer"] += 1
                    time.sleep(1.0)  # the server is restarting: not a loop of refused connections
            if code not in (0, 200):
                tally.refuse(code)
        else:
            call(f"{server.url}/sdapi/v1/interrupt", {})
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
        time.sleep(args.seconds / 2)
        stopped_with = server.stop()  # SIGTERM in the middle: running jobs keep their state
        server.start()
        for thread in threads:
            thread.join()
        finished = {"completed": 0, "cancelled": 0, "failed": 0}
        lost: list[str] = []
        deadline = time.monotonic() + args.drain
        for job_id, kind in tally.accepted.items():
            while True:
                code, job = call(f"{server.url}/api/jobs/{job_id}")
                state = job.get("state") if code == 200 and isinstance(job, dict) else None
                if state in finished or code != 200 or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            if state in finished:
                finished[state] += 1
            else:
                lost.append(f"{job_id} ({kind}: {code} {state})")
        server.stop()
    flags = " ".join(sorted(set(re.findall(r"\b(avx2|avx512f|avx512_bf16|amx_bf16)\b",
                                           Path("/proc/cpuinfo").read_text()))))
    print(f"{os.cpu_count()} CPUs ({flags}), load average {os.getloadavg()[0]:.1f} at the end; {args.clients} clients "
          f"for {args.seconds:g} s, img2img pictures {args.picture}x{args.picture} noise PNGs "
          f"({len(big) / 2**20:.1f} MiB of base64), a SIGTERM (exit {stopped_with}) and a restart at "
          f"{args.seconds / 2:g} s\n")
    print("| accepted (async) | completed | cancelled | failed | lost | blocking calls answered / unanswered (restart) "
          "| refused | /progress p50 / p99 (n) | peak RSS |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    refused = ", ".join(f"{count}x {code}" for code, count in sorted(tally.refused.items())) or "0"
    print(f"| {len(tally.accepted)} | {finished['completed']} | {finished['cancelled']} | {finished['failed']} | "
          f"{len(lost)} | {tally.blocking['completed']} / {tally.blocking['no answer']} | {refused} | "
          f"{percentile(tally.progress_s, 0.5) * 1000:.0f} / {percentile(tally.progress_s, 0.99) * 1000:.0f} ms "
          f"({len(tally.progress_s)}) | {server.peak_rss_mib:.0f} MiB |")
    if lost:
        print("\nlost: " + ", ".join(lost[:20]))
    if lost:
        sys.exit(1)


if __name__ == "__main__":
    main()
