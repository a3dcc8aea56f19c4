"""Cooled journal entries: only their record's offset stays in memory; every read of one, by
index, by slice, across a roll, a compaction or a cut, gives back the entry as written, and a
record that does not read back intact stops the node."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import pytest

from raftq.cluster.journal import COOL_MARGIN, Journal
from raftq.cluster.storage import (
    OsDisk,
    ReadFile,
    StorageCorrupt,
    StorageError,
)
from tests.raft.harness import RaftCluster, publish, wait_payloads

Entry = tuple[bytes, int, int]


def _filled(path: Path, n: int, disk: OsDisk | None = None) -> tuple[Journal, list[Entry]]:
    j = Journal(disk or OsDisk(), str(path), None)
    entries = [(os.urandom(i % 97) + b"cmd-%d" % i, i + 1, 1 + i // 50) for i in range(n)]
    for e in entries:
        j.add(*e)
    j.sync()
    return j, entries


def _cooled(j: Journal) -> list[int]:
    return [e[1] for e in j._entries if isinstance(e[0], int)]


def _reopen(path: Path) -> list[Entry]:
    j = Journal(OsDisk(), str(path), None)
    try:
        return list(j[:])
    finally:
        j._destroy()


def test_cooled_entries_read_back_as_written(tmp_path: Path) -> None:
    j, entries = _filled(tmp_path / "journal.log", 200)
    try:
        freed = j.cool(151)
        # The first entry stays whole; the margin before the bound too.
        assert _cooled(j) == list(range(2, 151 - COOL_MARGIN))
        assert freed == sum(len(c) for c, i, _ in entries if 2 <= i < 151 - COOL_MARGIN)
        assert j.cooled_bytes == freed
        assert j[0] == entries[0] and j[-1] == entries[-1]
        assert [j[i] for i in range(len(j))] == entries
        assert list(j[:]) == entries and list(j[10:]) == entries[10:]
        span = j[5:40]
        assert len(span) == 35 and span[-1] == entries[39] and span[3:6] == entries[8:11]
        with pytest.raises(IndexError):
            span[35]
        assert j[150:] == entries[150:]  # (none cooled there: a plain list)
        assert j[1:9:3] == entries[1:9:3]
        assert j.term_at(60) == entries[59][2]
        assert j.read_backs > 0
        assert j.cool(151) == 0  # already cooled
    finally:
        j._destroy()
    assert _reopen(tmp_path / "journal.log") == entries


def test_only_written_entries_are_cooled(tmp_path: Path) -> None:
    j, _ = _filled(tmp_path / "journal.log", 100)
    try:
        for i in range(100, 150):
            j.add(b"late-%d" % i, i + 1, 3)  # not written before the next sync
        assert j.uncooled > 0
        j.cool(200)
        assert _cooled(j) == list(range(2, 101))
        j.sync()
        j.cool(151)
        assert _cooled(j)[-1] == 151 - COOL_MARGIN - 1
        assert j[120] == (b"late-120", 121, 3)
    finally:
        j._destroy()


def test_cooled_entries_survive_a_roll_a_compaction_and_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "journal.log"
    j, entries = _filled(path, 200)
    try:
        j.cool(181)
        j.roll(101)  # cooled entries copied into the new segment come back whole
        assert _cooled(j) == list(range(2, 101))
        assert list(j[:]) == entries  # those before 101 read from the older segment
        more = [(b"more-%d" % i, i + 1, 5) for i in range(200, 260)]
        for e in more:
            j.add(*e)
        j.sync()
        j.cool(251)  # cooled at their offsets in the new segment
        assert 120 in _cooled(j)
        assert list(j[:]) == entries + more
        j.deleteEntriesTo(100)  # the compaction: older segments go
        assert list(j[:]) == (entries + more)[100:]
    finally:
        j._destroy()
    assert _reopen(path) == (entries + more)[100:]


def test_the_first_entry_is_whole_after_a_compaction_at_a_cooled_roll_point(
    tmp_path: Path,
) -> None:
    """pysyncobj reads entry 0 on every call: a compaction must not leave it cooled."""
    j, entries = _filled(tmp_path / "journal.log", 200)
    try:
        j.roll(101)  # a snapshot begins...
        j.cool(201)  # ...entries after its point cool while it is written...
        assert 101 in _cooled(j)
        j.deleteEntriesTo(100)  # ...then the compaction
        assert j._entries[0] == entries[100]
        before = j.read_backs
        assert j[0] == entries[100] and j[0][1] == 101
        assert j.read_backs == before
    finally:
        j._destroy()


def test_a_slice_reads_a_run_of_cooled_entries_at_once(tmp_path: Path) -> None:
    preads: list[int] = []

    class Counted(OsDisk):
        def open_read(self, path: str) -> ReadFile:
            r = super().open_read(path)

            class Reader:
                def pread(self, size: int, offset: int) -> bytes:
                    preads.append(size)
                    return r.pread(size, offset)

                def will_need(self, offset: int, size: int) -> None:
                    pass

                def close(self) -> None:
                    r.close()

            return Reader()

    j, entries = _filled(tmp_path / "journal.log", 2000, Counted())
    try:
        j.cool(2001)
        assert list(j[1:]) == entries[1:]
        assert len(preads) <= 4  # (a header, then the run)
    finally:
        j._destroy()


def test_compaction_without_a_roll_rewrites_cooled_entries(tmp_path: Path) -> None:
    path = tmp_path / "journal.log"
    j, entries = _filled(path, 200)
    try:
        j.cool(181)
        j.deleteEntriesTo(50)  # no roll before it: the kept entries are rewritten whole
        assert list(j[:]) == entries[50:]
        assert _cooled(j) == []
        j.cool(181)
        assert list(j[:]) == entries[50:]
    finally:
        j._destroy()
    assert _reopen(path) == entries[50:]


def test_a_cut_into_an_older_segment_rewrites_the_cooled_entries_kept(tmp_path: Path) -> None:
    path = tmp_path / "journal.log"
    j, entries = _filled(path, 200)
    try:
        j.cool(181)
        j.roll(151)
        j.deleteEntriesFrom(120)
        j.add(b"new", 121, 9)
        j.sync()
        assert list(j[:]) == [*entries[:120], (b"new", 121, 9)]
    finally:
        j._destroy()
    assert _reopen(path) == [*entries[:120], (b"new", 121, 9)]


def test_a_cooled_record_that_does_not_read_back_is_a_storage_failure(tmp_path: Path) -> None:
    path = tmp_path / "journal.log"
    j, entries = _filled(path, 100)
    try:
        j.cool(101)
        off = j._entries[40][0]
        assert isinstance(off, int)
        with open(path, "r+b") as f:  # bit rot under a cooled record
            f.seek(off + 40)
            byte = f.read(1)
            f.seek(off + 40)
            f.write(bytes([byte[0] ^ 1]))
        named = re.escape(f"{path}: entry 41 (term 1) at offset {off} does not read back")
        with pytest.raises(StorageCorrupt, match=named):
            j[40]
        with pytest.raises(StorageCorrupt):
            list(j[30:])
        assert j[41] == entries[41]
    finally:
        j._destroy()


def test_a_damaged_record_length_is_corruption_not_a_huge_read(tmp_path: Path) -> None:
    path = tmp_path / "journal.log"
    j, _ = _filled(path, 100)
    try:
        j.cool(101)
        off = j._entries[40][0]
        assert isinstance(off, int)
        with open(path, "r+b") as f:
            f.seek(off + 4)  # the length, after the magic
            f.write(b"\xff\xff\xff\xff")
        with pytest.raises(StorageCorrupt, match=r"entry 41 .* does not read back"):
            j[40]
    finally:
        j._destroy()


def test_nothing_is_cooled_once_the_journal_is_broken(tmp_path: Path) -> None:
    j, _ = _filled(tmp_path / "journal.log", 100)
    try:
        j._broken = StorageError("a segment switch failed")
        assert j.cool(101) == 0 and _cooled(j) == []
    finally:
        j._broken = None
        j._destroy()


def test_a_failed_read_back_is_a_storage_error(tmp_path: Path) -> None:
    class _Reader:
        def pread(self, size: int, offset: int) -> bytes:
            raise OSError(errno.EIO, "Input/output error")

        def will_need(self, offset: int, size: int) -> None:
            pass

        def close(self) -> None:
            pass

    class EioDisk(OsDisk):
        def open_read(self, path: str) -> ReadFile:
            return _Reader()

    j, _ = _filled(tmp_path / "journal.log", 100, EioDisk())
    try:
        j.cool(101)
        with pytest.raises(StorageError, match=r"reading entry 11 back failed: .*Input/output"):
            j[10]
    finally:
        j._destroy()


@pytest.mark.slow
def test_followers_catch_up_from_cooled_entries(
    tmp_path: Path, make_cluster: type[RaftCluster]
) -> None:
    """Cooling on every tick, with snapshots out of the way: a follower down while the others
    commit (the leader cools what the connected follower has), then the leader killed (the new
    one cooled everything as a follower): both catch up from entries read back."""
    c = make_cluster(tmp_path, extra=["--cool-bytes", "0", "--compaction-entries", "1000000"])
    c.start_all()
    c.propose([{"op": "create_topic", "topic": "t"}])
    leader = c.leader()
    down = next(p for p in c.nodes.values() if p is not leader)
    down.kill()
    acked = []
    for i in range(120):
        c.propose([publish("t", f"m-{i}-" + "x" * 300)])
        acked.append(f"m-{i}-" + "x" * 300)
    assert leader.ok("stats")["journal_cooled_bytes"] > 0
    c.start(down.id)
    wait_payloads(down, "t", acked)
    assert leader.ok("stats")["journal_read_backs"] > 0

    leader.kill()
    for i in range(120, 140):
        c.propose([publish("t", f"m-{i}")])
        acked.append(f"m-{i}")
    c.start(leader.id)
    for p in c.nodes.values():
        wait_payloads(p, "t", acked)
    assert len({p.ok("digest") for p in c.nodes.values()}) == 1


@pytest.mark.slow
def test_with_every_member_up_little_is_read_back(
    tmp_path: Path, make_cluster: type[RaftCluster]
) -> None:
    """Cooling on every tick and a snapshot every 40 entries: the hot paths (appends, commits,
    applies, compactions) do not read cooled entries back."""
    c = make_cluster(tmp_path, extra=["--cool-bytes", "0", "--compaction-entries", "40"])
    c.start_all()
    c.propose([{"op": "create_topic", "topic": "t"}])
    acked = []
    for i in range(300):
        c.propose([publish("t", f"m-{i}-" + "x" * 200)])
        acked.append(f"m-{i}-" + "x" * 200)
    for p in c.nodes.values():
        wait_payloads(p, "t", acked)
    stats = [p.ok("stats") for p in c.nodes.values()]
    assert all(s["journal_cooled_bytes"] > 0 for s in stats), stats
    assert sum(s["snapshots"] for s in stats) >= 3, stats
    # A follower whose connection the leader had not yet seen (or lost for a moment on a
    # loaded box) gets what was cooled meanwhile read back: a few. A hot path reading cooled
    # entries reads on every tick: hundreds.
    assert sum(s["journal_read_backs"] for s in stats) < 50, stats
