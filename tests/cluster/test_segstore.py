"""The segment store: deterministic appends, verified reads, freeing, compaction, transfer,
and its crash rules under the power-loss simulation (SimDisk). Messages are appended in
batches of 1 to 6 (one record each), as the state machine appends a publish command's."""

from __future__ import annotations

import errno
import itertools
import os
import random
from pathlib import Path
from typing import Any

import pytest
from tests.raft.simdisk import FileWrapper, SimDisk, power_loss

from raftq.cluster.segstore import (
    SEG_HEAD,
    WILL_NEED,
    WILL_NEED_FIRST,
    WRITEBACK_BYTES,
    Marks,
    SegmentStore,
    StoreDisk,
    StoreImporter,
    encode_record,
    files_of,
    seg_name,
    sync_marked,
)
from raftq.cluster.storage import DiskFile, OsDisk, StorageCorrupt, StorageError

AT = 1_700_000_000_000
SEG = 4096  # small segments: rolls, compaction and retirement happen within a few records


def _msg(i: int) -> tuple[bytes, dict[str, str] | None]:
    payload = (f"m-{i}-".encode() * (1 + i % 37))[: 10 + (i * 7919) % 300]
    return payload, ({"k": str(i), "h": "x" * (i % 5)} if i % 3 == 0 else None)


def _store(path: Path, disk: StoreDisk | None = None, marks: Marks | None = None) -> SegmentStore:
    s = SegmentStore(disk or OsDisk(), str(path), segment_bytes=SEG, flush_bytes=512)
    s.truncate_to(marks or [])
    return s


def _batches(seqs: range) -> list[range]:
    """``seqs`` cut into batches (a new one at each multiple of 6 and where seq % 9 == 4)."""
    cuts = [q for q in seqs if q == seqs.start or q % 6 == 0 or q % 9 == 4]
    return [range(a, b) for a, b in zip(cuts, [*cuts[1:], seqs.stop], strict=True)]


def _at(seqs: range) -> dict[int, int]:
    """The publish time of each message ``_append`` appends: its batch's."""
    return {q: AT + b.start for b in _batches(seqs) for q in b}


def _append(s: SegmentStore, key: str, seqs: range) -> dict[int, tuple[int, int]]:
    out: dict[int, tuple[int, int]] = {}
    for b in _batches(seqs):
        locs, lengths = s.append_batch(key, b.start, AT + b.start, [_msg(i) for i in b])
        out.update(zip(b, zip(locs, lengths, strict=True), strict=True))
    return out


def _files(path: Path, marks: Marks) -> dict[str, bytes]:
    """The bytes the marks describe, per segment file."""
    sizes = {seg_name(k, seg[0]): seg[1] for k, _, segs in marks for seg in segs}
    return {n: (path / n).read_bytes()[:size] for n, size in sorted(sizes.items())}


def test_replicas_fed_the_same_appends_write_the_same_bytes_at_the_same_locations(
    tmp_path: Path,
) -> None:
    a, b = _store(tmp_path / "a"), _store(tmp_path / "b")
    locs_a = {k: _append(a, k, range(1, 160)) for k in ("t.1", "u.2")}
    locs_b = {k: _append(b, k, range(1, 160)) for k in ("t.1", "u.2")}
    assert locs_a == locs_b
    ma, mb = a.marks()[1], b.marks()[1]
    assert ma == mb
    assert len(ma[0][2]) > 3, "expected several segments"
    assert _files(tmp_path / "a", ma) == _files(tmp_path / "b", mb)
    for key, locs in locs_a.items():
        for i, (loc, n) in locs.items():
            assert a.read(key, i, loc, n) == _msg(i)


def test_reads_serve_buffered_and_written_records_alike(tmp_path: Path) -> None:
    s = SegmentStore(OsDisk(), str(tmp_path), segment_bytes=SEG, flush_bytes=1 << 20)
    s.truncate_to([])
    locs = _append(s, "t.1", range(1, 40))  # crosses segments: earlier ones are written
    for i, (loc, n) in locs.items():
        assert s.read("t.1", i, loc, n) == _msg(i)
    many = [(i, loc, n) for i, (loc, n) in locs.items()]  # records of one and of several
    assert s.read_batch("t.1", many) == [_msg(i) for i in locs]
    assert s.read_batch("t.1", many[::-1]) == [_msg(i) for i in reversed(locs)]


def test_a_read_never_returns_another_records_payload(tmp_path: Path) -> None:
    s = _store(tmp_path)
    locs = _append(s, "t.1", range(1, 9))  # records of seqs 1-3, 4-5, 6-8
    loc, n = locs[2]
    assert locs[1][0] == loc == locs[3][0] != locs[4][0]
    with pytest.raises(StorageCorrupt, match=r"t\.1~00000000\.seg.*holds seqs 1\.\.3, not 4"):
        s.read("t.1", 4, loc, n)
    with pytest.raises(StorageCorrupt, match=r"t\.1~00000000\.seg.*seq 2 .* length"):
        s.read("t.1", 2, loc, n + 1)  # the wrong length
    # read_batch checks each message of a record it reads once (its own loop)
    with pytest.raises(StorageCorrupt, match=r"t\.1~00000000\.seg.*holds seqs 1\.\.3, not 4"):
        s.read_batch("t.1", [(2, loc, n), (4, loc, n)])
    with pytest.raises(StorageCorrupt, match=r"t\.1~00000000\.seg.*seq 3 .* length"):
        s.read_batch("t.1", [(2, loc, n), (3, loc, n + 1)])
    with pytest.raises(StorageCorrupt, match=r"t\.1~00000000\.seg: no record at offset"):
        s.read("t.1", 2, loc + 1 << 20, n)
    with pytest.raises(StorageCorrupt, match=r"t\.1~00000000\.seg: bad record header"):
        s.read("t.1", 2, loc + 4, n)  # inside a record
    with pytest.raises(StorageCorrupt, match="no such segment"):
        s.read("t.1", 2, loc + (5 << 32), n)
    assert [s.read("t.1", i, *locs[i]) for i in range(1, 9)] == [_msg(i) for i in range(1, 9)]
    one, n1 = s.append("t.1", 9, AT, *_msg(9))  # a record of one message: the same checks
    with pytest.raises(StorageCorrupt, match=r"t\.1~00000000\.seg.*holds seqs 9\.\.9, not 8"):
        s.read("t.1", 8, one, n1)
    with pytest.raises(StorageCorrupt, match=r"t\.1~00000000\.seg.*seq 9 .* length"):
        s.read("t.1", 9, one, n1 - 1)
    assert s.read("t.1", 9, one, n1) == _msg(9)


