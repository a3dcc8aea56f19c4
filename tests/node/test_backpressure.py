"""Backpressure, as a client sees it: every 429 and 503 says when to come back (Retry-After),
and a leader whose group-commit queue is full answers 503 overloaded at once instead of
making each request wait longer than the last."""

from __future__ import annotations

import asyncio
import base64

from raftq.node.errors import RETRY_AFTER_S, STATUS_BY_CODE, ApiError
from raftq.node.local import LocalRaft
from tests.node.inprocess import admin_client, app, topic_of


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_every_429_and_503_code_says_when_to_retry() -> None:
    codes = {c for c, status in STATUS_BY_CODE.items() if status in (429, 503)}
    assert codes and codes <= set(RETRY_AFTER_S)
    assert all(ApiError(c, "m").retry_after for c in codes)


async def test_topic_full_carries_retry_after() -> None:
    async with admin_client(app(LocalRaft())) as client:
        topic = "t-full"
        r = await client.post("/topics", json={"topic": topic, "config": {"max_messages": 1}})
        assert r.status == 201, await r.text()
        pub = f"/topics/{topic}/messages"
        assert (await client.post(pub, json={"payload": b64(b"1")})).status == 200
        r = await client.post(pub, json={"payload": b64(b"2")})
        assert r.status == 429 and (await r.json())["code"] == "topic_full"
        assert r.headers["Retry-After"] == "1"


async def test_a_full_commit_queue_is_answered_503_overloaded_with_retry_after() -> None:
    raft = LocalRaft()
    raft.delay = 0.2  # slow commits: requests pile up behind the one in flight
    application = app(raft, max_queue=4, max_inflight=1, batch_max_ops=2)
    async with admin_client(application) as client:
        raft.delay = 0.0
        topic = await topic_of(client)
        raft.delay = 0.2
        pub = f"/topics/{topic}/messages"
        responses = await asyncio.gather(
            *(client.post(pub, json={"payload": b64(b"%d" % i)}) for i in range(30))
        )
        statuses = sorted(r.status for r in responses)
        overloaded = [r for r in responses if r.status == 503]
        assert set(statuses) == {200, 503}, statuses
        for r in overloaded:
            assert (await r.json())["code"] == "overloaded"
            assert r.headers["Retry-After"] == "1"
        # What was refused was not stored; what was accepted was.
        stored = raft.read(lambda b: b.topic_stats(topic)["messages"])
        assert stored == statuses.count(200)
