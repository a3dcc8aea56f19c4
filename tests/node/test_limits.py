"""Storage limits at the node: the cluster's max_retained_bytes (``/cluster/settings``) and the
node's free-disk reserve (``--min-free-disk``) refuse publishes with 507 ``storage_full``
while consumers keep draining."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from raftq.node.app import SERVICE
from raftq.node.diskguard import CACHE_S, DiskGuard, DiskSpace, Reserve, parse_reserve
from raftq.node.local import LocalRaft
from raftq.node.service import BrokerService
from tests.node.inprocess import admin_client, app, topic_of

Client = TestClient[web.Request, web.Application]


def svc(c: Client) -> BrokerService:
    return c.app[SERVICE]


async def publish(c: Client, topic: str, text: str) -> Any:
    return await c.post(f"/topics/{topic}/messages", json={"text": text})


async def drain_one(c: Client, topic: str) -> None:
    r = await c.post(f"/topics/{topic}/groups/default/receive", json={"max": 1})
    (d,) = (await r.json())["deliveries"]
    r = await c.post("/ack", json={"receipts": [d["receipt"]]})
    assert (await r.json())["acked"] == 1


async def test_a_publish_past_max_retained_bytes_is_507_and_consumers_drain(
    node: tuple[LocalRaft, Client],
) -> None:
    _, c = node
    topic = await topic_of(c)
    assert (await publish(c, topic, "12345")).status == 200
    r = await c.patch("/cluster/settings", json={"max_retained_bytes": 8})
    assert r.status == 200, await r.text()
    assert await r.json() == {"settings": {"max_retained_bytes": 8}, "retained_bytes": 5}
    r = await publish(c, topic, "6789")
    assert r.status == 507
    assert "Retry-After" not in r.headers
    body = await r.json()
    assert body["code"] == "storage_full"
    assert body["details"] == {"retained_bytes": 5, "max_retained_bytes": 8, "bytes": 4}
    await drain_one(c, topic)  # receive and ack work at the limit, and free room
    assert (await publish(c, topic, "6789")).status == 200
    info = await (await c.get("/cluster")).json()
    assert info["storage"]["retained_bytes"] == 4
    assert info["storage"]["max_retained_bytes"] == 8
    metrics = await (await c.get("/metrics")).text()
    assert "raftq_cluster_max_retained_bytes 8.0" in metrics
    r = await c.patch("/cluster/settings", json={"max_retained_bytes": None})
    assert (await r.json())["settings"] == {"max_retained_bytes": None}
    assert (await (await c.get("/cluster/settings")).json())["retained_bytes"] == 4


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({}, "invalid_argument"),
        ({"max_retained_bytes": -1}, "invalid_argument"),
        ({"max_retained_bytes": "10GiB"}, "invalid_argument"),
        ({"max_bytes": 1}, "unknown_field"),
    ],
)
async def test_bad_cluster_settings_are_400_and_change_nothing(
    node: tuple[LocalRaft, Client], body: dict[str, Any], code: str
) -> None:
    raft, c = node
    r = await c.patch("/cluster/settings", json=body)
    assert r.status == 400
    assert (await r.json())["code"] == code
    assert raft.read(lambda b: b.settings) == {}


class FakeDisk:
    """A data disk whose free space the test sets; time moves only when told."""

    def __init__(self, free: int, total: int = 10_000) -> None:
        self.space = DiskSpace(free=free, total=total)
        self.now = 0.0
        self.probes = 0

    def probe(self, path: str) -> DiskSpace:
        self.probes += 1
        return self.space


@pytest.fixture
async def low_disk(tmp_path: Path) -> AsyncIterator[tuple[FakeDisk, Client]]:
    """One node with a data directory whose disk (faked) has 50 bytes free, reserve 100."""
    disk = FakeDisk(free=50)
    application = app(LocalRaft(), data_dir=str(tmp_path), min_free_disk=Reserve(bytes=100))
    application[SERVICE].disk = DiskGuard(
        str(tmp_path), Reserve(bytes=100), probe=disk.probe, clock=lambda: disk.now
    )
    async with admin_client(application) as c:
        yield disk, c


async def test_below_the_free_disk_reserve_publishes_are_507_and_nothing_is_proposed(
    low_disk: tuple[FakeDisk, Client],
) -> None:
    disk, c = low_disk
    disk.space = DiskSpace(free=500, total=10_000)
    topic = await topic_of(c)
    assert (await publish(c, topic, "kept")).status == 200
    disk.space = DiskSpace(free=50, total=10_000)
    disk.now += CACHE_S
    applied = svc(c).raft.status().applied_index
    r = await publish(c, topic, "refused")
    assert r.status == 507
    body = await r.json()
    assert body["code"] == "storage_full"
    assert body["details"] == {"node": "n1", "free_bytes": 50, "min_free_bytes": 100}
    r = await c.post(f"/topics/{topic}/publish", json={"messages": [{"text": "b"}]})
    assert r.status == 507
    assert svc(c).raft.status().applied_index == applied  # nothing proposed
    await drain_one(c, topic)  # consumers keep draining
    ready = await (await c.get("/readyz")).json()
    assert ready["ready"] is True
    assert ready["disk"] == {"free_bytes": 50, "min_free_bytes": 100, "ok": False}
    info = await (await c.get("/cluster")).json()
    assert info["storage"]["disk"]["ok"] is False
    metrics = await (await c.get("/metrics")).text()
    assert "raftq_disk_free_bytes 50.0" in metrics
    assert "raftq_disk_min_free_bytes 100.0" in metrics
    disk.space = DiskSpace(free=150, total=10_000)  # space freed: publishes again
    disk.now += CACHE_S
    assert (await publish(c, topic, "again")).status == 200


async def test_the_free_disk_probe_is_cached_for_a_second(
    low_disk: tuple[FakeDisk, Client],
) -> None:
    disk, c = low_disk
    topic = await topic_of(c)
    for _ in range(5):
        assert (await publish(c, topic, "x")).status == 507
    assert disk.probes == 1
    disk.now += CACHE_S
    await publish(c, topic, "x")
    assert disk.probes == 2


def test_a_reserve_is_bytes_with_a_unit_or_a_share_of_the_disk() -> None:
    assert parse_reserve("1GiB") == Reserve(bytes=1 << 30)
    assert parse_reserve("500MB") == Reserve(bytes=500_000_000)
    assert parse_reserve("0") == Reserve(bytes=0)
    assert parse_reserve("5%").of(1000) == 50
    for bad in ("", "lots", "-1", "101%", "1PiB"):
        with pytest.raises(ValueError, match=r"size|percentage"):
            parse_reserve(bad)


def test_a_node_in_memory_has_no_reserve() -> None:
    guard = DiskGuard(None, Reserve(bytes=1 << 60))
    assert guard.status() is None
    guard.check("n1")  # nothing to refuse


async def test_a_follower_forwards_the_507_of_the_leader(
    leader_and_follower: tuple[LocalRaft, Client, LocalRaft, Client],
) -> None:
    leader, lc, _, fc = leader_and_follower
    topic = await topic_of(lc)
    r = await fc.patch("/cluster/settings", json={"max_retained_bytes": 2})
    assert r.status == 200, await r.text()
    r = await publish(fc, topic, "abc")
    assert r.status == 507
    assert (await r.json())["details"]["max_retained_bytes"] == 2
    assert (await (await fc.get("/cluster/settings")).json())["settings"] == {
        "max_retained_bytes": 2
    }
    assert leader.read(lambda b: b.settings) == {"max_retained_bytes": 2}