def test_a_message_appended_alone_or_as_a_batch_of_one_is_the_same_bytes(tmp_path: Path) -> None:
    a, b = _store(tmp_path / "a"), _store(tmp_path / "b")
    for i in range(1, 40):
        loc, n = a.append("t.1", i, AT + i, *_msg(i))
        assert b.append_batch("t.1", i, AT + i, [_msg(i)]) == ([loc], [n])
        rec = encode_record(i, AT + i, [_msg(i)])  # as compaction writes a run of one
        a.marks()
        off = loc & 0xFFFFFFFF
        raw = (tmp_path / "a" / seg_name("t.1", loc >> 32)).read_bytes()[off : off + n]
        assert raw == rec.head + rec.body and rec.shares == [n]
    _, ma = a.marks()
    assert _files(tmp_path / "a", ma) == _files(tmp_path / "b", b.marks()[1])


def test_freed_segments_are_deleted_only_after_a_later_snapshot_is_durable(
    tmp_path: Path,
) -> None:
    s = _store(tmp_path)
    locs = _append(s, "t.1", range(1, 60))
    first = seg_name("t.1", 0)
    in_first = [(loc, n) for loc, n in locs.values() if loc >> 32 == 0]
    epoch_before, _ = s.marks()
    for loc, n in in_first:
        s.free("t.1", loc, n)
    assert 0 not in [st[0] for st in s.stats("t.1")]
    s.commit(epoch_before)  # a snapshot from before the free still needs it
    assert (tmp_path / first).exists()
    epoch_after, _ = s.marks()
    s.commit(epoch_after)
    assert not (tmp_path / first).exists()


def test_a_pinned_segment_outlives_its_commit_until_unpinned(tmp_path: Path) -> None:
    s = _store(tmp_path)
    locs = _append(s, "t.1", range(1, 60))
    _, marks = s.marks()
    chunks = s.export(marks, chunk=1000)  # pinned at once, before the first frame
    for loc, n in locs.values():
        if loc >> 32 == 0:
            s.free("t.1", loc, n)
    epoch, _ = s.marks()
    s.commit(epoch)
    assert (tmp_path / seg_name("t.1", 0)).exists()
    assert len(list(chunks)) > 4
    assert not (tmp_path / seg_name("t.1", 0)).exists()
    with s.export(s.marks()[1]) as abandoned:  # closed early: unpinned too
        next(abandoned)
    assert s._pins == {}


def test_the_tail_segment_stays_while_empty_and_a_purged_stream_goes_on(tmp_path: Path) -> None:
    s = _store(tmp_path)
    locs = _append(s, "t.1", range(1, 3))
    for loc, n in locs.values():
        s.free("t.1", loc, n)
    assert [st[2] for st in s.stats("t.1")] == [0]
    s.clear("t.1")
    assert s.stats("t.1") == []
    loc, n = s.append("t.1", 3, AT, b"again")
    assert loc >> 32 == 1, "a purge never reuses a segment number"
    assert s.read("t.1", 3, loc, n) == (b"again", None)


def test_a_dropped_key_is_refused_and_bad_keys_too(tmp_path: Path) -> None:
    s = _store(tmp_path)
    s.append("t.1", 1, AT, b"x")
    s.drop("t.1")
    with pytest.raises(ValueError, match="never reused"):
        s.append("t.1", 2, AT, b"x")
    for bad in ("", "../x", "a/b", "a~1", "-x"):
        with pytest.raises(ValueError, match="bad stream key"):
            s.append(bad, 1, AT, b"x")


def test_a_store_is_unusable_before_it_is_truncated_to_a_snapshot(tmp_path: Path) -> None:
    s = SegmentStore(OsDisk(), str(tmp_path))
    with pytest.raises(RuntimeError, match="truncate_to"):
        s.append("t.1", 1, AT, b"x")


def test_compaction_moves_live_records_and_returns_where_they_went(tmp_path: Path) -> None:
    def run(
        path: Path,
    ) -> tuple[dict[int, tuple[int, int]], dict[str, bytes], SegmentStore, dict[int, Any]]:
        s = _store(path)
        locs = _append(s, "t.1", range(1, 200))
        for i, (loc, n) in locs.items():
            if loc >> 32 == 1 and i % 8 > 1:  # three quarters of segment 1 acked
                s.free("t.1", loc, n)
        assert ("t.1", 1) in s.candidates()
        index = dict(locs)
        moved = s.compact("t.1", 1, lambda seq, loc: seq in index and index[seq][0] == loc
                          and seq % 8 < 2)  # fmt: skip
        index.update(moved)
        _, marks = s.marks()
        return moved, _files(path, marks), s, index

    moved, files, s, index = run(tmp_path / "a")
    moved_b, files_b, _, _ = run(tmp_path / "b")
    assert moved == moved_b and files == files_b, "compaction is deterministic"
    assert moved and all(loc >> 32 > 1 for loc, _ in moved.values())
    new_locs = [loc for loc, _ in moved.values()]
    assert len(set(new_locs)) < len(new_locs), "a run of live messages shares a new record"
    recs = sorted(set(new_locs))  # written one after the other: lengths add up to records'
    for a, b in itertools.pairwise(recs):
        if a >> 32 == b >> 32:
            assert sum(n for loc, n in moved.values() if loc == a) == b - a
    assert 1 not in [st[0] for st in s.stats("t.1")]
    for seq in moved:
        loc, n = index[seq]
        assert s.read("t.1", seq, loc, n) == _msg(seq)


