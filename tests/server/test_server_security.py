"""The server against hostile pages and clients: cross-site writes (CSRF), DNS rebinding, media types, OpenAI's
error shape through the real openai client, chunked and cut-off bodies, fractional counts. Each on a real uvicorn
in this process (test_server.running); the CLI's own guards (port, data dir lock, secrets) are
tests/cli/test_serve_cli.py's."""

from __future__ import annotations

import base64
import http.client
import io
import json
import logging
import socket
import time
import tracemalloc

import pytest
from PIL import Image
from test_server import SMALL, call, running

from anima_rknn.generation.pipeline import AnimaPipeline
from anima_rknn.server.job_queue import JobQueue
from anima_rknn.server.requests import MAX_BODY_BYTES, MAX_IMAGE_BODY_BYTES

webuiapi = pytest.importorskip("webuiapi")
openai = pytest.importorskip("openai")

EVIL = "http://evil.example"


@pytest.fixture(scope="module")
def server(queue):
    with running(queue) as url:
        yield url, queue


def send(url: str, method: str, path: str, body: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, dict]:
    """One raw request with exactly these headers (http.client adds Host only when not given)."""
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        raw, kind = response.read(), response.headers.get("Content-Type", "")
        return response.status, json.loads(raw) if "json" in kind else {"raw": raw}
    finally:
        connection.close()


def jobs_in(queue: JobQueue) -> int:
    return len(queue.recent(10_000))


# ---- cross-site writes (CSRF) -------------------------------------------------------------------------------

@pytest.mark.parametrize("path, headers", [
    # A page of another site can send these "simple" requests without asking the server first.
    ("/api/jobs", {"Content-Type": "text/plain", "Origin": EVIL}),
    ("/api/jobs", {"Content-Type": "application/json", "Origin": EVIL}),
    ("/sdapi/v1/interrupt", {"Content-Type": "text/plain", "Origin": EVIL}),
    ("/sdapi/v1/interrupt", {"Referer": f"{EVIL}/page.html"}),  # a page that sends no Origin
    ("/sdapi/v1/interrupt", {"Origin": "null"}),  # a sandboxed frame, a file:// page
    ("/sdapi/v1/interrupt", {"Origin": "http://127.0.0.1:1"}),  # another port is another origin
    ("/api/jobs/x/cancel", {"Origin": "http://localhost.evil.example"}),
])
def test_a_write_from_another_sites_page_is_refused(server, path, headers):
    url, queue = server
    before = jobs_in(queue)
    body = json.dumps({"prompt": "a cat", **SMALL}).encode()
    code, answer = send(url, "POST", path, body, headers)
    assert code == 403 and answer["error"].startswith("refused a POST from another site's page (Origin ")
    assert jobs_in(queue) == before


def test_the_servers_own_page_and_clients_without_an_origin_may_write(server):
    url, queue = server
    port = url.rsplit(":", 1)[1]
    for host, origin in ((f"127.0.0.1:{port}", url), (f"localhost:{port}", f"http://localhost:{port}"),
                         (f"127.0.0.1:{port}", f"https://127.0.0.1:{port}"),  # a TLS proxy's page
                         ("localhost", "http://localhost:80"), ("localhost", "http://localhost")):
        assert send(url, "POST", "/sdapi/v1/interrupt", b"", {"Host": host, "Origin": origin})[0] == 200, origin
    # The page at localhost is not the page at 127.0.0.1: another origin, whatever the address behind it.
    assert send(url, "POST", "/sdapi/v1/interrupt", b"", {"Origin": f"http://localhost:{port}"})[0] == 403
    assert send(url, "POST", "/sdapi/v1/interrupt", b"", {"Referer": f"{url}/"})[0] == 200
    # The real clients send neither header: webuiapi (requests) and openai (httpx).
    api = webuiapi.WebUIApi(host="127.0.0.1", port=int(port))
    api.interrupt()
    before = jobs_in(queue)
    result = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0).images.generate(
        prompt="a red circle", size="64x64", extra_body={"steps": 1})
    assert Image.open(io.BytesIO(base64.b64decode(result.data[0].b64_json))).size == (64, 64)
    assert jobs_in(queue) == before + 1


