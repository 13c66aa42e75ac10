"""GET /: the web page, page.html, one file of inline HTML, CSS and JS that calls the native API (and /v1/models).

The one path open without credentials: the page asks for them and sends them on every call it makes.
"""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

if TYPE_CHECKING:
    from .runtime import Server

# The page is inline HTML, CSS and JS: it may load nothing from elsewhere, nor be framed by another site.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                               "img-src 'self' blob:; connect-src 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}


# The page needs nothing of the server; `server` is there to keep every family's routes() alike.
def routes(server: Server) -> APIRouter:
    router = APIRouter()
    page = resources.files(__package__).joinpath("page.html").read_text(encoding="utf-8")  # once, not per request

    @router.get("/", include_in_schema=False)
    async def index():
        return HTMLResponse(page, headers=PAGE_HEADERS)

    return router
