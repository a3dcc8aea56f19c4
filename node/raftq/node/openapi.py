"""The OpenAPI 3 document served at ``/openapi.json``, derived from the route tables
(``routes.Route``: summary, path and query parameters, body and response schemas), so every
route is documented and nothing else is. The schemas are written here. JSON bodies carry
payloads as base64; send ``Content-Type: application/msgpack`` / ``Accept:
application/msgpack`` for msgpack with raw bytes. Errors are always JSON ``{"code",
"message", "details"}``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from raftq.cluster.validate import NAME_RE
from raftq.node.auth import OBSERVE, PUBLIC
from raftq.node.errors import STATUS_BY_CODE

if TYPE_CHECKING:
    from raftq.node.routes import Query, Route


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
            "running": B,
            "error": {"type": "string", "description": "why Raft stopped (role: stopped)"},
        }
    ),
    "Grant": _obj(
        {
            "topics": {"type": "string", "description": "a topic, a prefix such as orders.*, or *"},
            "actions": {
                "type": "array",
                "items": {"type": "string", "enum": ["publish", "consume", "admin"]},
                "minItems": 1,
            },
        },
        ["topics", "actions"],
    ),
    "CreateToken": _obj(
        {
            "name": S,
            "grants": {"type": "array", "items": _ref("Grant")},
            "cluster": B,
            "expires_in": {"type": "number", "description": "seconds from now"},
        },
        ["name"],
    ),
    "UpdateToken": _obj(
        {
            "name": S,
            "grants": {"type": "array", "items": _ref("Grant")},
            "cluster": B,
            "expires_in": N,
            "disabled": B,
        }
    ),
    "Token": {
        "type": "object",
        "description": "a token's public view (create also answers its secret: token)",
        "additionalProperties": True,
    },
    "TokenList": _obj({"tokens": {"type": "array", "items": _ref("Token")}}),
    "Empty": _obj({}),
    "Any": ANY,
}

_ERR = {"content": {"application/json": {"schema": _ref("Error")}}}


def _content(schema: str) -> dict[str, Any]:
    return {
        "application/json": {"schema": _ref(schema)},
        "application/msgpack": {"schema": _ref(schema)},
    }


NAME = {"type": "string", "pattern": f"^{NAME_RE.pattern}$"}
_PATH_PARAM = re.compile(r"{(\w+)}")
_PATH_DOC = {"topic": "a topic name", "group": "a consumer group name"}


def _query(q: Query) -> dict[str, Any]:
    schema: dict[str, Any]
    if q.kind == "flag":
        schema = {"type": "string", "enum": ["1", "true"]}
    elif q.choices:
        schema = {"type": "string", "enum": list(q.choices)}
    else:
        schema = {"type": q.kind}
        if q.lo is not None:
            schema["minimum"] = q.lo
        if q.hi is not None:
            schema["maximum"] = q.hi
    if q.default is not None:
        schema["default"] = q.default
    out: dict[str, Any] = {"name": q.name, "in": "query", "schema": schema}
    if q.doc:
        out["description"] = q.doc
    return out


def _operation(route: Route) -> dict[str, Any]:
    params: list[dict[str, Any]] = []
    for p in _PATH_PARAM.findall(route.path):
        schema = NAME if p in ("topic", "group", "node") else S
        doc = route.params.get(p) or _PATH_DOC.get(p, p)
        params.append(
            {"name": p, "in": "path", "required": True, "schema": schema, "description": doc}
        )
    params += [_query(q) for q in route.query]
    if route.answer == "text/plain":
        content: dict[str, Any] = {"text/plain": {"schema": S}}
    else:
        content = _content(route.answer)
    responses: dict[str, Any] = {
        str(status): {"description": "switching to WebSocket" if status == 101 else "OK"}
        | ({} if status == 101 else {"content": content})
        for status in route.ok
    }
    responses.setdefault("4XX", {"description": "client error", **_ERR})
    responses.setdefault("503", {"description": "no leader / overloaded (see Retry-After)", **_ERR})
    op: dict[str, Any] = {
        "summary": route.summary,
        "operationId": f"{route.method.lower()}_{route.path}",
        "parameters": params,
        "responses": responses,
    }
    if route.perm is not None and route.perm.action in (PUBLIC, OBSERVE):
        op["security"] = []  # (OBSERVE: unless the node is run with --auth-observe)
    if route.body is not None:
        op["requestBody"] = {"required": route.body != "Empty", "content": _content(route.body)}
    return op


def document(routes: Sequence[Route]) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route)
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "raftq node API",
            "version": "1",
            "description": __doc__,
        },
        "paths": paths,
        "security": [{"bearer": []}],
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "rq_<id>.<secret>"}
            },
        },
    }
