"""Faults of the payload store on a running node (issue 22): corruption and missing files stop
the node naming the file, a read error stops it (never a payload), ENOSPC stops it cleanly and
a restart once space is freed catches up, a torn tail is cut at restart."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from raftq.cluster.raft import RaftError, RaftNode, UnknownOutcome
from raftq.cluster.segstore import SEG_HEAD
from raftq.cluster.storage import OsDisk, StorageCorrupt
from tests.raft.faultdisk import STORE, FaultDisk
from tests.raft.test_node import Nodes, pub, until

SEGMENT = 4 << 10  # a few messages a segment: sealed segments (read from the files) at once


def _payload(i: int) -> bytes:
    return b"p%04d-" % i + bytes([97 + i % 26]) * (300 + i % 7)


def _payloads(node: RaftNode, topic: str = "t") -> list[bytes]:
    return [m["payload"] for m in node.read(lambda b: b.peek(topic, 1, 1000))]


async def _one_node_with_a_snapshot(tmp_path: Path, disk: OsDisk, n: int = 40) -> Nodes:
    """A single node, ``n`` messages published one by one (many sealed segments), a snapshot
    written after them, then stopped."""
    ns = Nodes(tmp_path, 1)
    node = ns.start("n1", disk=disk, store_segment_bytes=SEGMENT)
    await ns.leader()
    await node.propose([{"op": "create_topic", "topic": "t"}])
    for i in range(n):
        await node.propose([pub("t", _payload(i))])
    node.force_compaction()
    await until("a snapshot", lambda: node.stats["snapshots"] >= 1)
    await ns.stop("n1")
    return ns


def _segments(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "n1" / "store").glob("t.*~*.seg"))


def _stopped_naming(node: RaftNode, *words: str) -> None:
    st = node.status()
    assert st.role == "stopped" and not st.running, st
    assert st.error is not None and all(w in st.error for w in words), st.error


async def _start_or_stop_on_read(ns: Nodes, *words: str) -> None:
    """The node refuses to start, or stops at its first read of the damaged data (a peek):
    either way naming ``words``, and no payload comes out."""
    try:
        node = ns.start("n1", store_segment_bytes=SEGMENT)
    except Exception as e:  # refused at restart
        assert all(w in str(e) for w in words), e
        return
    try:
        with pytest.raises(RaftError, match="stopped"):
            node.read(lambda b: b.peek("t", 1, 1000))
        _stopped_naming(node, *words)
        with pytest.raises(RaftError, match="stopped"):
            node.read(lambda b: b.peek("t", 1, 1))
    finally:
        await ns.close()


async def test_a_flipped_byte_in_a_sealed_segment_stops_the_node_naming_the_file(
    tmp_path: Path,
) -> None:
    ns = await _one_node_with_a_snapshot(tmp_path, OsDisk())
    seg = _segments(tmp_path)[0]  # sealed (the stream rolled past it) and named by the snapshot
    data = bytearray(seg.read_bytes())
    data[SEG_HEAD + 60] ^= 0x20  # inside the first message's payload
    seg.write_bytes(bytes(data))
    await _start_or_stop_on_read(ns, seg.name, "checksum")


async def test_a_segment_the_snapshot_names_missing_stops_the_node_at_restart(
    tmp_path: Path,
) -> None:
    ns = await _one_node_with_a_snapshot(tmp_path, OsDisk())
    seg = _segments(tmp_path)[1]
    kept = seg.read_bytes()
    seg.unlink()
    with pytest.raises(StorageCorrupt, match=seg.name) as e:
        ns.start("n1", store_segment_bytes=SEGMENT)
    assert "missing" in str(e.value)
    seg.write_bytes(kept)  # put back: the same process starts the node (the lock was let go)
    node = ns.start("n1", store_segment_bytes=SEGMENT)
    try:
        await ns.leader()
        assert _payloads(node) == [_payload(i) for i in range(40)]
    finally:
        await ns.close()


@pytest.mark.parametrize("where", ["peek", "receive"])
async def test_a_store_read_error_stops_the_node_and_delivers_nothing(
    tmp_path: Path, where: str
) -> None:
    """EIO reading a segment: a peek (RaftNode.read) raises RaftError, a receive (read on the
    leader right after apply) gets no payload: its outcome is unknown and the node stops."""
    disk = FaultDisk()
    ns = Nodes(tmp_path, 1)
    node = ns.start("n1", disk=disk, store_segment_bytes=SEGMENT)
    try:
        await ns.leader()
        await node.propose([{"op": "create_topic", "topic": "t"}])
        for i in range(30):
            await node.propose([pub("t", _payload(i))])
        assert _payloads(node)[:2] == [_payload(0), _payload(1)]  # (its reader stays open)
        disk.eio_reads = True
        if where == "peek":
            with pytest.raises(RaftError, match="stopped"):
                node.read(lambda b: b.peek("t", 1, 10))
        else:
            receive = {"op": "receive", "topic": "t", "group": "default", "consumer": "c",
                       "max": 5, "token": b"k" * 16}  # fmt: skip
            with pytest.raises((UnknownOutcome, RaftError)):
                await node.propose([receive], timeout=5)
        _stopped_naming(node, "t.", ".seg", "read failed", "Input/output error")
        with pytest.raises(RaftError, match="stopped"):
            node.read(lambda b: b.peek("t", 1, 1))
        with pytest.raises(RaftError, match="stopped"):
            await node.propose([pub("t", b"refused")])
    finally:
        await ns.close()
    disk.eio_reads = False  # the disk is back: the node restarts with everything
    node = ns.start("n1", disk=disk, store_segment_bytes=SEGMENT)
    try:
        await ns.leader()
        await until("the journal replayed", lambda: len(_payloads(node)) == 30)
        assert _payloads(node) == [_payload(i) for i in range(30)]
    finally:
        await ns.close()


@pytest.mark.parametrize("full", [STORE, "journal.log"], ids=["store", "journal"])
async def test_enospc_on_a_follower_stops_it_and_it_catches_up_once_space_is_freed(
    tmp_path: Path, full: str
) -> None:
    """The follower stops naming the file and the problem; the others go on; started again once
    space is freed, it catches up (journal replay, then appends or a snapshot) with nothing lost."""
    ns = Nodes(tmp_path, 3, compaction=40)
    disks = {nid: FaultDisk() for nid in ns.addrs}
    try:
        for nid in ns.addrs:
            ns.start(nid, disk=disks[nid], store_segment_bytes=SEGMENT)
        leader = await ns.leader()
        await leader.propose([{"op": "create_topic", "topic": "t"}])
        for i in range(10):
            await leader.propose([pub("t", _payload(i))])
        nid = next(k for k, n in ns.nodes.items() if n is not leader)
        follower = ns.nodes[nid]
        last = leader.status().applied_index
        await until("the follower to apply", lambda: follower.status().applied_index >= last)
        disks[nid].full = full  # the store's next write (its segment's buffer) or the journal's
        for i in range(10, 60):  # acknowledged by the leader and the other follower
            await leader.propose([pub("t", _payload(i))])
        await until("the full follower to stop", lambda: follower.status().role == "stopped")
        assert disks[nid].refused, "the fault never fired"
        why = "No space left on device (ENOSPC)" if full == STORE else "No space left on device"
        # (the journal names the segment a roll was writing, journal.log.N, as a whole)
        _stopped_naming(follower, why, disks[nid].refused[0] if full == STORE else full)
        assert leader.is_leader()
        for i in range(60, 80):  # the others go on (more snapshots on the way)
            await leader.propose([pub("t", _payload(i))])
        await ns.stop(nid)
        disks[nid].full = None  # space freed
        node = ns.start(nid, disk=disks[nid], store_segment_bytes=SEGMENT)
        last = leader.status().applied_index
        await until("the follower to catch up", lambda: node.status().applied_index >= last, 30)
        await until(
            "the same state",
            lambda: node.read(lambda b: b.digest()) == leader.read(lambda b: b.digest()),
        )
        assert _payloads(node) == [_payload(i) for i in range(80)]
    finally:
        await ns.close()


@pytest.mark.parametrize("tail", ["garbage", "half-record"])
async def test_a_torn_store_tail_is_cut_at_restart(tmp_path: Path, tail: str) -> None:
    """Bytes past the snapshot's marks (unsynced appends a crash left half written) are cut
    and the journal replay writes the same bytes again."""
    ns = Nodes(tmp_path, 1)
    node = ns.start("n1", store_segment_bytes=SEGMENT)
    try:
        await ns.leader()
        await node.propose([{"op": "create_topic", "topic": "t"}])
        for i in range(20):
            await node.propose([pub("t", _payload(i))])
        node.force_compaction()
        await until("a snapshot", lambda: node.stats["snapshots"] >= 1)
        for i in range(20, 23):  # in the journal only: replayed after the cut
            await node.propose([pub("t", _payload(i))])
        node.read(lambda b: b.store.marks())  # (writes the buffers)
        before = {p.name: p.read_bytes() for p in _segments(tmp_path)}
        digest = node.read(lambda b: b.digest())
    finally:
        await ns.close()
    for seg in _segments(tmp_path):  # named by the snapshot: cut; newer ones: removed
        if tail == "garbage":
            extra = b"\xde\xad\xbe\xef" * 50
        else:  # the start of a copy of the segment's first record
            first = before[seg.name][SEG_HEAD:]
            extra = first[: len(first) // 4 or 8]
        seg.write_bytes(seg.read_bytes() + extra)
    node = ns.start("n1", store_segment_bytes=SEGMENT)
    try:
        await ns.leader()
        await until("the journal replayed", lambda: len(_payloads(node)) == 23)
        assert _payloads(node) == [_payload(i) for i in range(23)]
        assert node.read(lambda b: b.digest()) == digest
        node.read(lambda b: b.store.marks())
        after = {p.name: p.read_bytes() for p in _segments(tmp_path)}
        assert after == before, "the tail was not cut back to the same bytes"
    finally:
        await ns.close()


async def test_a_damaged_segment_sent_in_a_snapshot_stops_the_follower_not_the_leader(
    tmp_path: Path,
) -> None:
    """The export sends files as they are; the follower checks what it installed (segments
    without a sidecar are scanned record by record) and stops naming the file; the leader
    serves on."""
    ns = Nodes(tmp_path, 3, compaction=40)
    try:
        for nid in ns.addrs:
            ns.start(nid, store_segment_bytes=SEGMENT)
        leader = await ns.leader()
        await leader.propose([{"op": "create_topic", "topic": "t"}])
        lagging = next(k for k, n in ns.nodes.items() if n is not leader)
        await ns.stop(lagging)
        shutil.rmtree(tmp_path / lagging)
        for i in range(60):  # > compaction: the follower needs the snapshot
            await leader.propose([pub("t", _payload(i))])
        await until("a leader snapshot", lambda: leader.stats["snapshots"] >= 1)
        lid = next(k for k, n in ns.nodes.items() if n is leader)
        seg = sorted((tmp_path / lid / "store").glob("t.*~*.seg"))[0]
        data = bytearray(seg.read_bytes())
        data[SEG_HEAD + 60] ^= 0x20
        seg.write_bytes(bytes(data))
        node = ns.start(lagging, store_segment_bytes=SEGMENT)
        await until("the follower to stop", lambda: node.status().role == "stopped", 30)
        _stopped_naming(node, seg.name, "checksum")
        await leader.propose([pub("t", b"still served")])
        assert leader.is_leader()
    finally:
        await ns.close()
