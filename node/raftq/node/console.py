"""The web console: the static files under ``ui/`` (package data), served at ``/ui/``.

The console is one more client of the JSON API: its pages call the API routes with the token
the user signs in with (kept in the tab's ``sessionStorage``), so the files themselves are
public and need no state here. Files are read once and served from memory by name (a fixed
set: no path from the request reaches the file system), each with a strict
Content-Security-Policy (scripts and styles only from this origin, no inline code, no frames)
and an ETag so a reload costs a 304. It must never compute anything per message: rates are
counter deltas the browser takes between polls.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import mimetypes

from aiohttp import web

from raftq.node import httpio
from raftq.node.auth import PUBLIC, Permission
from raftq.node.errors import ApiError
from raftq.node.routes import LOCAL, Route
from raftq.node.service import BrokerService

# Everything the pages load comes from this origin; API calls included (connect-src). No
# inline script or style, no eval, no plugins, no framing (clickjacking), no base or form
# redirection elsewhere.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",  # revalidate (ETag): a new version shows at the next load
}
_TYPES = {
    ".js": "text/javascript",
    ".css": "text/css",
    ".html": "text/html",
    ".svg": "image/svg+xml",
}
ASSET_TYPES = ",".join(sorted(set(_TYPES.values())))  # (what the OpenAPI document declares)


def _load() -> dict[str, tuple[bytes, str, str]]:
    """name -> (bytes, content type, ETag) of every file in ``ui/``."""
    out: dict[str, tuple[bytes, str, str]] = {}
    for entry in importlib.resources.files("raftq.node").joinpath("ui").iterdir():
        name = entry.name
        if not entry.is_file() or name.startswith("."):
            continue
        data = entry.read_bytes()
        suffix = name[name.rfind(".") :]
        ctype = _TYPES.get(suffix) or mimetypes.guess_type(name)[0] or "application/octet-stream"
        out[name] = (data, ctype, '"' + hashlib.sha256(data).hexdigest()[:16] + '"')
    return out


FILES = _load()


async def add_headers(request: web.Request, response: web.StreamResponse) -> None:
    """(``on_response_prepare``) The console's headers on every answer under ``/ui``: a 404
    or 405 from the router, or an error, too."""
    if request.path == "/ui" or request.path.startswith("/ui/"):
        response.headers.update(HEADERS)


def _serve(request: web.Request, name: str) -> web.Response:
    found = FILES.get(name)
    if found is None:  # (a JSON error like every other route's)
        return httpio.error_response(
            ApiError("route_not_found", f"the console has no file {name!r}", {"file": name})
        )
    data, ctype, etag = found
    headers = {"ETag": etag, "Cache-Control": HEADERS["Cache-Control"]}
    if request.headers.get("If-None-Match") == etag:
        return web.Response(status=304, headers=headers)
    return web.Response(body=data, content_type=ctype, headers=headers)


async def index(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    return _serve(request, "index.html")


async def asset(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    return _serve(request, request.match_info["file"])


async def to_index(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    # (relative links in the page resolve against /ui/; a body of the declared type)
    body = '<a href="/ui/">/ui/</a>\n'
    return web.Response(
        status=308, headers={"Location": "/ui/"}, text=body, content_type="text/html"
    )


_OPEN = Permission(PUBLIC)
ROUTES = [
    Route("GET", "/ui", to_index, "The web console (redirects to /ui/)", where=LOCAL,
          strict_query=False, ok=(308,), answer="text/html", op="getConsoleRoot", perm=_OPEN),
    Route("GET", "/ui/", index, "The web console: sign in with a token", where=LOCAL,
          strict_query=False, answer="text/html", op="getConsole", perm=_OPEN),
    Route("GET", "/ui/{file}", asset, "A file of the web console (script, style sheet)",
          where=LOCAL, strict_query=False, ok=(200, 304), answer=ASSET_TYPES,
          params={"file": "a file name, e.g. app.js"}, op="getConsoleFile", perm=_OPEN),
]  # fmt: skip
