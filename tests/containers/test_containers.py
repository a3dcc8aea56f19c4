"""A 3-node raftq cluster in containers, under docker kill, pause and network disconnects."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import pytest

from raftq.client import AsyncClient, Client, RaftqError, UnknownOutcome
from tests.containers.conftest import ContainerCluster, http_json, wait_for

pytestmark = pytest.mark.slow


def applied(cluster: ContainerCluster, name: str) -> int:
    status, body = http_json(cluster.url(name) + "/cluster")
    return int(body["applied_index"]) if status == 200 else -1


def caught_up(cluster: ContainerCluster, name: str, leader: str) -> bool:
    status, body = http_json(cluster.url(name) + "/cluster")
    if status != 200 or body.get("leader") != leader:
        return False
    return applied(cluster, name) >= applied(cluster, leader) > 0


async def test_client_finds_the_leader_from_a_follower_address(cluster: ContainerCluster) -> None:
    leader = cluster.leader()
    follower = next(n for n in sorted(cluster.nodes) if n != leader)
    async with AsyncClient(cluster.url(follower)) as c:
        await c.cluster()
        assert c.endpoints.leader == cluster.url(leader)
        topic = f"t-{uuid.uuid4().hex[:8]}"
        await c.create_topic(topic)
        seq = await c.publish(topic, b"hello")
        [msg] = await c.receive(topic, max=1, wait=5)
        assert (msg.seq, msg.payload) == (seq, b"hello")
        await msg.ack()


async def test_killing_the_leader_loses_no_acknowledged_publish(cluster: ContainerCluster) -> None:
    topic = f"t-{uuid.uuid4().hex[:8]}"
    leader = cluster.leader()
    async with AsyncClient(cluster.urls(), timeout=30, attempt_timeout=3) as c:
        # No attempt limit: a delivery lost with its receive around the failover must not add
        # up to a dead letter, which would look like a lost message here.
        config = {"visibility_timeout": 3, "max_attempts": 0}
        await c.create_topic(topic, groups=[{"group": "g", "config": config}])
        acked: list[bytes] = []

        async def produce() -> None:
            for i in range(300):
                await c.publish(topic, f"v{i}".encode())
                acked.append(f"v{i}".encode())

        received: set[bytes] = set()
        held_back: list[int] = []

        async def consume() -> None:
            while len(received) < 300:
                try:
                    batch = await c.receive(topic, "g", max=20, wait=1)
                except UnknownOutcome:  # the leader died under the receive: ask again
                    continue
                for msg in batch:
                    if msg.attempt == 1 and msg.seq % 10 == 0:
                        held_back.append(msg.seq)  # in flight when the leader dies: no ack
                        continue
                    # Delivered: that is what the test asks of every acknowledged publish. A
                    # failed ack changes nothing here: a stale receipt means the message comes
                    # back, an unknown outcome means it may (the ack may have been applied, so
                    # waiting for it to come back could wait for ever).
                    received.add(msg.payload)
                    with contextlib.suppress(RaftqError):
                        await msg.ack()

        producer = asyncio.create_task(produce())
        consumer = asyncio.create_task(consume())
        await asyncio.sleep(0.5)
        cluster.nodes[leader].raw.kill()
        await asyncio.wait_for(producer, 60)
        try:
            await asyncio.wait_for(consumer, 90)
        except TimeoutError:
            missing = sorted(set(acked) - received)
            group = await c.group(topic, "g")
            raise AssertionError(
                f"{len(missing)} acknowledged publishes never delivered: {missing[:20]}; "
                f"the group: {group}"
            ) from None
    assert len(acked) == 300
    assert received == set(acked)
    assert held_back, "some deliveries were in flight and unacked"
    assert cluster.leader(exclude=leader) != leader


async def test_a_paused_follower_catches_up_after_unpause(cluster: ContainerCluster) -> None:
    leader = cluster.leader()
    follower = next(n for n in sorted(cluster.nodes) if n != leader)
    topic = f"t-{uuid.uuid4().hex[:8]}"
    cluster.nodes[follower].raw.pause()
    try:
        async with AsyncClient(cluster.url(leader)) as c:
            await c.create_topic(topic)
            await c.publish_batch(topic, [f"m{i}" for i in range(100)])
            assert (await c.topic(topic))["messages"] == 100
    finally:
        cluster.nodes[follower].raw.unpause()
    wait_for(lambda: caught_up(cluster, follower, leader), 30, f"{follower} caught up")


async def test_a_disconnected_node_rejoins_after_reconnect(cluster: ContainerCluster) -> None:
    leader = cluster.leader()
    topic = f"t-{uuid.uuid4().hex[:8]}"
    net = cluster.network._unwrap_network
    net.disconnect(cluster.nodes[leader].raw)
    try:
        others = [n for n in sorted(cluster.nodes) if n != leader]
        new_leader = cluster.leader(exclude=leader, timeout=30)
        assert new_leader in others
        async with AsyncClient([cluster.url(n) for n in others]) as c:
            await c.create_topic(topic)
            await c.publish_batch(topic, [b"a", b"b", b"c"])
    finally:
        net.connect(cluster.nodes[leader].raw, aliases=[leader], ipv4_address=cluster.ips[leader])
    wait_for(lambda: caught_up(cluster, leader, cluster.leader()), 30, f"{leader} caught up")
    with Client(cluster.url(leader)) as c:
        assert c.topic(topic)["messages"] == 3


async def test_restarting_every_node_on_its_volume_keeps_the_data(
    cluster: ContainerCluster,
) -> None:
    topic = f"t-{uuid.uuid4().hex[:8]}"
    async with AsyncClient(cluster.urls()) as c:
        await c.create_topic(topic)
        await c.publish_batch(topic, [f"m{i}" for i in range(50)])
    for node in cluster.nodes.values():
        node.raw.restart(timeout=30)
    cluster.ready(timeout=60)
    async with AsyncClient(cluster.urls()) as c:
        assert (await c.topic(topic))["messages"] == 50
        msgs = await c.receive(topic, max=50, wait=5)
        assert sorted(m.payload for m in msgs) == sorted(f"m{i}".encode() for i in range(50))
