"""The compact per-message index and the dedup-key table, alone and restored from a store."""

from __future__ import annotations

from pathlib import Path

import pytest

from raftq.cluster import msgindex
from raftq.cluster.msgindex import GONE, MsgIndex
from raftq.cluster.segstore import SegmentStore
from raftq.cluster.storage import OsDisk, StorageCorrupt

AT = 1_700_000_000_000


def test_get_by_seq_remove_and_the_gone_prefix_is_dropped() -> None:
    ix = MsgIndex()
    for i in range(5000):
        assert ix.append(i * 100, 40 + i % 7, i % 7, AT + i, 2) == i + 1
    assert ix.get(10) == (900, 40 + 9 % 7, 9 % 7, AT + 9)
    assert ix.remove(10) == (900, 40 + 9 % 7, 9 % 7)
    assert ix.remove(10) is None and ix.get(10) is None and not ix.retained(10)
    assert ix.oldest_seq() == 1, "a gap is not a prefix"
    for seq in range(1, 3000):
        ix.remove(seq)
    assert ix.oldest_seq() == 3000 and ix.next_seq == 5001
    assert 1 < ix.first_seq <= 3000 and len(ix.refs) < 2600, "the gone prefix was cut"
    assert ix.get(2999) is None and ix.get(3000) == (299900, 40 + 2999 % 7, 2999 % 7, AT + 2999)
    assert ix.get(5001) is None and ix.get(0) is None


def test_refs_count_down_and_compaction_moves_are_applied() -> None:
    ix = MsgIndex()
    for i in range(10):
        ix.append(i, 30, 1, AT, 3)
    ix.set_ref(4, ix.ref(4) - 1)
    assert ix.ref(4) == 2
    ix.relocate({4: (1 << 32 | 24, 30)})
    assert ix.is_live(4, 1 << 32 | 24) and not ix.is_live(4, 3)
    ix.remove(4)
    assert not ix.is_live(4, 1 << 32 | 24)


def test_an_index_costs_16_bytes_a_message_and_16_a_record() -> None:
    batched, single = MsgIndex(), MsgIndex()
    for r in range(1000):  # records of 100 messages (a publish of 100)
        batched.extend([r << 12] * 100, [108] * 100, [100] * 100, AT + r, 1)
    for i in range(100_000):  # a record per message
        single.append(i << 8, 130, 100, AT + i, 1)
    assert len(batched.rloc) == 1000 and len(single.rloc) == 100_000
    assert batched.nbytes() / 100_000 < 17.5
    assert single.nbytes() / 100_000 < 34


def test_messages_of_one_record_share_its_location_and_time() -> None:
    ix = MsgIndex()
    ix.append(64, 40, 2, AT, 1)
    ix.append(64, 10, 2, AT, 1)  # the same open record, another publish of the entry
    ix.extend([64, 64], [10, 10], [2, 2], AT, 1)
    ix.extend([128, 128, 4096], [40, 10, 40], [2, 2, 2], AT + 1, 1)  # (not one record)
    assert len(ix.rloc) == 3 and list(ix.rec) == [0, 0, 0, 0, 1, 1, 2]
    assert [ix.get(s) for s in (1, 4, 5, 7)] == [
        (64, 40, 2, AT),
        (64, 10, 2, AT),
        (128, 40, 2, AT + 1),
        (4096, 40, 2, AT + 1),
    ]


def test_relocated_messages_keep_their_time_and_the_record_table_is_trimmed() -> None:
    ix = MsgIndex()
    for r in range(3000):
        ix.extend([r << 8] * 2, [30, 22], [4, 4], AT + r, 1)
    # a compaction copies seqs 5001 and 5002 (record 2500) to a new record, then 1 and 2
    ix.relocate({5001: (9 << 32, 30), 5002: (9 << 32, 22)})
    ix.relocate({1: (10 << 32, 30), 2: (10 << 32, 22)})
    assert ix.get(5001) == (9 << 32, 30, 4, AT + 2500) and ix.is_live(5002, 9 << 32)
    assert ix.get(1) == (10 << 32, 30, 4, AT) and not ix.is_live(1, 0)
    for seq in range(3, 5001):
        ix.remove(seq)
    assert ix.oldest_seq() == 1 and len(ix.rloc) == 3002, "seq 1 holds the prefix"
    ix.remove(1)
    ix.remove(2)  # the head moves to 5001, the columns and then the records are cut
    assert ix.first_seq > 3000 and ix.rbase == 2501 and len(ix.rloc) == 501
    assert ix.get(5001) == (9 << 32, 30, 4, AT + 2500), "a relocated record is kept"
    assert ix.get(6000) == (2999 << 8, 22, 4, AT + 2999)


