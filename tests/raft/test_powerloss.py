"""Power loss on every node at once: only synced bytes and synced names survive (SimDisk)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from tests.raft.harness import RaftCluster, publish, wait_for, wait_payloads
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
    [(10_000, False), (8, False), (8, True), (-8, True)],
    ids=["journal", "snapshots", "snapshots-torn-tails", "forked-snapshots-torn-tails"],
)
def test_every_acknowledged_entry_survives_power_loss_with_fsync_always(
    tmp_path: Path, make_cluster: type[RaftCluster], compaction: int, torn: bool
) -> None:
    """Two power cuts in a row (the second one hits a recovered cluster). With compaction
    every 8 entries, snapshots and journal rewrites happen all along; with torn tails, part
    of the unsynced bytes survive too, cutting records in half. (Light states are written by
    a thread; -8: by a forked writer, as heavy ones are.)"""
    extra = ["--compaction-entries", str(abs(compaction))]
    if compaction < 0:
        extra += ["--inline-snapshot-us", "-1"]
    c = make_cluster(tmp_path, shadow=True, extra=extra)
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


SEGMENT = 32 << 10  # small store segments: they roll, retire, get compacted and deleted


class _Backlog:
    """What the cluster must keep across power cuts: the payloads whose publish was
    acknowledged and that no consumer acked, in order, and the names that may or may not
    have survived (in flight at the cut)."""

    def __init__(self) -> None:
        self.kept: list[str] = []
        self.maybe: set[str] = set()
        self.compactions = 0

    def check(self, got: list[str]) -> None:
        kept = set(self.kept)
        assert [m for m in got if m in kept] == self.kept, "an acknowledged payload was lost"
        assert set(got) - kept <= self.maybe, "a payload nobody published, or one acked"


def _payload(r: int, i: int) -> str:
    return f"r{r}-{i:04d}|" + chr(ord("a") + i % 26) * (600 + 37 * (i % 11))


def _store_round(c: RaftCluster, r: int, backlog: _Backlog, torn: random.Random) -> None:
    """Publish singly and in batches, consume and ack most (segments retire), compact what
    the store proposes, publish more, leave some in flight, then cut the power on every
    node."""
    c.start_all()
    c.propose([{"op": "create_topic", "topic": "t", "if_not_exists": True}])
    i = 0
    for n in [1] * 30 + [10] * 12:
        msgs = [{"payload": _payload(r, i + k)} for k in range(n)]
        c.propose([{"op": "publish", "topic": "t", "messages": msgs}])
        backlog.kept += [m["payload"] for m in msgs]
        i += n
    for _ in range(2):  # the oldest 200: every 5th stays in flight, the rest acked
        got = c.propose(
            [
                {
                    "op": "receive",
                    "topic": "t",
                    "group": "default",
                    "consumer": "c",
                    "max": 100,
                    "token": f"tok-{r}-{_}".ljust(16, "k"),
                    "visibility": 3600,
                }
            ]
        )
        dels = got[0]["deliveries"]
        acked = [d for k, d in enumerate(dels) if k % 5]
        c.propose([{"op": "ack", "receipts": [d["receipt"] for d in acked]}])
        gone = {d["payload"] for d in acked}
        backlog.kept = [m for m in backlog.kept if m not in gone]
        backlog.maybe -= gone
    cands = c.leader().ok("candidates")
    assert cands, "no segment became a compaction candidate: the test lost its point"
    for res in c.propose(cands):
        backlog.compactions += bool(res.get("compacted"))
    for n in [1] * 10 + [10] * 4:
        msgs = [{"payload": _payload(r, i + k)} for k in range(n)]
        c.propose([{"op": "publish", "topic": "t", "messages": msgs}])
        backlog.kept += [m["payload"] for m in msgs]
        i += n
    snaps = {p.id: p.ok("stats")["snapshots"] for p in c.nodes.values()}
    assert all(snaps.values()), f"a node took no snapshot: {snaps}"
    leader = c.leader()
    for k in range(5):  # in flight: may or may not survive
        msgs = [{"payload": _payload(r, i + k * 3 + j)} for j in range(1 + k % 3)]
        backlog.maybe |= {m["payload"] for m in msgs}
        leader.send("propose", commands=[{"op": "publish", "topic": "t", "messages": msgs}])
    c.kill_all()
    for p in c.nodes.values():
        assert p.shadow is not None
        sizes = power_loss(str(p.shadow), str(p.data), torn)
        assert any(name.startswith("store" + os.sep) for name in sizes), "no store file kept"


def _same_state(c: RaftCluster) -> bool:
    digests = {p.ok("digest") for p in c.nodes.values()}
    return len(digests) == 1


@pytest.mark.parametrize("writer", ["thread", "fork"])
def test_every_acknowledged_payload_survives_power_loss_in_the_store(
    tmp_path: Path, make_cluster: type[RaftCluster], writer: str
) -> None:
    """The payload store (issue 22) under two power cuts in a row on every node: segments of
    32 KiB roll, retire (acks), get compacted and deleted (snapshots every ~8 entries); torn
    tails keep part of the unsynced bytes. After each cut every acknowledged payload that no
    consumer acked is there byte for byte, and the replicas agree (digest: state and store
    marks)."""
    extra = ["--compaction-entries", "8", "--segment-bytes", str(SEGMENT)]
    if writer == "fork":  # (what a heavy state gets; a light one, this one, a thread)
        extra += ["--inline-snapshot-us", "-1"]
    c = make_cluster(tmp_path, shadow=True, extra=extra)
    torn = random.Random(22)
    backlog = _Backlog()
    for r in range(2):
        _store_round(c, r, backlog, torn)
        c.start_all()
        c.propose([{"op": "create_topic", "topic": f"probe-{r}"}])  # the new term commits
        backlog.check(c.leader().ok("payloads", topic="t"))
        wait_for("the replicas to agree", lambda: _same_state(c), 20)
        for p in c.nodes.values():
            backlog.check(p.ok("payloads", topic="t"))
        c.kill_all()
    assert backlog.compactions >= 2
    store = tmp_path / "n1" / "store"
    assert len(list(store.glob("*.seg"))) < 20, "retired segments were never deleted"
