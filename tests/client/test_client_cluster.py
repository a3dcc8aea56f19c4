"""The client against a real 3-process cluster: leader kills and consumer crashes."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.node.cluster_fixture import Cluster, wait_for

from raftq.client import AsyncClient, ReceiptStale, Unavailable

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster3(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, 3)
    try:
        yield c.start()
    finally:
        c.close()


def name() -> str:
    return "t-" + uuid.uuid4().hex[:10]


def urls(c: Cluster) -> list[str]:
    return [c.url(n) for n in c.nodes]


async def test_publishes_retried_across_a_leader_kill_are_stored_exactly_once(
    cluster3: Cluster,
) -> None:
    topic = name()
    leader = cluster3.wait_leader()
    async with AsyncClient(urls(cluster3), timeout=60, attempt_timeout=2) as c:
        await c.create_topic(topic)
        done: list[bytes] = []

        async def produce(worker: int) -> None:
            for i in range(150):
                payload = f"{worker}-{i}".encode()
                await c.publish(topic, payload)
                done.append(payload)

        producers = [asyncio.create_task(produce(w)) for w in range(8)]
        await asyncio.sleep(0.3)
        cluster3.signal(leader, signal.SIGSTOP)  # requests in flight get no answer...
        await asyncio.sleep(2.5)
        cluster3.kill(leader)  # ...and are retried elsewhere after the failover
        await asyncio.wait_for(asyncio.gather(*producers), 90)
        assert c.retries > 0, "no publish was retried: the test proved nothing"
        stored = await c.peek(topic, limit=1000)
        stored += await c.peek(topic, from_seq=stored[-1]["seq"] + 1, limit=1000)
    payloads = [m["payload"] for m in stored]
    assert len(payloads) == len(set(payloads)), "a retried publish was stored twice"
    assert sorted(payloads) == sorted(done)


async def test_leader_kill_during_a_consume_loop_loses_nothing_and_returns_only_unacked(
    cluster3: Cluster,
) -> None:
    topic = name()
    async with AsyncClient(urls(cluster3), timeout=60, attempt_timeout=3) as c:
        await c.create_topic(topic, groups=[{"group": "g", "config": {"visibility_timeout": 4}}])
        await c.publish_batch(topic, [f"m{i}" for i in range(200)])
        acked: set[bytes] = set()
        unacked: set[bytes] = set()
        seen_twice: list[tuple[bytes, int]] = []
        killed = False
        async for msg in c.consume(topic, "g", prefetch=10, wait=2):
            if msg.payload in acked:
                seen_twice.append((msg.payload, msg.attempt))
            if len(acked) + len(unacked) == 60 and not killed:
                cluster3.kill(cluster3.wait_leader())
                killed = True
            if msg.attempt == 1 and int(msg.payload[1:]) % 7 == 0:
                unacked.add(msg.payload)  # this consumer "forgets" it: must come back
                continue
            try:
                await msg.ack()
            except (ReceiptStale, Unavailable):
                continue  # the ack did not count: the message comes back, which is legal
            acked.add(msg.payload)
            unacked.discard(msg.payload)
            if len(acked) == 200:
                break
    assert killed
    assert acked == {f"m{i}".encode() for i in range(200)}
    assert not seen_twice, f"acked messages were delivered again: {seen_twice[:5]}"


CONSUMER = textwrap.dedent(
    """
    import asyncio, sys
    from raftq.client import AsyncClient

    async def main():
        async with AsyncClient(sys.argv[1].split(",")) as c:
            n = 0
            async for msg in c.consume(sys.argv[2], prefetch=5, stream=True):
                n += 1
                if n == 5:
                    print("holding", flush=True)
                    await asyncio.sleep(3600)  # "handler" stuck: killed here

    asyncio.run(main())
    """
)


async def test_killed_streaming_consumer_gets_its_messages_released_at_once(
    cluster3: Cluster,
) -> None:
    topic = name()
    async with AsyncClient(urls(cluster3)) as c:
        await c.create_topic(
            topic, config={}, groups=[{"group": "default", "config": {"visibility_timeout": 600}}]
        )
        await c.publish_batch(topic, [f"m{i}" for i in range(5)])
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CONSUMER, ",".join(urls(cluster3)), topic,
            stdout=asyncio.subprocess.PIPE, env=dict(os.environ),
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), 30)
            assert line.strip() == b"holding"
            assert (await c.group(topic, "default"))["in_flight"] == 5
            proc.kill()
            await asyncio.wait_for(proc.wait(), 10)
        finally:
            if proc.returncode is None:
                proc.kill()
                await asyncio.wait_for(proc.wait(), 10)

        async def pending() -> int:
            return int((await c.group(topic, "default"))["pending"])

        # Far sooner than the 600 s visibility timeout: the closed socket released them.
        for _ in range(100):
            if await pending() == 5:
                break
            await asyncio.sleep(0.1)
        assert await pending() == 5
        again = await c.receive(topic, max=5, wait=2)
        assert sorted(m.attempt for m in again) == [2] * 5


def test_fixture_helpers_are_shared() -> None:
    assert callable(wait_for)