def test_compaction_refuses_when_the_index_and_the_store_disagree(tmp_path: Path) -> None:
    s = _store(tmp_path)
    _append(s, "t.1", range(1, 200))
    with pytest.raises(StorageError, match="disagree"):
        s.compact("t.1", 1, lambda seq, loc: False)  # nothing freed, yet nothing live
    other = _store(tmp_path / "x")
    _append(other, "t.1", range(1, 200))
    tail = other.stats("t.1")[-1][0]
    with pytest.raises(ValueError, match="appended to"):
        other.compact("t.1", tail, lambda seq, loc: True)


def test_export_then_import_rebuilds_the_store_on_another_node(tmp_path: Path) -> None:
    src = _store(tmp_path / "src")
    locs = {k: _append(src, k, range(1, 90)) for k in ("t.1", "u.2")}
    for loc, n in list(locs["t.1"].values())[:20]:
        src.free("t.1", loc, n)
    _, marks = src.marks()
    after = src.append("t.1", 90, AT, b"after the snapshot")  # not part of the transfer
    dst = _store(tmp_path / "dst")
    _append(dst, "old.3", range(1, 10))  # what the follower had: replaced
    imp = StoreImporter(OsDisk(), str(tmp_path / "incoming"))
    for chunk in src.export(marks, chunk=700):
        imp.feed(chunk)
    assert imp.finish() == sorted(files_of(marks))
    dst.install(str(tmp_path / "incoming"))
    dst.truncate_to(marks)
    assert _files(tmp_path / "dst", marks) == _files(tmp_path / "src", marks)
    assert not list((tmp_path / "dst").glob("old.3~*"))
    for key, seqs in locs.items():
        for i, (loc, n) in list(seqs.items())[20 if key == "t.1" else 0 :]:
            assert dst.read(key, i, loc, n) == _msg(i)
    assert dst.append("t.1", 90, AT, b"after the snapshot") == after, "the follower goes on alike"


def test_an_import_refuses_bad_names_and_frames_out_of_order(tmp_path: Path) -> None:
    src = _store(tmp_path / "src")
    _append(src, "t.1", range(1, 30))
    _, marks = src.marks()
    frames = list(src.export(marks, chunk=500))
    imp = StoreImporter(OsDisk(), str(tmp_path / "in"))
    with pytest.raises(StorageError, match="expected 0"):
        imp.feed(frames[1])
    evil = frames[0].replace(b"t.1~00000000.seg", b"../../00000000.s")
    with pytest.raises(StorageError, match="bad segment name"):
        imp.feed(evil)
    with pytest.raises(StorageError, match="truncated"):
        imp.feed(frames[0][:-1])
    imp.abort()


# ---------------------------------------------------------------- crash rules (SimDisk)


def _all_files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.glob("*.seg"))}


def _crash_cycle(
    tmp_path: Path, torn: random.Random | None
) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """Two power losses in a row, each dropping what was appended after the last sync; each
    restore truncates to the snapshot's marks and replays what the journal would (after the
    first loss, a new leader replaced part of the lost tail: the replay is shorter). Returns
    the recovered and the reference files, whole."""
    data, shadow = tmp_path / "store", tmp_path / "shadow"
    disk = SimDisk(str(shadow))
    s = _store(data, disk)
    _append(s, "t.1", range(1, 50))
    _append(s, "u.2", range(1, 30))
    _, m1 = s.marks()
    s.sync()
    _append(s, "t.1", range(50, 120))  # unsynced: part of it written (flush_bytes), part not
    s.close()
    power_loss(str(shadow), str(data), torn)

    s = SegmentStore(disk, str(data), segment_bytes=SEG, flush_bytes=512)
    s.truncate_to(m1)
    _append(s, "t.1", range(50, 60))  # the journal replay
    _append(s, "u.2", range(30, 40))
    _, m2 = s.marks()
    s.sync()
    _append(s, "u.2", range(40, 70))
    _append(s, "v.3", range(1, 20))  # a stream born after the snapshot
    s.close()
    power_loss(str(shadow), str(data), torn)

    s = SegmentStore(disk, str(data), segment_bytes=SEG, flush_bytes=512)
    s.truncate_to(m2)
    _append(s, "u.2", range(40, 70))
    _append(s, "v.3", range(1, 20))
    _, m3 = s.marks()
    s.close()

    ref = _store(tmp_path / "ref")
    _append(ref, "t.1", range(1, 50))
    _append(ref, "u.2", range(1, 30))
    _append(ref, "t.1", range(50, 60))
    _append(ref, "u.2", range(30, 40))
    _append(ref, "u.2", range(40, 70))
    _append(ref, "v.3", range(1, 20))
    _, mref = ref.marks()
    ref.close()
    assert m3 == mref
    return _all_files(data), _all_files(tmp_path / "ref")


@pytest.mark.parametrize("torn", [False, True], ids=["clean-cut", "torn-tails"])
def test_power_loss_twice_then_truncate_and_replay_gives_the_same_bytes(
    tmp_path: Path, torn: bool
) -> None:
    got, want = _crash_cycle(tmp_path, random.Random(0) if torn else None)
    assert got == want


def test_power_loss_drops_unsynced_bytes_indeed(tmp_path: Path) -> None:
    """The simulation is not vacuous: without sync, appended records do not survive."""
    data, shadow = tmp_path / "store", tmp_path / "shadow"
    disk = SimDisk(str(shadow))
    s = _store(data, disk)
    _append(s, "t.1", range(1, 50))
    _, marks = s.marks()
    s.close()
    power_loss(str(shadow), str(data))
    with pytest.raises(StorageCorrupt, match="missing"):
        SegmentStore(disk, str(data)).truncate_to(marks)


