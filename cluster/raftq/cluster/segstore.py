"""Message payloads and headers of one node in append-only segment files (issue 22).

The state machine keeps only compact metadata per message (``msgindex``); the bytes live here.
Appends happen at apply time and are deterministic: every replica fed the same appends, frees
and compactions writes the same bytes at the same offsets (no clock, no randomness, a fixed roll
size), so a location (``segno << 32 | offset``) means the same record on every node, and a file
of the same name holds the same byte prefix on every node. The Raft journal stays the write-ahead
log: nothing here is fsynced per append; ``sync()`` makes everything durable before a snapshot
lets the journal drop the entries that wrote it. Restore cuts the files back to the snapshot's
``marks`` (``truncate_to``) and the journal replay writes the rest again, byte for byte.

Layout: one flat directory; each *stream* (the Broker's key for one topic incarnation, never
reused: a topic deleted and created again gets a new key) has its own segments
``<key>~<segno>.seg``. Per stream, not shared by the node: messages of one topic leave roughly
in order, so whole segments free up without compaction; deleting a topic deletes its files; a
snapshot's mark is per topic; the cost is one open file per topic being written (few).

A segment: ``SEG_MAGIC`` (``RAFTQS2``) + its segno (``_SEG``), then records of messages with
consecutive seqs ``first``, ``first + 1``, ... and one publish time: one per ``append_batch``
call, or per *open record* (``append_open`` ... ``seal``: the state machine's publishes to one
stream within one Raft entry)::

    magic u32 | crc32 u32 (of everything after it) | length u32 (whole record) |
    first seq u64 | messages n u32 | published_at ms u64 |
    n x payload size u32 | n x headers length u32 |
    the headers (msgpack maps, or nothing) in order | the payloads in order

One record per batch because the per-record work (a CRC call, struct packing, a location)
is what a store costs per publish; per message only a length and a slice remain. Every
message of a record has the record's location; its *length* is its share of the record
(8 column bytes + payload + headers bytes, the first one also carrying the fixed 32 bytes:
known when the message is appended, before the record is complete), so the shares add up to
the record and ``free(key, loc, length)`` per message keeps the live bytes of a segment
exact; a segment's ``live`` counts messages.

An open record (``append_open``) takes the messages of later calls that continue it (next
seqs, same publish time, below ``OPEN_BYTES``, its segment below the roll size); locations,
shares and counters are final at once, the bytes and columns are made when it is sealed:
by ``seal()``, by another append to the stream, or first thing in any method that reads or
moves bytes. The bytes are those of one ``append_batch`` of the same messages; replicas
write the same files as long as they seal at the same points (the state machine seals at
the end of every apply).

A sealed segment (one appends moved past) gets a sidecar ``<key>~<segno>.idx`` (``RAFTQI2``):
per record its first seq, count, offset and publish time, per message its length and payload
size (``Columns``), so a restore rebuilds the in-memory index (``msgindex``) without reading
payloads. It is a cache: written without fsync, checked (CRC and the segment size it
describes), and rebuilt by scanning the segment when missing or bad; the segment being
appended to is always scanned (at most one segment).

CRC32 (zlib, stdlib C code, the check the journal uses) over the record; a read takes the
whole record and checks magic, length, CRC, that the columns add up, that ``seq`` is in the
record and that its length is the one asked for, so a damaged or misplaced record raises
``StorageCorrupt`` naming the file, never a wrong payload. Records of several messages read
lately stay decoded in a small cache (``CACHE_RECORDS``, ``CACHE_BYTES``): a receive of 100
messages from one record reads and checks it once (``read_batch`` or ``read`` alike); the
cache is dropped when the files are cut back (``truncate_to``, ``install``). A read at random
costs its whole record (a batch of 100 x 1 KiB: ~100 KiB); consumers mostly read in order.

Compaction rewrites, per record, each run of consecutive live messages as a new record at the
tail (same publish time, same header and payload bytes).

Segments leave in two steps. A segment whose records are all freed (or that a compaction
emptied, or of a dropped stream) is *retired*: the state no longer refers to it, but the last
durable snapshot may, and a restore from that snapshot replays the journal over it. It is
deleted by ``commit(epoch)`` once a snapshot taken after its retirement is durable, and not
while an export pins it; until then its records can still be read (a result of the batch that
retired it). Deletions are never made durable: restore removes what comes back.

Threads: everything runs on the apply thread except iterating an ``Export``, which reads
with handles of its own; pins and retired segments are guarded by a lock. Never called from
here: a clock, randomness, the state machine.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import struct
import sys
import threading
import zlib
from array import array
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from itertools import accumulate
from operator import add, itemgetter
from typing import Any, Protocol

import msgpack

from raftq.cluster.storage import Disk, DiskFile, ReadFile, StorageCorrupt, StorageError

SEGMENT_BYTES = 8 << 20  # a segment is rolled once it holds this much (+ at most one record)
OPEN_BYTES = 1 << 20  # an open record takes no more messages once it is this long
FLUSH_BYTES = 256 << 10  # appends are buffered per stream up to this much, then written
WRITEBACK_BYTES = 1 << 20  # ...and their writeback started once this much is written (fsync
# "always"): a snapshot's sync then finds at most this much (+ a buffer) per stream written, and
# the journal's fsyncs meanwhile queue behind a MiB, not all (DiskFile.start_writeback)
READERS = 64  # open read handles kept (least recently used closed first)
CACHE_RECORDS = 32  # decoded records kept for reads (least recently used dropped first)
CACHE_BYTES = 16 << 20  # ... and at most this many of their bytes
READ_AHEAD = 256  # a read of a record not cached reads at least this much at once
WILL_NEED = 4 << 20  # reads going forward through a segment have up to this much after them
# asked for (posix_fadvise WILLNEED) when they pass the middle of what was asked for last, from
# WILL_NEED_FIRST, doubling: consuming a backlog after a restart (page cache cold) waited on each
# read on the apply thread; 4 MB at once for each of 100 topics read 400 MB to consume 13
WILL_NEED_FIRST = 256 << 10
EXPORT_CHUNK = 1 << 20
SEG_MAGIC = b"RAFTQS2\n"
_SEG = struct.Struct("<Q")  # segno
SEG_HEAD = len(SEG_MAGIC) + _SEG.size
REC_MAGIC = 0x3251_5352  # "RSQ2"
_REC = struct.Struct("<IIIQIQ")  # magic, crc32(rest), record length, first seq, messages, at
_HEAD = struct.Struct("<III")  # magic, crc32, record length
_ONE = struct.Struct("<II")  # the columns of a record of one message
_ONE_REC = struct.Struct("<IIIQIQII")  # a record of one message: _REC and its columns
_ONE_REST = struct.Struct("<IQIQII")  # ... from its length on
_MAGIC_CRC = struct.Struct("<II")
_N_AT, _N_ONE = 20, b"\x01\x00\x00\x00"  # where a record's message count is; one
_REST = struct.Struct("<IQIQ")  # the same from the length on (what the CRC starts with)
REC_OVERHEAD = _REC.size
PER_MESSAGE = 8  # column bytes a message adds: payload size u32, headers length u32
_CRC_FROM = 8  # the CRC covers the record from its length field on
MAX_SEGNO = (1 << 21) - 1  # locations stay below 2^53 (msgpack/JSON-safe integers)
KEY_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_NAME_RE = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]{0,199})~([0-9]{8,})\.seg")
_IDX_RE = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]{0,199})~([0-9]{8,})\.idx")
IDX_MAGIC = b"RAFTQI2\n"
_IDX = struct.Struct("<QQQQI")  # segno and size of the segment described, records, messages, crc
_FRAME = struct.Struct("<HQI")  # export frame: name length, offset, data length
COMPLETE = "COMPLETE"  # an import's staging directory holds every file, synced

# marks: [[key, next_segno, [[segno, size, live_messages, live_bytes], ...]], ...] (msgpack-able)
Marks = list[list[Any]]
Headers = Mapping[str, str] | None
Message = tuple[bytes, dict[str, str] | None]  # what a read gives: payload, headers


class StoreDisk(Disk, Protocol):
    def open_read(self, path: str) -> ReadFile: ...


def location(segno: int, offset: int) -> int:
    return segno << 32 | offset


def seg_name(key: str, segno: int) -> str:
    return f"{key}~{segno:08d}.seg"


def idx_name(key: str, segno: int) -> str:
    return f"{key}~{segno:08d}.idx"


class Columns:
    """The messages of one segment, in file order, as packed columns (the restore input of
    ``msgindex``): per record its first seq, message count, offset and publish time (its
    messages have consecutive seqs); per message its length (its share of the record, what
    ``free`` takes) and payload size. Per record, so appending a batch costs no work per
    message here."""

    __slots__ = ("at", "count", "first", "length", "offset", "size")

    def __init__(self) -> None:
        self.first = array("q")  # per record: seq of its first message
        self.count = array("I")  # ... its messages
        self.offset = array("I")  # ... its offset in the segment
        self.at = array("q")  # ... published_at ms
        self.length = array("I")  # per message: its share of its record's length
        self.size = array("I")  # ... payload bytes

    def __len__(self) -> int:
        return len(self.length)

    def add(
        self, first: int, at: int, offset: int, lengths: Sequence[int], sizes: Sequence[int]
    ) -> None:
        self.first.append(first)
        self.count.append(len(sizes))
        self.offset.append(offset)
        self.at.append(at)
        self.length.extend(lengths)
        self.size.extend(sizes)

    def add_one(self, seq: int, at: int, offset: int, length: int, size: int) -> None:
        self.first.append(seq)
        self.count.append(1)
        self.offset.append(offset)
        self.at.append(at)
        self.length.append(length)
        self.size.append(size)

    def rows(self) -> Iterator[tuple[int, int, int, int, int]]:
        """(seq, its record's offset, length, payload size, published_at) per message."""
        j = 0
        for first, n, off, at in zip(self.first, self.count, self.offset, self.at, strict=True):
            for i in range(n):
                yield first + i, off, self.length[j + i], self.size[j + i], at
            j += n

    def _arrays(self) -> tuple[array[int], ...]:
        return self.first, self.count, self.offset, self.at, self.length, self.size

    def encode(self, segno: int, seg_size: int) -> bytes:
        cols = b"".join(_le(a).tobytes() for a in self._arrays())
        head = _IDX.pack(segno, seg_size, len(self.first), len(self.length), zlib.crc32(cols))
        return IDX_MAGIC + head + cols

    @classmethod
    def decode(cls, data: bytes, segno: int, seg_size: int) -> Columns | None:
        """None unless ``data`` is an intact sidecar of segment ``segno`` at ``seg_size``."""
        head = len(IDX_MAGIC) + _IDX.size
        if len(data) < head or not data.startswith(IDX_MAGIC):
            return None
        got, size, records, messages, crc = _IDX.unpack_from(data, len(IDX_MAGIC))
        cols = memoryview(data)[head:]
        c = cls()
        if (
            (got, size) != (segno, seg_size)
            or len(cols) != records * 24 + messages * 8
            or zlib.crc32(cols) != crc
        ):
            return None
        off = 0
        for a, n in zip(c._arrays(), (records,) * 4 + (messages,) * 2, strict=True):
            a.frombytes(cols[off : off + n * a.itemsize])
            off += n * a.itemsize
            if sys.byteorder != "little":
                a.byteswap()
        return c if sum(c.count) == messages else None


def _le(a: array[int]) -> array[int]:
    if sys.byteorder == "little":
        return a
    b = array(a.typecode, a)
    b.byteswap()
    return b


_PAYLOAD, _HEADERS = itemgetter(0), itemgetter(1)


class Encoded:
    """A record ready to append (``head`` + ``body``), and per message its payload size and
    length: its share of the record's length, its column bytes, payload and packed headers,
    the first one also carrying the record's fixed part, so the shares add up to the record
    and each is known when the message is appended; ``shares`` when given are those (an
    open record's, counted as its messages came)."""

    __slots__ = ("at", "body", "first_seq", "head", "n", "shares", "sizes")

    def __init__(
        self,
        first_seq: int,
        at: int,
        payloads: Sequence[bytes],
        hdrs: Sequence[bytes] | None,
        given: tuple[array[int], array[int]] | None = None,
    ) -> None:
        n = len(payloads)
        self.sizes: Sequence[int]
        shares: Sequence[int] | None = None
        sizes: array[int] | None = None
        if given is not None:  # (an open record's: counted as its messages came)
            sizes, shares = given
            self.sizes = sizes
        if n == 1:  # a publish of one message: no arrays
            payload, hdr = payloads[0], (hdrs[0] if hdrs else b"")
            body = b"".join((_ONE.pack(len(payload), len(hdr)), hdr, payload))
            if shares is None:
                self.sizes = (len(payload),)
                shares = [REC_OVERHEAD + PER_MESSAGE + len(payload) + len(hdr)]
        elif hdrs is None:  # no message has headers (the common case): a column of zeros
            if sizes is None or shares is None:
                sizes = self.sizes = array("I", map(len, payloads))
                shares = [size + PER_MESSAGE for size in sizes]
                shares[0] += REC_OVERHEAD
            body = b"".join([_le(sizes).tobytes(), bytes(4 * n), *payloads])
        else:
            sizes = array("I", map(len, payloads))
            hlens = array("I", map(len, hdrs))
            body = b"".join([_le(sizes).tobytes(), _le(hlens).tobytes(), *hdrs, *payloads])
            if shares is None:
                self.sizes = sizes
                shares = [size + PER_MESSAGE for size in map(add, sizes, hlens)]
                shares[0] += REC_OVERHEAD
        rest = _REST.pack(len(body) + REC_OVERHEAD, first_seq, n, at)
        crc = zlib.crc32(body, zlib.crc32(rest))
        self.head = struct.pack("<II", REC_MAGIC, crc) + rest
        self.body, self.first_seq, self.at, self.n, self.shares = body, first_seq, at, n, shares


def encode_record(first_seq: int, at: int, items: Sequence[tuple[bytes, Headers]]) -> Encoded:
    """One record of messages ``first_seq``, ``first_seq + 1``, ... published at ``at``."""
    if not items:
        raise ValueError("a record holds at least one message")
    payloads = [p for p, _ in items]
    if not any(map(_HEADERS, items)):
        return Encoded(first_seq, at, payloads, None)
    hdrs = [msgpack.packb(dict(h)) if h else b"" for _, h in items]
    return Encoded(first_seq, at, payloads, hdrs)


class Record:
    """A decoded record whose checksum and columns were checked (``decode_record``): messages
    ``first_seq`` .. ``first_seq + n - 1``; offsets into ``data`` of each one's headers
    (``hstart[i]`` .. ``hstart[i + 1]``) and payload (``pstart``)."""

    __slots__ = ("at", "data", "first_seq", "hstart", "n", "offset", "path", "pstart")

    def __init__(
        self,
        data: bytes,
        where: tuple[str, int],
        head: tuple[int, int, int],
        hstart: list[int],
        pstart: list[int],
    ) -> None:
        self.data, (self.path, self.offset), (self.first_seq, self.n, self.at) = data, where, head
        self.hstart, self.pstart = hstart, pstart

    def sizes(self) -> array[int]:
        p = self.pstart
        return array("I", [p[i + 1] - p[i] for i in range(self.n)])

    def shares(self) -> array[int]:
        return array("I", [self.share(i) for i in range(self.n)])

    def share(self, i: int) -> int:
        p, h = self.pstart, self.hstart
        share = PER_MESSAGE + p[i + 1] - p[i] + h[i + 1] - h[i]  # (as ``Encoded`` counts)
        return share + REC_OVERHEAD if i == 0 else share

    def raw(self, i: int) -> tuple[bytes, bytes]:
        """(payload, packed headers or b"") of message ``first_seq + i``."""
        p, h, d = self.pstart, self.hstart, self.data
        return d[p[i] : p[i + 1]], d[h[i] : h[i + 1]]

    def message(self, i: int) -> Message:
        payload, hdr = self.raw(i)
        return payload, (msgpack.unpackb(hdr, raw=False) if hdr else None)


def _decode_one(data: bytes, path: str, offset: int, seq: int, length: int) -> Message:
    """``decode_record`` and ``read`` of a record of one message, in one step (the common
    publish of one message); the same checks and errors."""
    if len(data) < _ONE_REC.size:
        raise StorageCorrupt(f"{path}: short record at offset {offset} ({len(data)} bytes)")
    magic, crc, size, first, _, _, psize, hlen = _ONE_REC.unpack_from(data)
    if magic != REC_MAGIC or size != len(data):
        raise StorageCorrupt(f"{path}: bad record header at offset {offset}")
    if zlib.crc32(memoryview(data)[_CRC_FROM:]) != crc:
        raise StorageCorrupt(f"{path}: checksum mismatch in the record at offset {offset}")
    if size != _ONE_REC.size + psize + hlen:
        raise StorageCorrupt(f"{path}: the columns of the record at offset {offset} do not add up")
    if first != seq:
        raise StorageCorrupt(
            f"{path}: record at offset {offset} holds seqs {first}..{first}, not {seq}"
        )
    if size != length:
        raise StorageCorrupt(
            f"{path}: seq {seq} at offset {offset} has length {size}, not {length}"
        )
    start = _ONE_REC.size + hlen
    hdr = data[_ONE_REC.size : start]
    return data[start:], (msgpack.unpackb(hdr, raw=False) if hlen else None)


def decode_record(data: bytes, path: str, offset: int) -> Record:
    """The record that ``data`` is exactly; raises StorageCorrupt naming ``path`` and
    ``offset`` when it is not intact."""
    if len(data) < REC_OVERHEAD:
        raise StorageCorrupt(f"{path}: short record at offset {offset} ({len(data)} bytes)")
    magic, crc, size, first, n, at = _REC.unpack_from(data)
    if magic != REC_MAGIC or size != len(data) or not 0 < n <= (size - REC_OVERHEAD) // 8:
        raise StorageCorrupt(f"{path}: bad record header at offset {offset}")
    if zlib.crc32(memoryview(data)[_CRC_FROM:]) != crc:
        raise StorageCorrupt(f"{path}: checksum mismatch in the record at offset {offset}")
    fixed = REC_OVERHEAD + PER_MESSAGE * n
    if n == 1:  # the common single message: no arrays
        psize, hlen = _ONE.unpack_from(data, REC_OVERHEAD)
        hstart, pstart = [fixed, fixed + hlen], [fixed + hlen, fixed + hlen + psize]
    else:
        cols = array("I")
        cols.frombytes(data[REC_OVERHEAD:fixed])
        if sys.byteorder != "little":
            cols.byteswap()
        hstart = list(accumulate(cols[n:], initial=fixed))
        pstart = list(accumulate(cols[:n], initial=hstart[-1]))
    if pstart[-1] != size:
        raise StorageCorrupt(f"{path}: the columns of the record at offset {offset} do not add up")
    return Record(data, (path, offset), (first, n, at), hstart, pstart)


class _Seg:
    __slots__ = (
        "buf",
        "cols",
        "dirty",
        "file",
        "flushed",
        "hinted",
        "live",
        "live_bytes",
        "path",
        "segno",
        "size",
    )

    def __init__(self, path: str, segno: int, size: int) -> None:
        self.path, self.segno = path, segno
        self.size = size  # logical end, buffered bytes included
        self.flushed = size  # bytes [0, flushed) are in the file
        self.hinted = size  # ...and [0, hinted) on their way to the device (start_writeback)
        self.buf = bytearray()  # bytes [flushed, size)
        self.live = 0  # records the state still refers to
        self.live_bytes = 0
        self.file: DiskFile | None = None  # open for writing while it may be dirty
        self.dirty = False  # written since the last sync
        self.cols: Columns | None = None  # the records so far, while appended to


class _Open:
    """A stream's record still taking messages (``append_open``): its place, its messages'
    shares and the segment's counters are settled as they come; its bytes are encoded once,
    when it is sealed. ``hdrs`` stays None while no message has headers."""

    __slots__ = (
        "at",
        "first",
        "hdrs",
        "next_seq",
        "offset",
        "payloads",
        "seg",
        "shares",
        "size",
        "sizes",
    )

    def __init__(self, seg: _Seg, first: int, at: int) -> None:
        self.seg, self.offset, self.first, self.next_seq, self.at = seg, seg.size, first, first, at
        self.size = 0  # the shares so far: the record's length once sealed
        self.payloads: list[bytes] = []
        self.sizes = array("I")  # per message: payload bytes
        self.shares = array("I")  # ... its share (what ``free`` takes)
        self.hdrs: list[bytes] | None = None


class _Stream:
    __slots__ = ("key", "next_segno", "segs")

    def __init__(self, key: str, next_segno: int) -> None:
        self.key = key
        self.next_segno = next_segno
        self.segs: dict[int, _Seg] = {}  # by segno, ascending

    def tail(self) -> _Seg | None:
        seg = self.segs.get(self.next_segno - 1)
        return seg


class SegmentStore:
    """Append-only record files per stream; see the module docstring for the rules.

    ``truncate_to(marks)`` must be called once before use (``[]`` on a node without a
    snapshot). Any I/O failure raises ``StorageError`` naming the file and leaves the store
    refusing every later call: the node stops, and a restart recovers from the journal.
    """

    def __init__(
        self,
        disk: StoreDisk,
        directory: str,
        segment_bytes: int = SEGMENT_BYTES,
        flush_bytes: int = FLUSH_BYTES,
        fsync: bool = True,
    ) -> None:
        self.disk, self.dir = disk, directory
        self.segment_bytes, self.flush_bytes, self.fsync = segment_bytes, flush_bytes, fsync
        self.writeback_bytes = WRITEBACK_BYTES if fsync else 1 << 62
        self._streams: dict[str, _Stream] = {}
        self._open: dict[str, _Open] = {}  # by stream key: records not sealed yet
        self.open_bytes = OPEN_BYTES
        self._dropped: set[str] = set()  # keys never to be used again (in this process)
        self._readers: OrderedDict[str, ReadFile] = OrderedDict()
        # by reader: the last read's end, asked for up to there, the last ask's size
        self._ahead: dict[str, tuple[int, int, int]] = {}
        self._cache: OrderedDict[tuple[str, int], Record] = OrderedDict()  # (path, offset)
        self._cached = 0  # bytes of the cached records
        self._names_dirty = False  # a segment was created since the last directory sync
        self._live_bytes = 0  # sum of the segments' live_bytes
        self._seg_bytes = 0  # sum of the segments' sizes
        self._ready = False
        self._broken: StorageError | None = None
        self._lock = threading.Lock()  # guards the three below (export runs on its thread)
        self._retired: list[tuple[int, str]] = []  # (epoch when retired, path)
        self._gone: dict[str, _Seg] = {}  # retired segments not deleted yet: still readable
        self._pins: dict[str, int] = {}
        self._epoch = 0  # marks() taken so far
        self._committed = 0  # the newest epoch whose snapshot is durable
        makedirs = getattr(disk, "makedirs", None)  # (an in-memory disk: memdisk.MemDisk)
        if makedirs is not None:
            makedirs(directory)
        else:
            os.makedirs(directory, exist_ok=True)

    # ------------------------------------------------------------ appending and reading

    def append(
        self, key: str, seq: int, at: int, payload: bytes, headers: Headers = None
    ) -> tuple[int, int]:
        """Append message ``seq`` published at ``at`` (ms), a record of its own; returns its
        location and length (what ``read`` and ``free`` take). The bytes are those of
        ``append_batch`` of one message, written without its general machinery."""
        hdr = msgpack.packb(dict(headers)) if headers else b""
        size = _ONE_REC.size + len(hdr) + len(payload)
        rest = _ONE_REST.pack(size, seq, 1, at, len(payload), len(hdr))
        crc = zlib.crc32(payload, zlib.crc32(hdr, zlib.crc32(rest)))
        seg = self._tail_for(key)
        off = seg.size
        if seg.cols is not None:
            seg.cols.add_one(seq, at, off, size, len(payload))
        seg.buf += _MAGIC_CRC.pack(REC_MAGIC, crc)
        seg.buf += rest
        seg.buf += hdr
        seg.buf += payload
        self._grew(seg, size, 1)
        return location(seg.segno, off), size

    def append_batch(
        self, key: str, first_seq: int, at: int, items: Sequence[tuple[bytes, Headers]]
    ) -> tuple[list[int], Sequence[int]]:
        """Append messages ``first_seq``, ``first_seq + 1``, ... published at ``at`` as one
        record; returns per message its location (the record's) and its share of the record's
        length (the shares add up to it): what ``read`` and ``free`` take."""
        if len(items) <= 1:
            if not items:
                return [], []
            loc, size = self.append(key, first_seq, at, *items[0])
            return [loc], [size]
        return self._put(key, encode_record(first_seq, at, items))

    def append_open(
        self, key: str, first_seq: int, at: int, items: Sequence[tuple[bytes, Headers]]
    ) -> tuple[list[int], Sequence[int]]:
        """``append_batch``, but into the stream's *open* record: extended when these
        messages continue it (the next seqs, the same ``at``, below ``open_bytes``, its
        segment below its roll size), else sealed and a new one opened. Locations, shares
        and the counters are final at once; the bytes are written by ``seal`` (or any method
        that reads or moves bytes), the same bytes one ``append_batch`` of all the messages
        appended between two seals writes. Deterministic as long as every replica seals at
        the same points (the state machine: at the end of each apply)."""
        if not items:
            return [], []
        if self._broken is not None:
            raise self._broken
        op = self._open.get(key)
        if (
            op is None
            or op.next_seq != first_seq
            or op.at != at
            or op.size >= self.open_bytes
            or op.seg.size >= self.segment_bytes
        ):
            seg = self._tail_for(key)  # (seals the open one first)
            op = self._open[key] = _Open(seg, first_seq, at)
        n = len(items)
        first = not op.payloads
        if n == 1:  # the common publish of one message: no lists
            payload, headers = items[0]
            hdr = msgpack.packb(dict(headers)) if headers else b""
            op.payloads.append(payload)
            if hdr or op.hdrs is not None:
                if op.hdrs is None:
                    op.hdrs = [b""] * (len(op.payloads) - 1)
                op.hdrs.append(hdr)
            share = PER_MESSAGE + len(payload) + len(hdr) + (REC_OVERHEAD if first else 0)
            op.sizes.append(len(payload))
            op.shares.append(share)
            shares: Sequence[int] = (share,)
        else:
            payloads = list(map(_PAYLOAD, items))
            op.payloads += payloads
            sizes = array("I", map(len, payloads))
            if any(map(_HEADERS, items)) or op.hdrs is not None:
                hdrs = [msgpack.packb(dict(h)) if h else b"" for _, h in items]
                if op.hdrs is None:
                    op.hdrs = [b""] * (len(op.payloads) - n)
                op.hdrs += hdrs
                both = map(add, sizes, map(len, hdrs))
                col = array("I", [size + PER_MESSAGE for size in both])
            else:  # (a comprehension: twice as fast as map() of a bound method)
                col = array("I", [size + PER_MESSAGE for size in sizes])
            if first:
                col[0] += REC_OVERHEAD
            share = sum(col)
            op.sizes += sizes
            op.shares += col
            shares = col
        op.size += share
        op.next_seq += n
        self._grew(op.seg, share, n)
        return [location(op.seg.segno, op.offset)] * n, shares

    def seal(self) -> None:
        """Write every open record (``append_open``): the end of an apply."""
        if self._broken is not None:  # (refusing every call; the journal replays them)
            self._open.clear()
        if self._open:
            for key in list(self._open):
                self._seal(key)

    def _seal(self, key: str) -> None:
        op = self._open.pop(key, None)
        if op is None:
            return
        rec = Encoded(op.first, op.at, op.payloads, op.hdrs, (op.sizes, op.shares))
        seg = op.seg
        if REC_OVERHEAD + len(rec.body) != op.size or seg.flushed + len(seg.buf) != op.offset:
            self._broken = StorageError(  # a bug, not bad luck: stop before writing
                f"{seg.path}: the open record at offset {op.offset} does not add up"
            )
            raise self._broken
        if seg.cols is not None:
            seg.cols.add(rec.first_seq, rec.at, op.offset, rec.shares, rec.sizes)
        seg.buf += rec.head
        seg.buf += rec.body
        if len(seg.buf) >= self.flush_bytes:
            self._flush(seg)

    def _put(self, key: str, rec: Encoded) -> tuple[list[int], Sequence[int]]:
        seg = self._tail_for(key)
        loc = location(seg.segno, seg.size)
        if seg.cols is not None:  # array to array: copies, no work per message
            seg.cols.add(rec.first_seq, rec.at, seg.size, rec.shares, rec.sizes)
        seg.buf += rec.head
        seg.buf += rec.body
        self._grew(seg, REC_OVERHEAD + len(rec.body), rec.n)
        return [loc] * rec.n, rec.shares

    def _tail_for(self, key: str) -> _Seg:
        """The segment the next record of ``key`` goes to (its open record sealed)."""
        self._check()
        if key in self._open:
            self._seal(key)
        st = self._streams.get(key)
        if st is None:
            st = self._new_stream(key)
        seg = st.tail()
        if seg is None or seg.size >= self.segment_bytes:
            seg = self._roll(st)
        return seg

    def _grew(self, seg: _Seg, size: int, messages: int) -> None:
        seg.size += size
        seg.live += messages
        seg.live_bytes += size
        self._live_bytes += size
        self._seg_bytes += size
        if len(seg.buf) >= self.flush_bytes:
            self._flush(seg)

    def read(self, key: str, seq: int, loc: int, length: int) -> Message:
        """The payload and headers of message ``seq`` in the record at ``loc`` (``length``: its
        share); StorageCorrupt naming the file when it is missing, short or damaged, never
        another message's payload."""
        self._check()
        if self._open:
            self._seal(key)
        got = self._message_or_record(key, seq, loc, length)
        if isinstance(got, Record):
            return got.message(self._index(got, seq, length))
        return got

    def _message_or_record(self, key: str, seq: int, loc: int, length: int) -> Message | Record:
        """The checked record at ``loc`` (cached or read), or, for a record of one message
        not cached, that message at once (the common publish of one: no ``Record``)."""
        seg = self._segment(key, seq, loc)
        off = loc & 0xFFFF_FFFF
        rec = self._cache.get((seg.path, off))
        if rec is not None:
            self._cache.move_to_end((seg.path, off))
            return rec
        data = self._load(seg, off, length)
        if data[_N_AT : _N_AT + 4] == _N_ONE:
            return _decode_one(data, seg.path, off, seq, length)
        return self._decoded(seg, off, data)

    def read_batch(self, key: str, items: Iterable[tuple[int, int, int]]) -> list[Message]:
        """``read`` of each ``(seq, location, length)``; a record read and checked once serves
        all of its messages (the cache keeps the recent ones)."""
        self._check()
        if self._open:
            self._seal(key)
        out: list[Message] = []
        last, rec = -1, None
        first = n = 0
        p: list[int] = []
        h: list[int] = []
        data = b""
        for seq, loc, length in items:
            if loc != last or rec is None:
                got = self._message_or_record(key, seq, loc, length)
                if not isinstance(got, Record):
                    out.append(got)
                    rec = None
                    continue
                rec, last = got, loc
                first, n, p, h, data = rec.first_seq, rec.n, rec.pstart, rec.hstart, rec.data
            # ``rec.message(self._index(rec, seq, length))``, inline: a receive reads ~100
            # messages of a record, and the calls were a third of the read.
            i = seq - first
            if 0 <= i < n:
                ps, pe, hs, he = p[i], p[i + 1], h[i], h[i + 1]
                if PER_MESSAGE + pe - ps + he - hs + (0 if i else REC_OVERHEAD) == length:
                    hdrs = msgpack.unpackb(data[hs:he], raw=False) if he > hs else None
                    out.append((data[ps:pe], hdrs))
                    continue
            self._index(rec, seq, length)  # (raises StorageCorrupt, naming the mismatch)
        return out

    @staticmethod
    def _index(rec: Record, seq: int, length: int) -> int:
        i = seq - rec.first_seq
        if not 0 <= i < rec.n:
            raise StorageCorrupt(
                f"{rec.path}: record at offset {rec.offset} holds seqs"
                f" {rec.first_seq}..{rec.first_seq + rec.n - 1}, not {seq}"
            )
        if rec.share(i) != length:
            raise StorageCorrupt(
                f"{rec.path}: seq {seq} at offset {rec.offset} has length"
                f" {rec.share(i)}, not {length}"
            )
        return i

    def _decoded(self, seg: _Seg, off: int, data: bytes) -> Record:
        rec = decode_record(data, seg.path, off)
        if rec.n > 1:  # a record of one message is read again only by a retry
            self._remember((seg.path, off), rec)
        return rec

    def _segment(self, key: str, seq: int, loc: int) -> _Seg:
        segno = loc >> 32
        st = self._streams.get(key)
        seg = st.segs.get(segno) if st is not None else None
        if seg is None:
            path = os.path.join(self.dir, seg_name(key, segno))
            with self._lock:
                seg = self._gone.get(path)
            if seg is None:
                raise StorageCorrupt(f"{path}: no such segment (reading seq {seq})")
        return seg

    def _load(self, seg: _Seg, off: int, hint: int) -> bytes:
        """The bytes of the record at ``off`` (as long as its header says; not checked
        further). One read in the common case: a record of one message is ``hint`` long."""
        if off < SEG_HEAD or off + REC_OVERHEAD > seg.size:
            raise StorageCorrupt(f"{seg.path}: no record at offset {off} ({seg.size} bytes)")
        data = self._bytes(seg, off, min(max(hint, READ_AHEAD), seg.size - off))
        magic, _, length = _HEAD.unpack_from(data)
        if magic != REC_MAGIC or length < REC_OVERHEAD:
            raise StorageCorrupt(f"{seg.path}: bad record header at offset {off}")
        if off + length > seg.size:
            raise StorageCorrupt(
                f"{seg.path}: record at offset {off} ends past the segment ({seg.size} bytes)"
            )
        if length < len(data):
            return data[:length]
        if length > len(data):
            return data + self._bytes(seg, off + len(data), length - len(data))
        return data

    def _bytes(self, seg: _Seg, off: int, size: int) -> bytes:
        if off >= seg.flushed:
            return bytes(seg.buf[off - seg.flushed : off - seg.flushed + size])
        if off + size > seg.flushed:
            self._flush(seg)
        data = self._pread(seg.path, size, off)
        if len(data) != size:
            raise StorageCorrupt(f"{seg.path}: short read of {size} bytes at offset {off}")
        return data

    def _remember(self, where: tuple[str, int], rec: Record) -> None:
        size = len(rec.data)
        if size > CACHE_BYTES:
            return
        cache = self._cache
        cache[where] = rec
        self._cached += size
        while len(cache) > CACHE_RECORDS or self._cached > CACHE_BYTES:
            self._cached -= len(cache.popitem(last=False)[1].data)

    def _forget_records(self) -> None:
        self._cache.clear()
        self._cached = 0

    def _pread(self, path: str, size: int, offset: int) -> bytes:
        f = self._readers.get(path)
        try:
            if f is None:
                f = self.disk.open_read(path)
                self._readers[path] = f
                if len(self._readers) > READERS:
                    old, r = self._readers.popitem(last=False)
                    self._ahead.pop(old, None)
                    r.close()
            else:
                self._readers.move_to_end(path)
            data = f.pread(size, offset)
            last, asked, ask = self._ahead.get(path, (-1, 0, 0))
            if 0 <= offset - last < WILL_NEED and offset + size > asked - ask // 2:
                start, ask = max(asked, offset + size), min(2 * ask, WILL_NEED) or WILL_NEED_FIRST
                f.will_need(start, ask)
                asked = start + ask
            self._ahead[path] = (offset + size, asked, ask)
            return data
        except OSError as e:
            raise self._fail(path, "read failed", e) from e

    # ------------------------------------------------------------ freeing

    def free(self, key: str, loc: int, length: int) -> None:
        """The state no longer refers to this record (acked by every group, dropped, moved).
        A segment other than the one being appended to is retired when its last one goes."""
        st = self._streams[key]
        seg = st.segs[loc >> 32]
        seg.live -= 1
        seg.live_bytes -= length
        self._live_bytes -= length
        if seg.live <= 0 and seg is not st.tail():
            self._retire(st, seg)

    def clear(self, key: str) -> None:
        """Retire every segment of a stream, which goes on (a purge of the topic)."""
        if self._open:
            self._seal(key)
        st = self._streams.get(key)
        if st is not None:
            for seg in list(st.segs.values()):
                self._retire(st, seg)

    def drop(self, key: str) -> None:
        """Retire every segment of a stream and forget it (the topic is deleted); the key
        must never be appended to again."""
        self.clear(key)
        self._streams.pop(key, None)
        self._dropped.add(key)

    def watermark(self, key: str) -> tuple[int, int]:
        """(segno, offset) where the stream's next record goes (its append position), or
        (-1, 0) for a stream without segments; buffered bytes count (``sync`` makes them
        durable)."""
        st = self._streams.get(key)
        tail = st.tail() if st is not None else None
        return (tail.segno, tail.size) if tail is not None else (-1, 0)

    def stats(self, key: str) -> list[tuple[int, int, int, int]]:
        """(segno, size, live records, live bytes) of each segment of a stream."""
        if self._open:
            self._seal(key)
        st = self._streams.get(key)
        if st is None:
            return []
        return [(s.segno, s.size, s.live, s.live_bytes) for s in st.segs.values()]

    def retained_bytes(self) -> tuple[int, int]:
        """(bytes of the records the state refers to, bytes of the segments holding them):
        the first is what a node-wide limit counts (deterministic, O(1)); the second is at
        most twice it plus a segment per stream once compaction keeps up. Retired segments
        are not counted: their deletion waits only for the next snapshot."""
        return self._live_bytes, self._seg_bytes

    # ------------------------------------------------------------ compaction

    def candidates(self, min_dead: float = 0.5) -> list[tuple[str, int]]:
        """(key, segno) of segments, other than streams' tails, whose dead bytes are at least
        ``min_dead`` of their records' bytes: what a compaction would shrink. Deterministic
        order (streams in creation order, segments ascending)."""
        self.seal()
        out = []
        for st in self._streams.values():
            tail = st.tail()
            for seg in st.segs.values():
                total = seg.size - SEG_HEAD
                if seg is not tail and total and total - seg.live_bytes >= min_dead * total:
                    out.append((st.key, seg.segno))
        return out

    def compact(
        self, key: str, segno: int, is_live: Callable[[int, int], bool]
    ) -> dict[int, tuple[int, int]]:
        """Copy the live messages of a segment (``is_live(seq, loc)``: the caller's index still
        points at that record) to the stream's tail, each run of consecutive live messages of
        a record as a new record, retire the segment, and return ``{seq: (new location,
        length)}`` for the caller's index. Deterministic: the same files and index give the
        same result on every replica."""
        self._check()
        if self._open:
            self._seal(key)
        st = self._streams[key]
        seg = st.segs[segno]
        if seg is st.tail():
            raise ValueError(f"segment {segno} of {key!r} is being appended to")
        self._flush(seg)
        data = self._pread(seg.path, seg.size, 0)
        moved: dict[int, tuple[int, int]] = {}
        for rec in self._records(seg, data):
            loc, first = location(segno, rec.offset), rec.first_seq
            if rec.n == 1:  # the common record of one message: copied as it is
                if is_live(first, loc):
                    moved[first] = (self._put_record(key, rec), len(rec.data))
                continue
            live = [i for i in range(rec.n) if is_live(first + i, loc)]
            if len(live) == rec.n:  # all of it: the same bytes a rewrite would give
                new_loc = self._put_record(key, rec)
                for i, share in enumerate(rec.shares()):
                    moved[first + i] = (new_loc, share)
                continue
            for run in _runs(live):
                raws = [rec.raw(i) for i in run]
                hdrs = [h for _, h in raws]
                new = Encoded(rec.first_seq + run[0], rec.at, [p for p, _ in raws],
                              hdrs if any(hdrs) else None)  # fmt: skip
                locs, shares = self._put(key, new)
                for i, new_loc, share in zip(run, locs, shares, strict=True):
                    moved[rec.first_seq + i] = (new_loc, share)
        if len(moved) != seg.live:  # a bug, not bad luck: stop before anything is lost
            self._broken = StorageError(
                f"{seg.path}: {len(moved)} live messages found, {seg.live} expected:"
                " the index and the store disagree"
            )
            raise self._broken
        self._retire(st, seg)
        return moved

    # ------------------------------------------------------------ durability and restore

    def marks(self) -> tuple[int, Marks]:
        """What a snapshot of the current state needs: per stream its next segment number and
        each live segment's (segno, size, live records, live bytes). Writes the buffers (so an
        export can read everything up to the marks) and returns the epoch to ``commit``."""
        self._check()
        self.seal()
        out: Marks = []
        for st in self._streams.values():
            segs = []
            for seg in st.segs.values():
                self._flush(seg)
                segs.append([seg.segno, seg.size, seg.live, seg.live_bytes])
            out.append([st.key, st.next_segno, segs])
        with self._lock:
            self._epoch += 1
            return self._epoch, out

    def sync(self) -> None:
        """Make every appended byte and every new segment name durable (before a snapshot
        lets the journal drop the entries that wrote them)."""
        self._check()
        self.seal()
        for st in self._streams.values():
            for seg in st.segs.values():
                self._flush(seg)
                if seg.file is not None and seg.dirty:
                    try:
                        if self.fsync:
                            seg.file.sync()
                    except OSError as e:
                        raise self._fail(seg.path, "fdatasync failed", e) from e
                    seg.dirty = False
                if seg.file is not None:  # reopened by the next write: open files stay
                    self._close_writer(seg)  # bounded by the streams written between syncs
        if self._names_dirty:
            if self.fsync:
                try:
                    self.disk.sync_dir(self.dir)
                except OSError as e:
                    raise self._fail(self.dir, "directory fsync failed", e) from e
            self._names_dirty = False

    def retiring(self) -> bool:
        """Are retired segments waiting for a ``commit`` to be deleted?"""
        return bool(self._retired)

    def commit(self, epoch: int) -> None:
        """The snapshot of ``marks()`` epoch ``epoch`` is durable: delete the segments retired
        before it, except pinned ones (deleted when unpinned)."""
        with self._lock:
            self._committed = max(self._committed, epoch)
        self._delete_due()

    def _delete_due(self) -> None:
        with self._lock:
            due = {p for e, p in self._retired if e < self._committed and p not in self._pins}
            self._retired = [(e, p) for e, p in self._retired if p not in due]
            gone = sorted(due)
            for p in gone:
                self._gone.pop(p, None)
        for path in gone:  # a failure only delays the space to the next restore
            with contextlib.suppress(OSError):
                self.disk.remove(path)

    def truncate_to(self, marks: Marks) -> None:
        """Make the files exactly what ``marks`` describe (restore from a snapshot, or ``[]``
        for none): segments not named are removed, the named ones cut to their size (a torn
        or not yet replayed tail). A named segment missing, shorter than its mark or with a
        bad header raises StorageCorrupt naming it: those bytes were synced before the
        snapshot was written."""
        self._close_all()
        self._open = {}  # (dropped, not sealed: the buffers are dropped too, as on a crash)
        self._streams, self._dropped, self._broken = {}, set(), None
        self._live_bytes = self._seg_bytes = 0
        with self._lock:
            self._retired, self._gone = [], {}
        wanted: dict[str, tuple[int, int, int, int]] = {}
        for key, next_segno, segs in marks:
            if not KEY_RE.fullmatch(key) or key in self._streams:
                raise ValueError(f"bad or repeated stream key in marks: {key!r}")
            st = self._streams[key] = _Stream(key, next_segno)
            for segno, size, live, live_bytes in segs:
                if not 0 <= segno < next_segno or size < SEG_HEAD:
                    raise ValueError(f"bad segment in marks: {key!r} {segno} {size}")
                path = os.path.join(self.dir, seg_name(key, segno))
                seg = st.segs[segno] = _Seg(path, segno, size)
                seg.live, seg.live_bytes = live, live_bytes
                self._live_bytes += live_bytes
                self._seg_bytes += size
                wanted[seg_name(key, segno)] = (segno, size, live, live_bytes)
        try:
            names = self.disk.listdir(self.dir)
        except OSError as e:
            raise self._fail(self.dir, "listing failed", e) from e
        sealed = {
            idx_name(key, segno)
            for key, next_segno, segs in marks
            for segno, *_ in segs
            if segno != next_segno - 1
        }
        for name in sorted(names):
            if (name not in wanted and _NAME_RE.fullmatch(name)) or (
                name not in sealed and _IDX_RE.fullmatch(name)
            ):
                try:
                    self.disk.remove(os.path.join(self.dir, name))
                except OSError as e:
                    raise self._fail(os.path.join(self.dir, name), "remove failed", e) from e
        present = set(names)
        for st in self._streams.values():
            for seg in st.segs.values():
                self._cut(seg, present)
        self._ready = True
        for st in self._streams.values():  # the tails go on collecting their sidecars
            tail = st.tail()
            if tail is not None:
                tail.cols = self._scan(tail)

    def _cut(self, seg: _Seg, present: set[str]) -> None:
        name = os.path.basename(seg.path)
        if name not in present:
            raise StorageCorrupt(f"{seg.path}: missing; the snapshot needs {seg.size} bytes")
        try:
            r = self.disk.open_read(seg.path)
            try:
                head = r.pread(SEG_HEAD, 0)
                past = r.pread(1, seg.size)
                whole = len(r.pread(1, seg.size - 1)) == 1
            finally:
                r.close()
        except OSError as e:
            raise self._fail(seg.path, "read failed", e) from e
        if not whole:
            raise StorageCorrupt(
                f"{seg.path}: shorter than the {seg.size} bytes the snapshot needs"
            )
        if head != SEG_MAGIC + _SEG.pack(seg.segno):
            raise StorageCorrupt(f"{seg.path}: bad segment header")
        if past:
            try:
                f = self.disk.open(seg.path)
                try:
                    f.truncate(seg.size)
                    if self.fsync:
                        f.sync()
                finally:
                    f.close()
            except OSError as e:
                raise self._fail(seg.path, "truncate failed", e) from e

    # ------------------------------------------------------------ snapshot transfer

    def pin(self, marks: Marks) -> list[str]:
        """Keep the segments named in ``marks`` on disk (a transfer reads them) until
        ``unpin`` of what this returns."""
        paths = [os.path.join(self.dir, name) for name in files_of(marks)]
        with self._lock:
            for p in paths:
                self._pins[p] = self._pins.get(p, 0) + 1
        return paths

    def unpin(self, paths: list[str]) -> None:
        with self._lock:
            for p in paths:
                n = self._pins.pop(p) - 1
                if n:
                    self._pins[p] = n
        self._delete_due()

    def export(self, marks: Marks, chunk: int = EXPORT_CHUNK) -> Export:
        """The segments ``marks`` names, up to their marked sizes, as frames of at most
        ``chunk`` data bytes, read from the files (never the whole backlog in memory). Call it
        where the marks were taken (the apply thread): the segments are pinned at once, until
        the export is exhausted or closed. Iterating is safe on another thread."""
        self.seal()
        return Export(self, marks, chunk)

    def install(self, staging: str) -> None:
        """Move a complete import (``StoreImporter.finish``) into the store directory; then
        call ``truncate_to`` with the marks of the installed (or the restored) snapshot. Safe
        to repeat after a crash: a file of the same name holds the same byte prefix on every
        replica, and the import's is at least as long as a local older snapshot needs."""
        try:
            names = self.disk.listdir(staging)
        except OSError as e:
            raise StorageError(f"{staging}: {e}") from e
        if COMPLETE not in names:
            raise StorageError(f"{staging}: import not complete")
        self.seal()
        self._close_all()
        self._ready = False
        try:
            for name in sorted(names):
                if _NAME_RE.fullmatch(name):
                    self.disk.rename(os.path.join(staging, name), os.path.join(self.dir, name))
            if self.fsync:
                self.disk.sync_dir(self.dir)
            self.disk.remove(os.path.join(staging, COMPLETE))
        except OSError as e:
            raise StorageError(f"{staging}: install failed: {e}") from e

    # ------------------------------------------------------------ internals

    def _check(self) -> None:
        if self._broken is not None:
            raise self._broken
        if not self._ready:
            raise RuntimeError("SegmentStore used before truncate_to()")

    def _fail(self, path: str, what: str, e: OSError) -> StorageError:
        full = "No space left on device (ENOSPC)" if e.errno == errno.ENOSPC else str(e)
        self._broken = StorageError(f"{path}: {what}: {full}")
        return self._broken

    def _new_stream(self, key: str) -> _Stream:
        if not KEY_RE.fullmatch(key):
            raise ValueError(f"bad stream key {key!r}")
        if key in self._dropped:
            raise ValueError(f"stream {key!r} was dropped; keys are never reused")
        st = self._streams[key] = _Stream(key, 0)
        return st

    def _roll(self, st: _Stream) -> _Seg:
        old = st.tail()
        segno = st.next_segno
        if segno > MAX_SEGNO:
            raise StorageError(f"stream {st.key!r}: out of segment numbers")
        st.next_segno += 1
        if old is not None:
            self._flush(old)
            if old.live <= 0:
                self._retire(st, old)
            else:
                self._write_sidecar(old)
        path = os.path.join(self.dir, seg_name(st.key, segno))
        seg = st.segs[segno] = _Seg(path, segno, 0)
        seg.buf += SEG_MAGIC + _SEG.pack(segno)
        seg.size = SEG_HEAD
        seg.cols = Columns()
        self._seg_bytes += SEG_HEAD
        try:
            seg.file = self.disk.create(path)
        except OSError as e:
            raise self._fail(path, "create failed", e) from e
        self._names_dirty = True
        return seg

    def _write_sidecar(self, seg: _Seg) -> None:
        cols, seg.cols = seg.cols, None
        if cols is None:
            return
        path = seg.path[: -len(".seg")] + ".idx"
        try:  # no fsync: a cache, checked when read
            f = self.disk.create(path)
            try:
                f.write(cols.encode(seg.segno, seg.size))
            finally:
                f.close()
        except OSError as e:
            raise self._fail(path, "write failed", e) from e

    def columns(self, key: str) -> Iterator[tuple[int, Columns]]:
        """(segno, its records' columns) of each segment of a stream, from the sidecars, or
        by scanning the segment where there is none (or it is bad)."""
        self._check()
        if self._open:
            self._seal(key)
        st = self._streams.get(key)
        for seg in list(st.segs.values()) if st is not None else []:
            if seg.cols is not None:
                yield seg.segno, seg.cols
                continue
            data = self.disk.read(seg.path[: -len(".seg")] + ".idx")
            cols = Columns.decode(data, seg.segno, seg.size) if data is not None else None
            if cols is None:  # none yet (an imported segment) or bad: scan, and keep it
                cols = seg.cols = self._scan(seg)
                self._write_sidecar(seg)
            yield seg.segno, cols

    def _scan(self, seg: _Seg) -> Columns:
        self._flush(seg)
        data = self._pread(seg.path, seg.size, 0)
        cols = Columns()
        for rec in self._records(seg, data):
            _add_columns(cols, rec, rec.offset)
        return cols

    def _put_record(self, key: str, rec: Record) -> int:
        """Append a copy of a checked record (compaction); returns its new location."""
        seg = self._tail_for(key)
        off = seg.size
        if seg.cols is not None:
            _add_columns(seg.cols, rec, off)
        seg.buf += rec.data
        self._grew(seg, len(rec.data), rec.n)
        return location(seg.segno, off)

    def _records(self, seg: _Seg, data: bytes) -> Iterator[Record]:
        """The records of a segment's bytes, each checked."""
        if len(data) != seg.size:
            raise StorageCorrupt(f"{seg.path}: {len(data)} bytes on disk, expected {seg.size}")
        off = SEG_HEAD
        while off < seg.size:
            if off + REC_OVERHEAD > seg.size:
                raise StorageCorrupt(f"{seg.path}: short record at offset {off}")
            length = _REC.unpack_from(data, off)[2]
            if length < REC_OVERHEAD:
                raise StorageCorrupt(f"{seg.path}: bad record header at offset {off}")
            yield decode_record(data[off : off + length], seg.path, off)
            off += length

    def _flush(self, seg: _Seg) -> None:
        if not seg.buf:
            return
        try:
            if seg.file is None:
                seg.file = self.disk.open(seg.path)
            seg.file.write_at(seg.flushed, seg.buf)  # (no copy: a new buf follows)
        except OSError as e:
            raise self._fail(seg.path, "write failed", e) from e
        seg.flushed += len(seg.buf)  # (not seg.size: it counts an open record already)
        seg.buf = bytearray()
        seg.dirty = True
        if seg.flushed - seg.hinted >= self.writeback_bytes:
            end = seg.flushed & ~4095  # whole pages: the next write goes on from a page that is
            seg.file.start_writeback(seg.hinted, end - seg.hinted)  # not under writeback
            seg.hinted = end

    def _retire(self, st: _Stream, seg: _Seg) -> None:
        del st.segs[seg.segno]
        self._live_bytes -= seg.live_bytes
        self._seg_bytes -= seg.size
        self._flush(seg)  # readable until deleted: results of this batch may still point here
        seg.cols = None
        if seg.file is not None:
            self._close_writer(seg)
        with self._lock:
            self._gone[seg.path] = seg
            self._retired.append((self._epoch, seg.path))
            self._retired.append((self._epoch, seg.path[: -len(".seg")] + ".idx"))

    def _close_writer(self, seg: _Seg) -> None:
        f, seg.file = seg.file, None
        if f is not None:
            with contextlib.suppress(OSError):
                f.close()

    def _forget_reader(self, path: str) -> None:
        r = self._readers.pop(path, None)
        self._ahead.pop(path, None)
        if r is not None:
            with contextlib.suppress(OSError):
                r.close()

    def _close_all(self) -> None:
        self._forget_records()
        for st in self._streams.values():
            for seg in st.segs.values():
                self._close_writer(seg)
        for path in list(self._readers):
            self._forget_reader(path)

    def close(self) -> None:
        """Write the buffers (not synced: the journal replays what a power loss drops) and
        close every file."""
        if self._broken is None and self._ready:
            self.seal()
            for st in self._streams.values():
                for seg in st.segs.values():
                    self._flush(seg)
        self._close_all()


class Export:
    """An iterator of export frames holding pins on the segments it reads; ``close()`` (or
    ``with``) when abandoned early."""

    def __init__(self, store: SegmentStore, marks: Marks, chunk: int) -> None:
        self._store, self._paths = store, store.pin(marks)
        self._frames = self._gen(marks, chunk)

    def __iter__(self) -> Export:
        return self

    def __next__(self) -> bytes:
        try:
            return next(self._frames)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Export:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        paths, self._paths = self._paths, []
        if paths:
            self._frames.close()
            self._store.unpin(paths)

    def _gen(self, marks: Marks, chunk: int) -> Generator[bytes, None, None]:
        disk, directory = self._store.disk, self._store.dir
        for key, _, segs in marks:
            for segno, size, _, _ in segs:
                name = seg_name(key, segno)
                raw = name.encode()
                path = os.path.join(directory, name)
                try:
                    r = disk.open_read(path)
                    try:
                        for off in range(0, size, chunk):
                            data = r.pread(min(chunk, size - off), off)
                            if len(data) != min(chunk, size - off):
                                raise StorageCorrupt(f"{path}: short read at offset {off}")
                            yield _FRAME.pack(len(raw), off, len(data)) + raw + data
                    finally:
                        r.close()
                except OSError as e:
                    raise StorageError(f"{path}: export failed: {e}") from e


class StoreImporter:
    """Writes the frames of an ``export`` into ``staging`` (a directory of its own), file by
    file, in order; ``finish`` syncs them and marks the import complete for
    ``SegmentStore.install``."""

    def __init__(self, disk: StoreDisk, staging: str, fsync: bool = True) -> None:
        self.disk, self.dir, self.fsync = disk, staging, fsync
        os.makedirs(staging, exist_ok=True)
        for name in disk.listdir(staging):  # a previous attempt's leftovers
            disk.remove(os.path.join(staging, name))
        self._files: dict[str, tuple[DiskFile, int]] = {}

    def feed(self, chunk: bytes) -> None:
        view = memoryview(chunk)
        while view:
            if len(view) < _FRAME.size:
                raise StorageError(f"{self.dir}: truncated export frame")
            nlen, off, dlen = _FRAME.unpack_from(view)
            end = _FRAME.size + nlen + dlen
            if len(view) < end:
                raise StorageError(f"{self.dir}: truncated export frame")
            name = bytes(view[_FRAME.size : _FRAME.size + nlen]).decode("ascii", "replace")
            if not _NAME_RE.fullmatch(name):
                raise StorageError(f"{self.dir}: bad segment name in export: {name!r}")
            path = os.path.join(self.dir, name)
            f, size = self._files.get(name) or (None, 0)
            if off != size:
                raise StorageError(f"{path}: export frame at {off}, expected {size}")
            try:
                if f is None:
                    f = self.disk.create(path)
                f.write(view[_FRAME.size + nlen : end])
            except OSError as e:
                raise StorageError(f"{path}: import write failed: {e}") from e
            self._files[name] = (f, size + dlen)
            view = view[end:]

    def finish(self) -> list[str]:
        """Sync every file and the directory, then mark the import complete."""
        for name, (f, _) in self._files.items():
            path = os.path.join(self.dir, name)
            try:
                if self.fsync:
                    f.sync()
                f.close()
            except OSError as e:
                raise StorageError(f"{path}: import sync failed: {e}") from e
        marker = self.disk.create(os.path.join(self.dir, COMPLETE))
        marker.close()
        if self.fsync:
            self.disk.sync_dir(self.dir)
        return sorted(self._files)

    def abort(self) -> None:
        for f, _ in self._files.values():
            with contextlib.suppress(OSError):
                f.close()
        for name in self.disk.listdir(self.dir):
            with contextlib.suppress(OSError):
                self.disk.remove(os.path.join(self.dir, name))


def _add_columns(cols: Columns, rec: Record, offset: int) -> None:
    if rec.n == 1:
        cols.add_one(rec.first_seq, rec.at, offset, len(rec.data), rec.pstart[1] - rec.pstart[0])
    else:
        cols.add(rec.first_seq, rec.at, offset, rec.shares(), rec.sizes())


def _runs(indexes: list[int]) -> Iterator[list[int]]:
    """Runs of consecutive numbers of an ascending list."""
    run: list[int] = []
    for i in indexes:
        if run and i != run[-1] + 1:
            yield run
            run = []
        run.append(i)
    if run:
        yield run


def files_of(marks: Sequence[Sequence[Any]]) -> list[str]:
    """The segment file names a snapshot's marks refer to."""
    return [seg_name(key, s[0]) for key, _, segs in marks for s in segs]


def sync_marked(disk: StoreDisk, directory: str, marks: Marks) -> None:
    """fdatasync every segment ``marks`` names, then the directory, by path: for a snapshot
    writer in another process (a forked one), so the apply thread does not wait for the disk.
    Syncing a file through any descriptor flushes all of its written pages."""
    for name in files_of(marks):
        path = os.path.join(directory, name)
        try:
            f = disk.open(path)
            try:
                f.sync()
            finally:
                f.close()
        except OSError as e:
            raise StorageError(f"{path}: fdatasync failed: {e}") from e
    try:
        disk.sync_dir(directory)
    except OSError as e:
        raise StorageError(f"{directory}: directory fsync failed: {e}") from e
