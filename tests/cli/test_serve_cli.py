"""`anima-rknn serve` at its start: credentials from the environment or an owner-only file (never only the
command line, which `ps` shows), the port and the data dir taken before any model loads, each refusal one line
and exit 1. The refusals run in this process (they come before the model); one real server on the demo model
shows them against real processes."""

from __future__ import annotations

import base64
import contextlib
import fcntl
import io
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from folder_locks import held
from PIL import Image

from anima_rknn.model.model_set import DEMO_MODEL

openai = pytest.importorskip("openai")
webuiapi = pytest.importorskip("webuiapi")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _secret_file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def _refused(result, pattern: str) -> None:
    assert result.code == 1, result
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and pattern in lines[0], result.err


@pytest.mark.parametrize("args, pattern", [
    (["--api-key-file", "{group_readable}"], "--api-key-file {group_readable} is open to other users (mode 640): "
                                             "chmod 600 it"),
    (["--api-auth-file", "{world_readable}"], "is open to other users (mode 604)"),
    (["--api-key", "k", "--api-key-file", "{key}"], "give --api-key or --api-key-file, not both"),
    (["--api-key-file", "{two_lines}"], "must hold one line, the secret"),
    (["--api-key-file", "{empty}"], "must hold one line, the secret"),
    (["--api-key-file", "{missing}"], "No such file or directory"),
    (["--api-key", ""], "--api-key must not be empty"),
    (["--api-auth-file", "{key}"], "--api-auth must be USER:PASS"),
    (["--allowed-hosts", "board.local:7860"], "--allowed-hosts takes host names or addresses without a port"),
])
def test_bad_credentials_and_hosts_are_refused_before_anything_starts(run_cli, tmp_path, args, pattern):
    files = {"group_readable": _secret_file(tmp_path / "g", "k\n", 0o640),
             "world_readable": _secret_file(tmp_path / "w", "ann:pw\n", 0o604),
             "key": _secret_file(tmp_path / "key", "k\n"), "two_lines": _secret_file(tmp_path / "two", "a\nb\n"),
             "empty": _secret_file(tmp_path / "empty", ""), "missing": tmp_path / "missing"}
    data = tmp_path / "data"
    result = run_cli("serve", "--port", _free_port(), "--data-dir", data, *(a.format(**files) for a in args))
    _refused(result, pattern.format(**files))
    assert not data.exists()  # refused before the data dir is made