def test_with_credentials_a_write_from_another_site_is_still_refused(queue):
    """A browser attaches the basic credentials it has cached for this server to another site's form post: the
    Origin is checked whatever the credentials."""
    with running(queue, api_auth="ann:pw") as url:
        auth = "Basic " + base64.b64encode(b"ann:pw").decode()
        code, answer = send(url, "POST", "/sdapi/v1/interrupt", b"", {"Authorization": auth, "Origin": EVIL})
        assert code == 403 and "another site's page" in answer["error"]
        assert send(url, "POST", "/sdapi/v1/interrupt", b"", {"Authorization": auth})[0] == 200
        assert send(url, "POST", "/sdapi/v1/interrupt", b"", {})[0] == 401


@pytest.mark.parametrize("path, kind, pattern", [
    ("/api/jobs", "text/plain", "send this request as application/json (a JSON object), got 'text/plain'"),
    ("/sdapi/v1/txt2img", None, "send this request as application/json (a JSON object), got no Content-Type"),
    ("/sdapi/v1/img2img", "application/x-www-form-urlencoded", "send this request as application/json"),
    ("/v1/images/generations", "text/plain;charset=utf-8", "send this request as application/json"),
    ("/v1/images/edits", "text/plain", "send this request as multipart/form-data (the image as a file part)"),
])
def test_a_body_of_another_media_type_is_a_415(server, path, kind, pattern):
    url, queue = server
    before = jobs_in(queue)
    code, answer = send(url, "POST", path, json.dumps({"prompt": "a cat", **SMALL}).encode(),
                        {"Content-Type": kind} if kind else {})
    message = answer["error"]["message"] if path.startswith("/v1/") else answer["error"]
    assert code == 415 and message.startswith(pattern), answer
    assert jobs_in(queue) == before


def test_json_with_a_charset_is_json(server):
    url, _ = server
    code, answer = send(url, "POST", "/api/jobs", json.dumps({"prompt": "a cat", **SMALL}).encode(),
                        {"Content-Type": "Application/JSON; charset=utf-8"})
    assert code == 200 and answer["state"] in ("queued", "generating")


# ---- DNS rebinding: the Host header -------------------------------------------------------------------------

@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "127.0.0.1.evil.example:{port}",
                                  "localhost.evil.example", "evil@127.0.0.1:{port}", "10.1.2.3:{port}", ""])
@pytest.mark.parametrize("path", ["/api/jobs", "/", "/v1/models"])
def test_a_foreign_host_header_is_refused(server, host, path):
    url, _ = server
    code, answer = send(url, "GET", path, headers={"Host": host.format(port=url.rsplit(":", 1)[1])})
    message = answer["error"]["message"] if path.startswith("/v1/") else answer["error"]
    assert code == 400 and "\n" not in message
    assert ("not a name of this server" in message and "--allowed-hosts" in message) or "Host header" in message


@pytest.mark.parametrize("host", ["localhost", "localhost:{port}", "LOCALHOST.:{port}", "127.0.0.1:{port}",
                                  "[::1]:{port}", "[::1]"])
def test_loopback_names_are_this_servers(server, host):
    url, _ = server
    assert send(url, "GET", "/api/jobs", headers={"Host": host.format(port=url.rsplit(":", 1)[1])})[0] == 200


