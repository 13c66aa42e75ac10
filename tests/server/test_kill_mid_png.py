"""A live `kill -9` of `anima-rknn serve` while it writes a job's PNG (issue 46), through the CLI and the HTTP API
only: the server is stopped (SIGSTOP) the moment its PNG's temporary appears, checked to be unfinished (the
write is provably in progress), then killed. No partial PNG is left under the job's name, and a restart on the same data
folder runs the job to a whole PNG and leaves no temporary behind."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from PIL import Image

SIDE = 512  # the demo model's PNG at 512 px takes PIL tens of milliseconds to compress and write: the window
PNG_END = b"IEND\xaeB`\x82"
ATTEMPTS = 3  # jobs tried before giving up on catching a write (one is normally enough)


def _get(url: str, body: dict | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _serve(data: Path, port: int, log) -> subprocess.Popen:
    server = subprocess.Popen([sys.executable, "-m", "anima_rknn", "serve", "--data-dir", str(data), "--port",
                               str(port), "--vae-backend", "torch", "--dtype", "fp32", "--threads", "1"], stderr=log)
    deadline = time.monotonic() + 120
    while True:
        try:
            if _get(f"http://127.0.0.1:{port}/api/jobs")[0] == 200:
                return server
        except OSError:
            pass
        assert server.poll() is None and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.1)


def _worker(server: subprocess.Popen) -> int:
    """The process that serves: the CLI's watcher forks it (cli.run), and a SIGKILL of the watcher alone would
    reach it as a SIGTERM, a clean shutdown, not the crash this test is about."""
    children = Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


def _temporaries(data: Path, job: str = "") -> list[Path]:
    return [path for path in data.iterdir() if path.name.startswith(f".{job}") and path.name.endswith(".part")]


def _stop_mid_write(worker: int, data: Path, job: str, seconds: float = 120) -> Path | None:
    """Watch the data folder (every millisecond) for the job's PNG temporary and SIGSTOP the server's worker the
    moment it appears. Returns the temporary, or None if the job's PNG was published before the worker stopped."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for temporary in _temporaries(data, f"{job}.png."):
            os.kill(worker, signal.SIGSTOP)
            return temporary
        if (data / f"{job}.png").exists():
            return None
        time.sleep(0.001)
    raise AssertionError("the job's PNG was never written")


def test_a_server_killed_during_a_png_write_leaves_no_partial_png_and_the_job_finishes_after_restart(tmp_path):
    data, port = tmp_path / "data", _free_port()
    base = f"http://127.0.0.1:{port}"
    with open(tmp_path / "log.txt", "wb") as log:
        server = _serve(data, port, log)
        worker = _worker(server)
        try:
            for attempt in range(ATTEMPTS):
                code, answer = _get(f"{base}/api/jobs", {"prompt": "a red circle on a blue background",
                                                        "width": SIDE, "height": SIDE, "steps": 1, "seed": attempt})
                assert code == 200, answer
                job = json.loads(answer)["id"]
                temporary = _stop_mid_write(worker, data, job)
                if temporary is not None and temporary.exists() and not (data / f"{job}.png").exists() \
                        and not temporary.read_bytes().endswith(PNG_END):
                    break  # stopped mid-write
                os.kill(worker, signal.SIGCONT)  # the window was missed: another job
            else:
                raise AssertionError(f"no PNG write caught in progress in {ATTEMPTS} jobs")
            os.kill(worker, signal.SIGKILL)  # kill -9 (the watcher then ends too, with its one line)
            assert server.wait(timeout=60) == 128 + signal.SIGKILL
        finally:
            if server.poll() is None:  # the test failed: no stopped worker is left behind
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker, signal.SIGKILL)
                server.wait()
        half = temporary.read_bytes()
        # Cut mid-write: empty (PIL compresses before its first write) or the PNG's first chunks without its end.
        assert half == b"" or half.startswith(b"\x89PNG\r\n\x1a\n") and not half.endswith(PNG_END)
        assert not (data / f"{job}.png").exists()  # never a partial PNG under the job's name

        server = _serve(data, port, log)
        try:
            deadline = time.monotonic() + 120
            while (state := json.loads(_get(f"{base}/api/jobs/{job}")[1])["state"]) != "completed":
                assert state in ("queued", "generating") and time.monotonic() < deadline, state
                time.sleep(0.1)
            code, png = _get(f"{base}/api/jobs/{job}/image")
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)
    assert code == 200 and png == (data / f"{job}.png").read_bytes()
    with Image.open(io.BytesIO(png)) as image:
        image.load()  # whole: every chunk up to IEND decodes
        assert image.size == (SIDE, SIDE)
    assert not [path.name for path in data.rglob("*.part")]  # the killed write's temporary was cleared


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
