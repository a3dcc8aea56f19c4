"""The client against a real 3-process cluster: leader kills and consumer crashes."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.client.conftest import name
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


def urls(c: Cluster) -> list[str]:
    return [c.url(n) for n in c.nodes]


class ResponseDropper:
    """A TCP relay to one node that lets requests through but, while ``drop`` is set, swallows
    the node's answer and cuts the client off: an applied request whose outcome is lost."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.drop = True
        self.dropped = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, answer: bool) -> None:
            while data := await src.read(65536):
                if answer and self.drop:
                    self.dropped += 1
                    writer.transport.abort()  # the applied request's answer never arrives
                    return
                dst.write(data)
                await dst.drain()

        tasks = [asyncio.ensure_future(pump(reader, up_w, False)),
                 asyncio.ensure_future(pump(up_r, writer, True))]  # fmt: skip
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        except ConnectionError:
            pass
        finally:
            for t in tasks:
                t.cancel()
            up_w.close()
            writer.close()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


async def test_a_publish_retried_across_a_leader_kill_is_stored_exactly_once(
    cluster3: Cluster,
) -> None:
    topic = name()
    leader = cluster3.wait_leader()
    others = [cluster3.url(n) for n in cluster3.nodes if n != leader]
    async with AsyncClient(urls(cluster3)) as admin:
        await admin.create_topic(topic)
    dropper = ResponseDropper(cluster3.nodes[leader].api)
    entry = await dropper.start()
    try:
        async with AsyncClient([entry, *others], timeout=60, attempt_timeout=3) as c:
            first = asyncio.ensure_future(c.publish(topic, b"exactly-once"))
            # The leader applies it; its answer is swallowed; then the leader dies.
            await asyncio.wait_for(_until(lambda: dropper.dropped > 0), 20)
            cluster3.kill(leader)
            seq = await asyncio.wait_for(first, 60)
            assert c.retries > 0
    finally:
        await dropper.close()
    cluster3.wait_leader(not_=leader)
    async with AsyncClient(others) as reader:
        stored = await reader.peek(topic, limit=10)
    assert [(m["seq"], m["payload"]) for m in stored] == [(seq, b"exactly-once")]


async def _until(pred: Callable[[], bool]) -> None:
    while not pred():  # noqa: ASYNC110 - polling a relay's counter
        await asyncio.sleep(0.01)


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
