"""The OpenAPI 3 document served at ``/openapi.json``.

Written by hand from one table (``OPERATIONS``); a test checks that its paths and methods are
exactly the app's routes, so it cannot drift silently. JSON bodies carry payloads as base64;
send ``Content-Type: application/msgpack`` / ``Accept: application/msgpack`` for msgpack with raw
bytes. Errors are always JSON ``{"code", "message", "details"}``.
"""

from __future__ import annotations

from typing import Any

from raftq.node.httperrors import STATUS_BY_CODE


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        out["required"] = required
    return out


S = {"type": "string"}
I = {"type": "integer"}  # noqa: E741
N = {"type": "number"}
B = {"type": "boolean"}
M = {"type": "object", "additionalProperties": True}
H = {"type": "object", "additionalProperties": {"type": "string"}}
B64 = {"type": "string", "format": "byte", "description": "base64 in JSON, raw bytes in msgpack"}
ANY = {"type": "object", "additionalProperties": True}

SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["code", "message", "details"],
        "properties": {
            "code": {"type": "string", "enum": sorted(STATUS_BY_CODE)},
            "message": S,
            "details": M,
        },
    },
    "TopicList": _obj({"topics": {"type": "array", "items": S}}),
    "AddMember": _obj({"id": S, "raft": S, "api": S}, ["id", "raft", "api"]),
    "CreateTopic": _obj(
        {
            "topic": S,
            "config": _ref("TopicConfig"),
            "groups": {"type": "array", "items": _ref("GroupSpec")},
            "if_not_exists": B,
        },
        ["topic"],
    ),
    "TopicConfig": _obj(
        {
            "max_messages": I,
            "max_bytes": I,
            "max_message_bytes": I,
            "overflow": {"type": "string", "enum": ["reject", "drop_oldest"]},
            "max_age": N,
            "dedup_window": N,
        }
    ),
    "GroupConfig": _obj(
        {
            "visibility_timeout": N,
            "max_attempts": I,
            "backoff": {"type": "array", "items": N},
            "dead_letter_topic": {"type": "string", "nullable": True},
        }
    ),
    "GroupSpec": _obj({"group": S, "config": _ref("GroupConfig")}, ["group"]),
    "UpdateTopic": _obj({"config": _ref("TopicConfig")}, ["config"]),
    "UpdateGroup": _obj({"config": _ref("GroupConfig")}, ["config"]),
    "CreateGroup": _obj(
        {
            "group": S,
            "config": _ref("GroupConfig"),
            "start": {"type": "string", "enum": ["latest", "earliest"]},
            "if_not_exists": B,
        },
        ["group"],
    ),
    "Message": _obj({"payload": B64, "headers": H, "key": S, "delay": N}, ["payload"]),
    "PublishBatch": _obj({"messages": {"type": "array", "items": _ref("Message")}}, ["messages"]),
    "Published": _obj({"seq": I, "duplicate": B}),
    "PublishedBatch": _obj({"messages": {"type": "array", "items": _ref("Published")}}),
    "Receive": _obj(
        {
            "consumer": {"type": "string", "description": "defaults to a fresh id per request"},
            "max": {"type": "integer", "minimum": 1, "maximum": 1000},
            "wait": {"type": "number", "minimum": 0, "maximum": 20},
            "visibility": N,
        }
    ),
    "Delivery": _obj(
        {
            "topic": S,
            "group": S,
            "seq": I,
            "attempt": I,
            "receipt": S,
            "payload": B64,
            "headers": H,
            "published_at": I,
            "deadline": I,
        }
    ),
    "Deliveries": _obj({"consumer": S, "deliveries": {"type": "array", "items": _ref("Delivery")}}),
    "Receipts": _obj({"receipts": {"type": "array", "items": S}}, ["receipts"]),
    "Nack": _obj({"receipts": {"type": "array", "items": S}, "delay": N}, ["receipts"]),
    "Extend": _obj(
        {"receipts": {"type": "array", "items": S}, "seconds": N}, ["receipts", "seconds"]
    ),
    "Term": _obj({"receipts": {"type": "array", "items": S}, "reason": S}, ["receipts"]),
    "SettleResult": {
        "type": "object",
        "description": "counts (acked / nacked / extended / terminated, dead_lettered) and "
        "per-receipt errors [{receipt, code, message, details}]",
        "additionalProperties": True,
    },
    "Peek": _obj(
        {
            "topic": S,
            "messages": {
                "type": "array",
                "items": _obj({"seq": I, "payload": B64, "headers": H, "published_at": I}),
            },
        }
    ),
    "Redrive": _obj({"max": I}),
    "Cluster": _obj(
        {
            "node": S,
            "role": S,
            "leader": S,
            "leader_api": S,
            "term": I,
            "commit_index": I,
            "applied_index": I,
            "members": ANY,
        }
    ),
    "Empty": _obj({}),
    "Any": ANY,
}

