"""RaftNode in one process: definite outcomes, snapshots, transfer and membership."""

from __future__ import annotations

import asyncio
import logging
import os
import select
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from raftq.cluster.raft import (
    EntryTooLarge,
    NotLeader,
    QueueFull,
    RaftConfig,
    RaftError,
    RaftNode,
    UnknownOutcome,
)
from raftq.cluster.raft._proposals import _LOGGED, _Pending
from raftq.cluster.raft._ticks import _Wait
from raftq.cluster.raft._tuning import ELECTION_MAX, MAX_ENTRY_BYTES
from raftq.cluster.storage import DiskFile, OsDisk
from tests.raft.harness import free_ports
from tests.raft.simdisk import FileWrapper


async def until(what: str, cond: Callable[[], object], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


class Nodes:
    """Up to n nodes of one cluster in this process."""

    def __init__(
        self, root: Path | None, n: int, compaction: int = 10_000, secret: str | None = "secret"
    ) -> None:
        ports = free_ports(2 * n)
        self.addrs = {
            f"n{i + 1}": (f"127.0.0.1:{ports[2 * i]}", f"127.0.0.1:{ports[2 * i + 1]}")
            for i in range(n)
        }
        self.root = root
        self.compaction = compaction
        self.nodes: dict[str, RaftNode] = {}
        self.secret = secret

    def config(self, nid: str, members: list[str] | None = None) -> RaftConfig:
        members = members or list(self.addrs)
        peers = {k: self.addrs[k] for k in members if k != nid}
        raft, api = self.addrs[nid]
        data = None if self.root is None else str(self.root / nid)
        return RaftConfig(nid, raft, api, peers, data, self.secret, insecure=not self.secret)

    def start(self, nid: str, members: list[str] | None = None, **kw: Any) -> RaftNode:
        node = RaftNode(self.config(nid, members), compaction_entries=self.compaction, **kw)
        node.start()
        self.nodes[nid] = node
        return node

    async def leader(self) -> RaftNode:
        await until("a leader", lambda: any(n.is_leader() for n in self.nodes.values()))
        return next(n for n in self.nodes.values() if n.is_leader())

    async def stop(self, nid: str) -> None:
        await self.nodes.pop(nid).stop()

    async def close(self) -> None:
        for nid in list(self.nodes):
            await self.stop(nid)


@pytest.fixture
async def three(tmp_path: Path) -> AsyncIterator[Nodes]:
    ns = Nodes(tmp_path, 3, compaction=50)
    try:
        for nid in ns.addrs:
            ns.start(nid)
        yield ns
    finally:
        await ns.close()


def pub(topic: str, payload: bytes) -> dict[str, object]:
    return {"op": "publish", "topic": topic, "messages": [{"payload": payload}]}


def test_refuses_to_start_without_a_secret() -> None:
    cfg = RaftConfig("n1", "127.0.0.1:1", "127.0.0.1:2", {}, None, None)
    with pytest.raises(RaftError, match="secret"):
        RaftNode(cfg)
    RaftNode(RaftConfig("n1", "127.0.0.1:1", "127.0.0.1:2", {}, None, None, insecure=True))


async def test_single_node_proposals_resolve_with_results_concurrently() -> None:
    ns = Nodes(None, 1)
    node = ns.start("n1")
    try:
        await ns.leader()
        woken: list[int] = []
        node.add_apply_listener(lambda: woken.append(1))
        assert await node.propose([{"op": "create_topic", "topic": "t"}]) == [
            {"topic": "t", "created": True}
        ]
        results = await asyncio.gather(*(node.propose([pub("t", b"%d" % i)]) for i in range(300)))
        seqs = sorted(r[0]["messages"][0]["seq"] for r in results)
        assert seqs == list(range(1, 301))
        bad = await node.propose([{"op": "publish", "topic": "nope", "messages": []}])
        assert bad[0]["error"]["code"] == "topic_not_found"
        assert node.read(lambda b: b.topic_stats("t")["messages"]) == 300
        assert woken
        with pytest.raises(EntryTooLarge):
            await node.propose([pub("t", b"x" * (5 << 20))])
        st = node.status()
        assert (st.role, st.leader_id) == ("leader", "n1")
        t0 = time.monotonic()
        assert not await node.transfer_leadership(5.0)  # nobody to hand over to
        assert time.monotonic() - t0 < 0.5
        assert st.applied_index == st.commit_index
    finally:
        await ns.close()


async def test_apply_listeners_run_on_their_loop_only_when_wanted() -> None:
    ns = Nodes(None, 1)
    node = ns.start("n1")
    try:
        await ns.leader()
        me = threading.get_ident()
        calls: dict[str, list[int]] = {"wanted": [], "unwanted": []}
        asked: list[int] = []

        def unwanted() -> bool:
            asked.append(threading.get_ident())  # asked where the tick ran, after applying
            return False

        node.add_apply_listener(lambda: calls["wanted"].append(threading.get_ident()))
        node.add_apply_listener(lambda: calls["unwanted"].append(1), unwanted)
        await node.propose([{"op": "create_topic", "topic": "t"}])
        await asyncio.gather(*(node.propose([pub("t", b"x")]) for _ in range(50)))
        await until("a listener call", lambda: calls["wanted"])
        assert set(calls["wanted"]) == {me}  # on the loop that registered it
        # one call per tick that applied entries, not one per entry
        assert 1 <= len(calls["wanted"]) <= 51
        # (a leader ticks on the loop that started it: this one, see LOOP_TICKS)
        assert asked and set(asked) == {me} and not calls["unwanted"]
    finally:
        await ns.close()


async def test_not_leader_is_immediate_and_definite() -> None:
    ns = Nodes(None, 3)
    node = ns.start("n1")  # its peers never start: no leader, ever
    try:
        t0 = time.monotonic()
        with pytest.raises(NotLeader) as e:
            await node.propose([{"op": "tick"}], timeout=5)
        assert time.monotonic() - t0 < 1
        assert e.value.leader_id is None
    finally:
        await ns.close()


async def test_uncommittable_entry_times_out_as_unknown_outcome(three: Nodes) -> None:
    leader = await three.leader()
    await leader.propose([{"op": "create_topic", "topic": "t"}])
    for nid in [k for k, n in three.nodes.items() if n is not leader]:
        await three.stop(nid)
    t0 = time.monotonic()
    with pytest.raises(UnknownOutcome):
        await leader.propose([pub("t", b"lost?")], timeout=0.5)
    assert time.monotonic() - t0 < 1.5
    # Without a majority the leader steps down; proposals then fail definitely at once.
    await until("the isolated leader to step down", lambda: not leader.is_leader(), 10)
    with pytest.raises(NotLeader):
        await leader.propose([pub("t", b"no")])


async def test_followers_redirect_with_the_leader_address(three: Nodes) -> None:
    leader = await three.leader()
    await until(
        "followers to know the leader",
        lambda: all(n.status().leader_id == leader.config.node_id for n in three.nodes.values()),
    )
    follower = next(n for n in three.nodes.values() if n is not leader)
    with pytest.raises(NotLeader) as e:
        await follower.propose([{"op": "tick"}])
    assert (e.value.leader_id, e.value.leader_api) == (
        leader.config.node_id,
        leader.config.api_addr,
    )


async def test_lagging_follower_catches_up_from_a_snapshot(three: Nodes) -> None:
    leader = await three.leader()
    await leader.propose([{"op": "create_topic", "topic": "t"}])
    lagging = next(k for k, n in three.nodes.items() if n is not leader)
    await three.stop(lagging)
    for i in range(120):  # > 2 x compaction threshold (50): the leader compacts its log
        await leader.propose([pub("t", b"%d" % i)])
    await until("leader compaction", lambda: _log_len(leader) < 60)
    node = three.start(lagging)
    await until("snapshot install", lambda: node.status().applied_index >= 120, 20)
    await until(
        "same state",
        lambda: node.read(lambda b: b.digest()) == leader.read(lambda b: b.digest()),
    )
    # It restarts from its own snapshot (entries after it are applied once the leader tells
    # it the commit index: the commit index is not persisted).
    await three.stop(lagging)
    node = three.start(lagging)
    assert node.read(lambda b: b.topic_stats("t")["messages"]) >= 50
    await until("catch-up", lambda: node.read(lambda b: b.topic_stats("t")["messages"]) == 120)


async def test_elections_leaders_snapshots_and_installs_are_logged_at_info(
    three: Nodes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "raftq.cluster.raft")
    leader = await three.leader()
    lid = leader.config.node_id
    await leader.propose([{"op": "create_topic", "topic": "t"}])
    lagging = next(k for k, n in three.nodes.items() if n is not leader)

    def said(text: str) -> bool:
        return any(r.levelno == logging.INFO and text in r.getMessage() for r in caplog.records)

    await until("the followers' leader lines", lambda: said(f"{lagging}: leader is {lid} (term"))
    assert said(f"raft {lid}: election: standing in term")
    assert said(f"raft {lid}: elected leader in term")
    await three.stop(lagging)
    for i in range(120):  # > 2 x compaction threshold (50): the leader snapshots
        await leader.propose([pub("t", b"%d" % i)])
    await until("the snapshot line", lambda: said(f"raft {lid}: snapshot up to entry"))
    await until("leader compaction", lambda: _log_len(leader) < 60)
    node = three.start(lagging)
    await until("snapshot install", lambda: node.status().applied_index >= 120, 20)
    assert said(f"raft {lagging}: received a snapshot from the leader")
    assert said(f"raft {lagging}: installed the leader's snapshot up to entry")


async def test_a_follower_catches_up_through_appends_of_the_largest_entries(
    tmp_path: Path,
) -> None:
    # pysyncobj batches entries up to APPEND_BATCH_BYTES, plus one: the largest frames a member
    # sends, which the receiving port must take (MAX_FRAME).
    ns = Nodes(tmp_path, 3)
    try:
        for nid in ns.addrs:
            ns.start(nid)
        leader = await ns.leader()
        await leader.propose([{"op": "create_topic", "topic": "t"}])
        lagging = next(k for k, n in ns.nodes.items() if n is not leader)
        await ns.stop(lagging)
        big = b"x" * ((MAX_ENTRY_BYTES >> 2) - (16 << 10))  # four per entry: just under the max
        for _ in range(6):
            results = await leader.propose([pub("t", big) for _ in range(4)])
            assert all("error" not in r for r in results), results
        node = ns.start(lagging)
        await until(
            "catch-up",
            lambda: node.status().applied_index >= leader.status().applied_index,
            30,
        )
        assert node.read(lambda b: b.digest()) == leader.read(lambda b: b.digest())
        assert node.stats["frames_refused"] == 0
    finally:
        await ns.close()


async def test_leadership_transfer_hands_over_to_a_follower(three: Nodes) -> None:
    leader = await three.leader()
    await leader.propose([{"op": "create_topic", "topic": "t"}])
    assert await leader.transfer_leadership(5.0)
    new = await three.leader()
    assert new is not leader
    assert (await new.propose([pub("t", b"after")]))[0]["messages"][0]["seq"] == 1


async def test_add_and_remove_a_member(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "raftq.cluster.raft")
    ns = Nodes(tmp_path, 4)
    try:
        for nid in ["n1", "n2", "n3"]:
            ns.start(nid, ["n1", "n2", "n3"])
        leader = await ns.leader()
        await leader.propose([{"op": "create_topic", "topic": "t"}])
        n4 = ns.start("n4")
        raft, api = ns.addrs["n4"]
        await leader.add_member("n4", raft, api)
        await leader.propose([pub("t", b"x")])
        await until(
            "n4 to apply", lambda: n4.status().applied_index >= leader.status().applied_index
        )
        assert set(leader.status().members) == {"n1", "n2", "n3", "n4"}
        await leader.remove_member("n4")
        await until("n4 removed", lambda: "n4" not in leader.status().members)
        lid = leader.config.node_id
        lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
        assert f"raft {lid}: members now n1, n2, n3, n4 (added n4)" in lines
        assert f"raft {lid}: members now n1, n2, n3 (removed n4)" in lines
    finally:
        await ns.close()


@pytest.mark.parametrize("fixed", [True, False])
async def test_a_send_larger_than_the_socket_buffer_is_flushed_without_waiting(
    tmp_path: Path, fixed: bool
) -> None:
    """pysyncobj leaves the unsent rest of a message until the next send (a heartbeat later):
    a 1 MB entry through 16 KB socket buffers took seconds. With the fix it streams."""
    ns = Nodes(tmp_path, 3)
    try:
        for nid in ns.addrs:
            node = RaftNode(ns.config(nid), fix_partial_sends=fixed, socket_buffer=8192)
            node.start()
            ns.nodes[nid] = node
        leader = await ns.leader()
        await leader.propose([{"op": "create_topic", "topic": "t"}])
        t0 = time.monotonic()
        try:
            await leader.propose([pub("t", b"x" * (1 << 20))], timeout=1.0)
            took = time.monotonic() - t0
        except UnknownOutcome:
            took = float("inf")
        if fixed:
            assert took < 0.5
            assert leader.stats["rearmed_sends"] > 0
        else:
            assert took > 0.5  # the bug this guards against is still there without the fix
    finally:
        await ns.close()


class _FailingFile(FileWrapper):
    def __init__(self, f: DiskFile, armed: list[bool]) -> None:
        super().__init__(f)
        self.armed = armed

    def sync(self) -> None:
        if self.armed[0]:
            raise OSError(5, "Input/output error")
        self.f.sync()


class _FailingDisk(OsDisk):
    """fsync starts failing (EIO) once armed."""

    def __init__(self) -> None:
        self.armed = [False]

    def open(self, path: str) -> DiskFile:
        return _FailingFile(super().open(path), self.armed)


async def test_a_second_node_on_the_same_data_dir_refuses_to_start(tmp_path: Path) -> None:
    # Opening the journal truncates its torn tail and zero-fills ahead: done by a second
    # process while the first appended, it corrupted the first's journal.
    ns = Nodes(tmp_path, 1)
    first = ns.start("n1")
    try:
        await ns.leader()
        await first.propose([{"op": "create_topic", "topic": "t"}])
        journal = tmp_path / "n1" / "journal.log"
        before = journal.read_bytes()
        cfg = ns.config("n1")
        other = RaftConfig(cfg.node_id, f"127.0.0.1:{free_ports(1)[0]}", cfg.api_addr,
                           cfg.peers, cfg.data_dir, "secret")  # fmt: skip
        with pytest.raises(RaftError, match="in use by another raftq node"):
            RaftNode(other).start()
        assert journal.read_bytes() == before  # untouched
    finally:
        await ns.close()
    again = ns.start("n1")  # released at stop
    try:
        await ns.leader()
        assert again.read(lambda b: b.list_topics()) == ["t"]
    finally:
        await ns.close()


async def test_a_failed_fsync_stops_the_node_and_never_acknowledges(tmp_path: Path) -> None:
    ns = Nodes(tmp_path, 1)
    disk = _FailingDisk()
    node = RaftNode(ns.config("n1"), disk=disk)
    node.start()
    ns.nodes["n1"] = node
    try:
        await ns.leader()
        await node.propose([{"op": "create_topic", "topic": "t"}])
        disk.armed[0] = True
        with pytest.raises(UnknownOutcome):
            await node.propose([pub("t", b"never synced")], timeout=2)
        st = node.status()
        assert not st.running and st.error is not None and "journal.log" in st.error
        with pytest.raises(RaftError, match="stopped"):
            await node.propose([pub("t", b"refused")])
    finally:
        await ns.close()


@pytest.mark.parametrize("leader_fix", [True, False], ids=["both-fixes", "follower-fix-only"])
async def test_pipelined_appends_never_make_followers_rewrite_their_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, leader_fix: bool
) -> None:
    """pysyncobj rewound next_index on every ack older than the latest send, re-sent entries
    and made followers truncate and rewrite them (logging CRITICAL when already applied).
    The leader no longer rewinds; and a follower keeps entries it already has even when they
    are sent again."""
    three = Nodes(tmp_path, 3)
    for nid in three.addrs:
        three.start(nid, fix_stale_acks=leader_fix)
    try:
        await _pipelined(three, caplog, leader_fix)
    finally:
        await three.close()


