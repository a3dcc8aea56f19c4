"""Reading HTTP requests and writing responses in the negotiated format (``codec``'s rules
applied to aiohttp requests). Errors are always answered as JSON. A request body must arrive
within ``app[BODY_TIMEOUT]`` seconds (the node's ``--idle-timeout``), else 408 and the
connection closes: a body that never ends would hold its connection for good."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from raftq.node import codec
from raftq.node.errors import ApiError

BODY_TIMEOUT: web.AppKey[float] = web.AppKey("body_timeout", float)


def is_msgpack_request(request: web.BaseRequest) -> bool:
    return codec.is_msgpack_type(request.content_type)


def check_accept(request: web.BaseRequest) -> None:
    codec.check_accept(request.headers.get("Accept", ""))


def wants_msgpack(request: web.BaseRequest) -> bool:
    return codec.prefers_msgpack(request.headers.get("Accept", ""), is_msgpack_request(request))


def query_one(request: web.BaseRequest, name: str) -> str | None:
    """A query parameter given at most once (``?limit=1&limit=5000`` is refused, not guessed)."""
    values = request.query.getall(name, [])
    if len(values) > 1:
        raise ApiError("invalid_argument", f"{name} is given more than once", {"field": name})
    return values[0] if values else None


async def read_raw(request: web.Request) -> bytes:
    timeout = request.app.get(BODY_TIMEOUT)
    try:
        async with asyncio.timeout(timeout):
            return await request.read()
    except TimeoutError:
        request.content.feed_eof()  # (answer and close now: no waiting for the rest)
        raise ApiError(
            "request_timeout",
            f"the request body did not arrive within {timeout:g} s",
            close=True,
        ) from None
    except web.HTTPRequestEntityTooLarge as e:
        # Answered, then the connection is closed (after aiohttp has read, for a moment, what
        # the client still sends: no reset to lose the answer): whatever follows the part
        # read is not a request.
        raise ApiError("body_too_large", e.text or "request body too large", close=True) from None
    except web.RequestPayloadError as e:  # a Content-Encoding that does not decode, a cut body
        # The rest of the body cannot be skipped: answer, then close the connection (aiohttp
        # would fail again reading the rest, and log that as unhandled).
        request.content.feed_eof()
        message = " ".join(str(e).split())
        raise ApiError(
            "malformed_body", f"request body could not be read: {message}", close=True
        ) from None


async def read_body(request: web.Request) -> dict[str, Any]:
    return codec.decode_body(await read_raw(request), is_msgpack_request(request))


def respond(
    request: web.BaseRequest,
    obj: Any,
    status: int = 200,
    headers: dict[str, str] | None = None,
) -> web.Response:
    body, ctype = codec.encode(obj, wants_msgpack(request))
    return web.Response(body=body, status=status, content_type=ctype, headers=headers)


def error_response(err: ApiError) -> web.Response:
    # Errors are always JSON (the body is tiny and every client can read it).
    headers = dict(err.headers)
    if err.retry_after:
        headers["Retry-After"] = str(int(err.retry_after))
    return web.json_response(err.body(), status=err.status, headers=headers or None)