def test_corruption_in_the_middle_is_named_and_never_read_as_a_payload(tmp_path: Path) -> None:
    s = _store(tmp_path)
    locs = _append(s, "t.1", range(1, 60))
    _, marks = s.marks()
    s.sync()
    loc = locs[5][0]
    path = tmp_path / seg_name("t.1", loc >> 32)
    raw = bytearray(path.read_bytes())
    end = min(at for at, _ in locs.values() if at > loc) & 0xFFFFFFFF  # the next record
    raw[end - 3] ^= 0x40  # in the last payload of the record of seq 5
    path.write_bytes(bytes(raw))
    s = _store(tmp_path, marks=marks)  # a restart: the damage is past the header
    same = [q for q, (at, _) in locs.items() if at == loc]
    assert len(same) > 1
    for q in same:  # every message of the damaged record, not only the one hit
        with pytest.raises(StorageCorrupt, match=rf"{path}: checksum mismatch"):
            s.read("t.1", q, *locs[q])
    with pytest.raises(StorageCorrupt, match=rf"{path}: checksum mismatch"):
        s.read_batch("t.1", [(q, *locs[q]) for q in range(1, 60)])
    assert s.read("t.1", same[-1] + 1, *locs[same[-1] + 1]) == _msg(same[-1] + 1)


def test_a_segment_shorter_than_its_mark_or_with_a_bad_header_stops_the_restore(
    tmp_path: Path,
) -> None:
    s = _store(tmp_path)
    _append(s, "t.1", range(1, 60))
    _, marks = s.marks()
    s.sync()
    s.close()
    first = tmp_path / seg_name("t.1", 0)
    raw = first.read_bytes()
    first.write_bytes(raw[:-1])
    with pytest.raises(StorageCorrupt, match=rf"{first}: shorter"):
        _store(tmp_path, marks=marks)
    first.write_bytes(b"X" + raw[1:])
    with pytest.raises(StorageCorrupt, match=rf"{first}: bad segment header"):
        _store(tmp_path, marks=marks)