def test_a_busy_port_is_one_line_before_any_model_loads(run_cli, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("serve", "--port", port, "--data-dir", tmp_path / "data", "--model", tmp_path / "absent")
    # The model folder does not exist: the port was checked first.
    _refused(result, f"cannot listen on 127.0.0.1:{port}: Address already in use (another server is using it")
    assert not (tmp_path / "data").exists()


def test_a_data_dir_another_server_holds_is_refused_and_the_port_let_go(run_cli, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    port = _free_port()
    fd = os.open(data, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as a running server holds it
        result = run_cli("serve", "--port", port, "--data-dir", data, "--model", tmp_path / "absent")
    finally:
        os.close(fd)
    _refused(result, f"another anima-rknn serve is using the data dir {data}: stop it, or give this one its own")
    assert not any(data.iterdir())  # the job store was never opened
    with socket.socket() as again:
        again.bind(("127.0.0.1", port))  # the refused server let its port go


# ---- one real server ----------------------------------------------------------------------------------------

def _serve(*args: str | Path, env: dict[str, str] | None = None, log=subprocess.PIPE) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "anima_rknn", "serve", "--vae-backend", "torch", "--dtype", "fp32",
                             *map(str, args)], stderr=log, stdout=subprocess.DEVNULL, text=True,
                            env={**os.environ, **(env or {})})


def _get(url: str, headers: dict[str, str]) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:  # not listening yet (URLError is one)
        return 0


def _accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmRSS:"))


def test_a_real_server_takes_its_secrets_privately_and_holds_its_port_and_data_dir(run_cli, tmp_path, model_dir):
    key, user, password = "key-from-env-3f9", "ann", "pw-from-file-7c1"
    auth_file = _secret_file(tmp_path / "auth", f"{user}:{password}\n")
    port, data = _free_port(), tmp_path / "data"
    base = f"http://127.0.0.1:{port}"
    with open(tmp_path / "log.txt", "w") as log:
        # Two models (--model given twice): the demo model, the default, and the tiny one.
        first = _serve("--port", port, "--data-dir", data, "--api-auth-file", auth_file, "--model", DEMO_MODEL,
                       "--model", model_dir, env={"ANIMA_API_KEY": key}, log=log)
        try:
            deadline = time.monotonic() + 300
            # The port and the data dir are taken first, before the model loads.
            while not (_accepts(port) and data.is_dir() and held(data)):
                assert first.poll() is None and time.monotonic() < deadline, (tmp_path / "log.txt").read_text()
                time.sleep(0.1)
            # A second server on its data dir, a third on its port, while it loads: refused in one line each. Run
            # in this process (the refusals come before any model loads; two more interpreters cost CI seconds).
            refusals = {(_free_port(), data): f"error: another anima-rknn serve is using the data dir {data}",
                        (port, tmp_path / "other"): f"error: cannot listen on 127.0.0.1:{port}: Address already in use"}
            for (other_port, other_data), pattern in refusals.items():
                result = run_cli("serve", "--port", other_port, "--data-dir", other_data)
                assert result.code == 1 and result.err.strip().splitlines() == [result.err.strip()], result.err
                assert result.err.startswith(pattern), result.err
            assert not (tmp_path / "other").exists()
            while _get(f"{base}/v1/models", {"Authorization": f"Bearer {key}"}) != 200:
                assert first.poll() is None and time.monotonic() < deadline, (tmp_path / "log.txt").read_text()
                time.sleep(0.2)
            # Neither secret is on the command line that every local user can read.
            command_line = Path(f"/proc/{first.pid}/cmdline").read_bytes()
            assert key.encode() not in command_line and password.encode() not in command_line
            assert _get(f"{base}/v1/models", {}) == 401
            # Both credentials work through the real clients: the key from the environment, USER:PASS from the file.
            # Without a size, OpenAI's request is the demo model's own 64 px.
            client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
            result = client.images.generate(prompt="a red circle", extra_body={"steps": 1})
            assert Image.open(io.BytesIO(base64.b64decode(result.data[0].b64_json))).size == (64, 64)
            api = webuiapi.WebUIApi(host="127.0.0.1", port=port)
            api.set_auth(user, password)
            assert [model["model_name"] for model in api.get_sd_models()] == ["anima-demo", "anima-tiny-random"]
            assert "serving anima-demo.safetensors, anima-tiny-random.safetensors" in (tmp_path / "log.txt").read_text()
            api.util_set_model("anima-tiny-random")  # switched by POST /sdapi/v1/options, and back
            assert api.util_get_current_model().startswith("anima-tiny-random.safetensors [")
            api.util_set_model("anima-demo")
            # A chunked body past the limit leaves no memory behind (it used to keep what was read of it).
            before = _rss(first.pid)
            with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
                s.sendall(f"POST /api/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
                          "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
                for _ in range(56):
                    s.sendall(b"100000\r\n" + b"a" * (1 << 20) + b"\r\n")
                assert s.recv(4096).startswith(b"HTTP/1.1 413")
            assert _rss(first.pid) - before < 16 << 20, (_rss(first.pid) - before) >> 20
            assert json.loads(urllib.request.urlopen(urllib.request.Request(
                f"{base}/api/jobs", headers={"Authorization": f"Bearer {key}"}), timeout=30).read())[0]["state"] \
                == "completed"  # the first server's job, untouched by the second
        finally:
            with contextlib.suppress(ProcessLookupError):
                first.terminate()
            first.wait(timeout=60)


def _call(url: str, body: dict | None = None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_a_server_started_with_a_vae_set_decodes_in_its_tiles(tmp_path, model_dir, tiny_vae_onnx_set):
    """serve --vae-subgraphs with a set exported at 64-px tiles, overlap 16 (not the default 512 / 64): a request
    that leaves the tile alone decodes in the set's tiles, as generate and batch do (engine/vae_plan.py); one that
    asks for another tile is a 400."""
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    with open(tmp_path / "log.txt", "w") as log:
        server = _serve("--port", port, "--data-dir", tmp_path / "data", "--model", model_dir, "--threads", "1",
                        "--vae-backend", "onnx", "--vae-subgraphs", tiny_vae_onnx_set, log=log)
        try:
            deadline = time.monotonic() + 300
            while _get(f"{base}/api/jobs", {}) != 200:
                assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "log.txt").read_text()
                time.sleep(0.2)
            code, job = _call(f"{base}/api/jobs", {"prompt": "a red circle", "width": 64, "height": 64, "steps": 1})
            assert code == 200, job
            while job["state"] not in ("completed", "failed", "cancelled"):
                assert time.monotonic() < deadline, (tmp_path / "log.txt").read_text()
                time.sleep(0.2)
                code, job = _call(f"{base}/api/jobs/{job['id']}")
            assert job["state"] == "completed", job
            assert (job["params"]["vae_tile"], job["params"]["vae_overlap"], job["result"]["vae_backend"]) == (
                64, 16, "onnx")
            code, refused = _call(f"{base}/api/jobs", {"prompt": "x", "width": 64, "height": 64, "vae_tile": 512})
            assert code == 400 and "was made for VAE tile size 64, asked for 512" in json.dumps(refused), refused
        finally:
            server.terminate()
            server.wait(timeout=60)