async def _pipelined(three: Nodes, caplog: pytest.LogCaptureFixture, leader_fix: bool) -> None:
    leader = await three.leader()
    await leader.propose([{"op": "create_topic", "topic": "t"}])
    truncations: list[int] = []
    for n in three.nodes.values():
        assert n._journal is not None
        n._journal.on_truncate = truncations.append

    async def worker(k: int) -> None:
        for i in range(40):
            await leader.propose([pub("t", b"%d-%d" % (k, i))])

    await asyncio.gather(*(worker(k) for k in range(12)))
    if leader_fix:
        assert leader.stats["stale_acks_ignored"] > 0  # the situation did arise
    else:
        dups = sum(n.stats["duplicate_appends"] for n in three.nodes.values())
        assert dups > 0  # the leader re-sent entries the followers had
    assert truncations == []
    assert "truncating already-applied" not in caplog.text


async def test_queue_full_means_not_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    import raftq.cluster.raft._proposals as proposals

    monkeypatch.setattr(proposals, "QUEUE_MAX", 4)
    ns = Nodes(None, 1)
    node = ns.start("n1")
    try:
        await ns.leader()
        await node.propose([{"op": "create_topic", "topic": "t"}])
        # A busy tick thread (here: its lock held) leaves proposals in the queue; a proposal
        # made while it waits for events would be appended at once instead.
        node._ticks.lock.acquire()
        try:
            tasks = [asyncio.ensure_future(node.propose([pub("t", b"%d" % i)])) for i in range(200)]
            await until("the queue to fill", lambda: sum(t.done() for t in tasks) >= 196)
        finally:
            node._ticks.lock.release()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        full = [o for o in outcomes if isinstance(o, QueueFull)]
        done = [o for o in outcomes if isinstance(o, list)]
        assert full and done and len(full) + len(done) == 200
        assert node.read(lambda b: b.topic_stats("t")["messages"]) == len(done)
    finally:
        await ns.close()