def test_allowed_hosts_and_the_wildcard_bind(queue):
    # --allowed-hosts names are this server's: as a Host, and as the Origin of a proxy's page on another port.
    with running(queue, allowed_hosts=("board.local",)) as url:
        assert send(url, "GET", "/api/jobs", headers={"Host": "Board.Local:7860"})[0] == 200
        assert send(url, "POST", "/sdapi/v1/interrupt", b"", {"Host": "127.0.0.1",
                                                              "Origin": "https://board.local"})[0] == 200
        assert send(url, "GET", "/api/jobs", headers={"Host": "evil.example"})[0] == 400
    # "*": any Host (a reverse proxy that sets its own), but another site's page still may not write.
    with running(queue, allowed_hosts=("*",)) as url:
        assert send(url, "GET", "/api/jobs", headers={"Host": "whatever.example"})[0] == 200
        assert send(url, "POST", "/sdapi/v1/interrupt", b"", {"Host": "whatever.example", "Origin": EVIL})[0] == 403
    # Bound to every address: any address is a name of this machine (a rebound page sends its name, never one).
    with running(queue, bind_host="0.0.0.0") as url:
        assert send(url, "GET", "/api/jobs", headers={"Host": "192.168.7.7:7860"})[0] == 200
        assert send(url, "GET", "/api/jobs", headers={"Host": "[fe80::1]"})[0] == 200
        assert send(url, "GET", "/api/jobs", headers={"Host": "evil.example"})[0] == 400


# ---- OpenAI's errors, as the real openai client shows them --------------------------------------------------

def _openai_error(call_it) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as caught:
        call_it()
    error = caught.value
    assert set(error.body) == {"message", "type", "param", "code"}, error.body  # OpenAI's shape
    assert error.body["message"] in str(error) and "\n" not in error.body["message"]
    return error


def test_openai_errors_carry_their_message_to_the_client(tiny_set, queue, tmp_path):
    with running(queue, api_key="k") as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0)
        error = _openai_error(lambda: client.images.generate(prompt="x", size="huge"))
        assert isinstance(error, openai.BadRequestError) and "size must be WIDTHxHEIGHT" in str(error)
        error = _openai_error(lambda: client.images.generate(prompt="x", n=1.5, size="64x64"))
        assert isinstance(error, openai.BadRequestError) and "n must be a whole number, got 1.5" in str(error)
        error = _openai_error(lambda: openai.OpenAI(base_url=f"{url}/v1", api_key="wrong",
                                                    max_retries=0).models.list())
        assert isinstance(error, openai.AuthenticationError) and "authentication required" in str(error)
        error = _openai_error(lambda: client.models.retrieve("dall-e-3"))
        assert isinstance(error, openai.NotFoundError) and "no model 'dall-e-3'; this server has tiny" in str(error)
        error = _openai_error(lambda: client.models.delete("tiny"))  # a method the route does not take
        assert error.status_code == 405 and "Method Not Allowed" in str(error)
        error = _openai_error(lambda: client.images.generate(prompt="x" * MAX_BODY_BYTES, size="64x64"))
        assert error.status_code == 413 and "request body over 1 MiB" in str(error)
    # A request the queue cannot hold: 429, a rate limit error.
    small = JobQueue(AnimaPipeline(tiny_set), tmp_path / "data", max_queue=1)
    small.start()
    try:
        with running(small) as url:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
            error = _openai_error(lambda: client.images.generate(prompt="x", n=2, size="64x64"))
            assert isinstance(error, openai.RateLimitError) and error.type == "rate_limit_error"
            assert "queue" in error.body["message"]
    finally:
        small.close()


def test_an_openai_generation_without_size_is_the_models_size(queue):
    with running(queue, native_size=48) as url:  # the CLI gives the model's trained size (the demo model: 64)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        for size in (openai.NOT_GIVEN, "auto"):
            result = client.images.generate(prompt="a red circle", size=size, extra_body={"steps": 1})
            assert Image.open(io.BytesIO(base64.b64decode(result.data[0].b64_json))).size == (48, 48)


# ---- bodies: chunked, cut off ------------------------------------------------------------------------------

