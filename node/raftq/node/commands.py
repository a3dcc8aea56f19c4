"""Decoded wire input -> validated state-machine commands (pure: no aiohttp, no I/O).

Every transport (HTTP routes, WebSocket frames, and later other facades) builds its commands
here, so a rule holds the same whichever way a request came: unknown fields, required fields
and JSON types (``check_fields``), names, message shapes, settle batches. What a command's
fields mean is the state machine's business (``raftq.cluster.state``); this module checks what
must be refused before anything is proposed, naming the field, and raises ``ApiError``.
"""

from __future__ import annotations

import ipaddress
import re
import secrets
from collections.abc import Callable
from typing import Any

from raftq.cluster import validate
from raftq.cluster.errors import BrokerError
from raftq.node import codec
from raftq.node.errors import ApiError

MAX_WAIT_S = 20.0  # the longest receive long poll
MAX_CONSUMER_LEN = 256
MAX_EXPIRES_IN_S = 10 * 365 * 86400  # a token's expires_in

NUM = "number"
INT = "integer"
STR = "string"
MAP = "map"
LIST = "list"
BOOL = "boolean"
ANY = "any"  # checked by whoever uses the value (a payload, a frame's id)


def _is(value: Any, kind: str) -> bool:
    if kind == NUM:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == INT:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == STR:
        return isinstance(value, str)
    if kind == MAP:
        return isinstance(value, dict)
    if kind == LIST:
        return isinstance(value, list)
    if kind == BOOL:
        return isinstance(value, bool)
    return True


def check_fields(
    body: dict[str, Any], allowed: dict[str, str], required: tuple[str, ...] = (), where: str = ""
) -> dict[str, Any]:
    """Reject unknown fields, missing required ones and wrong JSON types, naming the field."""
    unknown = sorted(str(k) for k in body if k not in allowed)
    if unknown:
        raise ApiError(
            "unknown_field",
            f"unknown field(s) {where}{', '.join(unknown)}",
            {"fields": unknown},
        )
    for f in required:
        if body.get(f) is None:
            raise ApiError("invalid_argument", f"{where}{f} is required", {"field": f})
    for f, kind in allowed.items():
        if kind == ANY:
            continue
        value = body.get(f)
        if value is not None and not _is(value, kind):
            raise ApiError("invalid_argument", f"{where}{f} must be a {kind}", {"field": f})
    return body


def name(value: Any, field: str) -> str:
    """A topic, group or node name (``validate.name``'s rules), as an ``ApiError``."""
    try:
        return validate.name(value, field)
    except BrokerError as e:
        raise ApiError.from_wire(e.to_wire()) from None


def _checked(check: Callable[..., Any], *args: Any) -> None:
    """A ``validate`` check, its error as an ``ApiError``."""
    try:
        check(*args)
    except BrokerError as e:
        raise ApiError.from_wire(e.to_wire()) from None


def _given(body: dict[str, Any]) -> dict[str, Any]:
    """The fields that are set (a JSON ``null`` means "not given")."""
    return {k: v for k, v in body.items() if v is not None}


def empty(body: dict[str, Any]) -> None:
    """A route that takes no fields (an empty body or ``{}``)."""
    check_fields(body, {})


def cluster_settings(body: dict[str, Any]) -> dict[str, Any]:
    """A change of cluster settings: the fields given (null: back to no limit)."""
    check_fields(body, {"max_retained_bytes": INT})
    if not body:
        raise ApiError(
            "invalid_argument", "name a setting to change, e.g. max_retained_bytes",
            {"field": "max_retained_bytes"},
        )  # fmt: skip
    _checked(validate.cluster_settings, body, {})
    return {"op": "cluster_settings", "config": body}


# ---------------------------------------------------------------------- topics and groups


def create_topic(body: dict[str, Any]) -> dict[str, Any]:
    check_fields(
        body, {"topic": STR, "config": MAP, "groups": LIST, "if_not_exists": BOOL}, ("topic",)
    )
    name(body["topic"], "topic")
    for i, spec in enumerate(body.get("groups") or []):
        if not isinstance(spec, dict):
            raise ApiError("invalid_argument", f"groups[{i}] must be a map", {"field": "groups"})
        check_fields(spec, {"group": STR, "config": MAP}, ("group",), f"groups[{i}].")
    cmd = {"op": "create_topic", **_given(body)}
    # The whole spec, here: the state machine checks whether the topic exists first (as
    # older versions do), so with if_not_exists it would answer created=false to a bad one.
    _checked(validate.topic_spec, body["topic"], cmd)
    return cmd


def update_topic(topic: str, body: dict[str, Any]) -> dict[str, Any]:
    check_fields(body, {"config": MAP}, ("config",))
    return {"op": "update_topic", "topic": topic, "config": body["config"]}


