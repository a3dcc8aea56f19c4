"""Power loss on every node at once: only synced bytes and synced names survive (SimDisk)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.raft.harness import RaftCluster, publish, wait_payloads
from tests.raft.simdisk import power_loss

pytestmark = pytest.mark.slow


def _run_until_power_loss(
    c: RaftCluster, first: int = 0, torn: random.Random | None = None
) -> list[str]:
    """Get 30 publishes acknowledged, leave 10 in flight, cut the power on every node."""
    c.start_all()
    c.propose([{"op": "create_topic", "topic": "t", "if_not_exists": True}])
    acked = []
    for i in range(first, first + 30):
        c.propose([publish("t", f"m-{i}")])
        acked.append(f"m-{i}")
    leader = c.leader()
    for i in range(first + 30, first + 40):  # in flight: may or may not survive
        leader.send("propose", commands=[publish("t", f"m-{i}")])
    c.kill_all()
    for p in c.nodes.values():
        assert p.shadow is not None
        power_loss(str(p.shadow), str(p.data), torn)
    return acked


@pytest.mark.parametrize(
    ("compaction", "torn"),
    [(10_000, False), (8, False), (8, True)],
    ids=["journal", "snapshots", "snapshots-torn-tails"],
)
def test_every_acknowledged_entry_survives_power_loss_with_fsync_always(
    tmp_path: Path, make_cluster: type[RaftCluster], compaction: int, torn: bool
) -> None:
    """Two power cuts in a row (the second one hits a recovered cluster). With compaction
    every 8 entries, snapshots and journal rewrites happen all along; with torn tails, part
    of the unsynced bytes survive too, cutting records in half."""
    c = make_cluster(tmp_path, shadow=True, extra=["--compaction-entries", str(compaction)])
    rnd = random.Random(7) if torn else None
    acked = _run_until_power_loss(c, 0, rnd)
    acked += _run_until_power_loss(c, 40, rnd)
    c.start_all()
    c.propose([{"op": "create_topic", "topic": "probe"}])  # an entry of the new term commits
    got = c.leader().ok("payloads", topic="t")
    assert [m for m in got if m in acked] == acked
    assert set(got) <= {f"m-{i}" for i in range(80)}
    for p in c.nodes.values():
        wait_payloads(p, "t", got)


def test_fsync_never_can_lose_acknowledged_entries_on_power_loss(
    tmp_path: Path, make_cluster: type[RaftCluster]
) -> None:
    c = make_cluster(tmp_path, shadow=True, extra=["--fsync", "never"])
    acked = _run_until_power_loss(c)
    c.start_all()
    c.propose([{"op": "create_topic", "topic": "probe"}])
    got = c.leader().ok("payloads", topic="t")
    lost = [m for m in acked if m not in got]
    assert lost, "fsync=never kept everything: the simulation did not drop unsynced bytes"
