"""Journal, meta and snapshot files: torn tails are cut with a warning, corruption stops."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from types import SimpleNamespace

import msgpack
import pytest

from raftq.cluster.journal import SEGMENT_HEADER, Journal
from raftq.cluster.raft import RaftConfig, RaftNode
from raftq.cluster.raft._snapshots import _jitter, _Snapshots
from raftq.cluster.storage import (
    DiskFile,
    MetaStore,
    OsDisk,
    StorageCorrupt,
    StorageError,
    seal,
    write_atomic,
)
from tests.raft.simdisk import FileWrapper


def _journal(path: Path, n: int) -> list[tuple[bytes, int, int]]:
    j = Journal(OsDisk(), str(path), None)
    entries = [(b"cmd-%d" % i, i + 1, 1) for i in range(n)]
    for e in entries:  # one write (and fdatasync) per record
        j.add(*e)
        j.sync()
    j._destroy()
    return entries


REC = 12 + 24 + 5  # a record of "cmd-N": header, index/term/write start, command
HEAD = len(SEGMENT_HEADER) + 16  # segment header: magic, first index, end of its first write


def _reopen(path: Path) -> list[tuple[bytes, int, int]]:
    j = Journal(OsDisk(), str(path), None)
    try:
        return list(j[:])
    finally:
        j._destroy()


def test_journal_round_trips_and_truncates_from_the_end(tmp_path: Path) -> None:
    path = tmp_path / "journal.log"
    entries = _journal(path, 5)
    assert _reopen(path) == entries
    j = Journal(OsDisk(), str(path), None)
    j.deleteEntriesFrom(3)
    j.add(b"new", 4, 2)
    j.sync()
    j._destroy()
    assert _reopen(path) == [*entries[:3], (b"new", 4, 2)]
    j = Journal(OsDisk(), str(path), None)
    j.deleteEntriesTo(2)  # compaction rewrites the file with the tail only
    j._destroy()
    assert _reopen(path) == [entries[2], (b"new", 4, 2)]


@pytest.mark.parametrize("how", ["cut short", "zeroed in place"])
@pytest.mark.parametrize("cut", [1, 5, 12, 20])
def test_torn_last_record_is_truncated_with_a_warning(
    tmp_path: Path, cut: int, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "journal.log"
    entries = _journal(path, 4)
    end = HEAD + 4 * REC  # each record is 12 + 24 + 5 bytes
    assert path.stat().st_size > end  # zero-filled ahead
    with open(path, "r+b") as f:
        if how == "cut short":
            f.truncate(end - cut)
        else:  # the record overwrote zero-filled space; its last bytes never reached the disk
            f.seek(end - cut)
            f.write(bytes(cut))
    with caplog.at_level(logging.WARNING):
        assert _reopen(path) == entries[:3]
    assert "torn last record" in caplog.text and str(path) in caplog.text
    # The cut is durable: appending after it yields a clean file.
    j = Journal(OsDisk(), str(path), None)
    j.add(b"again", 4, 1)
    j.sync()
    j._destroy()
    assert _reopen(path) == [*entries[:3], (b"again", 4, 1)]


def test_records_of_a_torn_last_write_may_land_in_any_order(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Power lost during the fdatasync of one write of several records: a later record of that
    write on disk without an earlier one is a torn tail (nothing of it was acknowledged), not
    corruption; a bad record followed by a record of a later write is corruption."""
    path = tmp_path / "journal.log"
    first = _journal(path, 2)
    j = Journal(OsDisk(), str(path), None)
    last = [(b"cmd-%d" % i, i + 1, 1) for i in range(2, 6)]
    for e in last:
        j.add(*e)
    j.sync()  # one write of four records
    j._destroy()
    data = bytearray(path.read_bytes())
    second_of_write = HEAD + 3 * REC
    data[second_of_write : second_of_write + REC] = bytes(REC)  # its page never made it
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        assert _reopen(path) == [*first, last[0]]
    assert "torn last record" in caplog.text
    # The same damage in a write followed by a later, intact write: corruption.
    path.unlink()
    _journal(path, 6)  # one write per record
    data = bytearray(path.read_bytes())
    data[second_of_write : second_of_write + REC] = bytes(REC)
    path.write_bytes(bytes(data))
    with pytest.raises(StorageCorrupt, match="later write"):
        _reopen(path)