def create_group(topic: str, body: dict[str, Any]) -> dict[str, Any]:
    check_fields(
        body, {"group": STR, "config": MAP, "start": STR, "if_not_exists": BOOL}, ("group",)
    )
    name(body["group"], "group")
    cmd = {"op": "create_group", "topic": topic, **_given(body)}
    # (As create_topic: the state machine checks the config only for a group it creates.)
    name(topic, "topic")
    if cmd.get("start", "latest") not in ("latest", "earliest"):
        raise ApiError(
            "invalid_argument", "start must be 'latest' or 'earliest'", {"field": "start"}
        )
    _checked(validate.group_config, topic, cmd.get("config") or {})
    return cmd


def update_group(topic: str, group: str, body: dict[str, Any]) -> dict[str, Any]:
    check_fields(body, {"config": MAP}, ("config",))
    return {"op": "update_group", "topic": topic, "group": group, "config": body["config"]}


def redrive(topic: str, body: dict[str, Any]) -> dict[str, Any]:
    check_fields(body, {"max": INT})
    cmd: dict[str, Any] = {"op": "redrive", "topic": topic}
    if body.get("max") is not None:
        cmd["max"] = body["max"]
    return cmd


# ---------------------------------------------------------------------- publish

# ``text`` instead of ``payload``: the message's bytes are that string's UTF-8 (for JSON users,
# who need not base64 then); a message has exactly one of the two.
MESSAGE_FIELDS = {
    "payload": ANY, "text": STR, "headers": MAP, "key": STR, "delay": NUM, "ordering_key": STR,
}  # fmt: skip
RESERVED_HEADER = "x-raftq-"  # dead-letter history and redrive counts: set by the broker only
_PLAIN_MESSAGE_KEYS = frozenset(("payload", "key"))


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def header_names(hdrs: dict[Any, Any], where: str) -> None:
    """Header names a client may set: not empty, no control character (they end up in logs,
    dead-letter history and other protocols' headers), none of the broker's own. (Checked
    here, not by the state machine: a node of an older version would still apply them.)"""
    for k in hdrs:
        if not isinstance(k, str):
            continue  # (the state machine says: a map of string to string)
        if not k or _CONTROL.search(k):
            raise ApiError(
                "invalid_argument",
                f"{where}.headers: a header name must not be empty or hold a control"
                f" character, got {k[:100]!r}",
                {"field": "headers", "header": k[:100]},
            )
        if k.lower().startswith(RESERVED_HEADER):
            # The broker's own (dead-letter history, redrive counts): a client setting them
            # could make a redrive deliver into another topic's group.
            raise ApiError(
                "invalid_argument",
                f"{where}.headers: names starting {RESERVED_HEADER} are the broker's own",
                {"field": "headers", "header": k[:100]},
            )


def message(m: Any, where: str, msgpack_body: bool) -> tuple[dict[str, Any], int]:
    """One wire message as the command's message, and its payload's size."""
    # Fast path for the common msgpack shape {payload: bytes, key?: str} (the client's own):
    # nothing to convert or drop, so the decoded map itself becomes the command's message.
    if msgpack_body and type(m) is dict and m.keys() <= _PLAIN_MESSAGE_KEYS:
        payload = m.get("payload")
        key = m.get("key", "-")
        if type(payload) is bytes and type(key) is str and key:
            return m, len(payload)
    if not isinstance(m, dict):
        raise ApiError("invalid_argument", f"{where} must be a map", {"field": "messages"})
    check_fields(m, MESSAGE_FIELDS, (), where + ".")
    has_payload, has_text = m.get("payload") is not None, m.get("text") is not None
    if has_payload == has_text:
        raise ApiError(
            "invalid_argument",
            f"{where} needs payload (base64 in JSON) or text (a string), not "
            + ("both" if has_payload else "neither"),
            {"field": "payload"},
        )
    if m.get("key") == "":
        # A key names one message for dedup: "" would make every keyed publish after the
        # first a "duplicate" of it (dropped) for the whole dedup window.
        raise ApiError(
            "invalid_argument", f"{where}.key must not be empty (omit it for no key)",
            {"field": "key"},
        )  # fmt: skip
    hdrs = m.get("headers")
    if hdrs:
        header_names(hdrs, where)
    out = dict(m)
    text = out.pop("text", None)
    if has_text:
        out["payload"] = text.encode()  # (decode_body refused lone surrogates)
    else:
        out["payload"] = codec.payload_in(m["payload"], where + ".payload", msgpack_body)
    for k in ("headers", "key", "delay", "ordering_key"):
        if out.get(k) is None:
            out.pop(k, None)
    return out, len(out["payload"])


def publish(topic: str, messages: list[Any], msgpack_body: bool) -> tuple[dict[str, Any], int]:
    """The ``publish`` command for a batch of wire messages, and its payload bytes."""
    if not messages:
        raise ApiError("invalid_argument", "messages must not be empty", {"field": "messages"})
    msgs, size = [], 0
    for i, m in enumerate(messages):
        msg, n = message(m, f"messages[{i}]", msgpack_body)
        msgs.append(msg)
        size += n
    return {"op": "publish", "topic": topic, "messages": msgs}, size


