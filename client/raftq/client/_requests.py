"""One pure function per API call, building its ``Request``: the async and sync clients share
them and only run the I/O. Whether a call is safe to repeat after an unknown outcome is decided
here, and said by every builder: ``Request`` defaults to ``idempotent=False``, so a builder
that forgets is never resent. Reads, updates, deletes, purges, publishes (their messages carry
idempotency keys), settles and releases are safe; creates, receives, redrives and membership
changes are not. (tests/client/test_requests.py holds the table.)"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from raftq.client._core import Request, path


def cluster() -> Request:
    return Request("GET", "/cluster", idempotent=True)


def cluster_settings() -> Request:
    return Request("GET", "/cluster/settings", idempotent=True)


def update_cluster_settings(changes: Mapping[str, Any]) -> Request:
    return Request("PATCH", "/cluster/settings", dict(changes), idempotent=True)


def add_member(node_id: str, raft: str, api: str) -> Request:
    body = {"id": node_id, "raft": raft, "api": api}
    return Request("POST", "/cluster/members", body, idempotent=False)


def remove_member(node_id: str) -> Request:
    return Request("DELETE", path("cluster", "members", node_id), idempotent=False)


def create_token(
    name: str,
    grants: Sequence[Mapping[str, Any]],
    cluster: bool,
    expires_in: float | None,
) -> Request:
    body: dict[str, Any] = {"name": name, "grants": [dict(g) for g in grants]}
    if cluster:
        body["cluster"] = True
    if expires_in is not None:
        body["expires_in"] = expires_in
    # (a retry after an unknown outcome could make a second token, and the first one's
    # secret would be lost with the answer)
    return Request("POST", "/tokens", body, idempotent=False)


def sqs_credentials() -> Request:
    return Request("GET", "/sqs/credentials", idempotent=True)


def list_tokens() -> Request:
    return Request("GET", "/tokens", idempotent=True)


def token(token_id: str) -> Request:
    return Request("GET", path("tokens", token_id), idempotent=True)


def update_token(token_id: str, changes: Mapping[str, Any]) -> Request:
    return Request("PATCH", path("tokens", token_id), dict(changes), idempotent=True)


def revoke_token(token_id: str) -> Request:
    return Request("DELETE", path("tokens", token_id), idempotent=True)


def create_topic(
    topic: str,
    config: Mapping[str, Any] | None,
    groups: Sequence[Mapping[str, Any]] | None,
    if_not_exists: bool,
) -> Request:
    body: dict[str, Any] = {"topic": topic}
    if config:
        body["config"] = dict(config)
    if groups is not None:
        body["groups"] = [dict(g) for g in groups]
    if if_not_exists:
        body["if_not_exists"] = True
    return Request("POST", "/topics", body, idempotent=False)


def list_topics(after: str | None = None, limit: int | None = None) -> Request:
    """A page of topic names (``{"topics", "next"}``); the first page asks nothing of the
    server (a node older than paging refuses unknown query parameters, and answers all)."""
    query = []
    if limit is not None:
        query.append(f"limit={int(limit)}")
    if after is not None:
        query.append(f"after={quote(after, safe='')}")
    return Request("GET", "/topics" + ("?" + "&".join(query) if query else ""), idempotent=True)


def topic(name: str) -> Request:
    return Request("GET", path("topics", name), idempotent=True)


def update_topic(name: str, config: Mapping[str, Any]) -> Request:
    return Request("PATCH", path("topics", name), {"config": dict(config)}, idempotent=True)


def delete_topic(name: str) -> Request:
    return Request("DELETE", path("topics", name), idempotent=True)


def purge(name: str) -> Request:
    return Request("POST", path("topics", name, "purge"), idempotent=True)


def create_group(
    topic: str,
    group: str,
    config: Mapping[str, Any] | None,
    start: str,
    if_not_exists: bool,
) -> Request:
    body: dict[str, Any] = {"group": group, "start": start}
    if config:
        body["config"] = dict(config)
    if if_not_exists:
        body["if_not_exists"] = True
    return Request("POST", path("topics", topic, "groups"), body, idempotent=False)


def group(topic: str, name: str) -> Request:
    return Request("GET", path("topics", topic, "groups", name), idempotent=True)


def update_group(topic: str, name: str, config: Mapping[str, Any]) -> Request:
    return Request(
        "PATCH", path("topics", topic, "groups", name), {"config": dict(config)}, idempotent=True
    )


def delete_group(topic: str, name: str) -> Request:
    return Request("DELETE", path("topics", topic, "groups", name), idempotent=True)


def publish(topic: str, message: dict[str, Any]) -> Request:
    """One message, already carrying its idempotency key: repeating the request is safe."""
    return Request("POST", path("topics", topic, "messages"), message, idempotent=True)


def publish_batch(topic: str, messages: list[dict[str, Any]]) -> Request:
    """Messages already carry their idempotency keys: repeating the request is safe."""
    return Request(
        "POST", path("topics", topic, "publish"), {"messages": messages}, idempotent=True
    )


def receive(
    topic: str,
    group: str,
    max: int,
    wait: float,
    visibility: float | None,
    consumer: str | None,
) -> Request:
    body: dict[str, Any] = {"max": max, "wait": wait}
    if visibility is not None:
        body["visibility"] = visibility
    if consumer is not None:
        body["consumer"] = consumer
    p = path("topics", topic, "groups", group, "receive")
    return Request("POST", p, body, idempotent=False, hold=wait)


def settle(op: str, receipts: Sequence[str], **extra: Any) -> Request:
    """``ack`` / ``nack`` / ``extend`` / ``term`` for a batch of receipts."""
    body = {"receipts": list(receipts), **{k: v for k, v in extra.items() if v is not None}}
    return Request("POST", "/" + op, body, idempotent=True, settle=True)


def release(consumer: str) -> Request:
    return Request("POST", path("consumers", consumer, "release"), idempotent=True)


def peek(topic: str, from_seq: int | None, limit: int) -> Request:
    p = path("topics", topic, "messages") + f"?limit={int(limit)}"
    if from_seq is not None:
        p += f"&from_seq={int(from_seq)}"
    return Request("GET", p, idempotent=True)


def redrive(topic: str, max: int) -> Request:
    return Request("POST", path("topics", topic, "redrive"), {"max": max}, idempotent=False)