def test_zero_filled_space_after_the_last_record_is_a_clean_end(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "journal.log"
    entries = _journal(path, 3)
    with open(path, "ab") as f:
        f.write(b"\x00" * 100)
    with caplog.at_level(logging.WARNING):
        assert _reopen(path) == entries
    assert "torn" not in caplog.text


def test_records_overwrite_the_zero_filled_space_ahead(tmp_path: Path) -> None:
    """Records land in space zero-filled ahead of time (an fdatasync then has no file size to
    commit), across several fills, through truncation and compaction."""
    path = tmp_path / "journal.log"
    j = Journal(OsDisk(), str(path), None, chunk=64 << 10)
    entries = [(os.urandom(5000), i + 1, 1) for i in range(100)]  # ~500 KB: several fills
    sizes = []
    for e in entries:
        j.add(*e)
        j.sync()
        sizes.append(path.stat().st_size)
    assert sizes[-1] > j._end and len(set(sizes)) > 3
    j.deleteEntriesFrom(90)
    j.add(b"new", 91, 2)
    j.sync()
    j._destroy()
    assert _reopen(path) == [*entries[:90], (b"new", 91, 2)]
    j = Journal(OsDisk(), str(path), None, chunk=64 << 10)
    j.deleteEntriesTo(50)
    j.add(b"after", 92, 2)
    j._destroy()
    assert _reopen(path) == [*entries[50:90], (b"new", 91, 2), (b"after", 92, 2)]


def test_the_zero_filler_syncs_through_a_file_of_its_own(tmp_path: Path) -> None:
    """Linux reports a writeback error to one fsync per open file: a filler syncing the
    journal's own file could take the error the journal's sync must see (a review)."""
    import threading

    synced: list[tuple[int, str]] = []

    class Watched(FileWrapper):
        def sync(self) -> None:
            synced.append((id(self), threading.current_thread().name))
            super().sync()

    class WatchedDisk(OsDisk):
        def open(self, path: str) -> DiskFile:
            return Watched(super().open(path))

        def create(self, path: str) -> DiskFile:
            return Watched(super().create(path))

    path = tmp_path / "journal.log"
    j = Journal(WatchedDisk(), str(path), None, chunk=64 << 10)
    for i in range(100):  # ~500 KB: several fills
        j.add(os.urandom(5000), i + 1, 1)
        j.sync()
    j._wait_fill()
    journal_file = id(j._file)
    fillers = {f for f, thread in synced if thread == "journal-zero-fill"}
    j._destroy()
    assert fillers and journal_file not in fillers


def test_records_kept_by_a_cut_are_synced_before_it(tmp_path: Path) -> None:
    """A follower's unsynced entries 2-4 conflict with a new leader's at 3: entry 2 must be
    durable before 3' is written over the cut, or one fdatasync covers both and a power loss
    that keeps 3' but drops 2 reads as corruption at restart (a review)."""
    ops: list[str] = []

    class Watched(FileWrapper):
        def write_at(self, offset: int, data: bytes | bytearray) -> None:
            if any(data):  # (not the zero fill)
                ops.append("write")
            super().write_at(offset, data)

        def sync(self) -> None:
            ops.append("sync")
            super().sync()

        def truncate(self, size: int) -> None:
            ops.append("truncate")
            super().truncate(size)

    class WatchedDisk(OsDisk):
        def open(self, path: str) -> DiskFile:
            return Watched(super().open(path))

    path = tmp_path / "journal.log"
    j = Journal(WatchedDisk(), str(path), None)
    j.add(b"\x01", 1, 0)
    j.sync()
    for i in (2, 3, 4):
        j.add(b"old" * 30, i, 1)
    ops.clear()
    j.deleteEntriesFrom(2)  # (positions: indexes 3 and 4 go)
    j.add(b"new" * 30, 3, 2)
    j.sync()
    j._destroy()
    cut = ops.index("truncate")
    assert "sync" in ops[ops.index("write") : cut]  # kept records synced before the cut
    assert _reopen(path) == [(b"\x01", 1, 0), (b"old" * 30, 2, 1), (b"new" * 30, 3, 2)]


@pytest.mark.parametrize("where", ["payload", "length", "magic"])
def test_corrupt_record_before_the_end_stops_with_the_file_name(tmp_path: Path, where: str) -> None:
    path = tmp_path / "journal.log"
    _journal(path, 6)
    data = bytearray(path.read_bytes())
    rec = HEAD + REC  # second record (each record its own write)
    pos = {"payload": rec + 12 + 24 + 2, "length": rec + 5, "magic": rec}[where]
    data[pos] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(StorageCorrupt, match=re.escape(str(path))):
        _reopen(path)


def test_corrupt_header_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "journal.log"
    path.write_bytes(b"NOTAJOURNALFILE" * 4)
    with pytest.raises(StorageCorrupt, match=r"journal\.log"):
        _reopen(path)


def test_meta_is_durable_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "meta.bin"
    m = MetaStore(OsDisk(), str(path), fsync=True)
    assert (m.term, m.voted_for) == (0, None)
    m.store(7, "127.0.0.1:1")
    m2 = MetaStore(OsDisk(), str(path), fsync=True)
    assert (m2.term, m2.voted_for) == (7, "127.0.0.1:1")
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(StorageCorrupt, match=r"meta\.bin"):
        MetaStore(OsDisk(), str(path), fsync=True)


class _CountingDisk(OsDisk):
    """Counts the bytes each fdatasync made durable."""

    def __init__(self) -> None:
        self.synced: list[int] = []

    def create(self, path: str) -> DiskFile:
        disk = self

        class Counting(FileWrapper):
            written = 0

            def write(self, data: bytes | memoryview) -> None:
                super().write(data)
                self.written += len(data)

            def sync(self) -> None:
                super().sync()
                disk.synced.append(self.written)

        return Counting(super().create(path))


@pytest.mark.parametrize(("chunk", "synced"), [(0, [10_000]), (4096, [4096, 8192, 10_000])])
def test_a_whole_file_write_is_synced_every_chunk(
    tmp_path: Path, chunk: int, synced: list[int]
) -> None:
    disk = _CountingDisk()
    data = os.urandom(10_000)
    write_atomic(disk, str(tmp_path / "snap"), data, True, chunk=chunk)
    assert (tmp_path / "snap").read_bytes() == data
    assert disk.synced == synced
    assert not (tmp_path / "snap.tmp").exists()


def test_snapshot_thresholds_differ_between_nodes_and_snapshots() -> None:
    draws = [_jitter(1000) for _ in range(50)]
    assert all(750 <= d <= 1250 for d in draws)
    assert len({int(d) for d in draws}) > 10  # nodes applying the same entries drift apart


def _config(tmp_path: Path) -> RaftConfig:
    return RaftConfig("n1", "127.0.0.1:0", "127.0.0.1:1", {}, str(tmp_path), None, insecure=True)


def test_node_refuses_to_start_on_a_corrupt_journal(tmp_path: Path) -> None:
    _journal(tmp_path / "journal.log", 5)
    path = tmp_path / "journal.log"
    data = bytearray(path.read_bytes())
    data[HEAD + 20] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(StorageCorrupt, match=r"journal\.log"):
        RaftNode(_config(tmp_path)).start()


def test_node_refuses_to_start_on_a_corrupt_snapshot(tmp_path: Path) -> None:
    (tmp_path / "snapshot.bin").write_bytes(seal(b"x" * 100)[:-10])
    with pytest.raises(StorageCorrupt, match=r"snapshot\.bin"):
        RaftNode(_config(tmp_path)).start()
    assert os.path.exists(tmp_path / "snapshot.bin")  # never deleted or overwritten


def test_node_refuses_to_start_when_the_snapshot_before_the_journal_is_missing(
    tmp_path: Path,
) -> None:
    j = Journal(OsDisk(), str(tmp_path / "journal.log"), None)
    j.add(b"\x01", 40, 3)  # a compacted journal: entries before 40 live in the snapshot
    j.add(b"\x01", 41, 3)
    j.sync()
    j._destroy()
    with pytest.raises(StorageCorrupt, match="snapshot before it is missing"):
        RaftNode(_config(tmp_path)).start()


def _segments(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir() if p.name.startswith(path.name))


def _more(j: Journal, lo: int, hi: int, term: int = 1) -> list[tuple[bytes, int, int]]:
    added = [(b"cmd-%d" % (i - 1), i, term) for i in range(lo, hi + 1)]
    for e in added:
        j.add(*e)
    j.sync()
    return added


def test_compaction_after_a_roll_deletes_the_old_segment_and_rewrites_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.log"
    entries = _journal(path, 10)
    j = Journal(OsDisk(), str(path), None)
    j.roll(8)  # a snapshot of entries up to 7 begins: 8.. are copied into a new segment
    entries += _more(j, 11, 12)
    assert _segments(path) == ["journal.log", "journal.log.1"]
    assert _reopen(path) == entries  # a crash before the compaction loses nothing
    new = (tmp_path / "journal.log.1").stat()
    j.deleteEntriesTo(7)  # the snapshot is durable: entries before 8 go
    entries += _more(j, 13, 13)
    j._destroy()
    assert _segments(path) == ["journal.log.1"]
    assert (tmp_path / "journal.log.1").stat().st_ino == new.st_ino  # not rewritten
    assert _reopen(path) == entries[7:]


def test_a_newer_segment_replaces_the_older_copies_from_its_first_index(tmp_path: Path) -> None:
    path = tmp_path / "journal.log"
    entries = _journal(path, 10)
    j = Journal(OsDisk(), str(path), None)
    j.roll(8)
    j.deleteEntriesFrom(8)  # a new leader's log differs from index 9 on
    j.add(b"other", 9, 2)
    j.sync()
    j._destroy()
    # The old segment still holds 9 and 10 of term 1: the new one wins from 8 on.
    assert _reopen(path) == [*entries[:8], (b"other", 9, 2)]


def test_cutting_into_an_older_segment_rewrites_the_journal(tmp_path: Path) -> None:
    path = tmp_path / "journal.log"
    entries = _journal(path, 10)
    j = Journal(OsDisk(), str(path), None)
    j.roll(8)
    j.deleteEntriesFrom(4)
    j._destroy()
    assert _segments(path) == ["journal.log.2"]
    assert _reopen(path) == entries[:4]


def test_clear_outlives_older_segments_whose_deletion_was_lost(tmp_path: Path) -> None:
    path = tmp_path / "journal.log"
    _journal(path, 10)
    j = Journal(OsDisk(), str(path), None)
    j.roll(8)
    saved = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    j.clear()  # a snapshot install: nothing of the old log may come back
    j._destroy()
    for name, data in saved.items():  # as if the deletions never reached the disk
        (tmp_path / name).write_bytes(data)
    assert _segments(path) == ["journal.log", "journal.log.1", "journal.log.2"]
    assert _reopen(path) == []


def test_history_older_than_a_compacted_segment_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "journal.log"
    entries = _journal(path, 10)
    stale = path.read_bytes()
    j = Journal(OsDisk(), str(path), None)
    entries += _more(j, 11, 25)
    j.roll(20)
    j.deleteEntriesTo(19)
    j._destroy()
    path.write_bytes(stale)  # 1..10: compacted, but its deletion was lost
    assert _reopen(path) == entries[19:]


def test_a_journal_from_before_segments_is_read_and_appended_to(tmp_path: Path) -> None:
    path = tmp_path / "journal.log"
    entries = _journal(path, 3)
    data = path.read_bytes()
    path.write_bytes(b"RAFTQJ1\n" + data[HEAD:])  # the old header, same records
    j = Journal(OsDisk(), str(path), None)
    entries += _more(j, 4, 5)
    j._destroy()
    assert _segments(path) == ["journal.log"]
    assert _reopen(path) == entries


@pytest.mark.parametrize("which", [0, 2])  # first or last of the copied records
def test_a_bad_record_among_those_written_with_a_segment_is_corruption(
    tmp_path: Path, which: int
) -> None:
    # Written and synced before the segment got its name: it cannot be a torn write.
    path = tmp_path / "journal.log"
    _journal(path, 10)
    j = Journal(OsDisk(), str(path), None)
    j.roll(8)  # copies 8, 9, 10
    j._destroy()
    seg = tmp_path / "journal.log.1"
    data = bytearray(seg.read_bytes())
    data[HEAD + which * REC + 20] ^= 0xFF
    seg.write_bytes(bytes(data))
    with pytest.raises(StorageCorrupt, match=r"journal\.log\.1.*synced before"):
        _reopen(path)


class _NoNewFiles(OsDisk):
    def create(self, path: str) -> DiskFile:
        raise OSError(28, "No space left on device")


def test_a_failed_segment_switch_stops_the_journal(tmp_path: Path) -> None:
    path = tmp_path / "journal.log"
    entries = _journal(path, 10)
    j = Journal(OsDisk(), str(path), None)
    j._disk = _NoNewFiles()
    with pytest.raises(StorageError, match="No space"):
        j.clear()  # (pysyncobj swallows errors of a snapshot install's clear)
    with pytest.raises(StorageError, match="No space"):
        j.add(b"x", 11, 1)  # nothing more is acknowledged from memory alone
    with pytest.raises(StorageError, match="No space"):
        j.sync()
    j._disk = OsDisk()
    j._destroy()
    assert _reopen(path) == entries


def test_a_roll_for_a_failed_snapshot_attempt_serves_the_next_one(tmp_path: Path) -> None:
    path = tmp_path / "journal.log"
    entries = _journal(path, 10)
    j = Journal(OsDisk(), str(path), None)
    j.roll(6)
    entries += _more(j, 11, 12)
    j.roll(9)  # the first attempt failed; the segment from 6 on still lets compaction delete
    j.deleteEntriesTo(8)
    j._destroy()
    assert _segments(path) == ["journal.log.1"]
    assert _reopen(path) == entries[5:]


def test_files_that_only_look_like_segments_are_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "journal.log"
    entries = _journal(path, 3)
    for name in ("journal.log.0", "journal.log.01", "journal.log.1.tmp"):
        (tmp_path / name).write_bytes(b"junk")
    assert _reopen(path) == entries


@pytest.mark.parametrize("size", [10, 300, 70_000])  # bin 8, 16 and 32 headers
def test_a_snapshot_written_in_parts_is_the_sealed_msgpack_body(size: int) -> None:
    snap = os.urandom(size)
    snaps = _Snapshots.__new__(_Snapshots)
    snaps._owner = SimpleNamespace(broker=SimpleNamespace(snapshot=lambda marks: snap))  # type: ignore[assignment]
    node = SimpleNamespace(id="127.0.0.1:9001", raftq_id="n1", raftq_api="127.0.0.1:8001")
    blob = b"".join(snaps._blob((None, (b"x", 7, 2), (b"y", 6, 2), [node]), []))
    body = [1, [b"x", 7, 2], [b"y", 6, 2], [["127.0.0.1:9001", "n1", "127.0.0.1:8001"]], snap]
    assert blob == seal(msgpack.packb(body, use_bin_type=True))


def test_damage_in_a_segment_a_newer_one_wholly_replaces_is_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "journal.log"
    old = _journal(path, 10)
    damaged_old = bytearray(path.read_bytes())  # generation 0: entries 1..10
    damaged_old[HEAD + 5 * REC + 20] ^= 0xFF
    j = Journal(OsDisk(), str(path), None)
    j.roll(8)  # generation 1: entries 8.. on
    entries = old[7:] + _more(j, 11, 12)
    j.deleteEntriesTo(7)
    j._destroy()
    assert _segments(path) == ["journal.log.1"]
    # A crash undid the deletion of generation 0, which then rotted. Its entries 1..7 are
    # not in the newer segment: it is still needed, so its damage stops the start.
    path.write_bytes(bytes(damaged_old))
    with pytest.raises(StorageCorrupt, match=r"journal\.log:"):
        _reopen(path)
    # A damaged segment whose entries all lie at or after a newer one's first index is not.
    damaged_copy = bytearray((tmp_path / "journal.log.1").read_bytes())  # first index 8
    damaged_copy[HEAD + 20] ^= 0xFF
    path.write_bytes(bytes(damaged_copy))
    caplog.set_level(logging.WARNING)
    assert _reopen(path) == entries
    assert "ignored, a newer segment replaces all of it" in caplog.text


def test_segment_writes_cut_short_by_a_crash_are_removed(tmp_path: Path) -> None:
    path = tmp_path / "journal.log"
    entries = _journal(path, 3)
    for name in ("journal.log.4.tmp", "journal.log.tmp"):
        (tmp_path / name).write_bytes(b"half a segment")
    (tmp_path / "journal.log.x.tmp").write_bytes(b"not ours")
    assert _reopen(path) == entries
    assert sorted(p.name for p in tmp_path.iterdir()) == ["journal.log", "journal.log.x.tmp"]


def test_remove_slowly_frees_a_file_in_steps_its_name_gone_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The name goes at once (a crash leaves what an unlink leaves), then the blocks of the
    open file a step at a time: 10 MB in steps of 4 MB is three cuts, the name gone at each."""
    path = tmp_path / "journal.log.1"
    path.write_bytes(os.urandom(10 << 20))
    cuts: list[tuple[int, bool]] = []
    real = os.ftruncate

    def ftruncate(fd: int, size: int) -> None:
        cuts.append((size, path.exists()))
        real(fd, size)

    monkeypatch.setattr(os, "ftruncate", ftruncate)
    disk = OsDisk()
    disk.remove_slowly(str(path))
    assert cuts == [(6 << 20, False), (2 << 20, False), (0, False)]
    assert not path.exists()
    disk.remove_slowly(str(path))  # (a file already gone: nothing to do)