def publish_one(topic: str, body: Any, msgpack_body: bool) -> tuple[dict[str, Any], int]:
    msg, size = message(body, "message", msgpack_body)
    return {"op": "publish", "topic": topic, "messages": [msg]}, size


def publish_batch(
    topic: str, body: dict[str, Any], msgpack_body: bool
) -> tuple[dict[str, Any], int]:
    check_fields(body, {"messages": LIST}, ("messages",))
    return publish(topic, body["messages"], msgpack_body)


# ---------------------------------------------------------------------- receive and settle


def fresh_consumer() -> str:
    """A consumer id for a receive that names none (each such receive its own)."""
    return f"c-{secrets.token_hex(8)}"


def receive(topic: str, group: str, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """The ``receive`` command (without its token: each proposal gets a fresh one) and how
    long the long poll may wait."""
    check_fields(body, {"consumer": STR, "max": INT, "wait": NUM, "visibility": NUM})
    wait = body.get("wait") or 0
    if not 0 <= wait <= MAX_WAIT_S:
        raise ApiError(
            "invalid_argument", f"wait must be between 0 and {MAX_WAIT_S} seconds",
            {"field": "wait"},
        )  # fmt: skip
    consumer = body.get("consumer") or fresh_consumer()
    if len(consumer) > MAX_CONSUMER_LEN:
        raise ApiError(
            "invalid_argument", f"consumer is longer than {MAX_CONSUMER_LEN} characters",
            {"field": "consumer"},
        )  # fmt: skip
    cmd: dict[str, Any] = {"op": "receive", "topic": topic, "group": group, "consumer": consumer}
    for k in ("max", "visibility"):
        if body.get(k) is not None:
            cmd[k] = body[k]
    return cmd, wait


# The fields each settle takes besides ``receipts`` (the same over HTTP and WebSocket).
SETTLE_FIELDS: dict[str, dict[str, str]] = {
    "ack": {},
    "nack": {"delay": NUM},
    "extend": {"seconds": NUM},
    "term": {"reason": STR},
}
_SETTLE_REQUIRED = {"extend": ("receipts", "seconds")}


def settle(op: str, body: dict[str, Any]) -> dict[str, Any]:
    """An ack / nack / extend / term (``op``, one of ``SETTLE_FIELDS``) of a batch of
    receipts, over HTTP or a stream alike. The batch must be a non-empty list of strings; a
    receipt in it that is not ours or whose delivery is over is reported in the result's
    ``errors`` by the state machine (``receipt_invalid``, ``receipt_stale``), not refused."""
    check_fields(
        body, {"receipts": LIST, **SETTLE_FIELDS[op]}, _SETTLE_REQUIRED.get(op, ("receipts",))
    )
    receipts = body["receipts"]
    if not receipts or not all(isinstance(r, str) for r in receipts):
        raise ApiError(
            "invalid_argument", "receipts must be a non-empty list of strings",
            {"field": "receipts"},
        )  # fmt: skip
    return {"op": op, **_given(body)}


def release(consumer_id: str) -> dict[str, Any]:
    if not consumer_id or len(consumer_id) > MAX_CONSUMER_LEN:
        raise ApiError(
            "invalid_argument", f"consumer must be 1 to {MAX_CONSUMER_LEN} characters",
            {"field": "consumer"},
        )  # fmt: skip
    return {"op": "release", "consumer": consumer_id}


# ---------------------------------------------------------------------- cluster


def member(body: dict[str, Any]) -> tuple[str, str, str]:
    """A member to add: (id, Raft host:port, API host:port)."""
    check_fields(body, {"id": STR, "raft": STR, "api": STR}, ("id", "raft", "api"))
    node_id = name(body["id"], "id")
    for field in ("raft", "api"):
        if host_port(body[field]) is None:
            raise ApiError(
                "invalid_argument",
                f"{field} must be host:port (a DNS name, IPv4 or [IPv6] address, and a port"
                " 1-65535)",
                {"field": field},
            )
    return node_id, body["raft"], body["api"]


# (underscores too: Docker names containers proj_n4_1, and they resolve)
_HOST_NAME = re.compile(r"(?!-)[\w-]{1,63}(?<!-)(\.(?!-)[\w-]{1,63}(?<!-))*\.?", re.ASCII)


def host_port(value: str, bare_ipv6: bool = False) -> tuple[str, int] | None:
    """``host:port`` with a DNS name, an IPv4 address or a bracketed IPv6 address (with
    ``bare_ipv6`` also an unbracketed one, as ``:::8001``: the port follows the last colon),
    as (host without brackets, port); None if it is not one."""
    host, sep, port = value.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        return None
    literal = host[1:-1] if host.startswith("[") and host.endswith("]") else None
    if literal is None and bare_ipv6 and ":" in host:
        literal = host
    if literal is not None:
        try:
            ipaddress.IPv6Address(literal)
        except ValueError:
            return None
        return literal, int(port)
    if len(host) <= 253 and _HOST_NAME.fullmatch(host) is not None:
        return host, int(port)
    return None
