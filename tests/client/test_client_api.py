"""The client's conveniences against one in-process node: typed answers, ``msg.process()``,
``subscribe``, ``publish_nowait``'s pending bound, logging and connection hooks."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, get_type_hints

import pytest
from tests.client.conftest import name
from tests.support import free_ports

from raftq.client import (
    AsyncClient,
    Client,
    ClusterInfo,
    ClusterSettings,
    Created,
    GroupInfo,
    Redriven,
    SettleResult,
    TopicInfo,
    Unavailable,
)
from raftq.client._http import HttpPool
from raftq.client.transport import Response
from raftq.node.local import LocalRaft


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
        conforms(await c.cluster_settings(), ClusterSettings)
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


async def test_subscribe_runs_at_most_concurrency_handlers_and_settles_each(
    server: tuple[LocalRaft, str],
) -> None:
    raft, url = server
    topic = name()
    running = 0
    most = 0
    seen: list[bytes] = []
    all_in = asyncio.Event()

    async def handler(msg: Any) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        try:
            await asyncio.sleep(0.02)  # (work that yields to the loop)
            if msg.payload == b"m3":
                raise RuntimeError("bad message")
            seen.append(msg.payload)
        finally:
            running -= 1
            if len(seen) == 19:
                all_in.set()

    async with AsyncClient(url) as c:
        await c.create_topic(topic)
        await c.publish_batch(topic, [b"m%d" % i for i in range(20)])
        sub = await c.subscribe(topic, "default", handler, concurrency=3, nack_delay=60, wait=1)
        await asyncio.wait_for(all_in.wait(), 10)
        await sub.stop()
    assert most == 3
    assert sorted(seen) == sorted(b"m%d" % i for i in range(20) if i != 3)
    stats = raft.read(lambda b: b.group_stats(topic, "default"))
    assert (stats["in_flight"], stats["delayed"], stats.get("acked_total")) == (0, 1, 19)


async def test_subscribe_to_a_missing_group_fails_at_once(server: tuple[LocalRaft, str]) -> None:
    from raftq.client import GroupNotFound

    _, url = server
    topic = name()

    async def handler(msg: Any) -> None:
        raise AssertionError("not called")

    async with AsyncClient(url) as c:
        await c.create_topic(topic)
        with pytest.raises(GroupNotFound):
            await c.subscribe(topic, "nope", handler)


async def test_stop_lets_running_handlers_finish_and_returns_the_rest(
    server: tuple[LocalRaft, str],
) -> None:
    raft, url = server
    topic = name()
    started = asyncio.Event()
    finish = asyncio.Event()
    done: list[bytes] = []

    async def handler(msg: Any) -> None:
        started.set()
        await finish.wait()
        done.append(msg.payload)

    async with AsyncClient(url) as c:
        await c.create_topic(topic)
        await c.publish(topic, b"slow")
        sub = await c.subscribe(topic, "default", handler, concurrency=2, wait=1)
        await asyncio.wait_for(started.wait(), 5)
        stopping = asyncio.create_task(sub.stop())
        await asyncio.sleep(0.05)
        assert not stopping.done()  # waiting for the handler
        finish.set()
        await asyncio.wait_for(stopping, 5)
    assert done == [b"slow"]
    assert pending(raft, topic) == (0, 0)


class GatedPool(HttpPool):
    """The default transport, holding publish requests until ``gate`` opens."""

    def __init__(self) -> None:
        super().__init__(limit=16, connect_timeout=2.0)
        self.gate = asyncio.Event()
        self.held = 0

    async def request(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes | None, timeout: float
    ) -> Response:
        if "/publish" in url or url.endswith("/messages"):
            self.held += 1
            await self.gate.wait()
        return await super().request(method, url, headers, body, timeout)


async def test_publish_nowait_waits_once_max_pending_messages_await_their_answer(
    server: tuple[LocalRaft, str],
) -> None:
    raft, url = server
    topic = name()
    pool = GatedPool()
    async with AsyncClient(url, transport=pool, max_pending=3, publish_stream=False) as c:
        await c.create_topic(topic)
        try:
            futures = [await c.publish_nowait(topic, b"m%d" % i) for i in range(3)]  # at once
            fourth = asyncio.create_task(c.publish_nowait(topic, b"m3"))
            await asyncio.wait_for(_until(lambda: pool.held > 0), 5)
            await asyncio.sleep(0.05)
            assert not fourth.done()  # 3 pending: it waits
        finally:
            pool.gate.set()
        futures.append(await asyncio.wait_for(fourth, 5))
        assert [await f for f in futures] == [1, 2, 3, 4]
    assert raft.read(lambda b: b.topic_stats(topic))["messages"] == 4


async def _until(pred: Any) -> None:
    while not pred():  # noqa: ASYNC110 - polling the transport's state
        await asyncio.sleep(0.01)


async def test_hooks_and_log_tell_of_a_leader_and_of_a_node_that_is_down(
    server: tuple[LocalRaft, str], caplog: pytest.LogCaptureFixture
) -> None:
    _, url = server
    [dead] = free_ports(1)
    dead_url = f"http://127.0.0.1:{dead}"
    leaders: list[tuple[str | None, str]] = []
    lost: list[str] = []

    def on_leader_change(old: str | None, new: str) -> None:
        leaders.append((old, new))

    def on_disconnect(u: str, err: BaseException) -> None:
        lost.append(u)
        raise RuntimeError("a broken hook")  # logged, never breaks the call

    caplog.set_level(logging.DEBUG, logger="raftq.client")
    async with AsyncClient(
        [dead_url, url], on_leader_change=on_leader_change, on_disconnect=on_disconnect
    ) as c:
        # (the seeds are tried in order: the dead one first)
        info = await c.cluster()
    assert lost == [dead_url]
    assert leaders and leaders[0][0] is None  # (the node names itself with the port it was given)
    assert info["leader_api"]
    messages = [r.getMessage() for r in caplog.records if r.name == "raftq.client"]
    assert any(m.startswith(f"lost {dead_url}") for m in messages), messages
    assert any("try 2" in m for m in messages), messages
    assert any("on_disconnect hook failed" in m for m in messages), messages


def test_sync_client_calls_the_disconnect_hook() -> None:
    lost: list[str] = []
    [dead] = free_ports(1)
    with (
        Client(
            f"http://127.0.0.1:{dead}", timeout=0.3, on_disconnect=lambda u, e: lost.append(u)
        ) as c,
        pytest.raises(Unavailable, match=r"127\.0\.0\.1"),
    ):
        c.cluster()
    assert lost and set(lost) == {f"http://127.0.0.1:{dead}"}