TG = "/topics/{topic}/groups/{group}"
# (method, path, summary, request schema or None, success status, response schema)
OPERATIONS: list[tuple[str, str, str, str | None, int, str]] = [
    ("GET", "/topics", "List topic names", None, 200, "TopicList"),
    (
        "POST",
        "/topics",
        "Create a topic (with groups; default group 'default')",
        "CreateTopic",
        201,
        "Any",
    ),
    ("GET", "/topics/{topic}", "Topic stats, config and groups", None, 200, "Any"),
    ("PATCH", "/topics/{topic}", "Change topic config", "UpdateTopic", 200, "Any"),
    ("DELETE", "/topics/{topic}", "Delete a topic", None, 200, "Any"),
    ("POST", "/topics/{topic}/purge", "Drop every retained message", "Empty", 200, "Any"),
    ("GET", "/topics/{topic}/groups", "Group stats of a topic", None, 200, "Any"),
    ("POST", "/topics/{topic}/groups", "Create a consumer group", "CreateGroup", 201, "Any"),
    ("GET", TG, "Group stats and config", None, 200, "Any"),
    ("PATCH", TG, "Change group config", "UpdateGroup", 200, "Any"),
    ("DELETE", TG, "Delete a group", None, 200, "Any"),
    ("POST", TG + "/purge", "Settle everything pending in a group", "Empty", 200, "Any"),
    (
        "POST",
        TG + "/receive",
        "Receive deliveries (long poll up to 20 s)",
        "Receive",
        200,
        "Deliveries",
    ),
    (
        "GET",
        TG + "/stream",
        "WebSocket streaming consumer (see raftq.node.stream; query "
        "prefetch, visibility, format, batch); a follower redirects (307) to the leader",
        None,
        101,
        "Any",
    ),
    ("POST", "/topics/{topic}/messages", "Publish one message", "Message", 200, "Published"),
    (
        "GET",
        "/topics/{topic}/messages",
        "Peek retained messages (e.g. dead letters)",
        None,
        200,
        "Peek",
    ),
    ("POST", "/topics/{topic}/publish", "Publish a batch", "PublishBatch", 200, "PublishedBatch"),
    (
        "GET",
        "/publish/stream",
        "WebSocket publisher: each frame is one batch publish, answered after commit (see "
        "raftq.node.stream; query format); a follower redirects (307) to the leader",
        None,
        101,
        "Any",
    ),
    (
        "POST",
        "/topics/{topic}/redrive",
        "Move dead letters back to their source group",
        "Redrive",
        200,
        "Any",
    ),
    ("POST", "/ack", "Acknowledge deliveries", "Receipts", 200, "SettleResult"),
    (
        "POST",
        "/nack",
        "Fail deliveries (retry after delay or backoff)",
        "Nack",
        200,
        "SettleResult",
    ),
    ("POST", "/extend", "Extend visibility deadlines", "Extend", 200, "SettleResult"),
    ("POST", "/term", "Dead-letter deliveries now", "Term", 200, "SettleResult"),
    (
        "POST",
        "/consumers/{consumer}/release",
        "Give back every delivery of a consumer",
        "Empty",
        200,
        "Any",
    ),
    ("GET", "/cluster", "This node, its role, the leader and the members", None, 200, "Cluster"),
    ("POST", "/cluster/members", "Add a member (start it first)", "AddMember", 200, "Any"),
    ("DELETE", "/cluster/members/{node}", "Remove a member", "Empty", 200, "Any"),
    ("GET", "/healthz", "Process is alive", None, 200, "Any"),
    ("GET", "/readyz", "Has a leader and is caught up (503 otherwise)", None, 200, "Any"),
    ("GET", "/metrics", "Prometheus metrics (text format)", None, 200, "Any"),
    ("GET", "/openapi.json", "This document", None, 200, "Any"),
]

_ERR = {"content": {"application/json": {"schema": _ref("Error")}}}


def _content(schema: str) -> dict[str, Any]:
    return {
        "application/json": {"schema": _ref(schema)},
        "application/msgpack": {"schema": _ref(schema)},
    }


def document() -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for method, path, summary, req, status, resp in OPERATIONS:
        params = [
            {"name": p, "in": "path", "required": True, "schema": S}
            for p in ("topic", "group", "consumer")
            if "{" + p + "}" in path
        ]
        if method == "GET" and path == "/topics/{topic}/messages":
            params += [
                {"name": "from_seq", "in": "query", "schema": I},
                {"name": "limit", "in": "query", "schema": I},
            ]
        op: dict[str, Any] = {
            "summary": summary,
            "operationId": f"{method.lower()}_{path}",
            "parameters": params,
            "responses": {
                str(status): {"description": "OK", "content": _content(resp)},
                "4XX": {"description": "client error", **_ERR},
                "503": {"description": "no leader / overloaded (see Retry-After)", **_ERR},
            },
        }
        if req is not None:
            op["requestBody"] = {"required": req != "Empty", "content": _content(req)}
        paths.setdefault(path, {})[method.lower()] = op
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "raftq node API",
            "version": "1",
            "description": __doc__,
        },
        "paths": paths,
        "components": {"schemas": SCHEMAS},
    }
