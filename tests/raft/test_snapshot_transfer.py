"""A follower that needs a snapshot gets the metadata and the payload store's files (issue 22):
it ends with the leader's state, the leader's store bytes, and no election on the way."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from raftq.cluster.raft import RaftNode
from tests.raft.test_node import Nodes, pub, until

SEGMENT = 64 << 10  # small segments: the transfer spans many files


def _store_files(node: RaftNode) -> dict[str, bytes]:
    """The segment files a snapshot of this node names, up to their marked sizes."""
    store = node.broker.store
    _, marks = node.read(lambda b: store.marks())
    out = {}
    for key, _, segs in marks:
        for segno, size, *_ in segs:
            name = f"{key}~{segno:08d}.seg"
            with open(os.path.join(store.dir, name), "rb") as f:
                out[name] = f.read(size)
    return out


@pytest.fixture
async def three(tmp_path: Path) -> AsyncIterator[Nodes]:
    ns = Nodes(tmp_path, 3, compaction=50)
    try:
        for nid in ns.addrs:
            ns.start(nid, store_segment_bytes=SEGMENT)
        yield ns
    finally:
        await ns.close()


async def test_a_wiped_follower_gets_the_store_files_without_an_election(three: Nodes) -> None:
    leader = await three.leader()
    term = leader.status().term
    await leader.propose([{"op": "create_topic", "topic": "t"}])
    await leader.propose([{"op": "create_topic", "topic": "u"}])
    lagging = next(k for k, n in three.nodes.items() if n is not leader)
    await three.stop(lagging)
    shutil.rmtree(three.root / lagging)  # type: ignore[operator]
    for i in range(400):  # ~400 KiB per topic: several segments; > 2 x compaction (50)
        await leader.propose([pub("t", b"t%04d" % i + b"x" * 1000), pub("u", b"u%04d" % i)])
    # A consumed part frees records (some segments retire), so the marks are not just appends.
    got = await leader.propose(
        [
            {
                "op": "receive",
                "topic": "t",
                "group": "default",
                "consumer": "c",
                "max": 100,
                "token": b"k" * 16,
            }
        ]
    )
    receipts = [m["receipt"] for m in got[0]["deliveries"]]
    assert got[0]["deliveries"][0]["payload"][:5] == b"t0000", "the leader read it"
    assert len(receipts) == 100
    await leader.propose([{"op": "ack", "receipts": receipts}])
    await until("leader snapshot", lambda: leader.stats["snapshots"] >= 1)
    node = three.start(lagging, store_segment_bytes=SEGMENT)
    last = leader.status().applied_index
    await until("snapshot install", lambda: node.status().applied_index >= last, 30)
    await until(
        "same state",
        lambda: node.read(lambda b: b.digest()) == leader.read(lambda b: b.digest()),
    )
    peek = node.read(lambda b: b.peek("t", 1, 3))
    assert [m["payload"][:5] for m in peek] == [b"t0100", b"t0101", b"t0102"]
    assert node.read(lambda b: b.peek("u", 400, 1))[0]["payload"] == b"u0399"
    assert _store_files(node) == _store_files(leader), "the same bytes on both"
    assert len(_store_files(node)) > 4
    assert leader.is_leader() and leader.status().term == term, "no election"