def test_record_ids_are_renumbered_before_they_overflow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(msgindex, "_REC_LIMIT", 5000)
    ix = MsgIndex()
    for i in range(20_000):
        ix.append(i << 8, 30, 1, AT + i, 1)
        if i >= 10:
            ix.remove(i - 9)
    assert ix.rbase + len(ix.rloc) <= 5000 and len(ix) == 10
    assert ix.get(20_000) == (19_999 << 8, 30, 1, AT + 19_999) and ix.get(19_990) is None
    assert ix.get(19_991) == (19_990 << 8, 30, 1, AT + 19_990)


def _build(path: Path) -> tuple[SegmentStore, MsgIndex]:
    """A topic of 300 messages published in batches of 1-4, some acked, part of it
    compacted."""
    s = SegmentStore(OsDisk(), str(path), segment_bytes=4096, flush_bytes=512)
    s.truncate_to([])
    ix = MsgIndex()
    i = 1
    while i < 301:
        batch = range(i, min(i + 1 + i % 4, 301))
        items = [(b"p" * (q % 50), {"i": str(q)} if q % 2 else None) for q in batch]
        locs, lengths = s.append_batch("t.1", i, AT + i, items)
        for q, loc, n in zip(batch, locs, lengths, strict=True):
            assert ix.append(loc, n, q % 50, AT + i, 2) == q
        i = batch.stop
    for seq in [*range(1, 40), *range(60, 120, 2)]:
        loc, n, _ = ix.remove(seq) or (0, 0, 0)
        s.free("t.1", loc, n)
    moved = 0
    for key, segno in s.candidates():
        m = s.compact(key, segno, ix.is_live)
        ix.relocate(m)
        moved += len(m)
    assert moved, "expected a compaction to move records"
    ix.set_ref(200, 1)
    return s, ix


def test_restore_rebuilds_every_column_from_the_stores_records(tmp_path: Path) -> None:
    s, ix = _build(tmp_path)
    assert s.candidates() == []
    dumped = ix.dump()
    _, marks = s.marks()
    s.sync()
    again = SegmentStore(OsDisk(), str(tmp_path), segment_bytes=4096, flush_bytes=512)
    again.truncate_to(marks)
    got = MsgIndex.restore(dumped, again.columns("t.1"))
    assert got.oldest_seq() == ix.oldest_seq() == 40
    assert got.next_seq == ix.next_seq == 301
    for seq in range(1, 302):
        assert got.get(seq) == ix.get(seq), seq
        if ix.retained(seq):
            assert got.ref(seq) == ix.ref(seq)
            loc, n, _, _ = got.get(seq) or (0, 0, 0, 0)
            assert again.read("t.1", seq, loc, n)[0] == b"p" * (seq % 50)
    assert got.ref(200) == 1 and got.refs.count(GONE) == ix.refs[ix.head :].count(GONE)


def test_restore_refuses_a_retained_message_without_a_record(tmp_path: Path) -> None:
    s, ix = _build(tmp_path)
    dumped = ix.dump()
    cols = list(s.columns("t.1"))
    with pytest.raises(StorageCorrupt, match="has no record"):
        MsgIndex.restore(dumped, cols[1:])


def test_extend_is_the_appends_of_one_publish() -> None:
    a, b = MsgIndex(5), MsgIndex(5)
    for loc, n, size in ((10, 40, 4), (50, 41, 5), (91, 38, 2)):
        a.append(loc, n, size, 777, 2)
    b.extend([10, 50, 91], [40, 41, 38], [4, 5, 2], 777, 2)
    assert [a.get(s) for s in range(5, 8)] == [b.get(s) for s in range(5, 8)]
    assert a.refs == b.refs and b.next_seq == 8
