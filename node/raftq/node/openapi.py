"""The OpenAPI 3 document served at ``/openapi.json``, derived from the route tables
(``routes.Route``: summary, operationId, path and query parameters, body and response schemas,
statuses; the tag is the route's module), so every route is documented and nothing else is. The
schemas are written here, with the limits of ``raftq.cluster.validate`` and ``commands``:
request bodies are closed (the node refuses unknown fields) and carry names' patterns, numeric
ranges and minItems; answers are open (a later version may add fields). ``DESCRIPTION`` is what
a user reads first (info.description).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from raftq.cluster.grants import MAX_GRANTS, MAX_PATTERNS
from raftq.cluster.topics import GROUP_COUNTERS, TOPIC_COUNTERS
from raftq.cluster.validate import (
    MAX_BACKOFF_STEPS,
    MAX_DELAY_S,
    MAX_HEADER_LEN,
    MAX_HEADERS,
    MAX_INT,
    MAX_KEY_LEN,
    MAX_LABEL_KEY_LEN,
    MAX_LABEL_VALUE_LEN,
    MAX_LABELS,
    MAX_ORDERING_KEY_LEN,
    MAX_RECEIVE,
    MAX_TIMEOUT_S,
    NAME_RE,
    TOKEN_ID_RE,
)
from raftq.node.auth import OBSERVE, PUBLIC
from raftq.node.commands import MAX_CONSUMER_LEN, MAX_EXPIRES_IN_S, MAX_WAIT_S
from raftq.node.errors import STATUS_BY_CODE
from raftq.node.routes import LEADER

if TYPE_CHECKING:
    from raftq.node.routes import Query, Route


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    """A request body's object: the node refuses fields it does not know."""
    out: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        out["required"] = required
    return out


