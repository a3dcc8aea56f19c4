"""The Raft journal: pysyncobj's journal interface over checksummed, zero-filled-ahead segment
files, written through a ``storage.Disk``. Rules kept here:

* journal records carry a magic, a length, a CRC32 and the offset where the write carrying
  them began; a torn last write is cut off with a warning (its records may reach the disk in
  any order), a bad record followed by an intact record of a *later* write is corruption and
  raises ``StorageCorrupt`` naming the file (the node must not start: never silent loss);
* ``add()`` only keeps the record; ``sync()`` writes every record added since the last call
  with one write and makes them durable with one fdatasync (group commit); the binding calls
  it before an entry counts on the leader and before a follower acknowledges (so with fsync
  "never" too, a kill -9 loses no acknowledged entry);
* the journal is zero-filled ahead of its end (``JOURNAL_CHUNK`` at a time, by a background
  thread) and records overwrite those zeros: an fdatasync then flushes data only, no size
  change for the file system journal to commit (3 nodes syncing 10 KB records at once on this
  box: p50 0.37 ms appending, 0.34 ms into fallocate'd space, 0.24 ms into written zeros).
  Bytes past the last record are always zeros, so a restart stops at the first zero header;
* the journal is a series of segments (``journal.log``, ``journal.log.1``, ...), each created
  whole (temp file, fsync, rename, directory fsync) with its first index in its header: its
  entries replace older segments' from there on. ``roll`` starts one when a snapshot begins,
  with the few entries after the snapshot point copied, so the compaction that follows deletes
  older segments instead of rewriting what it keeps; a clear or a cut into an older segment
  writes a new segment with exactly the remaining entries. Deleting is never made durable: a
  segment that comes back after a crash only holds replaced or snapshotted entries (damage in
  one that a newer segment wholly replaces is logged and ignored; temp files of segment
  writes a crash cut short are removed at start). The records written with a segment's
  header are synced with it (its header says where they end), so a bad one is corruption,
  never a torn write. Older versions read only ``journal.log``: downgrading after a roll is
  not supported;
* an entry every follower has and this node applied keeps only its record's offset in memory
  (``cool``, called by the binding every few MB of commands added); a read of one
  reads the record back from its segment (``_Span`` for slices), its CRC checked.

With ``fsync=False`` ("never") every sync is skipped: a kill -9 loses nothing, a power loss can
lose acknowledged entries. This module never imports pysyncobj.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import threading
import zlib
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, overload

from raftq.cluster.storage import (
    Disk,
    DiskFile,
    MetaStore,
    ReadFile,
    StorageCorrupt,
    StorageError,
    write_atomic,
)

log = logging.getLogger(__name__)

Entry = tuple[bytes, int, int]  # (command, index, term) - pysyncobj's journal tuple
_Slot = tuple[bytes | int, int, int]  # an Entry, or a cooled one: its record's offset, index, term

JOURNAL_HEADER = b"RAFTQJ1\n"  # a journal written before segments (read only)
SEGMENT_HEADER = b"RAFTQJ2\n"  # + _SEG: a segment replaces older segments' entries from its
_SEG = struct.Struct("<QQ")  # first index; the records before "whole end" were synced with it
_SEG_WHOLE = struct.Struct("<Q")
ROLL_MAX_BYTES = 8 << 20  # a segment is started with at most this much copied into it
COOL_MARGIN = 16  # entries just before the bound stay whole (pysyncobj's compaction reads two)
READ_AHEAD = 1 << 20  # a slice over cooled entries reads this much of their segment at a time
_RECORD_MAX = 64 << 20  # a journal record's length above this is damage (entries are <= 4 MB)
RECORD_MAGIC = 0x5251_4A53  # "SJQR": payload = index, term, write start, command
RECORD_MAGIC_V1 = 0x5251_4A52  # "RJQR" (read only): payload = index, term, command
_REC = struct.Struct("<III")  # magic, payload length, crc32(payload)
_IDX = struct.Struct("<QQQ")  # index, term, offset where the write carrying the record began
_IDX_V1 = struct.Struct("<QQ")
JOURNAL_CHUNK = 8 << 20  # zero-filled ahead of the last record, at most; a new chunk is started
# when less than half is left. Chunks start at 256 KiB after every open or compaction and double
# (an idle node keeps a small file). Costs a second write of every journal byte, off the tick
# thread.
_FIRST_CHUNK = 256 << 10


def _segment_gen(base: str, name: str) -> int | None:
    """The generation of a journal segment file name (``base`` is 0, ``base.N`` is N), or None
    when ``name`` is not one (only canonical names: ``base.01`` is not)."""
    if name == base:
        return 0
    tail = name[len(base) + 1 :] if name.startswith(base + ".") else ""
    ok = tail.isascii() and tail.isdigit() and not tail.startswith("0")
    return int(tail) if ok else None


class Journal:
    """pysyncobj's journal interface over checksummed, zero-filled-ahead segment files.

    Entries live in memory too (pysyncobj indexes and slices them) until the compaction after
    a snapshot; those no one needs in the normal course keep only their place (``cool``).
    ``path=None`` keeps everything in memory (tests only).
    """

    def __init__(
        self,
        disk: Disk | None,
        path: str | None,
        meta: MetaStore | None,
        fsync: bool = True,
        chunk: int = JOURNAL_CHUNK,
    ) -> None:
        self._disk = disk
        self._path = path
        self._meta = meta
        self._fsync = fsync
        self._chunk = chunk
        self._entries: list[_Slot] = []
        self._offsets: list[int] = []  # file offset of each entry's record (-1: older segment)
        self._cooled = 0  # entries before this position may be cooled (``cool``)...
        self._uncooled = 0  # ...the commands after it: this many bytes
        self._readers: dict[str, ReadFile] = {}  # segments that cooled entries are read from
        self.cooled_bytes = 0  # commands dropped from memory, in all
        self.read_backs = 0  # cooled entries read back, in all
        self._end = len(JOURNAL_HEADER)  # after the last record
        self._unwritten: list[bytes] = []  # records added since the last sync, not yet written
        self._wend = self._end  # after the last written record: _end - len(unwritten records)
        self._zeroed = self._end  # the file's size: zeros from _wend up to here
        self._filler: threading.Thread | None = None  # zero-fills [_zeroed, _fill_to)
        self._fill_to = 0
        self._fill_size = min(_FIRST_CHUNK, chunk)
        self._fill_error: OSError | None = None
        self._file: DiskFile | None = None
        # Segments: generation 0 is ``path``, generation g is ``path.g``; the newest one is
        # appended to, older ones wait for a compaction to delete them (see ``roll``).
        self._gen = -1
        self._cur_path = path or ""
        self._cur_first: int | None = None  # the current segment replaces entries from here
        self._older: list[tuple[int, str, int | None]] = []  # (generation, path, first)
        self._removers: list[threading.Thread] = []  # delete segments no longer needed
        self._broken: StorageError | None = None  # a segment switch failed: refuse to go on
        self._whole = 0  # the current segment's records before this offset were synced whole
        self.dirty = False
        self._term = meta.term if meta else 0
        self._vote: str | None = meta.voted_for if meta else None
        self.on_truncate: Callable[[int], None] | None = None  # first removed index
        if disk is not None and path is not None:
            self._load(disk, path)

    # ---------------------------------------------------------------- file format

    @staticmethod
    def _record(command: bytes, idx: int, term: int, write_start: int) -> bytes:
        payload = _IDX.pack(idx, term, write_start) + command
        return _REC.pack(RECORD_MAGIC, len(payload), zlib.crc32(payload)) + payload

    @staticmethod
    def _parse(data: bytes, off: int) -> tuple[Entry, int, int | None] | None:
        """The record at ``off``, the offset after it and where the write that carried it
        began (None for a v1 record), or None when it is not intact."""
        if off + _REC.size > len(data):
            return None
        magic, size, crc = _REC.unpack_from(data, off)
        start = off + _REC.size
        head = _IDX if magic == RECORD_MAGIC else _IDX_V1 if magic == RECORD_MAGIC_V1 else None
        if head is None or size < head.size or start + size > len(data):
            return None
        payload = data[start : start + size]
        if zlib.crc32(payload) != crc:
            return None
        if head is _IDX:
            idx, term, write_start = _IDX.unpack_from(payload)
            return (payload[_IDX.size :], idx, term), start + size, write_start
        idx, term = _IDX_V1.unpack_from(payload)
        return (payload[_IDX_V1.size :], idx, term), start + size, None

    def _segment_path(self, gen: int) -> str:
        assert self._path is not None
        return self._path if gen == 0 else f"{self._path}.{gen}"

    def _load(self, disk: Disk, path: str) -> None:
        """Read every segment, oldest first: a segment's entries replace those of older
        segments from its first index on (a crash can leave segments that a newer one
        covers, or older than a compaction)."""
        directory, base = os.path.split(path)
        try:
            names = disk.listdir(directory or ".")
        except OSError as e:
            raise StorageError(f"{directory}: {e}") from e
        gens = sorted(g for g in map(partial(_segment_gen, base), names) if g is not None)
        for name in names:  # a segment write that a crash cut short, before its rename
            if name.endswith(".tmp") and _segment_gen(base, name[:-4]) is not None:
                log.warning("journal: removing %s, left by an interrupted write", name)
                with contextlib.suppress(OSError):
                    disk.remove(os.path.join(directory, name))
        # Where each segment's entries begin: one wholly replaced by a newer segment is not
        # needed, so damage in it (bit rot in a file whose deletion a crash undid) is ignored.
        datas = [disk.read(self._segment_path(gen)) or b"" for gen in gens]
        starts = [self._first_index(data) for data in datas]
        entries: list[Entry] = []
        offsets: list[int] = []
        segs: list[tuple[int, str, int | None]] = []
        data, end = b"", 0
        for i, gen in enumerate(gens):
            seg = self._segment_path(gen)
            data, datas[i] = datas[i], b""  # (each segment's bytes are freed once scanned)
            own, newer = starts[i], [f for f in starts[i + 1 :] if f is not None]
            replaced = own is not None and bool(newer) and min(newer) <= own
            try:
                first, found, offs, end = self._scan(data, seg)
            except StorageCorrupt as e:
                if not replaced:
                    raise
                log.warning("journal %s: ignored, a newer segment replaces all of it (%s)", seg, e)
                segs.append((gen, seg, own))
                continue
            if first is not None:
                while entries and entries[-1][1] >= first:
                    entries.pop()
            if found and entries and found[0][1] != entries[-1][1] + 1:
                entries = []  # compacted history: a crash came before its deletion
            offsets = [-1] * len(entries) + offs  # offsets only within the newest segment
            entries += found
            segs.append((gen, seg, first))
        self._entries, self._offsets = list(entries), offsets
        self._uncooled = sum(len(command) for command, _, _ in entries)
        if not segs:
            self._rewrite([])
            return
        *self._older, (self._gen, self._cur_path, self._cur_first) = segs
        if end == 0:  # empty, or a torn header: this segment never held a record
            self._rewrite(entries)  # a new segment; the others are removed
            return
        self._end = self._wend = self._zeroed = end
        if data.startswith(SEGMENT_HEADER):
            self._whole = _SEG.unpack_from(data, len(SEGMENT_HEADER))[1]
        try:
            self._file = disk.open(self._cur_path)
            if end < len(data):  # cut the torn record and the zeros; they are written anew
                self._file.truncate(end)
                self._file.sync()
        except OSError as e:
            raise StorageError(f"{self._cur_path}: {e}") from e
        self._fill_ahead(0)

    def _first_index(self, data: bytes) -> int | None:
        """The index a segment's entries begin at: its header's, or an old-format journal's
        first record's; None when unknown (empty, torn or unreadable)."""
        head = len(SEGMENT_HEADER) + _SEG.size
        if data.startswith(SEGMENT_HEADER) and len(data) >= head:
            first: int = _SEG.unpack_from(data, len(SEGMENT_HEADER))[0]
            return first
        if data.startswith(JOURNAL_HEADER):
            parsed = self._parse(data, len(JOURNAL_HEADER))
            return parsed[0][1] if parsed is not None else None
        return None

    def _scan(self, data: bytes, path: str) -> tuple[int | None, list[Entry], list[int], int]:
        """A segment's first index (None: a journal from before segments), its intact entries,
        their offsets and the offset after the last one (0: no header). A torn last write is
        cut with a warning; corruption raises ``StorageCorrupt``."""
        head = len(SEGMENT_HEADER) + _SEG.size
        first: int | None = None
        whole = 0  # records before this offset were synced with the header: never torn
        if data.startswith(SEGMENT_HEADER) and len(data) >= head:
            first, whole = _SEG.unpack_from(data, len(SEGMENT_HEADER))
            off = head
        elif data.startswith(JOURNAL_HEADER):
            off = len(JOURNAL_HEADER)
        elif len(data) < head and (
            SEGMENT_HEADER.startswith(data[:8]) or JOURNAL_HEADER.startswith(data[:8])
        ):
            if data:
                log.warning("journal %s: torn header (%d bytes) rewritten", path, len(data))
            return None, [], [], 0
        else:
            raise StorageCorrupt(f"{path}: not a raftq journal (bad header)")
        entries: list[Entry] = []
        offsets: list[int] = []
        while off < len(data):
            parsed = self._parse(data, off)
            if parsed is None:
                if off < whole:
                    raise StorageCorrupt(
                        f"{path}: corrupt record at offset {off}, written and synced before"
                        f" the segment was named; refusing to start"
                    )
                if data.count(0, off) == len(data) - off:
                    break  # the zero-filled space after the last record
                later = self._later_write(data, off)
                if later is not None and self._fsync:
                    raise StorageCorrupt(
                        f"{path}: corrupt record at offset {off} followed by intact records"
                        f" of a later write (at {later}); refusing to start"
                    )
                if later is not None:  # fsync "never": writes reach the disk in any order
                    log.warning(
                        "journal %s: record at offset %d lost (fsync never, power loss?);"
                        " cut there: this node may have lost entries it acknowledged",
                        path,
                        off,
                    )
                else:
                    log.warning(
                        "journal %s: torn last record at offset %d truncated;"
                        " it was never synced, so never acknowledged",
                        path,
                        off,
                    )
                break
            entry, nxt, _ = parsed
            if entries and entry[1] != entries[-1][1] + 1:
                raise StorageCorrupt(
                    f"{path}: index gap at offset {off} ({entries[-1][1]} -> {entry[1]})"
                )
            entries.append(entry)
            offsets.append(off)
            off = nxt
        return first, entries, offsets, off

    @classmethod
    def _later_write(cls, data: bytes, off: int) -> int | None:
        """Torn tail or corruption? The offset of an intact record after ``off`` that was
        written after the bytes at ``off`` had been synced (so those were durable and are now
        corrupt), or None. Records of one write reach the disk in any order when the power
        goes during its fdatasync (they overwrite zero-filled space: no file size orders
        them), so a record of the same write (begun at or before ``off``) proves nothing."""
        for magic in (RECORD_MAGIC, RECORD_MAGIC_V1):
            pattern = _REC.pack(magic, 0, 0)[:4]
            probe = data.find(pattern, off + 1)
            while probe != -1:
                parsed = cls._parse(data, probe)
                if parsed is not None and (parsed[2] is None or parsed[2] > off):
                    return probe
                probe = data.find(pattern, probe + 1)
        return None

    def _rewrite(self, entries: list[Entry]) -> None:
        """Replace the journal with exactly ``entries``: a new segment (atomic and durable),
        then every older one removed (clear, compaction without a roll, deep truncation)."""
        self._start_segment(entries, entries[0][1] if entries else 0, 0)
        self._entries = list(entries)
        self._cooled, self._uncooled = 0, sum(len(command) for command, _, _ in entries)
        self._remove_older()

    def _start_segment(self, keep: list[Entry], first: int, before: int) -> None:
        """Make a new segment holding ``keep`` (entries from index ``first`` on) the one to
        append to; the ``before`` entries ahead of them are in older segments."""
        self._wait_fill()
        self._unwritten = []
        self._offsets = [-1] * before
        if self._disk is None or self._path is None:
            return
        start = len(SEGMENT_HEADER) + _SEG.size
        buf = bytearray(start)
        for command, idx, term in keep:
            self._offsets.append(len(buf))
            buf += self._record(command, idx, term, start)
        buf[:start] = SEGMENT_HEADER + _SEG.pack(first, len(buf))
        gen = self._gen + 1
        path = self._segment_path(gen)
        try:
            # Synced with fsync "never" too (rare): a new name is not flushed by a rename over
            # an old one, and losing it could bring back the entries it replaces.
            write_atomic(self._disk, path, bytes(buf), True)
            new = self._disk.open(path)
        except OSError as e:
            self._broken = StorageError(f"{path}: {e}")
            raise self._broken from e
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
        self._file = new
        if self._gen >= 0:
            self._older.append((self._gen, self._cur_path, self._cur_first))
        self._gen, self._cur_path, self._cur_first = gen, path, first
        self._end = self._wend = self._zeroed = self._whole = len(buf)
        self.dirty = False
        self._fill_size = min(_FIRST_CHUNK, self._chunk)
        self._fill_ahead(0)

    def _remove_older(self) -> None:
        """Delete the older segments, in the background: freeing a 64 MB file took the Raft
        thread 40-70 ms. Nothing waits for it to be durable: a segment that comes back after a
        crash holds only entries that a newer segment replaces or that a snapshot covers."""
        gone, self._older = self._older, []
        for _, path, _ in gone:
            self._close_reader(path)
        if not gone or self._disk is None:
            return
        disk = self._disk

        def remove() -> None:
            for _, path, _ in gone:
                try:
                    disk.remove_slowly(path)
                except OSError as e:
                    log.warning("journal: removing old segment %s failed: %s", path, e)

        # Not waiting for an earlier remover (it frees its files a few MB at a time, ~0.1 s
        # for 64 MB): they remove different files.
        self._removers = [t for t in self._removers if t.is_alive()]
        t = threading.Thread(target=remove, name="journal-remove", daemon=True)
        self._removers.append(t)
        t.start()

    def _wait_removal(self) -> None:
        removers, self._removers = self._removers, []
        for t in removers:
            t.join()

    def roll(self, first: int) -> None:
        """Start a new segment with the entries from index ``first`` on, copied (a snapshot
        covering the entries before ``first`` is being written). The compaction after it then
        deletes the older segments instead of rewriting the entries it keeps: rewriting ~40 MB
        of entries held the Raft thread for ~0.2 s. Skipped (compaction rewrites, as before)
        when more than ``ROLL_MAX_BYTES`` would be copied, and when a roll for an earlier
        snapshot attempt that failed already serves."""
        if self._file is None or not self._entries:
            return
        pos = first - self._entries[0][1]
        if not 0 < pos <= len(self._entries):
            return  # nothing before it to compact, or not in the log
        if self._older and self._cur_first is not None and self._cur_first <= first:
            return
        if len(self._entries) - pos > ROLL_MAX_BYTES // _REC.size:
            return  # (surely too many bytes: not read back to count them)
        keep = self._whole_entries(pos, len(self._entries))
        if sum(len(command) for command, _, _ in keep) > ROLL_MAX_BYTES:
            return
        # What the current segment holds is made durable before a newer one exists; no new
        # zero-fill is started in a file that is about to be left.
        self._write_added(fill=False)
        if self._fsync and self.dirty:
            try:
                self._file.sync()
            except OSError as e:
                raise StorageError(f"{self._cur_path}: fdatasync failed: {e}") from e
        self.dirty = False
        self._start_segment(keep, first, pos)
        if pos < self._cooled:  # cooled entries kept: whole again, at their new offsets
            self._entries[pos:] = keep
            self._cooled, self._uncooled = pos, sum(len(command) for command, _, _ in keep)

    # ---------------------------------------------------------------- zero fill

    def _fill_ahead(self, need: int, more: bool = True) -> None:
        """Make sure the next ``need`` bytes can be written at ``_wend`` without touching space
        being zero-filled, and (``more``) start filling the next chunk when less than half is
        left."""
        if self._file is None:
            return
        if self._filler is not None and (
            not self._filler.is_alive() or self._wend + need > self._zeroed
        ):
            self._wait_fill()  # finished, or we are about to write into it: wait
        size = self._fill_size
        if more and self._filler is None and self._zeroed - (self._wend + need) < size // 2:
            start = max(self._zeroed, self._wend + need)
            self._fill_to = start + size
            self._fill_size = min(size * 2, self._chunk)
            self._filler = threading.Thread(
                target=self._fill,
                args=(self._cur_path, start, size),
                name="journal-zero-fill",
                daemon=True,
            )
            self._filler.start()

    def _fill(self, path: str, start: int, size: int) -> None:
        # Through a file of its own: Linux reports a writeback error to one fsync per open
        # file, and the filler's must not take the one the journal's own sync has to see.
        assert self._disk is not None
        try:
            f = self._disk.open(path)
            try:
                zeros = bytes(min(size, 1 << 20))
                for off in range(start, start + size, len(zeros)):
                    f.write_at(off, zeros[: start + size - off])
                if self._fsync:
                    f.sync()
            finally:
                f.close()
        except OSError as e:
            self._fill_error = e

    def _wait_fill(self) -> None:
        t, self._filler = self._filler, None
        if t is None:
            return
        t.join()
        err, self._fill_error = self._fill_error, None
        if err is not None:
            raise StorageError(f"{self._cur_path}: zero-filling failed: {err}")
        self._zeroed = max(self._zeroed, self._fill_to)

    # ---------------------------------------------------------------- durability

    def sync(self) -> None:
        """Write the records added since the last call, then one fdatasync (none for
        'never')."""
        if self._broken is not None:
            raise self._broken
        if not self.dirty:
            return
        self.dirty = False
        if self._file is not None:
            self._write_added()
            if self._fsync:
                try:
                    self._file.sync()
                except OSError as e:
                    raise StorageError(f"{self._cur_path}: fdatasync failed: {e}") from e

    def _write_added(self, fill: bool = True) -> None:
        recs, self._unwritten = self._unwritten, []
        if not recs or self._file is None:
            return
        size = self._end - self._wend
        self._fill_ahead(size, fill)
        try:
            self._file.write_at(self._wend, recs[0] if len(recs) == 1 else b"".join(recs))
        except OSError as e:
            raise StorageError(f"{self._cur_path}: {e}") from e
        self._wend = self._end
        self._zeroed = max(self._zeroed, self._end)

    def term_at(self, idx: int) -> int | None:
        if not self._entries:
            return None
        pos = idx - self._entries[0][1]
        if 0 <= pos < len(self._entries):
            return self._entries[pos][2]
        return None

    # ---------------------------------------------------------------- cooled entries

    @property
    def uncooled(self) -> int:
        """Bytes of the commands added since the last ``cool`` (about)."""
        return self._uncooled

    def cool(self, before: int) -> int:
        """Keep only the record's offset of the entries before index ``before`` (less a margin)
        that are written to the current segment: the binding passes an index that every
        follower it sends to has and that this node applied, so nothing reads them in the
        normal course, and memory holds the commands since the last call, not all since the
        last snapshot (64 MB). A follower catching up after a leader change, a new member or
        pysyncobj's compaction reads them back. The first entry stays whole: pysyncobj reads
        it on every call. Returns the bytes of the commands dropped."""
        entries, offsets = self._entries, self._offsets
        if self._file is None or not entries or self._broken is not None:
            return 0
        stop = min(before - COOL_MARGIN - entries[0][1], len(entries) - 1)
        pos, passed, cooled, wend = max(self._cooled, 1), 0, 0, self._wend
        if self._cooled == 0 and stop > 0:
            passed = _whole_bytes(entries[:1])  # (never cooled; no longer counted either)
        while pos < stop:
            command, idx, term = entries[pos]
            if isinstance(command, bytes):
                off = offsets[pos]
                if off >= 0:  # (-1: in an older segment, deleted by the next compaction)
                    if offsets[pos + 1] > wend:
                        break  # not written yet
                    entries[pos] = (off, idx, term)
                    cooled += len(command)
                passed += len(command)
            pos += 1
        self._cooled = max(self._cooled, pos)
        self._uncooled = max(self._uncooled - passed, 0)
        self.cooled_bytes += cooled
        return cooled

    def _whole_entries(self, start: int, stop: int) -> list[Entry]:
        """Entries ``start:stop``, cooled ones read back."""
        if start >= self._cooled:
            return self._entries[start:stop]  # type: ignore[return-value]  # (none cooled)
        return list(_Span(self, start, stop))

    def _holder(self, idx: int) -> tuple[str, int | None]:
        """The segment that a cooled entry of index ``idx`` was written to: the newest one
        whose first index is at or before it; and the first index of the segment after it."""
        after: int | None = None
        for _, path, first in [*self._older, (0, self._cur_path, self._cur_first)][::-1]:
            if first is None or first <= idx:
                return path, after
            after = first
        raise StorageCorrupt(f"{self._cur_path}: no journal segment holds entry {idx}")

    def _read_run(self, pos: int, ahead: int = 0) -> list[Entry]:
        """The cooled entry at position ``pos`` read back and, within ``ahead`` bytes read
        at once, the cooled entries after it in the same segment. A failed read or a record
        that is not the one written is a storage failure (never a wrong command applied or
        sent)."""
        entries = self._entries
        off, idx, term = entries[pos]
        assert isinstance(off, int) and self._disk is not None
        path, limit = self._holder(idx)
        bad = StorageCorrupt(
            f"{path}: entry {idx} (term {term}) at offset {off} does not read back intact"
        )
        try:
            reader = self._readers.get(path)
            if reader is None:
                reader = self._readers[path] = self._disk.open_read(path)
            head = reader.pread(_REC.size, off)
            magic, size, _ = _REC.unpack(head) if len(head) == _REC.size else (0, 0, 0)
            if magic not in (RECORD_MAGIC, RECORD_MAGIC_V1) or size > _RECORD_MAX:
                raise bad
            data = head + reader.pread(max(size, ahead - _REC.size), off + _REC.size)
        except OSError as e:
            raise StorageError(f"{path}: reading entry {idx} back failed: {e}") from e
        run: list[Entry] = []
        at = 0
        for p in range(pos, len(entries)):
            o, i, t = entries[p]
            if not isinstance(o, int) or o - off != at or (limit is not None and i >= limit):
                break
            parsed = self._parse(data, at)
            if parsed is None or parsed[0][1:] != (i, t):
                break  # (the first: damage, below; a later one: cut by the read's end)
            run.append(parsed[0])
            at = parsed[1]
        if not run:
            raise bad
        self.read_backs += len(run)
        return run

    def _close_reader(self, path: str) -> None:
        reader = self._readers.pop(path, None)
        if reader is not None:
            with contextlib.suppress(OSError):
                reader.close()

    # ---------------------------------------------------------------- pysyncobj's interface

    def add(self, command: bytes, idx: int, term: int) -> None:
        if self._broken is not None:
            raise self._broken
        self._entries.append((command, idx, term))
        self._uncooled += len(command)
        if self._file is None:
            return
        rec = self._record(command, idx, term, self._wend)  # written by the next sync, at _wend
        self._unwritten.append(rec)
        self._offsets.append(self._end)
        self._end += len(rec)
        self.dirty = True

    def clear(self) -> None:
        self._rewrite([])

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        if entryFrom >= len(self._entries):
            return
        first_removed = self._entries[entryFrom][1]
        if self._file is not None and self._offsets[entryFrom] < 0:
            # Reaches into an older segment (committed entries are never cut: not expected).
            self._rewrite(self._whole_entries(0, entryFrom))
        elif self._file is None:
            del self._entries[entryFrom:]
        else:
            del self._entries[entryFrom:]
            if entryFrom < self._cooled:  # (committed entries are never cut: not expected)
                self._cooled = entryFrom
            self._uncooled = _whole_bytes(self._entries[self._cooled :])
            self._write_added()  # (simplest: written, then cut with the rest)
            self._wait_fill()
            if self._fsync and self.dirty:
                # Records kept before the cut land before the ones written after it: else
                # one fdatasync covers both, and a power loss that drops a kept record while
                # a later one landed reads as corruption at restart (rare: a follower whose
                # unsynced entries conflict with a new leader's).
                try:
                    self._file.sync()
                except OSError as e:
                    raise StorageError(f"{self._cur_path}: fdatasync failed: {e}") from e
            self._end = self._wend = self._zeroed = self._offsets[entryFrom]
            del self._offsets[entryFrom:]
            try:
                if self._end < self._whole:
                    # The header first says the synced-whole records end here (synced even
                    # with fsync "never"): a cut that reaches the disk before it would read
                    # as corruption.
                    self._whole = self._end
                    self._file.write_at(len(SEGMENT_HEADER) + 8, _SEG_WHOLE.pack(self._end))
                    self._file.sync()
                # cut, not zeroed in place: a later restart must not find the removed records
                self._file.truncate(self._end)
            except OSError as e:
                raise StorageError(f"{self._cur_path}: {e}") from e
            self.dirty = True
        if self.on_truncate is not None:
            self.on_truncate(first_removed)

    def deleteEntriesTo(self, entryTo: int) -> None:
        entryTo = max(entryTo, 0)
        keep_from = self._entries[entryTo][1] if entryTo < len(self._entries) else None
        if entryTo > self._cooled:  # (not yet cooled: a compaction soon after a restart)
            self._uncooled -= _whole_bytes(self._entries[self._cooled : entryTo])
        self._cooled = max(self._cooled - entryTo, 0)
        del self._entries[:entryTo]
        del self._offsets[:entryTo]
        if self._entries and isinstance(self._entries[0][0], int):
            # Cooled after a roll, before this compaction: whole again (read on every call).
            self._entries[0] = self._read_run(0)[0]
        if self._file is None:
            return
        if self._older and keep_from is not None and (self._cur_first or 0) <= keep_from:
            # Rolled at or before the cut: what older segments still contribute (entries before
            # the current segment's first) is all cut.
            self._remove_older()
        elif entryTo:
            self._rewrite(self._whole_entries(0, len(self._entries)))

    @overload
    def __getitem__(self, item: int) -> Entry: ...
    @overload
    def __getitem__(self, item: slice) -> Sequence[Entry]: ...
    def __getitem__(self, item: int | slice) -> Entry | Sequence[Entry]:
        if isinstance(item, slice):
            start, stop, step = item.indices(len(self._entries))
            if start >= self._cooled and step == 1:
                return self._entries[item]  # type: ignore[return-value]  # (none cooled)
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            return _Span(self, start, max(start, stop))
        entry = self._entries[item]
        if isinstance(entry[0], int):
            return self._read_run(item % len(self._entries))[0]
        return entry  # type: ignore[return-value]  # (whole)

    def __len__(self) -> int:
        return len(self._entries)

    def _destroy(self) -> None:
        self._wait_removal()
        for path in list(self._readers):
            self._close_reader(path)
        if self._file is not None:
            try:
                self._wait_fill()
                if self._broken is None:
                    self.sync()  # (may start another fill: wait for it before closing the file)
                self._wait_fill()
            finally:
                self._file.close()
                self._file = None

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:
        # Not here: the binding keeps a CommitMark (pysyncobj calls this on every commit).
        pass

    def getRaftCommitIndex(self) -> int:
        return 1

    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:
        if self._meta is not None:
            self._meta.store(term, votedForNodeId)
        self._term, self._vote = term, votedForNodeId

    def getCurrentTerm(self) -> int:
        return self._term

    def getVotedForNodeId(self) -> Any:
        return self._vote

    def onOneSecondTimer(self) -> None:
        pass


