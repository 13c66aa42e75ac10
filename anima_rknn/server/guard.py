"""What every request meets before its route: the Host and Origin checks and the credentials (app.py's docstring
says why a server on a person's own machine needs them)."""

from __future__ import annotations

import base64
import hmac
import ipaddress
import re
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.requests import Request

from ..checks import shown

PUBLIC_PATHS = ("/",)  # the page itself; everything it calls needs the credentials
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")  # what a Host header may always name
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")  # the methods that change nothing: any site's page may send them
_DEFAULT_PORTS = {"http": 80, "https": 443}
# A Host header: a name or an address, an IPv6 one in brackets, then an optional port; nothing else (no userinfo).
_HOST = re.compile(r"(\[[0-9a-f:.]+\]|[a-z0-9_.-]+)(?::([0-9]{1,5}))?", re.IGNORECASE)


def host_name(name: str) -> str:
    """A host name as compared: lowercased, without IPv6 brackets or a trailing dot."""
    return name.strip().lower().removeprefix("[").removesuffix("]").rstrip(".")


def _host_and_port(header: str) -> tuple[str, int | None] | None:
    """A Host header's name and port (None: no port), or None for a malformed one."""
    match = _HOST.fullmatch(header)
    return (host_name(match[1]), int(match[2]) if match[2] else None) if match else None


def _address(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


class Guard:
    """The names a Host header may give (loopback, the bound address and the --allowed-hosts names, which an Origin
    may name too: a reverse proxy's public name; "*" takes any Host) and what an Authorization header must be,
    exactly: a Bearer token (OpenAI clients) or HTTP basic (WebUI's)."""

    def __init__(self, bind_host: str = "127.0.0.1", allowed_hosts: Iterable[str] = (), api_key: str | None = None,
                 api_auth: str | None = None) -> None:
        self.named_hosts = {host_name(name) for name in allowed_hosts} - {"*"}
        self.any_host = "*" in allowed_hosts
        self.hosts = {*LOOPBACK_NAMES, host_name(bind_host), *self.named_hosts}
        bound = _address(host_name(bind_host))
        self.any_address = bound is not None and bound.is_unspecified
        self.credentials = [f"Bearer {api_key}"] if api_key else []
        if api_auth:
            self.credentials.append("Basic " + base64.b64encode(api_auth.encode()).decode())

    def authorized(self, request: Request) -> bool:
        given = request.headers.get("authorization", "")
        return not self.credentials or request.url.path in PUBLIC_PATHS or any(
            hmac.compare_digest(given.encode(), expected.encode()) for expected in self.credentials)


    def refused_host(self, request: Request) -> str | None:
        """Why the request's Host header is not one of this server's names (None: it is)."""
        header = request.headers.get("host", "")
        parsed = _host_and_port(header)
        if parsed is None:
            return f"malformed Host header {shown(header)}" if header else "a Host header is required"
        name = parsed[0]
        if self.any_host or name in self.hosts or (self.any_address and _address(name) is not None):
            return None
        return (f"refused Host {shown(header)}: not a name of this server (a guard against DNS rebinding); "
                "serve --allowed-hosts NAME adds one")

    def foreign_origin(self, request: Request) -> str | None:
        """The Origin (without one, the Referer) of a write sent by another site's page; None for a safe method,
        this server's own page, or a client that sends neither (not a browser)."""
        if request.method in SAFE_METHODS:
            return None
        source = request.headers.get("origin") or request.headers.get("referer")
        if not source:
            return None
        host, port = _host_and_port(request.headers["host"])  # checked by refused_host
        try:
            parts = urlsplit(source)
            scheme_port = _DEFAULT_PORTS.get(parts.scheme)
            name, given_port = host_name(parts.hostname or ""), parts.port
        except ValueError:  # a port that is not one
            return source
        if scheme_port is None or not name:  # "null" (a sandboxed frame, a file), or no web origin at all
            return source
        # The scheme may differ (a TLS proxy in front); the name and port are the page's own.
        same = (name, given_port or scheme_port) == (host, port or scheme_port)
        return None if same or name in self.named_hosts else source