def _answer(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    """An answer's object: a later version may add fields."""
    out: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        out["required"] = required
    return out


def _int(lo: int = 0, hi: int = MAX_INT) -> dict[str, Any]:
    return {"type": "integer", "minimum": lo, "maximum": hi}


def _secs(lo: float, hi: float, doc: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"type": "number", "minimum": lo, "maximum": hi}
    if doc:
        out["description"] = doc
    return out


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {**schema, "nullable": True}


def _list(items: dict[str, Any], lo: int = 0, hi: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "array", "items": items}
    if lo:
        out["minItems"] = lo
    if hi is not None:
        out["maxItems"] = hi
    return out


S = {"type": "string"}
I = {"type": "integer"}  # noqa: E741
N = {"type": "number"}
B = {"type": "boolean"}
M = {"type": "object", "additionalProperties": True}
NAME = {"type": "string", "pattern": f"^{NAME_RE.pattern}$"}
TOKEN_ID = {"type": "string", "pattern": f"^{TOKEN_ID_RE.pattern}$"}
PATTERN = {
    "type": "string",
    "pattern": f"^(\\*|{NAME_RE.pattern}(\\.\\*)?)$",
    "description": "a topic, a prefix such as orders.* (the topics below it), or *",
}
HOST_PORT = {"type": "string", "pattern": "^.+:[0-9]{1,5}$", "description": "host:port"}
B64 = {"type": "string", "format": "byte", "description": "base64 in JSON, raw bytes in msgpack"}
TEXT = {
    "type": "string",
    "description": "the payload as text, instead of payload: stored as its UTF-8 bytes",
}
TEXT_OUT = {
    "type": "string",
    "description": "with payload_encoding=utf-8, a payload that is valid UTF-8 comes as text"
    " instead of payload",
}
HEADERS = {
    "type": "object",
    "additionalProperties": {"type": "string", "maxLength": MAX_HEADER_LEN},
    "maxProperties": MAX_HEADERS,
    "description": "names: not empty, no control character, not starting x-raftq- (the"
    " broker's own)",
}
ANSWER_HEADERS = {"type": "object", "additionalProperties": {"type": "string"}}
ORDERING_KEY = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_ORDERING_KEY_LEN,
    "description": "in a group with ordered: true, delivered one at a time per key, in order",
}
LABELS = {
    "type": "object",
    "maxProperties": MAX_LABELS,
    "additionalProperties": {"type": "string", "maxLength": MAX_LABEL_VALUE_LEN},
    # (OpenAPI 3.0 has no propertyNames: the key rule is in the description)
    "description": f"free-form labels, keys of 1 to {MAX_LABEL_KEY_LEN} characters"
    " (update_topic replaces them all)",
}
RECEIPTS = _list({"type": "string"}, lo=1)
CONSUMER = {"type": "string", "minLength": 1, "maxLength": MAX_CONSUMER_LEN}
ANY = {"type": "object", "additionalProperties": True}
_COUNTERS = {
    f"{k}_total": I for k in (*TOPIC_COUNTERS, *GROUP_COUNTERS)
}  # (topic or group counters)

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
    # ------------------------------------------------------------- request bodies
    "AddMember": _obj({"id": NAME, "raft": HOST_PORT, "api": HOST_PORT}, ["id", "raft", "api"]),
    "CreateTopic": _obj(
        {
            "topic": NAME,
            "config": _ref("TopicConfig"),
            "groups": _list(_ref("GroupSpec"), hi=None),
            "if_not_exists": B,
        },
        ["topic"],
    ),
    "TopicConfig": _obj(
        {
            "max_messages": _nullable(_int(1)),
            "max_bytes": _nullable(_int(1)),
            "max_message_bytes": _int(1, 64 << 20),
            "overflow": {"type": "string", "enum": ["reject", "drop_oldest"]},
            "max_age": _nullable(_secs(0.001, 10 * 365 * 86400, "seconds; null: kept")),
            "dedup_window": _secs(0, 7 * 86400, "seconds"),
            "labels": LABELS,
        }
    ),
    "GroupConfig": _obj(
        {
            "visibility_timeout": _secs(0.001, MAX_TIMEOUT_S, "seconds"),
            "max_attempts": _int(0, 1_000_000),
            "backoff": _list(_secs(0, MAX_TIMEOUT_S), hi=MAX_BACKOFF_STEPS),
            "dead_letter_topic": _nullable(NAME),
            "ordered": {
                **B,
                "description": "hold back a message while an earlier one of its ordering_key"
                " is held (in flight, delayed or waiting for redelivery)",
            },
        }
    ),
    "GroupSpec": _obj({"group": NAME, "config": _ref("GroupConfig")}, ["group"]),
    "UpdateTopic": _obj({"config": _ref("TopicConfig")}, ["config"]),
    "UpdateClusterSettings": _obj(
        {
            "max_retained_bytes": _nullable(
                {
                    **_int(0),
                    "description": "payload bytes retained over every topic at most; a publish"
                    " past it gets 507 storage_full (dead letters and redrives pass); null: none",
                }
            )
        }
    ),
    "UpdateGroup": _obj({"config": _ref("GroupConfig")}, ["config"]),
    "CreateGroup": _obj(
        {
            "group": NAME,
            "config": _ref("GroupConfig"),
            "start": {"type": "string", "enum": ["latest", "earliest"]},
            "if_not_exists": B,
        },
        ["group"],
    ),
    "Message": _obj(
        {
            "payload": B64,
            "text": TEXT,
            "headers": HEADERS,
            "key": {
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_KEY_LEN,
                "description": "idempotency key (a repeat within dedup_window is stored once)",
            },
            "delay": _secs(0, MAX_DELAY_S, "seconds before it may be delivered"),
            "ordering_key": ORDERING_KEY,
        },
    )
    | {"oneOf": [{"required": ["payload"]}, {"required": ["text"]}]},
    "PublishBatch": _obj({"messages": _list(_ref("Message"), lo=1)}, ["messages"]),
    "Receive": _obj(
        {
            "consumer": {**CONSUMER, "description": "defaults to a fresh id per request"},
            "max": _int(1, MAX_RECEIVE),
            "wait": _secs(0, MAX_WAIT_S, "long poll, seconds"),
            "visibility": _secs(0.001, MAX_TIMEOUT_S, "seconds (else the group's)"),
        }
    ),
    "Receipts": _obj({"receipts": RECEIPTS}, ["receipts"]),
    "Nack": _obj(
        {"receipts": RECEIPTS, "delay": _secs(0, MAX_TIMEOUT_S, "else the group's backoff")},
        ["receipts"],
    ),
    "Extend": _obj(
        {"receipts": RECEIPTS, "seconds": _secs(0.001, MAX_TIMEOUT_S)}, ["receipts", "seconds"]
    ),
    "Term": _obj(
        {"receipts": RECEIPTS, "reason": {"type": "string", "maxLength": 1024}}, ["receipts"]
    ),
    "Release": _obj(
        {
            "topics": {
                **_list(PATTERN, hi=MAX_PATTERNS),
                "description": "only deliveries on these topics (patterns the token holds)",
            }
        }
    ),
    "Redrive": _obj({"max": _int(1, 100_000)}),
    "Grant": _obj(
        {
            "topics": PATTERN,
            "actions": _list(
                {"type": "string", "enum": ["publish", "consume", "admin"]}, lo=1, hi=3
            ),
        },
        ["topics", "actions"],
    ),
    "CreateToken": _obj(
        {
            "name": NAME,
            "grants": _list(_ref("Grant"), hi=MAX_GRANTS),
            "cluster": B,
            "expires_in": {
                **_secs(0, MAX_EXPIRES_IN_S, "seconds from now"),
                "exclusiveMinimum": True,
            },
        },
        ["name"],
    ),
    "UpdateToken": _obj(
        {
            "name": NAME,
            "grants": _list(_ref("Grant"), hi=MAX_GRANTS),
            "cluster": B,
            "expires_in": {**_secs(0, MAX_EXPIRES_IN_S), "exclusiveMinimum": True},
            "disabled": B,
        }
    ),
    "Empty": _obj({}),
    # ------------------------------------------------------------- answers
    "TopicList": _answer(
        {
            "topics": _list(S),
            "next": _nullable({**S, "description": "the after of the next page; null: last"}),
            "stats": _list(_ref("TopicSummary")),
        },
        ["topics"],
    ),
    "TopicSummary": _answer(
        {
            "topic": S,
            "messages": I,
            "bytes": I,
            "last_seq": I,
            "oldest_age_ms": _nullable({**N, "description": "oldest retained message"}),
            "oldest_unsettled_age_ms": _nullable(
                {**N, "description": "oldest message a group has yet to settle"}
            ),
            "groups": {**I, "description": "how many"},
            "pending": {**I, "description": "summed over its groups (so are the next three)"},
            "delayed": I,
            "in_flight": I,
            "consumers": I,
            "counters": {**ANY, "description": "the topic's counters (published...)"},
            "group_counters": {
                **ANY,
                "description": "its groups' counters summed (delivered, acked, dead_lettered...)",
            },
        },
        ["topic", "messages"],
    ),
    "Created": _answer({"topic": S, "group": S, "created": B}, ["topic", "created"]),
    "Configured": _answer({"topic": S, "group": S, "config": ANY}, ["topic", "config"]),
    "Deleted": _answer({"topic": S, "group": S, "deleted": B}, ["topic", "deleted"]),
    "Purged": _answer({"topic": S, "group": S, "purged": I}, ["topic", "purged"]),
    "GroupStats": _answer(
        {
            "group": S,
            "config": ANY,
            "pending": I,
            "delayed": I,
            "in_flight": I,
            "consumers": I,
            "oldest_age_ms": _nullable(I),
            **_COUNTERS,
        },
        ["group", "pending", "delayed", "in_flight"],
    ),
    "TopicStats": _answer(
        {
            "topic": S,
            "config": ANY,
            "created_at": I,
            "messages": I,
            "bytes": I,
            "first_seq": _nullable(I),
            "last_seq": I,
            "oldest_age_ms": _nullable(I),
            "groups": _list(_ref("GroupStats")),
            **_COUNTERS,
        },
        ["topic", "messages", "bytes", "groups"],
    ),
    "GroupList": _answer({"topic": S, "groups": _list(_ref("GroupStats"))}, ["groups"]),
    "Published": _answer({"seq": I, "duplicate": B}, ["seq"]),
    "PublishedBatch": _answer({"messages": _list(_ref("Published"))}, ["messages"]),
    "Delivery": _answer(
        {
            "topic": S,
            "group": S,
            "seq": I,
            "attempt": I,
            "receipt": S,
            "payload": B64,
            "text": TEXT_OUT,
            "headers": ANSWER_HEADERS,
            "published_at": I,
            "deadline": I,
            "first_received_at": {**I, "description": "ms: the first delivery in this group"},
            "ordering_key": S,
        },
        ["seq", "attempt", "receipt"],
    ),
    "Deliveries": _answer(
        {"consumer": S, "deliveries": _list(_ref("Delivery"))}, ["consumer", "deliveries"]
    ),
    "SettleResult": _answer(
        {
            "acked": I,
            "nacked": I,
            "extended": I,
            "terminated": I,
            "dead_lettered": I,
            "deadline": _nullable(I),
            "errors": _list(
                _answer(
                    {"receipt": S, "code": S, "message": S, "details": M},
                    ["receipt", "code", "message"],
                )
            ),
        },
        ["errors"],
    ),
    "Released": _answer({"consumer": S, "released": I, "dead_lettered": I}, ["released"]),
    "Peek": _answer(
        {
            "topic": S,
            "messages": _list(
                _answer(
                    {
                        "seq": I,
                        "payload": B64,
                        "text": TEXT_OUT,
                        "headers": ANSWER_HEADERS,
                        "published_at": I,
                        "ordering_key": S,
                    },
                    ["seq"],
                )
            ),
        },
        ["messages"],
    ),
    "Redriven": _answer({"topic": S, "redriven": I, "skipped": I}, ["redriven"]),
    "Cluster": _answer(
        {
            "node": S,
            "role": S,
            "leader": _nullable(S),
            "leader_api": _nullable(S),
            "term": I,
            "commit_index": I,
            "applied_index": I,
            "last_log_index": {
                **I,
                "description": "this node's last entry (--force-new-cluster takes it)",
            },
            "last_log_term": {**I, "description": "its term"},
            "members": {
                **ANY,
                "description": "id -> raft, api, connected, self, answers (its /healthz now),"
                " figures (NodeFigures, when it answers and shows them)",
            },
            "running": B,
            "you": _ref("Caller"),
            "error": {**S, "description": "why Raft stopped (role: stopped)"},
            "storage": _answer(
                {
                    "retained_bytes": I,
                    "max_retained_bytes": _nullable(I),
                    "disk": {**_ref("Disk"), "description": "this node's (not in memory)"},
                }
            ),
            "digest": {**S, "description": "with digest=1"},
        },
        ["node", "role", "members"],
    ),
    "ClusterSettings": _answer(
        {
            "settings": _answer({"max_retained_bytes": _nullable(I)}),
            "retained_bytes": {**I, "description": "payload bytes retained, every topic"},
        },
        ["settings", "retained_bytes"],
    ),
    "Membership": _answer({"added": S, "removed": S, "members": _list(S)}, ["members"]),
    "Health": _answer(
        {
            "ok": B,
            "node": S,
            "raft_error": {**S, "description": "why Raft stopped (503)"},
            "figures": _ref("NodeFigures"),
        },
        ["ok"],
    ),
    "NodeFigures": _answer(
        {
            "role": S,
            "term": I,
            "commit_index": I,
            "applied_index": I,
            "rss_bytes": _nullable({**I, "description": "resident memory (Linux)"}),
            "fsyncs": _nullable(I),
            "fsync_seconds": _nullable({**N, "description": "time spent in fsync, in all"}),
            "snapshots": _nullable({**I, "description": "written since start"}),
            "last_snapshot_seconds": _nullable({**N, "description": "how long the last took"}),
            "last_snapshot_at": _nullable(
                {**N, "description": "when the last was written (seconds since the epoch)"}
            ),
        },
        ["role"],
    ),
    "Caller": _answer(
        {
            "name": S,
            "cluster": {**B, "description": "may manage members and tokens"},
            "all": {**B, "description": "every right (bootstrap admin, or access control off)"},
            "grants": _list(_ref("Grant")),
        },
        ["name"],
    ),
    "Readiness": _answer(
        {
            "ready": B,
            "leader": _nullable(S),
            "caught_up": B,
            "draining": B,
            "removed": B,
            "raft_error": {**S, "description": "why Raft stopped"},
            "disk": {**_ref("Disk"), "description": "low on disk: still ready (consumers)"},
        },
        ["ready"],
    ),
    "Disk": _answer(
        {
            "free_bytes": I,
            "min_free_bytes": {**I, "description": "the reserve (--min-free-disk)"},
            "ok": {**B, "description": "false: publishes are refused, 507 storage_full"},
        },
        ["free_bytes", "min_free_bytes", "ok"],
    ),
    "Token": _answer(
        {
            "id": S,
            "name": S,
            "token": {**S, "description": "the secret (create only, shown once)"},
            "grants": _list(ANY),
            "cluster": B,
            "expires_at": _nullable(I),
            "disabled": B,
            "created_at": I,
        },
        ["id", "name"],
    ),
    "TokenList": _answer({"tokens": _list(_ref("Token"))}, ["tokens"]),
    "Revoked": _answer({"id": S, "revoked": B}, ["id", "revoked"]),
    "SqsCredentials": _answer(
        {"access_key_id": S, "secret_access_key": S, "region": S, "note": S},
        ["access_key_id", "secret_access_key"],
    ),
    "Any": ANY,
}

