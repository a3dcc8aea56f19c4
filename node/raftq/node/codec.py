"""Bodies on the wire: JSON by default, msgpack on request (pure: no aiohttp; ``httpio`` applies
these rules to requests and responses).

A request body is msgpack when its ``Content-Type`` is ``application/msgpack`` (or
``application/x-msgpack``, ``application/vnd.msgpack``), JSON otherwise. A response is msgpack
when ``Accept`` prefers msgpack (q-values count; ``q=0`` refuses), or when the request was msgpack
and ``Accept`` prefers neither; a write whose ``Accept`` allows neither gets 406 (a read falls
back to JSON). In JSON, ``bytes`` travel as base64 strings (message payloads); in msgpack as raw
bytes. A message may come as ``text`` (a string, stored as its UTF-8 bytes) instead of
``payload``, and a reader asking ``payload_encoding=utf-8`` gets each payload that is valid UTF-8
back as ``text`` (``payloads_as_text``); the state machine stores bytes either way.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from typing import Any

import msgpack

from raftq.node.errors import ApiError

JSON = "application/json"
MSGPACK = "application/msgpack"
_MSGPACK_TYPES = frozenset([MSGPACK, "application/x-msgpack", "application/vnd.msgpack"])


def is_msgpack_type(content_type: str) -> bool:
    return content_type in _MSGPACK_TYPES


_RANGE_RANK = {"*/*": 0, "application/*": 1}


def _accept_q(accept: str) -> tuple[float, float]:
    """How much an ``Accept`` header wants (JSON, msgpack): the q of the most specific range
    matching each (``*/*`` < ``application/*`` < the type itself), 0 when none matches."""
    best = {"json": (-1, 0.0), "msgpack": (-1, 0.0)}
    for part in accept.split(","):
        kind, *params = (p.strip() for p in part.split(";"))
        kind = kind.lower()
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = min(1.0, max(0.0, float(value)))
                except ValueError:
                    q = 0.0
                if not math.isfinite(q):
                    q = 0.0
        rank = _RANGE_RANK.get(kind, -1)
        for fmt, types in (("json", (JSON,)), ("msgpack", _MSGPACK_TYPES)):
            r = 2 if kind in types else rank
            if r > best[fmt][0]:
                best[fmt] = (r, q)
    return best["json"][1], best["msgpack"][1]


def check_accept(accept: str) -> None:
    """Refuse (406) up front an ``Accept`` that allows neither format: after the handler ran,
    a refusal would hide that the command was applied."""
    accept = accept.strip()
    if accept and accept not in (JSON, MSGPACK) and max(_accept_q(accept)) <= 0:
        raise ApiError(
            "not_acceptable",
            f"Accept {accept[:100]!r} allows neither {JSON} nor {MSGPACK}",
            {"accept": accept[:200]},
        )


def prefers_msgpack(accept: str, msgpack_body: bool) -> bool:
    """Whether to answer in msgpack: as ``Accept`` prefers, else as the request body came."""
    accept = accept.strip()
    if not accept:
        return msgpack_body
    if accept == JSON:
        return False
    if accept == MSGPACK:
        return True
    q_json, q_msgpack = _accept_q(accept)
    if q_json == q_msgpack:
        return msgpack_body
    return q_msgpack > q_json


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
        why = str(e) or (
            "nesting too deep" if isinstance(e, msgpack.StackError) else type(e).__name__
        )
        raise ApiError("malformed_body", f"request body is not valid {kind}: {why}") from None
    if not isinstance(obj, dict):
        raise ApiError("malformed_body", "request body must be a map (JSON object)")
    _check_values(obj, 0, not msgpack_body)  # (msgpack's decoder refuses bad UTF-8 itself)
    return obj


MAX_DEPTH = 32
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 64) - 1


def _check_values(obj: Any, depth: int, text: bool = True) -> None:
    """Reject what cannot be replicated faithfully: integers beyond 64 bits, non-finite floats
    (JSON ``1e400``), strings that are not Unicode text (JSON ``"\\ud800"``, a lone surrogate:
    no UTF-8 for it) and nesting deeper than ``MAX_DEPTH``."""
    if depth > MAX_DEPTH:
        raise ApiError("malformed_body", f"request body nests deeper than {MAX_DEPTH} levels")
    t = type(obj)
    if t is bytes:  # payloads
        return
    if t is str:
        if text and not obj.isascii():
            _check_text(obj)
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            if text and type(k) is str and not k.isascii():
                _check_text(k)
            _check_values(v, depth + 1, text)
    elif isinstance(obj, list):
        for v in obj:
            _check_values(v, depth + 1, text)
    elif isinstance(obj, bool):
        return
    elif isinstance(obj, int):
        if not _INT_MIN <= obj <= _INT_MAX:
            raise ApiError("invalid_argument", f"integer {obj} is out of the 64-bit range")
    elif isinstance(obj, float) and not math.isfinite(obj):
        raise ApiError("invalid_argument", "numbers must be finite")


def _check_text(s: str) -> None:
    """(Called for strings that are not ASCII: nearly every string is, names, keys, base64.)"""
    try:
        s.encode()
    except UnicodeEncodeError:
        raise ApiError(
            "invalid_argument",
            f"string {s[:40]!r} is not valid Unicode text (a lone surrogate)",
        ) from None


def check_frame(obj: Any) -> None:
    """``decode_body``'s checks for a map that came another way (a WebSocket frame)."""
    _check_values(obj, 0)


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


PAYLOAD_ENCODINGS = ("base64", "utf-8")


def payloads_as_text(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``payload_encoding=utf-8``: each message whose payload is valid UTF-8 carries it as
    ``text`` instead of ``payload``; the others keep ``payload`` (base64 in JSON), so a reader
    tells which by the field."""
    out = []
    for m in messages:
        payload = m.get("payload")
        if isinstance(payload, bytes):
            try:
                text = payload.decode()
            except UnicodeDecodeError:
                pass
            else:
                m = {k: v for k, v in m.items() if k != "payload"}
                m["text"] = text
        out.append(m)
    return out
