"""The client's conveniences against one in-process node: typed answers, ``msg.process()``,
``subscribe``, ``publish_nowait``'s pending bound, logging and connection hooks."""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any, get_type_hints

import pytest
from aiohttp.test_utils import TestServer
from tests.node.inprocess import app as inprocess_app
from tests.support import free_ports

from raftq.client import (
    AsyncClient,
    Client,
    ClusterInfo,
    Created,
    GroupInfo,
    Redriven,
    SettleResult,
    TopicInfo,
)
from raftq.client._http import HttpPool
from raftq.client.transport import Response
from raftq.node.local import LocalRaft


def name() -> str:
    return "t-" + uuid.uuid4().hex[:10]


@pytest.fixture
async def server() -> AsyncIterator[tuple[LocalRaft, str]]:
    raft = LocalRaft()
    srv = TestServer(inprocess_app(raft), host="127.0.0.1")
    await srv.start_server()
    try:
        yield raft, f"http://127.0.0.1:{srv.port}"
    finally:
        await srv.close()


def conforms(answer: Mapping[str, Any], typed: Any) -> None:
    """``answer`` has every key ``typed`` requires, and no key it does not declare (counters,
    ``<name>_total``, aside)."""
    assert typed.__required_keys__ <= answer.keys(), (typed.__name__, answer)
    extra = {k for k in answer if k not in get_type_hints(typed) and not k.endswith("_total")}
    assert not extra, (typed.__name__, extra)


def pending(raft: LocalRaft, topic: str, group: str = "default") -> tuple[int, int]:
    s = raft.read(lambda b: b.group_stats(topic, group))
    return s["pending"], s["in_flight"]


async def test_answers_have_the_keys_their_types_declare(server: tuple[LocalRaft, str]) -> None:
    _, url = server
    topic = name()
    async with AsyncClient(url) as c:
        conforms(await c.create_topic(topic), Created)
        conforms(await c.create_group(topic, "g", config={"max_attempts": 1}), Created)
        await c.publish(topic, b"x")
        conforms(await c.cluster(), ClusterInfo)
        info = await c.topic(topic)
        conforms(info, TopicInfo)
        for g in info["groups"]:
            conforms(g, GroupInfo)
        conforms(await c.group(topic, "g"), GroupInfo)
        [msg] = await c.receive(topic, "g")
        conforms(await c.nack([msg.receipt]), SettleResult)  # (dead-lettered: max_attempts 1)
        conforms(await c.redrive(topic + ".dlq"), Redriven)


async def test_process_acks_on_success_and_nacks_on_an_exception(
    server: tuple[LocalRaft, str],
) -> None:
    raft, url = server
    topic = name()
    async with AsyncClient(url) as c:
        await c.create_topic(topic)
        await c.publish_batch(topic, [b"ok", b"fails"])
        ok, fails = await c.receive(topic, max=2)
        async with ok.process():
            pass
        with pytest.raises(ValueError, match="boom"):
            async with fails.process(nack_delay=60):
                raise ValueError("boom")
        assert ok.settled and fails.settled
        stats = raft.read(lambda b: b.group_stats(topic, "default"))
        # one acked, one nacked and waiting out its delay
        assert (stats["in_flight"], stats["delayed"], stats.get("acked_total")) == (0, 1, 1)


async def test_sync_process_acks_on_success_and_nacks_on_an_exception(
    server: tuple[LocalRaft, str],
) -> None:
    raft, url = server
    topic = name()

    def work() -> str:
        with Client(url) as c:
            c.create_topic(topic)
            c.publish_batch(topic, [b"ok", b"fails"])
            ok, fails = c.receive(topic, max=2)
            with ok.process():
                pass
            try:
                with fails.process(nack_delay=60):
                    raise ValueError("boom")
            except ValueError as e:
                return str(e)
            return "not raised"

    assert await asyncio.to_thread(work) == "boom"
    stats = raft.read(lambda b: b.group_stats(topic, "default"))
    assert (stats["in_flight"], stats["delayed"], stats.get("acked_total")) == (0, 1, 1)