_ERR = {"content": {"application/json": {"schema": _ref("Error")}}}


def _content(schema: str) -> dict[str, Any]:
    return {
        "application/json": {"schema": _ref(schema)},
        "application/msgpack": {"schema": _ref(schema)},
    }


_HEADER = {"schema": S}
# The SQS protocols' answers, errors too (raftq.node.sqs.wire): AWS JSON 1.0 or XML.
SQS = "sqs"
_SQS_CONTENT = {"application/x-amz-json-1.0": {"schema": ANY}, "text/xml": {"schema": S}}
_RETRY = {"description": "seconds to wait before trying again", "schema": _int(0)}
_PATH_PARAM = re.compile(r"{(\w+)}")
_PATH_DOC = {"topic": "a topic name", "group": "a consumer group name"}
_FILE = {**S, "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]*$"}  # (a console file's name)
_PATH_SCHEMA = {"topic": NAME, "group": NAME, "node": NAME, "token": TOKEN_ID,
                "consumer": CONSUMER, "file": _FILE}  # fmt: skip


def _query(q: Query) -> dict[str, Any]:
    schema: dict[str, Any]
    if q.kind == "flag":
        schema = {"type": "string", "enum": ["1", "true"]}
    elif q.choices:
        schema = {"type": "string", "enum": list(q.choices)}
    elif q.kind == "name":
        schema = dict(NAME)
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