@pytest.mark.parametrize("path, limit", [("/api/jobs", MAX_IMAGE_BODY_BYTES), ("/sdapi/v1/txt2img", MAX_BODY_BYTES)])
def test_a_chunked_body_past_the_limit_is_refused_as_it_arrives(server, path, limit):
    """No Content-Length to refuse it by: it is counted as it comes, refused once past the route's limit (a body
    of three times the limit and more is not read whole), and what was read of it does not stay in memory."""
    url, _ = server
    host, port = url.removeprefix("http://").split(":")
    # Python's own count of what it allocates, not the process's RSS: glibc keeps a freed block in the heap or
    # returns it as it sees fit (it kept 32 MiB of a freed 48 MiB in one CI run), which says nothing of whether the
    # server still holds the body.
    chunk = b"a" * (1 << 20)
    tracemalloc.start()
    try:
        with socket.create_connection((host, int(port)), timeout=60) as s:
            s.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                      "Transfer-Encoding: chunked\r\n\r\n".encode())
            try:
                for _ in range((3 * limit + (32 << 20)) // len(chunk)):  # more than the bound below
                    s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            except (BrokenPipeError, ConnectionResetError):  # refused and closed while the rest was on its way
                pass
            answer = s.recv(4096)
        time.sleep(0.5)  # the server's side of the closed connection let go
        after, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert answer.startswith(b"HTTP/1.1 413") and b"request body over" in answer
    # At most the limit's worth, held in one growing buffer: twice that at the moment a growth copies it, never
    # the 3x body; and once refused, none of it kept.
    assert peak < 2 * limit + (24 << 20), peak >> 20
    assert after < limit // 2, after


def test_a_client_gone_mid_body_is_one_line_in_the_log(server, caplog):
    url, _ = server
    host, port = url.removeprefix("http://").split(":")
    uvicorn_log = logging.getLogger("uvicorn.error")  # uvicorn's tracebacks: its logger does not propagate
    uvicorn_log.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING):
            for path in ("/api/jobs", "/v1/images/generations"):
                with socket.create_connection((host, int(port)), timeout=60) as s:
                    s.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                              "Content-Length: 100000\r\n\r\n".encode() + b'{"prompt": "' + b"a" * 5000)
                    time.sleep(0.3)
            deadline = time.monotonic() + 10
            while len(caplog.records) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.3)  # anything else the server would log about them
    finally:
        uvicorn_log.removeHandler(caplog.handler)
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2 and all("the client disconnected before its request body was read" in line
                                   for line in lines), lines
    assert not any(record.exc_info for record in caplog.records)


# ---- numbers that count something ---------------------------------------------------------------------------

@pytest.mark.parametrize("path, body, pattern", [
    ("/api/jobs", {"prompt": "x", **SMALL, "width": 64.9}, "width must be a whole number, got 64.9"),
    ("/api/jobs", {"prompt": "x", **SMALL, "steps": 1.7}, "steps must be a whole number, got 1.7"),
    ("/sdapi/v1/txt2img", {"prompt": "x", **SMALL, "height": 63.5}, "height must be a whole number, got 63.5"),
    ("/sdapi/v1/txt2img", {"prompt": "x", **SMALL, "enable_hr": True, "hr_second_pass_steps": 2.5},
     "hr_second_pass_steps must be a whole number, got 2.5"),
    ("/v1/images/generations", {"prompt": "x", "size": "64x64", "steps": 2.2}, "steps must be a whole number"),
    ("/v1/images/generations", {"prompt": "x", "size": "64x64", "n": 1.5}, "n must be a whole number, got 1.5"),
])
def test_a_fraction_where_a_count_is_asked_is_refused(server, path, body, pattern):
    url, queue = server
    before = jobs_in(queue)
    code, answer = call(f"{url}{path}", body)
    message = answer["error"]["message"] if path.startswith("/v1/") else answer["error"]
    assert code == 400 and pattern in message, answer
    assert jobs_in(queue) == before


def test_a_whole_number_written_as_a_float_is_taken(server):
    url, _ = server
    code, answer = call(f"{url}/api/jobs", {"prompt": "x", "width": 64.0, "height": 64, "steps": 2.0})
    assert code == 200 and (answer["params"]["width"], answer["params"]["steps"]) == (64, 2)
    assert isinstance(answer["params"]["width"], int)