class _FullDisk(OsDisk):
    """Writes fail with ENOSPC once ``room`` bytes are spent (the failing write lands half)."""

    def __init__(self, room: int) -> None:
        self.room = room

    def _wrap(self, f: DiskFile) -> DiskFile:
        disk = self

        class Full(FileWrapper):
            def write_at(self, offset: int, data: bytes | bytearray) -> None:
                if len(data) > disk.room:
                    self.f.write_at(offset, data[: len(data) // 2])
                    disk.room = 0
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                disk.room -= len(data)
                self.f.write_at(offset, data)

        return Full(f)

    def open(self, path: str) -> DiskFile:
        return self._wrap(super().open(path))

    def create(self, path: str) -> DiskFile:
        return self._wrap(super().create(path))


def test_enospc_is_a_clean_storage_error_and_leaves_no_partial_record_readable(
    tmp_path: Path,
) -> None:
    disk = _FullDisk(room=6000)
    s = SegmentStore(disk, str(tmp_path), segment_bytes=SEG, flush_bytes=512)
    s.truncate_to([])
    locs = _append(s, "t.1", range(1, 10))
    _, marks = s.marks()
    s.sync()
    with pytest.raises(
        StorageError, match=r"t\.1~0000000\d\.seg: write failed: No space left on device \(ENOSPC\)"
    ) as e:
        _append(s, "t.1", range(10, 200))
    with pytest.raises(StorageError) as again:
        s.read("t.1", 1, *locs[1])
    assert again.value is e.value, "a failed store refuses everything after"
    disk.room = 1 << 30  # space freed; the node restarts from its snapshot
    s = SegmentStore(disk, str(tmp_path), segment_bytes=SEG, flush_bytes=512)
    s.truncate_to(marks)
    for i, (loc, n) in locs.items():
        assert s.read("t.1", i, loc, n) == _msg(i)
    sizes = {seg_name("t.1", seg[0]): seg[1] for seg in marks[0][2]}
    assert {p.name: p.stat().st_size for p in tmp_path.glob("*.seg")} == sizes
    ref = _store(tmp_path / "ref")
    _append(ref, "t.1", range(1, 10))
    assert _append(s, "t.1", range(10, 200)) == _append(ref, "t.1", range(10, 200))


def test_segment_header_size_is_what_locations_start_at(tmp_path: Path) -> None:
    s = _store(tmp_path)
    assert s.watermark("t.1") == (-1, 0)
    loc, n = s.append("t.1", 1, AT, b"x")
    assert loc == SEG_HEAD and s.watermark("t.1") == (0, SEG_HEAD + n)


def test_retained_bytes_follow_appends_frees_retirement_and_restore(tmp_path: Path) -> None:
    s = _store(tmp_path)
    locs = _append(s, "t.1", range(1, 200))
    _append(s, "u.2", range(1, 20))
    total = sum(n for _, n in locs.values())

    def recount() -> tuple[int, int]:
        stats = [st for k in ("t.1", "u.2") for st in s.stats(k)]
        return sum(st[3] for st in stats), sum(st[1] for st in stats)

    assert s.retained_bytes() == recount() and s.retained_bytes()[0] > total
    for loc, n in list(locs.values())[:120]:
        s.free("t.1", loc, n)
    assert s.retained_bytes() == recount()
    s.clear("u.2")
    assert s.retained_bytes() == recount()
    _, marks = s.marks()
    s.truncate_to(marks)
    assert s.retained_bytes() == recount()


def _rows(s: SegmentStore, key: str) -> list[tuple[int, int, int, int, int]]:
    return [
        (seq, segno << 32 | off, n, size, at)
        for segno, c in s.columns(key)
        for seq, off, n, size, at in c.rows()
    ]


def test_columns_describe_every_record_from_sidecars_or_a_scan(tmp_path: Path) -> None:
    s = _store(tmp_path)
    locs = _append(s, "t.1", range(1, 200))
    at = _at(range(1, 200))
    want = [(i, loc, n, len(_msg(i)[0]), at[i]) for i, (loc, n) in locs.items()]
    assert _rows(s, "t.1") == want
    _, marks = s.marks()
    s.sync()
    sidecars = sorted(p.name for p in tmp_path.glob("*.idx"))
    assert sidecars == [f"t.1~{n:08d}.idx" for n in range(len(marks[0][2]) - 1)]
    (tmp_path / sidecars[0]).write_bytes(b"junk")  # a bad sidecar is rebuilt from its segment
    (tmp_path / sidecars[1]).unlink()  # and a missing one
    s = _store(tmp_path, marks=marks)
    assert _rows(s, "t.1") == want
    assert (tmp_path / sidecars[0]).read_bytes() != b"junk"
    assert (tmp_path / sidecars[1]).exists()
    assert _rows(_store(tmp_path, marks=marks), "t.1") == want


def test_a_sidecar_describing_another_size_is_not_believed(tmp_path: Path) -> None:
    s = _store(tmp_path)
    locs = _append(s, "t.1", range(1, 200))
    _, marks = s.marks()
    first = tmp_path / "t.1~00000000.idx"
    other = tmp_path / "t.1~00000001.idx"
    first.write_bytes(other.read_bytes())  # intact, but of another segment
    s = _store(tmp_path, marks=marks)
    at = _at(range(1, 200))
    want = [(i, loc, n, len(_msg(i)[0]), at[i]) for i, (loc, n) in locs.items()]
    assert _rows(s, "t.1") == want


def test_a_snapshot_writer_can_sync_the_marked_segments_by_path(tmp_path: Path) -> None:
    data, shadow = tmp_path / "store", tmp_path / "shadow"
    disk = SimDisk(str(shadow))
    s = _store(data, disk)
    _append(s, "t.1", range(1, 60))
    _, marks = s.marks()
    sync_marked(disk, str(data), marks)  # instead of s.sync(), from "another process"
    s.close()
    power_loss(str(shadow), str(data))
    again = SegmentStore(disk, str(data), segment_bytes=SEG, flush_bytes=512)
    again.truncate_to(marks)
    assert [r[0] for r in _rows(again, "t.1")] == list(range(1, 60))


def test_an_install_cut_short_by_a_crash_is_finished_by_the_next_one(tmp_path: Path) -> None:
    src = _store(tmp_path / "src")
    locs = _append(src, "t.1", range(1, 90))
    _, marks = src.marks()
    imp = StoreImporter(OsDisk(), str(tmp_path / "incoming"))
    for chunk in src.export(marks):
        imp.feed(chunk)
    names = imp.finish()
    dst = _store(tmp_path / "dst")
    (tmp_path / "incoming" / names[0]).rename(tmp_path / "dst" / names[0])  # moved, then crash
    dst = SegmentStore(OsDisk(), str(tmp_path / "dst"), segment_bytes=SEG, flush_bytes=512)
    dst.install(str(tmp_path / "incoming"))
    dst.truncate_to(marks)
    assert all(dst.read("t.1", i, loc, n) == _msg(i) for i, (loc, n) in locs.items())
    with pytest.raises(StorageError, match="not complete"):
        dst.install(str(tmp_path / "incoming"))  # done: the marker is gone


@pytest.mark.parametrize("seed", [1, 2])
def test_random_appends_frees_compactions_and_power_cuts_match_an_uncut_replica(
    tmp_path: Path, seed: int
) -> None:
    """A replica whose power is cut now and then (restored from its last snapshot, the ops
    since replayed as the journal would) ends with the same marks and the same files as one
    that never crashed."""
    rnd = random.Random(seed)
    data, shadow = tmp_path / "store", tmp_path / "shadow"
    disk = SimDisk(str(shadow))
    ref, s = _store(tmp_path / "ref"), _store(data, disk)
    live: dict[str, dict[int, tuple[int, int]]] = {"t.1": {}, "u.2": {}}
    ref_live: dict[str, dict[int, tuple[int, int]]] = {"t.1": {}, "u.2": {}}
    next_seq = {"t.1": 1, "u.2": 1}

    def apply(store: SegmentStore, model: dict[str, dict[int, tuple[int, int]]], op: Any) -> None:
        kind, key, arg = op
        if kind == "append":  # a batch of messages arg[0], ... arg[1] - 1
            batch = range(*arg)
            locs, lengths = store.append_batch(key, arg[0], AT + arg[0], [_msg(q) for q in batch])
            model[key].update(zip(batch, zip(locs, lengths, strict=True), strict=True))
        elif kind == "free":
            store.free(key, *model[key].pop(arg))
        else:
            m = model[key]
            moved = store.compact(key, arg, lambda q, loc: q in m and m[q][0] == loc)
            m.update(moved)

    Model = dict[str, dict[int, tuple[int, int]]]
    saved: tuple[Marks, Model] = ([], {k: dict(v) for k, v in live.items()})  # last snapshot
    since: list[Any] = []
    pending: list[int] = []
    seen = {"compact": 0, "replayed": 0, "cuts": 0}
    for _ in range(1500):
        r = rnd.random()
        key = rnd.choice(["t.1", "u.2"])
        if r < 0.3:
            k = rnd.choice([1, 1, 2, 3, 5, 8])
            op: Any = ("append", key, (next_seq[key], next_seq[key] + k))
            next_seq[key] += k
        elif r < 0.86 and live[key]:
            fifo = rnd.random() < 0.7  # acks mostly in order: whole segments free up
            op = ("free", key, min(live[key]) if fifo else rnd.choice(sorted(live[key])))
        elif r < 0.9 and s.candidates():
            key, segno = s.candidates()[0]
            op = ("compact", key, segno)
            seen["compact"] += 1
        elif r < 0.93:
            epoch, marks = s.marks()
            s.sync()
            pending.append(epoch)  # committed later: the snapshot file takes a while
            saved, since = (marks, {k: dict(v) for k, v in live.items()}), []
            continue
        elif r < 0.95:  # the file system commits names on its own (ext4: every 5 s)
            disk.sync_dir(str(data))
            continue
        elif r < 0.975:
            if pending:
                s.commit(pending.pop(0))
                ref.commit(ref.marks()[0])
            continue
        else:
            s.close()
            power_loss(str(shadow), str(data), rnd)
            s = SegmentStore(disk, str(data), segment_bytes=SEG, flush_bytes=512)
            s.truncate_to(saved[0])
            pending = []
            live = {k: dict(v) for k, v in saved[1].items()}
            for old in since:
                apply(s, live, old)
            seen["cuts"] += 1
            seen["replayed"] += len(since)
            continue
        apply(s, live, op)
        apply(ref, ref_live, op)
        since.append(op)
    _, m1 = s.marks()
    _, m2 = ref.marks()
    assert seen["compact"] and seen["cuts"] >= 3 and seen["replayed"] > 50, seen
    assert m1 == m2 and live == ref_live
    s.close()
    ref.close()
    names = set(files_of(m1))
    assert {n: b for n, b in _all_files(data).items() if n in names} == {
        n: b for n, b in _all_files(tmp_path / "ref").items() if n in names
    }
    again = _store(data, disk, m1)
    for key, msgs in live.items():
        for q, (loc, n) in msgs.items():
            assert again.read(key, q, loc, n) == _msg(q)


def test_a_retired_segment_stays_readable_until_a_later_snapshot_commits(tmp_path: Path) -> None:
    """A receive's result is read after its batch is applied; a later command of the same
    batch (a purge) may have retired the segment by then."""
    s = _store(tmp_path)
    locs = _append(s, "t.1", range(1, 5))  # still buffered, in the tail
    s.clear("t.1")
    assert all(s.read("t.1", i, loc, n) == _msg(i) for i, (loc, n) in locs.items())
    s.commit(s.marks()[0])
    with pytest.raises(StorageCorrupt, match="no such segment"):
        s.read("t.1", 1, *locs[1])


def test_append_batch_gives_each_message_a_readable_location(tmp_path: Path) -> None:
    s = _store(tmp_path)
    items = [(b"p%d" % i, {"h": str(i)} if i % 2 else None) for i in range(5)]
    locs, lengths = s.append_batch("t.1", 7, AT, items)
    assert len(locs) == len(lengths) == 5
    for i, (loc, n) in enumerate(zip(locs, lengths, strict=True)):
        assert s.read("t.1", 7 + i, loc, n) == items[i]


class _CountingDisk(OsDisk):
    """Counts the reads from files (``pread`` calls)."""

    def __init__(self) -> None:
        self.preads = 0

    def open_read(self, path: str) -> Any:
        f, disk = super().open_read(path), self

        class Counted:
            def pread(self, size: int, offset: int) -> bytes:
                disk.preads += 1
                return f.pread(size, offset)

            def will_need(self, offset: int, size: int) -> None:
                pass

            def close(self) -> None:
                f.close()

        return Counted()


def test_a_batch_is_one_record_whose_lengths_add_up_and_free_one_by_one(tmp_path: Path) -> None:
    s = _store(tmp_path)
    items = [_msg(i) for i in range(7, 12)]
    locs, lengths = s.append_batch("t.1", 7, AT, items)
    assert locs == [SEG_HEAD] * 5, "one record: every message at its location"
    assert sum(lengths) == s.watermark("t.1")[1] - SEG_HEAD == s.retained_bytes()[0]
    assert s.append_batch("t.1", 12, AT, []) == ([], [])
    assert s.stats("t.1") == [(0, SEG_HEAD + sum(lengths), 5, sum(lengths))]
    for i, (loc, n) in enumerate(zip(locs, lengths, strict=True)):
        assert s.read("t.1", 7 + i, loc, n) == items[i]
    assert s.read_batch("t.1", [(9, locs[2], lengths[2]), (7, locs[0], lengths[0])]) == [
        items[2],
        items[0],
    ]
    assert [r[:3] for r in _rows(s, "t.1")] == [
        (7 + i, loc, n) for i, (loc, n) in enumerate(zip(locs, lengths, strict=True))
    ]
    first = s.append_batch("t.1", 12, AT, [(b"x" * 1000, None)] * 2)
    last = s.append("t.1", 14, AT, b"y" * 3000)
    s.append("t.1", 15, AT, b"z")  # segment 0 is full: this one rolls to segment 1
    assert [st[:3] for st in s.stats("t.1")] == [(0, last[0] + last[1], 8), (1, SEG_HEAD + 41, 1)]
    for loc, n in zip(locs, lengths, strict=True):  # the first batch goes, message by message
        s.free("t.1", loc, n)
    assert s.stats("t.1")[0][2:] == (3, sum(first[1]) + last[1])
    s.free("t.1", *last)
    for loc, n in zip(*first, strict=True):
        s.free("t.1", loc, n)
    assert [st[0] for st in s.stats("t.1")] == [1], "its last message freed: retired"
    assert s.retained_bytes()[0] == s.stats("t.1")[0][3] == 41


def test_a_record_is_read_and_checked_once_for_all_of_its_messages(tmp_path: Path) -> None:
    disk = _CountingDisk()
    s = SegmentStore(disk, str(tmp_path), segment_bytes=1 << 20, flush_bytes=512)
    s.truncate_to([])
    items = [(b"%d" % i * 20, None) for i in range(100)]
    locs, lengths = s.append_batch("t.1", 1, AT, items)
    s.marks()  # written to the file
    got = s.read_batch("t.1", [(1 + i, locs[i], lengths[i]) for i in range(100)])
    assert got == items and disk.preads == 2, "a first guess, then the rest"
    assert [s.read("t.1", 1 + i, locs[i], lengths[i]) for i in range(100)] == items
    assert disk.preads == 2, "the cache served the second pass"
    many = [s.append("t.1", 101 + i, AT, b"m") for i in range(40)]
    s.marks()
    for i, (loc, n) in enumerate(many):
        assert s.read("t.1", 101 + i, loc, n) == (b"m", None)
    assert len(s._cache) == 1, "records of one message are not kept"
    more = [s.append_batch("t.1", 141 + 2 * i, AT, [(b"a", None), (b"b", None)]) for i in range(40)]
    s.marks()
    for i, (locs2, lengths2) in enumerate(more):
        assert s.read("t.1", 141 + 2 * i, locs2[0], lengths2[0]) == (b"a", None)
    assert len(s._cache) == 32, "the cache is bounded"
    s.read("t.1", 1, locs[0], lengths[0])
    assert disk.preads == 2 + 40 + 40 + 2, "the first record was dropped and read again"


def test_a_restore_forgets_the_records_read_before_it(tmp_path: Path) -> None:
    s = _store(tmp_path)
    loc, n = s.append("t.1", 1, AT, b"before the crash")
    assert s.read("t.1", 1, loc, n) == (b"before the crash", None)
    s.truncate_to([])  # a snapshot from before it: the journal replay writes another record
    assert s.append("t.1", 1, AT, b"after the restore") == (loc, n + 1)
    assert s.read("t.1", 1, loc, n + 1) == (b"after the restore", None)


def test_a_segment_file_cut_short_behind_the_stores_back_is_named_on_read(tmp_path: Path) -> None:
    s = _store(tmp_path)
    locs = _append(s, "t.1", range(1, 30))
    s.sync()
    path = tmp_path / seg_name("t.1", 0)
    path.write_bytes(path.read_bytes()[:-10])
    last = max(q for q, (loc, _) in locs.items() if loc >> 32 == 0)
    with pytest.raises(StorageCorrupt, match=rf"{path}: short read"):
        s.read("t.1", last, *locs[last])


def _open_append(s: SegmentStore, key: str, seqs: range) -> dict[int, tuple[int, int]]:
    """``_append``'s batches, but each one into the open record (``append_open``)."""
    out: dict[int, tuple[int, int]] = {}
    for b in _batches(seqs):
        locs, lengths = s.append_open(key, b.start, AT, [_msg(i) for i in b])
        out.update(zip(b, zip(locs, lengths, strict=True), strict=True))
    return out


def test_an_open_record_writes_the_bytes_of_one_append_batch_of_its_messages(
    tmp_path: Path,
) -> None:
    a, b = _store(tmp_path / "a"), _store(tmp_path / "b")
    a.segment_bytes = b.segment_bytes = 1 << 20
    locs = _open_append(a, "t.1", range(1, 30))  # batches of 1 to 6, and one message alone
    locs.update(_open_append(a, "t.1", range(30, 31)))
    assert len({loc for loc, _ in locs.values()}) == 1
    a.seal()
    want_locs, want_lengths = b.append_batch("t.1", 1, AT, [_msg(i) for i in range(1, 31)])
    assert [locs[i] for i in range(1, 31)] == list(zip(want_locs, want_lengths, strict=True))
    assert a.stats("t.1") == b.stats("t.1")
    ma, mb = a.marks()[1], b.marks()[1]
    assert ma == mb and _files(tmp_path / "a", ma) == _files(tmp_path / "b", mb)
    assert a.read_batch("t.1", [(i, *locs[i]) for i in locs]) == [_msg(i) for i in locs]
    cols = dict(a.columns("t.1"))[0]
    assert list(cols.count) == [30] and list(cols.length) == want_lengths


def test_an_open_record_ends_at_a_gap_another_time_its_cap_or_a_seal(tmp_path: Path) -> None:
    s = _store(tmp_path)
    s.segment_bytes, s.open_bytes = 1 << 20, 600
    loc1 = s.append_open("t.1", 1, AT, [_msg(1)])[0][0]
    assert s.append_open("t.1", 2, AT, [_msg(2)])[0][0] == loc1
    assert s.append_open("t.1", 4, AT, [_msg(4)])[0][0] != loc1  # seq 3 missing
    loc4 = s.append_open("t.1", 5, AT, [_msg(5)])[0][0]
    assert s.append_open("t.1", 6, AT + 1, [_msg(6)])[0][0] != loc4  # another time
    got = {i: s.append_open("t.1", i, AT + 1, [_msg(i)]) for i in range(7, 30)}
    locs = [loc[0] for loc, _ in got.values()]
    assert 1 < len(set(locs)) < len(locs), "the cap closes a record, the next one opens"
    s.seal()
    loc = s.append_open("t.1", 30, AT + 1, [_msg(30)])[0][0]
    assert loc not in locs  # a seal ends it
    assert [s.read("t.1", i, lo[0], n[0]) for i, (lo, n) in got.items()] == [_msg(i) for i in got]


def test_reads_marks_and_other_appends_seal_the_open_record_first(tmp_path: Path) -> None:
    s = _store(tmp_path)
    s.segment_bytes = 1 << 20
    locs = _open_append(s, "t.1", range(1, 10))
    assert [s.read("t.1", i, *locs[i]) for i in locs] == [_msg(i) for i in locs]
    more = _open_append(s, "t.1", range(10, 20))  # the read sealed it: a new record
    assert more[10][0] != locs[9][0] and more[19][0] == more[10][0]
    _, marks = s.marks()  # sealed and written: the file holds what the marks say
    assert (tmp_path / seg_name("t.1", 0)).stat().st_size == marks[0][2][0][1]
    loc, n = s.append("t.1", 20, AT, *_msg(20))
    new = _open_append(s, "t.1", range(21, 25))
    s.append("t.1", 25, AT, *_msg(25))  # a record of its own seals the open one first
    assert more[19][0] < loc < new[21][0]
    _, marks = s.marks()
    s.close()
    r = _store(tmp_path, marks=marks)  # a restart reads every record back
    got = {**locs, **more, 20: (loc, n), **new}
    assert [r.read("t.1", i, *got[i]) for i in sorted(got)] == [_msg(i) for i in sorted(got)]


def test_free_inside_an_open_record_only_counts_and_a_roll_seals_it(tmp_path: Path) -> None:
    s = _store(tmp_path)  # 4 KiB segments
    locs = _open_append(s, "t.1", range(1, 5))
    total = sum(n for _, n in locs.values())
    assert s.stats("t.1")[0][2:] == (4, total)  # (stats seals it: a new record next)
    locs.update(_open_append(s, "t.1", range(5, 7)))
    s.free("t.1", *locs[6])  # in the open record: counters only
    total += locs[5][1]
    assert s.retained_bytes()[0] == total
    rolled = _open_append(s, "t.1", range(7, 200))  # past the roll size: new segments
    assert len({loc >> 32 for loc, _ in rolled.values()}) > 2
    s.seal()
    for _, size, _, _ in s.stats("t.1")[:-1]:  # at most one append past the roll size
        assert SEG <= size < SEG + 6 * 400
    every = {**locs, **rolled}
    del every[6]
    assert [s.read("t.1", i, *every[i]) for i in sorted(every)] == [_msg(i) for i in sorted(every)]
    assert s.retained_bytes()[0] == total + sum(n for _, n in rolled.values())


class _HintDisk(OsDisk):
    """Records each file's ``start_writeback`` ranges and syncs, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int, int]] = []

    def _wrap(self, f: DiskFile, path: str) -> DiskFile:
        disk = self

        class Hinted(FileWrapper):
            def start_writeback(self, offset: int, size: int) -> None:
                disk.calls.append(("hint", path, offset, size))
                self.f.start_writeback(offset, size)

            def sync(self) -> None:
                disk.calls.append(("sync", path, 0, 0))
                self.f.sync()

        return Hinted(f)

    def open(self, path: str) -> DiskFile:
        return self._wrap(super().open(path), path)

    def create(self, path: str) -> DiskFile:
        return self._wrap(super().create(path), path)


@pytest.mark.parametrize("fsync", [True, False])
def test_writeback_starts_as_each_mib_is_written(tmp_path: Path, fsync: bool) -> None:
    """With fsync "always" the bytes written are handed to the device a MiB at a time, each
    range where the last ended, so a snapshot's sync finds little left; with "never" not."""
    disk = _HintDisk()
    s = SegmentStore(disk, str(tmp_path), segment_bytes=4 << 20, flush_bytes=64 << 10,
                     fsync=fsync)  # fmt: skip
    s.truncate_to([])
    payload = bytes(10_000)
    for i in range(700):  # ~7 MB: a roll at 4 MB
        s.append_batch("t.1", i, AT, [(payload, None)])
    s.sync()
    hints = [c for c in disk.calls if c[0] == "hint"]
    if not fsync:
        assert hints == []
        return
    by_file: dict[str, list[tuple[int, int]]] = {}
    for _, path, off, size in hints:
        by_file.setdefault(path, []).append((off, size))
    assert len(by_file) == 2, "both segments"
    for path, ranges in by_file.items():
        assert ranges[0][0] == 0
        for (off, size), (nxt, _) in itertools.pairwise(ranges):
            assert nxt == off + size, "each range starts where the last ended"
        assert all((off + size) % 4096 == 0 for off, size in ranges), "whole pages"
        assert all(WRITEBACK_BYTES - 4096 < size < WRITEBACK_BYTES + (64 << 10) + 20_000
                   for _, size in ranges)  # fmt: skip
        unhinted = os.path.getsize(path) - sum(size for _, size in ranges)
        assert 0 <= unhinted < WRITEBACK_BYTES + 4096, "all but the last MiB started early"
    assert disk.calls[-1][0] == "sync"


def test_reads_going_forward_ask_for_what_follows_them(tmp_path: Path) -> None:
    """Each read past the middle of what was asked for asks for what follows (contiguous
    ranges, doubling up to WILL_NEED); reads going backwards ask for nothing."""
    asked: list[tuple[int, int]] = []

    class Watched(OsDisk):
        def open_read(self, path: str) -> Any:
            f = super().open_read(path)

            class Reader:
                def pread(self, size: int, offset: int) -> bytes:
                    return f.pread(size, offset)

                def will_need(self, offset: int, size: int) -> None:
                    asked.append((offset, size))

                def close(self) -> None:
                    f.close()

            return Reader()

    s = SegmentStore(Watched(), str(tmp_path), segment_bytes=64 << 20, flush_bytes=512)
    s.truncate_to([])
    body = b"p" * 1000
    where = [s.append("t.1", q, AT, body) for q in range(1, 10_001)]  # ~10 MB, one segment
    s.sync()
    for q, (loc, n) in enumerate(where, 1):
        assert s.read("t.1", q, loc, n) == (body, None)
    starts = [a for a, _ in asked]
    assert len(asked) >= 3 and starts[0] < 2 * len(body) and starts == sorted(starts)
    assert all(a + size == b for (a, size), b in zip(asked, starts[1:], strict=False))
    sizes = [size for _, size in asked]
    assert sizes[0] == WILL_NEED_FIRST and sizes[1] == 2 * WILL_NEED_FIRST
    assert sizes[-1] == WILL_NEED and sizes == sorted(sizes)
    end = where[-1][0] + where[-1][1]
    assert starts[-1] - WILL_NEED < end < starts[-1] + WILL_NEED  # (not far past the reads)
    asked.clear()
    for q in range(10_000, 0, -7):
        loc, n = where[q - 1]
        assert s.read("t.1", q, loc, n) == (body, None)
    assert asked == []
    s.close()