def _answer_content(answer: str) -> dict[str, Any]:
    """``answer``: a schema's name (JSON or msgpack, as the request's Accept says), or a media
    type the route always answers in."""
    if answer == "text/plain":
        return {"text/plain": {"schema": S}}
    if answer == "application/json":
        return {"application/json": {"schema": ANY}}
    if answer == SQS:
        return _SQS_CONTENT
    if "/" in answer:  # media types, comma-separated (the console's files)
        return {media: {"schema": S} for media in answer.split(",")}
    return _content(answer)


def _operation(route: Route) -> dict[str, Any]:
    params: list[dict[str, Any]] = []
    for p in _PATH_PARAM.findall(route.path):
        doc = route.params.get(p) or _PATH_DOC.get(p, p)
        params.append(
            {"name": p, "in": "path", "required": True, "schema": _PATH_SCHEMA.get(p, S),
             "description": doc}
        )  # fmt: skip
    params += [_query(q) for q in route.query]
    content = _answer_content(route.answer)
    responses: dict[str, Any] = {
        str(status): {"description": "switching to WebSocket" if status == 101 else "OK"}
        | ({} if status == 101 else {"content": content})
        for status in route.ok
    }
    if route.stream:
        responses["307"] = {
            "description": "a follower redirects to the leader",
            "headers": {"Location": _HEADER, "X-Raftq-Leader": _HEADER},
        }
    if route.answer == SQS:
        for status in ("4XX", "5XX"):
            responses[status] = {"description": "an SQS error", "content": _SQS_CONTENT}
    responses.setdefault("4XX", {"description": "client error", **_ERR})
    responses.setdefault(
        "503",
        {"description": "no leader / overloaded", "headers": {"Retry-After": _RETRY}, **_ERR},
    )
    if route.where == LEADER and not route.stream:
        responses["504"] = {
            "description": "outcome unknown: the command may or may not have been applied",
            **_ERR,
        }
    op: dict[str, Any] = {
        "summary": route.summary,
        "operationId": _operation_id(route),
        "tags": [_tag(route)],
        "parameters": params,
        "responses": responses,
    }
    if route.perm is not None and route.perm.action in (PUBLIC, OBSERVE):
        op["security"] = []  # (OBSERVE: unless the node is run with --auth-observe)
    if route.body is not None:
        # An empty body is read as {}: one is required only where the schema requires a field.
        required = bool(SCHEMAS[route.body].get("required"))
        op["requestBody"] = {"required": required, "content": _content(route.body)}
    return op