def _whole_bytes(slots: list[_Slot]) -> int:
    """The bytes of the commands that ``slots`` hold whole (not cooled)."""
    return sum(len(c) for c, _, _ in slots if isinstance(c, bytes))


class _Span(Sequence[Entry]):
    """Entries ``start:stop`` of a journal, some of them cooled: each read back when first
    asked for. pysyncobj slices a lagging follower's entries to the end of the log, then
    sends the first few MB of them."""

    def __init__(self, journal: Journal, start: int, stop: int) -> None:
        self._journal, self._start, self._stop = journal, start, stop
        self._got: dict[int, Entry] = {}

    def __len__(self) -> int:
        return self._stop - self._start

    @overload
    def __getitem__(self, item: int) -> Entry: ...
    @overload
    def __getitem__(self, item: slice) -> list[Entry]: ...
    def __getitem__(self, item: int | slice) -> Entry | list[Entry]:
        if isinstance(item, slice):
            return [self[i] for i in range(*item.indices(len(self)))]
        pos = item + len(self) if item < 0 else item
        if not 0 <= pos < len(self):
            raise IndexError(item)
        entry = self._got.get(pos)
        if entry is None:
            at = self._start + pos
            slot = self._journal._entries[at]
            if not isinstance(slot[0], int):
                return slot  # type: ignore[return-value]  # (whole)
            run = self._journal._read_run(at, READ_AHEAD)[: len(self) - pos]
            self._got.update(zip(range(pos, pos + len(run)), run, strict=True))
            entry = run[0]
        return entry
