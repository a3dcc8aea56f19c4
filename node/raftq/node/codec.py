"""Request and response bodies: JSON by default, msgpack on request.

A request body is msgpack when its ``Content-Type`` is ``application/msgpack`` (or
``application/x-msgpack``), JSON otherwise. A response is msgpack when ``Accept`` names msgpack,
or when the request was msgpack and ``Accept`` does not ask for JSON. In JSON, ``bytes`` travel as
base64 strings (message payloads); in msgpack as raw bytes.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from typing import Any

import msgpack
from aiohttp import web

from raftq.node.httperrors import ApiError

JSON = "application/json"
MSGPACK = "application/msgpack"
_MSGPACK_TYPES = frozenset([MSGPACK, "application/x-msgpack"])


def is_msgpack_request(request: web.BaseRequest) -> bool:
    return request.content_type in _MSGPACK_TYPES


def wants_msgpack(request: web.BaseRequest) -> bool:
    accept = request.headers.get("Accept", "")
    if any(t in accept for t in _MSGPACK_TYPES):
        return True
    if "json" in accept:
        return False
    return is_msgpack_request(request)


def _reject_constant(value: str) -> Any:
    raise ValueError(f"{value} is not valid JSON")


def decode_body(raw: bytes, msgpack_body: bool) -> dict[str, Any]:
    """Parse a request body into a map; an empty body is an empty map."""
    if not raw:
        return {}
    try:
        if msgpack_body:
            obj = msgpack.unpackb(raw, raw=False, strict_map_key=True)
        else:
            obj = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, TypeError, msgpack.UnpackException, RecursionError) as e:
        kind = "msgpack" if msgpack_body else "JSON"
        raise ApiError("malformed_body", f"request body is not valid {kind}: {e}") from None
    if not isinstance(obj, dict):
        raise ApiError("malformed_body", "request body must be a map (JSON object)")
    _check_values(obj, 0)
    return obj


MAX_DEPTH = 32
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 64) - 1


def _check_values(obj: Any, depth: int) -> None:
    """Reject what cannot be replicated faithfully: integers beyond 64 bits, non-finite floats
    (JSON ``1e400``) and nesting deeper than ``MAX_DEPTH``."""
    if depth > MAX_DEPTH:
        raise ApiError("malformed_body", f"request body nests deeper than {MAX_DEPTH} levels")
    t = type(obj)
    if t is bytes or t is str:  # most values (payloads, names, keys): nothing to check
        return
    if isinstance(obj, dict):
        for v in obj.values():
            _check_values(v, depth + 1)
    elif isinstance(obj, list):
        for v in obj:
            _check_values(v, depth + 1)
    elif isinstance(obj, bool):
        return
    elif isinstance(obj, int):
        if not _INT_MIN <= obj <= _INT_MAX:
            raise ApiError("invalid_argument", f"integer {obj} is out of the 64-bit range")
    elif isinstance(obj, float) and not math.isfinite(obj):
        raise ApiError("invalid_argument", "numbers must be finite")


async def read_raw(request: web.Request) -> bytes:
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge as e:
        raise ApiError("body_too_large", e.text or "request body too large") from None


async def read_body(request: web.Request) -> dict[str, Any]:
    return decode_body(await read_raw(request), is_msgpack_request(request))


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, bytes):
        return base64.b64encode(obj).decode("ascii")
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    return obj


def encode(obj: Any, use_msgpack: bool) -> tuple[bytes, str]:
    if use_msgpack:
        return msgpack.packb(obj, use_bin_type=True), MSGPACK
    return json.dumps(_jsonable(obj), separators=(",", ":")).encode(), JSON


def respond(
    request: web.BaseRequest,
    obj: Any,
    status: int = 200,
    headers: dict[str, str] | None = None,
) -> web.Response:
    body, ctype = encode(obj, wants_msgpack(request))
    return web.Response(body=body, status=status, content_type=ctype, headers=headers)


def payload_in(value: Any, field: str, msgpack_body: bool) -> bytes:
    """A message payload from a request: base64 in JSON, raw bytes (or UTF-8 text) in msgpack."""
    if msgpack_body:
        if isinstance(value, bytes):
            return value
        if isinstance(value, str):
            return value.encode()
        raise ApiError("invalid_argument", f"{field} must be bytes", {"field": field})
    if not isinstance(value, str):
        raise ApiError("invalid_argument", f"{field} must be a base64 string", {"field": field})
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(
            "invalid_argument", f"{field} is not valid base64", {"field": field}
        ) from None