DESCRIPTION = """\
raftq is a message broker replicated with Raft: topics hold messages, each consumer group of a
topic receives every message once, and a delivery is settled by its receipt (ack, nack, extend,
term) before its visibility timeout runs out; a message that fails `max_attempts` times goes to
the group's dead-letter topic.

**Any node** answers any call: a follower forwards to the leader (its answer carries
`X-Raftq-Leader`), and WebSocket streams redirect there (307).

**Access control.** Every call but `/healthz` and `/readyz` (and `/metrics`, `/openapi.json`
unless the node runs with `--auth-observe`) needs `Authorization: Bearer rq_<id>.<secret>`:
401 without a valid token, 403 without the right on the topic.

**Bodies** are JSON, or msgpack with `Content-Type` / `Accept: application/msgpack` (payloads
as raw bytes). In JSON a message's `payload` is base64; send `text` (a string) instead to
publish text, and add `?payload_encoding=utf-8` to a receive or peek to get each payload that is
valid UTF-8 back as `text`:

    curl -H "Authorization: Bearer $RAFTQ_TOKEN" -d '{"text": "hello"}' \\
      http://localhost:8001/topics/orders/messages
    curl -H "Authorization: Bearer $RAFTQ_TOKEN" -d '{"max": 10, "wait": 5}' \\
      'http://localhost:8001/topics/orders/groups/default/receive?payload_encoding=utf-8'

**Errors** are always JSON `{"code", "message", "details"}`, a 4xx for bad input. 429 and 503
carry `Retry-After`; a 504 `outcome_unknown` means the command may or may not have been
applied: publish again with the same `key` (stored once within the topic's `dedup_window`).
"""

