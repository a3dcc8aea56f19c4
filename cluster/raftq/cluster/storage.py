"""Durable files of one Raft node: the disk layer, term/vote meta, the commit mark, snapshot blobs.

Every byte goes through a ``Disk`` (``OsDisk`` in production) so tests can inject a layer that
records what was synced and simulate power loss (the journal, ``journal.py``, and the payload
store, ``segstore.py``, write through it too). Rules kept here:

* small files (meta, snapshots) are replaced atomically: temp file, fsync, rename, directory
  fsync; the commit mark (``CommitMark``) likewise but without fsync: it is only a hint;
* a blob (``seal``) carries a magic, its length and a CRC32; ``unseal`` of a damaged one is
  ``StorageCorrupt`` naming the file;
* a file no longer needed can be removed a few MB at a time (``OsDisk.remove_slowly``), so a
  GB of deleted segments does not stall the disk for everyone else.

An I/O failure is a ``StorageError`` (the node must stop), damage a ``StorageCorrupt``. This
module never imports pysyncobj.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import struct
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Protocol

import msgpack

log = logging.getLogger(__name__)

FREE_STEP = 4 << 20  # OsDisk.remove_slowly frees this much at a time...
FREE_PAUSE = 0.002  # ...and waits this long (seconds) in between
BLOB_MAGIC = b"RAFTQB1\n"
_BLOB = struct.Struct("<QI")  # length, crc32


class StorageError(Exception):
    """An I/O failure of the journal/meta/snapshot files; the node must stop."""


class StorageCorrupt(StorageError):
    """A file failed its checksum somewhere other than a torn tail."""


class DiskFile(Protocol):
    def write(self, data: bytes | memoryview) -> None: ...  # sequentially from offset 0
    def write_at(self, offset: int, data: bytes | bytearray) -> None: ...
    def truncate(self, size: int) -> None: ...
    def sync(self) -> None: ...
    def start_writeback(self, offset: int, size: int) -> None: ...  # a hint: see _OsFile
    def close(self) -> None: ...


class ReadFile(Protocol):
    def pread(self, size: int, offset: int) -> bytes: ...  # shorter at the end of the file
    def will_need(self, offset: int, size: int) -> None: ...  # a hint: see _OsReader
    def close(self) -> None: ...


class Disk(Protocol):
    def read(self, path: str) -> bytes | None: ...  # None when missing
    def open_read(self, path: str) -> ReadFile: ...  # raises when missing
    def open(self, path: str) -> DiskFile: ...  # for write_at; creates when missing
    def create(self, path: str) -> DiskFile: ...  # creates or empties
    def rename(self, src: str, dst: str) -> None: ...
    def remove(self, path: str) -> None: ...
    def remove_slowly(self, path: str) -> None: ...  # remove, off the tick thread: see OsDisk
    def sync_dir(self, path: str) -> None: ...
    def listdir(self, path: str) -> list[str]: ...


def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """Linux's sync_file_range(2), which ``os`` does not bind (ctypes; None elsewhere)."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_SYNC_FILE_RANGE = _sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2


class _OsFile:
    def __init__(self, path: str, flags: int) -> None:
        self.fd = os.open(path, flags | os.O_WRONLY | os.O_CREAT, 0o644)

    def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]

    def write_at(self, offset: int, data: bytes | bytearray) -> None:
        view = memoryview(data)
        while view:
            n = os.pwrite(self.fd, view, offset)
            view, offset = view[n:], offset + n

    def truncate(self, size: int) -> None:
        os.ftruncate(self.fd, size)

    def sync(self) -> None:
        os.fdatasync(self.fd)

    def start_writeback(self, offset: int, size: int) -> None:
        """Start writing these bytes to the device, without waiting and without making them
        durable (``sync`` does). A hint (its failure shows at the ``sync`` that matters): the
        32 MB the segment store wrote between two snapshots took 30-45 ms to sync and stalled
        the journal's fsyncs as long; started 1 MB at a time as it is written, the journal's
        longest fsync alongside is ~1.5 ms (measured here)."""
        if _SYNC_FILE_RANGE is not None:
            _SYNC_FILE_RANGE(self.fd, offset, size, _SYNC_FILE_RANGE_WRITE)

    def close(self) -> None:
        os.close(self.fd)


class _OsReader:
    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDONLY)

    def pread(self, size: int, offset: int) -> bytes:
        return os.pread(self.fd, size, offset)

    def will_need(self, offset: int, size: int) -> None:
        """Start reading ``size`` bytes at ``offset`` into the page cache, not waiting for
        them (posix_fadvise WILLNEED; where there is none, nothing). A hint: a failure is
        no reason to stop."""
        if hasattr(os, "posix_fadvise"):
            with contextlib.suppress(OSError):
                os.posix_fadvise(self.fd, offset, size, os.POSIX_FADV_WILLNEED)

    def close(self) -> None:
        os.close(self.fd)