async def test_nodes_with_different_secrets_never_form_a_cluster(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ns = Nodes(None, 2)
    try:
        for nid, secret in (("n1", "one"), ("n2", "two")):
            cfg = ns.config(nid)
            node = RaftNode(RaftConfig(nid, cfg.raft_addr, cfg.api_addr, cfg.peers, None, secret))
            node.start()
            ns.nodes[nid] = node
        await until("an authentication warning", lambda: "cluster secret" in caplog.text, 10)
        assert not any(n.is_leader() for n in ns.nodes.values())
    finally:
        await ns.close()


class _NoSnapshotDisk(OsDisk):
    def create(self, path: str) -> DiskFile:
        if os.path.basename(path).startswith("snapshot.bin") and path.endswith(".tmp"):
            raise OSError(28, "No space left on device")
        return super().create(path)


async def test_a_failed_snapshot_keeps_the_journal_and_the_node_serving(tmp_path: Path) -> None:
    ns = Nodes(tmp_path, 1, compaction=20)
    node = RaftNode(ns.config("n1"), disk=_NoSnapshotDisk(), compaction_entries=20)
    node.start()
    ns.nodes["n1"] = node
    try:
        await ns.leader()
        await node.propose([{"op": "create_topic", "topic": "t"}])
        for i in range(60):
            await node.propose([pub("t", b"%d" % i)])
        assert node.stats["snapshots"] == 0
        assert node._journal is not None and len(node._journal) > 60  # nothing compacted away
        await ns.stop("n1")
        node = ns.start("n1")
        await ns.leader()
        await node.propose([pub("t", b"after")])
        assert node.read(lambda b: b.topic_stats("t")["messages"]) == 61
    finally:
        await ns.close()


async def test_a_crash_between_snapshot_and_compaction_keeps_later_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot is durable before the journal is compacted. Restarting in between, pysyncobj
    found a journal head that did not match the snapshot and dropped the WHOLE journal,
    committed entries after the snapshot included."""
    ns = Nodes(tmp_path, 1)
    node = ns.start("n1")
    try:
        await ns.leader()
        await node.propose([{"op": "create_topic", "topic": "t"}])
        for i in range(20):
            await node.propose([pub("t", b"a%d" % i)])
        # The crash window, held open: the snapshot is written, the journal never compacted.
        assert node._journal is not None
        monkeypatch.setattr(node._journal, "deleteEntriesTo", lambda entry_to: None)
        node.force_compaction()
        await until("a snapshot", lambda: node.stats["snapshots"] >= 1)
        for i in range(5):
            await node.propose([pub("t", b"b%d" % i)])
        await ns.stop("n1")
        node = ns.start("n1")
        await ns.leader()
        await node.propose([pub("t", b"c")])  # commits the new term's entries
        assert node.read(lambda b: b.topic_stats("t")["messages"]) == 26
    finally:
        await ns.close()


@pytest.mark.parametrize("inline_us", [None, -1], ids=["light", "forced-fork"])
async def test_a_light_state_is_snapshotted_in_place_a_heavy_one_by_a_forked_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inline_us: int | None
) -> None:
    forks: list[int] = []
    real_fork = os.fork

    def fork() -> int:
        pid = real_fork()
        if pid:
            forks.append(pid)
        return pid

    monkeypatch.setattr(os, "fork", fork)
    ns = Nodes(tmp_path, 1)
    kw: dict[str, Any] = {} if inline_us is None else {"inline_snapshot_us": inline_us}
    node = ns.start("n1", **kw)
    try:
        await ns.leader()
        await node.propose([{"op": "create_topic", "topic": "t"}])
        await node.propose([pub("t", b"a")])
        assert node.read(lambda b: b.snapshot_cost()) < 1000
        node.force_compaction()
        await until("a snapshot", lambda: node.stats["snapshots"] >= 1)
        assert len(forks) == (0 if inline_us is None else 1)
        await ns.stop("n1")
        node = ns.start("n1")  # from that snapshot
        await ns.leader()
        assert node.read(lambda b: b.topic_stats("t")["messages"]) == 1
    finally:
        await ns.close()


async def _snapshotted(ns: Nodes, node: RaftNode) -> bytes:
    """A topic created and a snapshot written: its file's bytes."""
    await ns.leader()
    await node.propose([{"op": "create_topic", "topic": "t"}])
    node.force_compaction()
    await until("a snapshot", lambda: node.stats["snapshots"] >= 1)
    assert node._snaps is not None
    blob = node._snaps._read()
    assert blob is not None
    return blob


async def test_a_snapshot_that_fails_to_serialize_in_place_keeps_the_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ns = Nodes(tmp_path, 1)
    node = ns.start("n1")
    try:
        await ns.leader()
        await node.propose([{"op": "create_topic", "topic": "t"}])

        def broken(marks: Any = None) -> bytes:
            raise RuntimeError("a bug")

        monkeypatch.setattr(node.broker, "snapshot", broken)
        node.force_compaction()
        snaps = node._snaps
        assert snaps is not None
        await until("the failure", lambda: snaps._retry_at > 0)
        await node.propose([pub("t", b"still serving")])
        assert node.stats["snapshots"] == 0
        monkeypatch.undo()
        snaps._retry_at = 0.0
        node.force_compaction()
        await until("a snapshot", lambda: node.stats["snapshots"] >= 1)
    finally:
        await ns.close()


async def test_a_snapshot_install_waits_for_our_own_writer_thread_first(tmp_path: Path) -> None:
    """The thread writing a light state's snapshot cannot be killed: the install waits for
    it, so its (older) file never lands over the installed one."""
    ns = Nodes(tmp_path, 1)
    node = ns.start("n1")
    try:
        blob = await _snapshotted(ns, node)
        snaps = node._snaps
        assert snaps is not None
        path = tmp_path / "n1" / "snapshot.bin"
        gate = threading.Event()

        def slow_writer() -> None:  # an older state's file, renamed in late
            gate.wait(10)
            time.sleep(0.2)
            path.write_bytes(b"older")

        done: list[bool] = []

        def install() -> None:
            snaps._writer = threading.Thread(target=slow_writer, daemon=True)
            snaps._writer.start()
            gate.set()
            done.append(snaps.setTransmissionData((b"S" + blob, True, True)))

        node._ticks.calls.append(install)
        node._ticks.wake()
        await until("the install", lambda: done)
        assert done == [True] and snaps._writer is None
        assert path.read_bytes() == blob
    finally:
        await ns.close()


async def test_a_snapshot_install_stops_our_own_snapshot_writer_first(tmp_path: Path) -> None:
    """Otherwise the writer (older state) could rename its file over the installed one."""
    ns = Nodes(tmp_path, 1)
    node = ns.start("n1")
    try:
        blob = await _snapshotted(ns, node)
        assert node._snaps is not None
        # a slow "snapshot writer" (spawning is instant: no event-loop stall)
        pid = os.posix_spawn("/bin/sleep", ["sleep", "30"], {})  # noqa: ASYNC221
        done: list[bool] = []

        def install() -> None:
            assert node._snaps is not None
            node._snaps._pid = pid
            done.append(node._snaps.setTransmissionData((b"S" + blob, True, True)))

        node._ticks.calls.append(install)
        node._ticks.wake()
        await until("the install", lambda: done)
        assert done == [True]
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # killed and reaped
        assert (tmp_path / "n1" / "snapshot.bin").read_bytes() == blob
    finally:
        await ns.close()


def test_a_failed_bind_closes_the_socket_it_opened(monkeypatch: pytest.MonkeyPatch) -> None:
    """pysyncobj retries a failed bind later but left that attempt's socket open (a
    ResourceWarning at some later garbage collection)."""
    from pysyncobj.tcp_server import TcpServer

    from raftq.cluster.raft._seam import _close_socket_on_failed_bind

    made: list[socket.socket] = []

    class Recording(socket.socket):
        def __init__(self, *args: Any, **kw: Any) -> None:
            super().__init__(*args, **kw)
            made.append(self)

    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:
        server = TcpServer(None, "127.0.0.1", busy.getsockname()[1], lambda conn: None)
        _close_socket_on_failed_bind(server)
        with monkeypatch.context() as m:
            m.setattr(socket, "socket", Recording)
            with pytest.raises(OSError):
                server.bind()  # the port is taken
        assert len(made) == 1 and made[0].fileno() == -1  # closed, not left to the collector
    finally:
        busy.close()


@pytest.mark.parametrize("size", [0, 1, 100, 65534, 65535, 65536, 131071, 300_000])
def test_wire_messages_are_zlib_streams_of_stored_blocks(size: int) -> None:
    """pysyncobj's receiver inflates every message: what we send must stay a zlib stream
    (split into stored blocks of at most 65535 bytes) that yields the bytes unchanged."""
    import zlib

    from raftq.cluster.raft._wire import _stored_zlib

    data = os.urandom(size)
    wire = _stored_zlib(data)
    assert zlib.decompress(wire) == data
    assert len(wire) == len(data) + 2 + 5 * max(1, -(-size // 0xFFFF)) + 4


def _count_appends(leader: RaftNode) -> dict[str, int]:
    """Append messages carrying entries that the leader sends, per follower id."""
    sent: dict[str, int] = {}
    send_now = leader._replication.send_now

    def counting(node: Any, message: Any) -> bool:
        if isinstance(message, dict) and message.get("entries"):
            nid = leader._info[node.id][0]
            sent[nid] = sent.get(nid, 0) + 1
        return send_now(node, message)

    leader._replication.send_now = counting
    return sent


def _log_len(node: RaftNode) -> int:
    assert node._journal is not None  # (the journal pysyncobj was given)
    return len(node._journal)


def _journals_equal(ns: Nodes) -> bool:
    ends = {n._journal[-1][1] for n in ns.nodes.values() if n._journal is not None}
    return len(ends) == 1


async def _with_topic(ns: Nodes, **kw: Any) -> RaftNode:
    """Start every node of ``ns``; return the leader once topic ``t`` exists."""
    for nid in ns.addrs:
        ns.start(nid, **kw)
    leader = await ns.leader()
    await leader.propose([{"op": "create_topic", "topic": "t"}])
    return leader


@pytest.mark.parametrize("quorum_sends", [True, False], ids=["quorum", "everyone"])
async def test_new_entries_go_at_once_only_to_the_followers_a_majority_needs(
    tmp_path: Path, quorum_sends: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With quorum sends, sequential proposals wake one follower per entry; the other gets
    them batched with the heartbeat and still ends up with the same log."""
    import raftq.cluster.raft._replication as replication

    monkeypatch.setattr(replication, "RESCUE_AFTER", 1.0)  # no rescues on a loaded box
    ns = Nodes(tmp_path, 3)
    try:
        leader = await _with_topic(ns, quorum_sends=quorum_sends)
        await until("every log to match", lambda: _journals_equal(ns))
        sent = _count_appends(leader)
        t0 = time.monotonic()
        for i in range(60):
            await leader.propose([pub("t", b"%d" % i)])
        await until("every log to match", lambda: _journals_equal(ns))
        followers = [n for n in ns.nodes.values() if n is not leader]
        counts = sorted(sent.get(n.config.node_id, 0) for n in followers)
        tagged = (
            [n._elections.quorum_at > t0 for n in followers],
            [n._elections.lagging_at > t0 for n in followers],
        )
        if quorum_sends:
            assert counts[1] >= 60 and counts[0] <= 30, counts
            assert any(tagged[0]) and any(tagged[1])  # one told it is in the quorum, one not
        else:
            assert counts[0] >= 60, counts
            assert not any(tagged[0]) and not any(tagged[1])  # no tags: full timeout range
        await until(
            "every replica to apply it all",
            lambda: len({n.read(lambda b: b.digest()) for n in ns.nodes.values()}) == 1,
        )
    finally:
        await ns.close()


def test_a_follower_whose_connection_is_backed_up_is_not_chosen_for_the_quorum() -> None:
    """pysyncobj moves a follower's next index when it queues entries, so one whose connection
    holds more than SEND_AHEAD unsent looks current; the append send passes over it, so a
    quorum that picked it would wait for a rescue: the next in line is chosen instead, and
    with too few left the caller sends to everyone."""
    from collections import namedtuple
    from types import SimpleNamespace

    from raftq.cluster.raft._replication import Replication

    peer = namedtuple("peer", "id")
    n2, n3 = peer("n2"), peer("n3")
    full: set[object] = set()
    sent: list[set[object]] = []
    raft = SimpleNamespace(
        other_nodes={n2, n3},
        next_index={n2: 20, n3: 20},
        connected_nodes={n2, n3},
        backed_up=lambda: set(full),
        send_append_entries_to=sent.append,
        send_now=lambda node, message: True,
    )
    rep = Replication(SimpleNamespace(_raft=raft, stats={}), True, True)  # type: ignore[arg-type]
    assert rep.send_new(10) and sent[-1] == {n2}  # (by id)
    full.add(n2)
    assert rep.send_new(11) and sent[-1] == {n3} and rep.quorum == [n3]
    full.clear()
    assert rep.send_new(12) and sent[-1] == {n3}  # (kept from one entry to the next)
    full.update({n2, n3})
    assert not rep.send_new(13) and len(sent) == 3 and rep.quorum == []
    # Sending to everyone: a backed-up follower is passed over, not waited for.
    everyone: list[bool] = []
    raft.send_append_entries = lambda: everyone.append(True)
    rep = Replication(SimpleNamespace(_raft=raft, stats={}), True, False)  # type: ignore[arg-type]
    full.clear()
    full.add(n2)
    assert rep.send_new(14) and everyone == [True]
    raft.next_index[n3] = 5  # (behind: catching up is the tick thread's job)
    assert not rep.send_new(14) and everyone == [True]


async def test_a_stalled_quorum_follower_is_replaced_by_the_first_to_acknowledge(
    tmp_path: Path,
) -> None:
    ns = Nodes(tmp_path, 3)
    try:
        leader = await _with_topic(ns)
        await leader.propose([pub("t", b"first")])
        await until("a quorum follower", lambda: len(leader._replication.quorum) == 1)
        (chosen,) = leader._replication.quorum
        stalled = next(n for n in ns.nodes.values() if n.config.raft_addr == chosen.id)
        other = next(n for n in ns.nodes.values() if n is not leader and n is not stalled)
        stalled._ticks.lock.acquire()  # its tick thread stops: no acknowledgements
        try:
            for i in range(5):
                await leader.propose([pub("t", b"%d" % i)], timeout=5)
            assert leader.stats["rescues"] >= 1
            assert [n.id for n in leader._replication.quorum] == [other.config.raft_addr]
        finally:
            stalled._ticks.lock.release()
        await leader.propose([pub("t", b"after")])
        await until("every log to match", lambda: _journals_equal(ns))
    finally:
        await ns.close()


def test_fast_election_timeouts_put_the_quorum_follower_first() -> None:
    """After the leader's connection drops, a follower sent new entries as a quorum member
    stands first: one that got them only in heartbeats lags, and its vote request would be
    refused by the other (whose own timeout the election would then wait for)."""
    from types import SimpleNamespace

    from raftq.cluster.raft._seam import FOLLOWER
    from raftq.cluster.raft._tuning import (
        FAST_ELECTION_MAX,
        FAST_ELECTION_MIN,
        FAST_ELECTION_SPLIT,
    )

    node = RaftNode(RaftConfig("n1", "127.0.0.1:1", "127.0.0.1:2", {}, None, "s"))
    elections = node._elections
    elections._raft = SimpleNamespace(state=FOLLOWER)  # type: ignore[assignment]
    elections.leader_lost, elections.leader_lost_until = True, time.monotonic() + 60

    def spread() -> tuple[float, float]:
        draws = [elections.election_timeout() for _ in range(300)]
        return min(draws), max(draws)

    lo, hi = spread()  # idle: nothing heard either way
    assert lo < FAST_ELECTION_SPLIT < hi and lo >= FAST_ELECTION_MIN and hi <= FAST_ELECTION_MAX
    elections.lagging_at = time.monotonic()
    assert spread()[0] >= FAST_ELECTION_SPLIT
    elections.quorum_at = time.monotonic()  # a quorum member (it may have lagged before)
    assert spread()[1] <= FAST_ELECTION_SPLIT


async def test_a_restarted_node_applies_what_was_committed_before_any_leader_is_known(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ns = Nodes(tmp_path, 3)
    try:
        leader = await _with_topic(ns)
        for i in range(30):
            await leader.propose([pub("t", b"%d" % i)])
        await until(
            "every replica to apply it all",
            lambda: all(
                n.read(lambda b: b.topic_stats("t")["messages"] if b.topics else 0) == 30
                for n in ns.nodes.values()
            ),
        )
        await ns.close()
        alone = ns.start("n2")  # no quorum: it will hear from no leader
        assert alone.read(lambda b: b.topic_stats("t")["messages"]) == 30
        await ns.close()
        mark = tmp_path / "n2" / "commit.bin"
        mark.write_bytes(b"garbage")  # a damaged mark is ignored: start, apply nothing yet
        alone = ns.start("n2")
        assert "commit.bin ignored" in caplog.text
        assert not alone.read(lambda b: b.topics)
    finally:
        await ns.close()


def test_a_quorum_send_reaches_only_the_quorum_while_everyone_sees_every_member() -> None:
    from raftq.cluster.raft._seam import _Members

    members = _Members({"a", "b"})
    members.only = {"a"}
    assert members | set() == {"a"}  # pysyncobj's send loop: `others | readonly`
    assert set(members) == {"a", "b"} and len(members) == 2 and "b" in members
    members.only = None
    assert members | {"c"} == {"a", "b", "c"}


async def test_a_snapshot_message_never_commits_entries_it_did_not_check(tmp_path: Path) -> None:
    """A follower holding entries nobody else has (an old leader's tail) must not commit them
    because a snapshot chunk carries a higher commit index: that message checks nothing."""
    ns = Nodes(tmp_path, 3)
    try:
        leader = await _with_topic(ns)
        await until("every log to match", lambda: _journals_equal(ns))
        follower = next(n for n in ns.nodes.values() if n is not leader)
        fb, journal = follower._raft, follower._journal
        assert journal is not None
        with follower._ticks.lock:  # its tick thread stays out meanwhile
            committed = fb.commit_index
            last = journal[-1][1]
            for idx in range(last + 1, last + 4):
                journal.add(b"\x01", idx, 0)  # a tail of no-ops from an older term
            leader_node = fb.leader
            message = {
                "type": "append_entries",
                "term": fb.term,
                "commit_index": last + 3,
                "serialized": None,  # "no snapshot ready yet": no log check at all
            }
            follower._inbound.on_message(leader_node, message)
            assert fb.commit_index == committed
        await leader.propose([pub("t", b"after")])  # the leader's append replaces the tail
        await until("every log to match", lambda: _journals_equal(ns))
    finally:
        await ns.close()


# ---------------------------------------------------------------------- a leader's loop ticks


async def test_a_leader_ticks_on_its_loop_and_hands_back_when_it_steps_down(
    three: Nodes,
) -> None:
    leader = await three.leader()
    await until("the loop to tick", lambda: leader._ticks.on_home and leader.stats["loop_ticks"])
    me = threading.get_ident()
    applied_on: list[int] = []

    def wanted() -> bool:
        applied_on.append(threading.get_ident())
        return False

    leader.add_apply_listener(lambda: None, wanted)
    await leader.propose([{"op": "create_topic", "topic": "t"}])
    assert applied_on and set(applied_on) == {me}  # committed and applied on this loop
    assert await leader.transfer_leadership(5.0)
    new = await three.leader()
    assert not leader._ticks.on_home  # a follower again: its tick thread ticks
    await new.propose([pub("t", b"after")])
    await until(
        "the old leader to apply",
        lambda: leader.status().applied_index >= new.status().commit_index,
    )


async def test_a_blocked_loop_does_not_cost_the_leader_its_leadership(three: Nodes) -> None:
    """While the loop runs something long, the tick thread sends the heartbeats: without it
    the followers would elect a new leader after ELECTION_MAX."""
    leader = await three.leader()
    await until("the loop to tick", lambda: leader._ticks.on_home and leader.stats["loop_ticks"])
    term = leader.status().term
    time.sleep(ELECTION_MAX + 0.5)  # noqa: ASYNC251 - blocking the loop is the point
    assert leader.stats["watchdog_ticks"] > 0
    assert leader.is_leader() and leader.status().term == term
    assert all(n.status().term == term for n in three.nodes.values())
    await leader.propose([{"op": "create_topic", "topic": "t"}])
    assert leader._ticks.on_home


async def test_followers_measure_the_longest_gap_between_their_leaders_appends(
    three: Nodes,
) -> None:
    """The gap a silent leader death must exceed to be noticed (raft stat max_append_gap_ms,
    which ELECTION_MIN is chosen from): measured by each follower, none by the leader."""
    leader = await three.leader()
    followers = [n for n in three.nodes.values() if n is not leader]
    await until(
        "the followers to measure a gap",
        lambda: all(n.stats["max_append_gap_ms"] > 0 for n in followers),
    )
    assert leader.stats["max_append_gap_ms"] == 0  # (it hears no appends)


def test_a_socket_closed_before_it_is_unregistered_wakes_the_loop_at_most_once() -> None:
    """pysyncobj closes a socket, then unsubscribes it. While a forked snapshot writer holds a
    copy, an epoll set keeps the registration: one-shot registrations report it once."""
    w = _Wait(SimpleNamespace(ticking=False, ident=0))  # type: ignore[arg-type]
    a, b = socket.socketpair()
    try:
        w.register(a.fileno(), select.POLLIN | select.POLLERR)
        b.send(b"x")
        assert w.poll(0) == [(a.fileno(), select.POLLIN)]
        assert w.poll(0) == [(a.fileno(), select.POLLIN)]  # unread: reported again
        assert a.recv(16) == b"x" and w.poll(0) == []
        held = os.dup(a.fileno())  # the writer's copy
        try:
            fd = a.fileno()
            a.close()
            w.unregister(fd)
            b.send(b"y")
            w.poll(0)
            assert not select.select([w.fileno()], [], [], 0)[0]  # the loop sleeps
        finally:
            os.close(held)
    finally:
        a.close()
        b.close()
        w.close()


async def test_a_follower_far_behind_is_caught_up_by_the_tick_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Catch-up sends (8 MB batches, snapshot chunks) would stall the API's loop: the leader
    hands its ticks back to the tick thread until the follower is close again."""
    import raftq.cluster.raft._ticks as ticks

    monkeypatch.setattr(ticks, "CATCH_UP_ENTRIES", 5)
    ns = Nodes(tmp_path, 3)
    try:
        leader = await _with_topic(ns)
        await until("the loop to tick", lambda: leader._ticks.on_home)
        lagging = next(nid for nid, n in ns.nodes.items() if n is not leader)
        await ns.stop(lagging)
        for i in range(30):
            await leader.propose([pub("t", b"%d" % i)])
        assert leader._ticks.on_home  # the stopped follower is not connected: not waited for
        back = ns.start(lagging)
        await until(
            "the follower to catch up",
            lambda: back.status().applied_index >= leader.status().commit_index,
        )
        assert leader.stats["catch_up_handbacks"] >= 1
        await until("the loop to tick again", lambda: leader._ticks.on_home)
    finally:
        await ns.close()


def _cut_off(ns: Nodes, nid: str, deaf_to: str | None = None) -> Callable[[], None]:
    """Drop Raft messages where they are received, to and from ``nid`` (or, with ``deaf_to``,
    only those from that node to ``nid``): the connections stay up and silent, as in a
    partition that TCP has not noticed yet. Returns the heal."""
    away = ns.addrs[nid][0]
    deaf = None if deaf_to is None else ns.addrs[deaf_to][0]
    undo = []
    for k, node in ns.nodes.items():
        raft = node._raft
        orig = raft.on_receive

        def keep(peer: Any, message: Any, orig: Any = orig, here: bool = k == nid) -> None:
            if here:
                if deaf is not None and peer.id != deaf:
                    orig(peer, message)
            elif deaf is not None or peer.id != away:
                orig(peer, message)

        raft.on_receive = keep
        undo.append((raft, orig))

    def heal() -> None:
        for raft, orig in undo:
            raft.on_receive = orig

    return heal


@pytest.mark.parametrize(
    ("pre_vote", "one_way", "secret"),
    [
        (True, False, "secret"),
        (False, False, "secret"),
        (True, True, "secret"),
        (False, True, "secret"),
        (True, False, None),  # pysyncobj reports outgoing connections before they can send
    ],
)
async def test_a_node_cut_off_and_back_leaves_the_leader_in_place(
    tmp_path: Path, pre_vote: bool, one_way: bool, secret: str | None
) -> None:
    # Cut off entirely, or deaf to the leader only (it still hears the other follower, which
    # has a live leader and must refuse it).
    ns = Nodes(tmp_path, 3, secret=secret)
    try:
        for nid in ns.addrs:
            ns.start(nid, pre_vote=pre_vote)
        leader = await ns.leader()
        await leader.propose([{"op": "create_topic", "topic": "t"}])
        term = leader.status().term
        # the follower that connects out to the other (the lower address)
        away = min(
            (n for n in ns.nodes.values() if n is not leader), key=lambda n: n.config.raft_addr
        )
        heal = _cut_off(ns, away.config.node_id, leader.config.node_id if one_way else None)
        try:
            # it times out 1-2 s after the last heartbeat and keeps trying
            if pre_vote:
                await until("two lost pre-votes", lambda: away.stats["pre_votes_lost"] >= 2)
                await leader.propose([pub("t", b"while away")])
            else:
                await until("a term raised while away", lambda: away.status().term > term)
        finally:
            heal()
        if not pre_vote:  # what pre-vote prevents
            await until("the leader deposed", lambda: leader.status().term > term)
            return
        index = leader.status().commit_index
        await until("the node back", lambda: away.status().applied_index >= index)
        assert leader.is_leader() and leader.status().term == term
        assert away.status().term == term
        if one_way:
            assert sum(n.stats["pre_votes_refused"] for n in ns.nodes.values()) >= 2
    finally:
        await ns.close()


async def test_pre_vote_counts_a_peer_of_an_older_version_as_granting(tmp_path: Path) -> None:
    # n2 runs without pre-vote (as a version before it: no hello, no answers) and never stands
    # itself, n3 is down: n1 must win with n2's vote alone.
    ns = Nodes(tmp_path, 3)
    try:
        ns.start("n1")
        old = RaftNode(ns.config("n2"), pre_vote=False)
        old._elections.election_timeout = lambda: 100.0  # type: ignore[method-assign]
        old.start()
        ns.nodes["n2"] = old
        leader = await ns.leader()
        assert leader is ns.nodes["n1"] and leader.stats["pre_votes_won"] >= 1
        await leader.propose([{"op": "create_topic", "topic": "t"}])
    finally:
        await ns.close()


async def test_a_node_whose_term_is_ahead_of_the_leader_rejoins(tmp_path: Path) -> None:
    # (e.g. it was cut off while running a version without pre-vote). pysyncobj ignores a
    # leader of an older term without telling it: only a vote request brings terms together.
    ns = Nodes(tmp_path, 3)
    try:
        for nid in ns.addrs:
            ns.start(nid)
        leader = await ns.leader()
        await leader.propose([{"op": "create_topic", "topic": "t"}])
        ahead = next(n for n in ns.nodes.values() if n is not leader)
        term = leader.status().term
        with ahead._ticks.lock:
            ahead._raft.set_term(term + 5)

        def rejoined() -> bool:
            lead = [n for n in ns.nodes.values() if n.is_leader()]
            return bool(lead) and lead[0].status().term == ahead.status().term > term + 5

        await until("one election at a term above it", rejoined)
        new = await ns.leader()
        await new.propose([pub("t", b"after")])
        index = new.status().commit_index
        await until("it to follow", lambda: ahead.status().applied_index >= index)
    finally:
        await ns.close()


async def test_a_read_barrier_needs_a_majority_that_still_follows(three: Nodes) -> None:
    leader = await three.leader()
    await leader.propose([{"op": "create_topic", "topic": "t"}])
    await leader.read_barrier(2.0)
    follower = next(n for n in three.nodes.values() if n is not leader)
    with pytest.raises(NotLeader):
        await follower.read_barrier(2.0)
    heal = _cut_off(three, leader.config.node_id)
    try:
        # Cut off, it still thinks it leads (for LEADER_FALLBACK) but cannot confirm it.
        with pytest.raises((TimeoutError, NotLeader)):
            await leader.read_barrier(1.0)

        def other() -> RaftNode | None:
            return next(
                (n for n in three.nodes.values() if n.is_leader() and n is not leader), None
            )

        await until("a new leader", other)
        new = other()
        assert new is not None
        await new.propose([pub("t", b"unseen by the old leader")])
        await new.read_barrier(2.0)
        assert new.read(lambda b: b.topic_stats("t")["messages"]) == 1
        assert leader.read(lambda b: b.topic_stats("t")["messages"]) == 0  # what it would show
    finally:
        heal()


async def test_a_deposed_leader_whose_pings_still_arrive_cannot_read(three: Nodes) -> None:
    # The followers stop hearing the leader's appends (not its pings) and elect another; the
    # old leader, kept from learning it any other way (no fallback; no vote request or append
    # reaches it), must learn it from their answers to its pings.
    leader = await three.leader()
    await leader.propose([{"op": "create_topic", "topic": "t"}])
    leader._raft.conf.leaderFallbackTimeout = 60.0
    old = leader.config.raft_addr
    for n in three.nodes.values():
        raft = n._raft
        orig = raft.on_receive
        if n is leader:
            drop: tuple[str, ...] = ("append_entries", "request_vote")
            dropped = lambda peer: True  # noqa: E731
        else:
            drop = ("append_entries",)
            dropped = lambda peer: peer.id == old  # noqa: E731

        def keep(
            peer: Any,
            m: Any,
            orig: Any = orig,
            drop: tuple[str, ...] = drop,
            dropped: Any = dropped,
        ) -> None:
            if not (isinstance(m, dict) and m.get("type") in drop and dropped(peer)):
                orig(peer, m)

        raft.on_receive = keep

    def other() -> RaftNode | None:
        return next((n for n in three.nodes.values() if n.is_leader() and n is not leader), None)

    await until("a new leader", other)
    assert leader.is_leader()  # as far as it knows
    with pytest.raises(NotLeader):
        await leader.read_barrier(2.0)


async def test_a_proposal_superseded_in_the_leaders_log_has_an_unknown_outcome() -> None:
    """An older entry of ours at an index this leader now fills was not committed yet, but a
    later leader that still holds it may commit it: "not applied" would be a lie (a review
    found this with 5 nodes and three elections), so its proposer is told "unknown"."""
    ns = Nodes(None, 1)
    node = ns.start("n1")
    try:
        await ns.leader()
        await node.propose([{"op": "create_topic", "topic": "t"}])
        journal = node._journal
        assert journal is not None
        idx = journal[-1][1] + 1
        loop = asyncio.get_running_loop()
        old = _Pending(loop.create_future(), loop, state=_LOGGED, index=idx, term=0)
        with node._proposals.lock:
            node._proposals.pending[idx] = (
                old  # as if an entry of an earlier term of ours were cut here
            )
        new = await node.propose([pub("t", b"new")])
        assert new[0]["messages"][0]["seq"] == 1
        with pytest.raises(UnknownOutcome):
            await asyncio.wait_for(old.fut, 5)
    finally:
        await ns.close()


@pytest.mark.parametrize("failure", ["restore fails", "no space for the new journal"])
async def test_a_follower_that_fails_to_install_a_snapshot_acks_nothing(
    tmp_path: Path, failure: str
) -> None:
    """pysyncobj swallows a failed install and acks the follower's old log end, which the
    leader would count toward commit for entries the follower does not hold (a review)."""
    import msgpack

    from raftq.cluster.state import Broker
    from raftq.cluster.storage import seal

    p1, p2 = free_ports(2)
    peers = {"n2": (f"127.0.0.1:{p2}", "127.0.0.1:2")}
    node = RaftNode(RaftConfig("n1", f"127.0.0.1:{p1}", "127.0.0.1:1", peers, str(tmp_path),
                               None, insecure=True))  # fmt: skip
    node.start()
    try:
        raft = node._raft
        journal = node._journal
        assert journal is not None
        peer = next(iter(raft.other_nodes))
        sent: list[Any] = []
        with node._ticks.lock:
            for i in range(2, 7):  # a tail of its own (say, a deposed leader's)
                journal.add(b"\x00x", i, 1)
            journal.sync()
            nodes = [[peer.id, "n2", ""], [f"127.0.0.1:{p1}", "n1", ""]]
            snap = [1, [b"\x00", 4, 2], [b"\x00", 3, 2], nodes, Broker().snapshot()]
            blob = seal(msgpack.packb(snap, use_bin_type=True))
            if failure == "restore fails":

                def refuse(data: Any) -> None:
                    raise ValueError("a snapshot of a newer version")

                node.broker.restore = refuse  # type: ignore[method-assign]
            else:

                class FullDisk(OsDisk):
                    def create(self, path: str) -> DiskFile:
                        raise OSError(28, "No space left on device")

                journal._disk = FullDisk()
            term = raft.term + 1
            chunk = {"type": "append_entries", "term": term, "commit_index": 4,
                     "serialized": (b"S" + blob, True, True)}  # fmt: skip
            node._inbound.on_message(peer, chunk)

            def record(to: Any, msg: Any) -> bool:
                sent.append(msg)
                return True

            node._replication.send_now = record  # type: ignore[assignment]
            node._ticks.after_tick()
        assert node._fatal is not None
        assert not [m for m in sent if m.get("type") == "next_node_idx"]
    finally:
        await node.stop()


@pytest.mark.parametrize("where", ["tick", "loop poll"])
async def test_an_unexpected_error_in_pysyncobj_stops_the_node_logged_once(
    caplog: pytest.LogCaptureFixture, where: str
) -> None:
    """A tick that raises would raise again every TICK, pysyncobj's state half updated: the
    node stops instead, as on a storage failure, and says why once."""
    ns = Nodes(None, 1 if where == "loop poll" else 3)  # a leader on its loop / a follower
    node = ns.start("n1")
    boom = ValueError("boom")

    def fail(*args: Any) -> None:
        raise boom

    try:
        if where == "loop poll":
            await ns.leader()
            await until("the loop to tick", lambda: node._ticks.on_home)
            node._raft.poll = fail
        else:
            await until("a tick", lambda: node.stats["max_tick_ms"] > 0)
            node._raft.tick = fail
        await until("the node to stop", lambda: not node.status().running, 5)
        thread = node._ticks.thread
        assert thread is not None
        thread.join(5)
        assert not thread.is_alive()  # the tick thread ended
        st = node.status()
        assert st.error is not None and "ValueError('boom')" in st.error
        assert ("tick" if where == "tick" else "poll") in st.error
        with pytest.raises(RaftError, match=r"stopped.*boom"):
            await node.propose([{"op": "create_topic", "topic": "t"}])
        await asyncio.sleep(0.2)  # (20 ticks' worth)
        logged = [r for r in caplog.records if r.exc_info and r.exc_info[1] is boom]
        assert len(logged) == 1 and logged[0].levelname == "CRITICAL"
    finally:
        await ns.close()


async def test_tokens_survive_a_restart_from_the_snapshot_and_from_the_journal(
    tmp_path: Path,
) -> None:
    """Tokens are replicated state: a node restarted on its data dir knows them again, whether
    they were in the snapshot it loads or only in the journal after it."""
    ns = Nodes(tmp_path, 1, compaction=1_000_000)

    def create(tid: str) -> dict[str, object]:
        return {"op": "token_create", "id": tid, "name": f"name-{tid}", "hash": bytes(32),
                "grants": [{"topics": "orders.*", "actions": ["publish"]}]}  # fmt: skip

    node = ns.start("n1")
    try:
        await ns.leader()
        await node.propose([create("insnap")])
        node.force_compaction()
        await until("a snapshot", lambda: node.stats["snapshots"] >= 1)
        await node.propose([create("injournal"), {"op": "token_revoke", "id": "insnap"}])
        await node.propose([create("insnap2")])
    finally:
        await ns.close()
    node = ns.start("n1")
    try:
        await ns.leader()
        await until("the journal applied", lambda: node.read(lambda b: b.token("insnap2")))
        names = node.read(lambda b: [t["name"] for t in b.tokens()])
        assert names == ["name-injournal", "name-insnap2"]
        record = node.read(lambda b: b.token("injournal"))
        assert record is not None
        assert record["grants"] == [{"topics": "orders.*", "actions": ["publish"]}]
    finally:
        await ns.close()