# The tag of each route module (a module not listed here is tagged with its own name).
TAGS = {
    "topics": ("topics", "Topics and consumer groups: create, configure, stats, purge"),
    "messages": ("messages", "Publish, receive, settle by receipt, peek and redrive"),
    "stream": ("streams", "WebSocket streams: a pushing consumer, a publisher"),
    "tokens": ("tokens", "Access tokens and their grants"),
    "ops": ("cluster", "This node, its members, probes, metrics and this document"),
    "sqs.routes": ("sqs", "The SQS-compatible API (see the README), and SQS credentials"),
    "console": ("console", "The web console's static files (public; its pages call the API)"),
}


def _tag(route: Route) -> str:
    module = route.handler.__module__.removeprefix("raftq.node.")
    return TAGS[module][0] if module in TAGS else module


def _operation_id(route: Route) -> str:
    """The route's own ``op``; else one made from method and path (a route table that forgot
    it still serves; ``tests/node/test_layers.py`` asks every route to name one)."""
    if route.op:
        return route.op
    words = re.findall(r"[A-Za-z0-9]+", route.path)
    return route.method.lower() + "".join(w[:1].upper() + w[1:] for w in words)


def document(routes: Sequence[Route]) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    used: list[str] = []
    for route in routes:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route)
        if _tag(route) not in used:
            used.append(_tag(route))
    described = dict(TAGS.values())
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "raftq node API",
            "version": "1",
            "description": DESCRIPTION,
        },
        "tags": [{"name": t, "description": described.get(t, t)} for t in used],
        "paths": paths,
        "security": [{"bearer": []}],
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "rq_<id>.<secret>"}
            },
        },
    }