class OsDisk:
    """The real file system."""

    def open_read(self, path: str) -> ReadFile:
        """For reads at offsets (the segment store); raises FileNotFoundError when missing."""
        return _OsReader(path)

    def read(self, path: str) -> bytes | None:
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def open(self, path: str) -> DiskFile:
        return _OsFile(path, 0)

    def create(self, path: str) -> DiskFile:
        return _OsFile(path, os.O_TRUNC)

    def rename(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def remove(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    def remove_slowly(self, path: str) -> None:
        """``remove``, the file's blocks then freed ``FREE_STEP`` at a time with a pause
        between (it sleeps: background threads only). Freeing a 40 MB file at once stalled a
        concurrent journal fdatasync ~6.5 ms here (ext4 mounted with ``discard``); in 4 MB
        steps, ~1 ms. The name goes first, durably, so a crash half-way leaves what an
        unlink does. (A reader that had the file open sees it cut: nothing in raftq has an
        old journal segment open.)"""
        try:
            fd = os.open(path, os.O_WRONLY)
        except FileNotFoundError:
            return
        except OSError:  # (no write permission: unlinking may still work)
            self.remove(path)
            return
        try:
            os.unlink(path)
            self.sync_dir(os.path.dirname(path) or ".")
            size = os.fstat(fd).st_size
            while size > 0:
                size = max(0, size - FREE_STEP)
                os.ftruncate(fd, size)
                if size:
                    time.sleep(FREE_PAUSE)
        finally:
            os.close(fd)

    def sync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)


def write_atomic(
    disk: Disk,
    path: str,
    data: bytes | Sequence[bytes],
    fsync: bool,
    tmp: str = ".tmp",
    chunk: int = 0,
) -> None:
    """Replace ``path`` with ``data`` (or its parts, in order): temp file, fsync, rename,
    directory fsync. Writers that may run at the same time (a snapshot writer and a snapshot
    install) use distinct ``tmp`` suffixes. With ``chunk``, the file is also synced every
    ``chunk`` bytes: a background writer's one fdatasync of a 70 MB snapshot held the journal
    fsyncs sharing the disk for 0.1-0.2 s."""
    tmp = path + tmp
    f = disk.create(tmp)
    parts = [data] if isinstance(data, bytes | bytearray) else data
    unsynced = 0
    try:
        for part in parts:
            view = memoryview(part)
            step = chunk or max(len(view), 1)
            for off in range(0, len(view), step):
                piece = view[off : off + step]
                f.write(piece)
                unsynced += len(piece)
                if fsync and chunk and unsynced >= chunk:
                    f.sync()
                    unsynced = 0
        if fsync and (unsynced or not chunk):
            f.sync()
    finally:
        f.close()
    disk.rename(tmp, path)
    if fsync:
        disk.sync_dir(os.path.dirname(path) or ".")


def seal_parts(parts: Sequence[bytes]) -> list[bytes]:
    """``seal`` of the parts joined, without joining them (snapshots: ~65 MB copied twice)."""
    crc = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
    return [BLOB_MAGIC + _BLOB.pack(sum(len(p) for p in parts), crc), *parts]


def seal(payload: bytes) -> bytes:
    """Frame a blob with magic, length and CRC32 (meta and snapshot files)."""
    return BLOB_MAGIC + _BLOB.pack(len(payload), zlib.crc32(payload)) + payload


def unseal(data: bytes, path: str) -> bytes:
    head = len(BLOB_MAGIC) + _BLOB.size
    if len(data) < head or not data.startswith(BLOB_MAGIC):
        raise StorageCorrupt(f"{path}: not a raftq file or truncated header")
    size, crc = _BLOB.unpack_from(data, len(BLOB_MAGIC))
    payload = data[head : head + size]
    if len(payload) != size or zlib.crc32(payload) != crc:
        raise StorageCorrupt(f"{path}: checksum mismatch ({len(data)} bytes on disk)")
    return payload


class MetaStore:
    """currentTerm and votedFor, durable before any message reflecting them is sent."""

    def __init__(self, disk: Disk, path: str, fsync: bool) -> None:
        self.disk, self.path, self.fsync = disk, path, fsync
        data = disk.read(path)
        self.term, self.voted_for = 0, None
        if data is not None:
            obj = msgpack.unpackb(unseal(data, path), raw=False)
            self.term, self.voted_for = int(obj["term"]), obj["vote"]

    def store(self, term: int, voted_for: str | None) -> None:
        if (term, voted_for) == (self.term, self.voted_for):
            return
        blob = seal(msgpack.packb({"term": term, "vote": voted_for}))
        try:
            write_atomic(self.disk, self.path, blob, self.fsync)
        except OSError as e:
            raise StorageError(f"{self.path}: {e}") from e
        self.term, self.voted_for = term, voted_for


class CommitMark:
    """The highest index known to be committed, and its entry's term, so a restarted node can
    apply its journal up to there before it hears from a leader (pysyncobj relearns the commit
    index from the leader; after a full-cluster restart nothing was applied until a leader
    was elected, and that leader then applied the whole journal in one tick, missing its
    heartbeats). Written without fsync, at most once a second and at stop: an index once
    committed stays committed, so an old or lost mark only means replaying less; a damaged
    one is ignored."""

    def __init__(self, disk: Disk, path: str) -> None:
        self.disk, self.path = disk, path
        self.index, self.term = 0, 0
        data = disk.read(path)
        if data is not None:
            try:
                obj = msgpack.unpackb(unseal(data, path), raw=False)
                self.index, self.term = int(obj["index"]), int(obj["term"])
            except Exception as e:  # a hint only: never a reason not to start
                log.warning("%s ignored: %s", path, e)

    def store(self, index: int, term: int) -> None:
        blob = seal(msgpack.packb({"index": index, "term": term}))
        write_atomic(self.disk, self.path, blob, fsync=False)
        self.index, self.term = index, term
