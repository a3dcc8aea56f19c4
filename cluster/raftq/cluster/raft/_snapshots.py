"""Snapshots: pysyncobj's serializer replaced by sealed msgpack files written by a forked child,
sent to followers in chunks, and the jittered thresholds that start them.

A snapshot holds the broker's metadata and the payload store's *marks* (per stream, its
segments and their sizes), not the payloads. The marks are taken under the apply lock before
the fork; the child makes the marked segment bytes durable (``segstore.sync_marked``) before
it writes the snapshot file, and once that file is durable ``store.commit`` may delete the
segments retired before it. A follower that needs the snapshot gets it in parts: ``S`` (the
snapshot file's bytes), ``F`` (frames of the marked segment files, read from disk by an
``Export``), ``E`` (the end); it writes the frames with a ``StoreImporter`` into
``store.incoming`` and the node installs them before restoring (``RaftNode._restore``).

A light state (``Broker.snapshot_cost`` under ``INLINE_SNAPSHOT_US``: no big dedup window or
crowd of in-flight deliveries) is serialized in place on the tick thread instead, and a thread
syncs the marks and writes the file: a fork and the copy-on-write faults it makes the node pay
while the child lives cost more than serializing a few MB (1 KiB publishes, paired A/B: CPU
per message -5 %, batch publish rate +11 %)."""

from __future__ import annotations

import concurrent.futures.thread  # noqa: F401  (see below)
import contextlib
import logging
import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import msgpack

from raftq.cluster.journal import Entry
from raftq.cluster.raft._files import drop_inherited_locks
from raftq.cluster.raft._seam import SERIALIZER_STATE, Raft, make_node
from raftq.cluster.raft._tuning import (
    COMPACTION_BYTES,
    INLINE_SNAPSHOT_US,
    SNAPSHOT_SYNC_EVERY,
)
from raftq.cluster.segstore import Export, Marks, StoreImporter, sync_marked
from raftq.cluster.state import Broker
from raftq.cluster.storage import (
    Disk,
    StorageCorrupt,
    StorageError,
    seal_parts,
    unseal,
    write_atomic,
)

if TYPE_CHECKING:
    from raftq.cluster.raft._node import RaftNode

log = logging.getLogger("raftq.cluster.raft")  # one logger for the whole package

# Imported above, before any fork, for its at-fork hooks: Python runs the after-fork hooks
# registered while a fork was under way even though their before-fork half never ran, so when
# asyncio's first run_in_executor imported it lazily during a snapshot writer's fork, the
# parent released the executor's global lock under the thread that held it ("release unlocked
# lock" from a node's first getaddrinfo, seen about once in ten cluster restarts).


class _Snapshots:
    """pysyncobj's serializer interface: checkSerializing, serialize, deserialize and the
    snapshot transmissions (camelCase names are pysyncobj's).

    File layout: ``seal(msgpack([1, last_entry, prev_entry, [[addr, id, api], ...],
    broker_snapshot]))``.
    """

    def __init__(
        self,
        owner: RaftNode,
        raft: Raft,
        disk: Disk | None,
        path: str | None,
        chunk: int,
        compaction_entries: int,
        inline_us: int = INLINE_SNAPSHOT_US,
    ) -> None:
        self._owner = owner
        self._raft = raft
        self._disk = disk
        self._path = path
        self._chunk = chunk
        self._inline_us = inline_us  # (-1: always fork, for tests)
        self._pid = 0  # a forked writer's
        self._writer: threading.Thread | None = None  # or the thread writing a light one
        self._wrote: bool | None = None  # (its outcome)
        self._id: Any = None
        self._mem: bytes | None = None  # in-memory mode, and a received snapshot to load
        self._mem_done = False
        self._started = 0.0
        self._retry_at = 0.0
        self._aborted = False
        self._loaded: tuple[Entry, Entry, list[Any], bytes] | None = None
        self._tx: dict[Any, _Tx] = {}
        self._rx: bytearray | None = None
        self._importer: StoreImporter | None = None
        self._epoch = 0  # the store's epoch of the snapshot being written (store.commit)
        self.installed = False  # the next deserialize() is a snapshot install, not startup
        # Thresholds of the next snapshot (see _jitter): pysyncobj counts entries (rearm); entry
        # bytes applied are counted here (by Proposals.apply, which calls force_by_bytes).
        self.compaction_entries = compaction_entries
        self.since_compaction = 0
        self.last_bytes = 0  # the size of the last snapshot written
        self.compaction_bytes = _jitter(COMPACTION_BYTES)

    def rearm(self) -> None:
        """A new entry-count threshold for the next snapshot."""
        self._raft.set_compaction_entries(int(_jitter(self.compaction_entries)))

    def force_by_bytes(self) -> None:
        """``compaction_bytes`` of entries applied since the last: snapshot now."""
        self.since_compaction = 0
        self.compaction_bytes = _jitter(max(COMPACTION_BYTES, self.last_bytes))
        self._raft.force_compaction()  # taken up by pysyncobj's next compaction check

    def _blob(self, data: Any, marks: Marks) -> list[bytes]:
        """The snapshot file's bytes in parts: ``seal(msgpack(body))`` without copying the
        broker's snapshot twice more."""
        last, prev, cluster = data[1], data[2], data[3]
        nodes = [
            [n.id, getattr(n, "raftq_id", n.id), getattr(n, "raftq_api", "")]
            for n in sorted(cluster, key=lambda n: str(n.id))
        ]
        snap = self._owner.broker.snapshot(marks)
        head = msgpack.packb([1, list(last), list(prev), nodes], use_bin_type=True)
        # A five-element array: the four above (after their one-byte array header) + bin(snap).
        return seal_parts([b"\x95", head[1:], _bin_header(len(snap)), snap])

    def serialize(self, data: Any, id_: Any) -> None:
        if self._busy() or self._mem_done or time.monotonic() < self._retry_at:
            return  # (pysyncobj asks again every tick after a failure)
        self._id = id_
        self._started = time.monotonic()
        owner = self._owner
        store = owner.broker.store
        with owner._lock:  # (a peek on another thread reads, and so flushes, the store)
            self._epoch, marks = store.marks()
            light = owner.broker.snapshot_cost() <= self._inline_us
            try:
                blob = self._blob(data, marks) if light or self._disk is None else None
            except Exception:  # a bug: as a forked writer's failure (the journal is kept)
                log.exception("snapshot %s: serializing failed; retrying in 30 s", self._path)
                self._retry_at = time.monotonic() + 30
                return
        if self._disk is None or self._path is None:
            assert blob is not None
            self._mem = b"".join(blob)
            self._mem_done = True
            return
        # The entries this snapshot covers then sit in older journal segments only: the
        # compaction after it deletes them instead of rewriting the rest.
        journal = self._owner._journal
        if journal is not None:
            journal.roll(id_)
        if blob is not None:
            self._wrote = None
            self._writer = threading.Thread(
                target=self._write, args=(marks, blob), name="snapshot-writer", daemon=True
            )
            self._writer.start()
            return
        # A forked child writes the snapshot from a copy-on-write image of the state, so the
        # tick thread (heartbeats) never waits for it: 1M messages take seconds to serialize.
        try:
            pid = os.fork()
        except OSError as e:
            log.error("snapshot %s: cannot fork the writer: %s; retrying in 30 s", self._path, e)
            self._retry_at = time.monotonic() + 30
            return
        if pid == 0:  # pragma: no cover - child process
            code = 1
            try:
                drop_inherited_locks()
                if self._owner.fsync:  # the journal drops what wrote these bytes
                    sync_marked(store.disk, store.dir, marks)
                blob = self._blob(data, marks)
                write_atomic(
                    self._disk, self._path, blob, self._owner.fsync, ".w.tmp", SNAPSHOT_SYNC_EVERY
                )
                code = 0
            finally:
                os._exit(code)
        self._pid = pid

    def _write(self, marks: Marks, blob: list[bytes]) -> None:
        """The writer thread of a light snapshot: what the forked child does, but the state
        is serialized already."""
        store = self._owner.broker.store
        try:
            if self._owner.fsync:
                sync_marked(store.disk, store.dir, marks)
            assert self._disk is not None and self._path is not None
            write_atomic(
                self._disk, self._path, blob, self._owner.fsync, ".w.tmp", SNAPSHOT_SYNC_EVERY
            )
            self._wrote = True
        except BaseException as e:  # (reported by checkSerializing, on the tick thread)
            log.error("snapshot %s: writer thread failed: %r", self._path, e)
            self._wrote = False

    def _busy(self) -> bool:
        return bool(self._pid) or self._writer is not None

    def abort_writer(self) -> None:
        """Stop a writer of an older state before another snapshot file replaces it (an
        install) or the node lets go of its directory: a child is killed; a thread, which
        cannot be, is waited for (a light state's file: small; its rename then comes first)."""
        if self._writer is not None:
            self._writer.join()
            self._writer = None
            self._aborted = True
            return
        if not self._pid:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._pid, signal.SIGKILL)
        os.waitpid(self._pid, 0)
        self._pid = 0
        self._aborted = True

    def checkSerializing(self) -> tuple[int, Any]:
        if self._aborted:
            self._aborted = False
            return SERIALIZER_STATE.FAILED, self._id
        if self._mem_done:
            self._mem_done = False
            self.rearm()
            self._written()
            return SERIALIZER_STATE.SUCCESS, self._id
        if self._writer is not None:
            if self._writer.is_alive():
                return SERIALIZER_STATE.SERIALIZING, self._id
            self._writer = None
            status = 0 if self._wrote else 1
        elif not self._pid:
            return SERIALIZER_STATE.NOT_SERIALIZING, None
        else:
            pid, status = os.waitpid(self._pid, os.WNOHANG)
            if pid == 0:
                return SERIALIZER_STATE.SERIALIZING, self._id
            self._pid = 0
        if status == 0:
            self.rearm()
            self._written()
            ms = int((time.monotonic() - self._started) * 1000)
            self._owner.stats["snapshots"] += 1
            self._owner.stats["last_snapshot_ms"] = ms
            self._owner.stats["last_snapshot_timestamp_ms"] = int(time.time() * 1000)
            log.info(
                "raft %s: snapshot up to entry %s written in %d ms",
                self._owner.config.node_id,
                self._id,
                ms,
            )
            return SERIALIZER_STATE.SUCCESS, self._id
        log.error(
            "snapshot %s: writer failed (status %d); journal kept, retrying in 30 s",
            self._path,
            status,
        )
        self._retry_at = time.monotonic() + 30
        return SERIALIZER_STATE.FAILED, self._id

    def _written(self) -> None:
        """A new snapshot is durable: transfers of the older one end (their followers ask
        again and get this one), and segments retired before it may go."""
        self.cancel_all()
        self._owner.broker.store.commit(self._epoch)
        # The next snapshot comes after as many entry bytes as this one holds (at least
        # COMPACTION_BYTES): a big dedup window never makes snapshots most of the writes.
        if self._mem is not None:
            self.last_bytes = len(self._mem)
        elif self._path is not None:
            with contextlib.suppress(OSError):
                self.last_bytes = os.path.getsize(self._path)
        self.compaction_bytes = _jitter(max(COMPACTION_BYTES, self.last_bytes))

    def cancel_all(self) -> None:
        for tx in self._tx.values():
            tx.close()
        self._tx.clear()

    def _read(self) -> bytes | None:
        if self._mem is not None:
            return self._mem
        if self._disk is None or self._path is None:
            return None
        return self._disk.read(self._path)

    def exists(self) -> bool:
        return self._read() is not None

    def load(self) -> tuple[Entry, Entry, list[Any], bytes]:
        """Read, check and decode the snapshot: (last entry, previous entry, nodes, state)."""
        blob = self._read()
        if blob is None:
            raise StorageError(f"{self._path}: snapshot missing")
        body = msgpack.unpackb(unseal(blob, str(self._path)), raw=False)
        if not isinstance(body, list) or len(body) != 5 or body[0] != 1:
            raise StorageCorrupt(f"{self._path}: unknown snapshot version")
        _, last, prev, nodes, snap = body
        last_e = (bytes(last[0]), int(last[1]), int(last[2]))
        prev_e = (bytes(prev[0]), int(prev[1]), int(prev[2]))
        return last_e, prev_e, nodes, snap

    def preload(self) -> tuple[Entry, Entry, list[Any], bytes]:
        """At start: ``load``, kept for the ``deserialize`` that follows."""
        self._loaded = loaded = self.load()
        return loaded

    def deserialize(self) -> tuple[Any, ...]:
        try:
            loaded, self._loaded = self._loaded, None
            last_e, prev_e, nodes, snap = loaded if loaded is not None else self.load()
            cluster = [make_node(addr, nid, api) for addr, nid, api in nodes]
            self._owner._restore(snap, nodes, last_e[1], install=self.installed)
            log.info(
                "raft %s: %s snapshot up to entry %d (%d bytes of state)",
                self._owner.config.node_id,
                "installed the leader's" if self.installed else "loaded the",
                last_e[1],
                len(snap),
            )
        except Exception as e:
            err = e if isinstance(e, StorageError) else StorageError(f"{self._path}: {e!r}")
            self._owner._fail(err)
            raise err from e
        finally:
            self.installed = False
            if self._disk is not None:
                self._mem = None
        return (None, last_e, prev_e, cluster)

    def getTransmissionData(self, key: Any) -> tuple[bytes, bool, bool] | None:
        """The next part of the snapshot for follower ``key`` (pysyncobj's tick thread, which
        applies too: the export pins its segments where the marks hold)."""
        if self._busy():
            return None
        tx = self._tx.get(key)
        first = tx is None
        if tx is None:
            blob = self._read()
            if blob is None:
                return None
            # (In memory, a snapshot carries its segment bytes itself: see Broker.snapshot.)
            tx = self._tx[key] = _Tx(blob, self._chunk, files=self._disk is not None)
        try:
            part = tx.next_part(self._owner.broker.store)
        except StorageError as e:
            self._tx.pop(key, None)
            tx.close()
            self._owner._fail(e)
            return None
        if part == _END:
            self._tx.pop(key, None)
        return part, first, part == _END

    def setTransmissionData(self, data: Any) -> bool:
        if data is None:
            return False
        part, first, last = data
        if first:
            self._rx = bytearray()
            self._abort_import()
        if self._rx is None or not part:
            return False
        kind, body = part[:1], part[1:]
        try:
            if kind == b"S":
                self._rx += body
            elif kind == b"F":
                if self._importer is None:
                    store = self._owner.broker.store
                    self._importer = StoreImporter(
                        store.disk, store.dir + ".incoming", self._owner.fsync
                    )
                self._importer.feed(body)
        except StorageError as e:
            log.error("%s; waiting for the leader to resend", e)
            self._rx = None
            self._abort_import()
            return False
        if not last:
            return False
        blob, self._rx = bytes(self._rx), None
        try:
            unseal(blob, "received snapshot")
        except StorageCorrupt as e:
            log.error("%s; waiting for the leader to resend", e)
            self._abort_import()
            return False
        importer, self._importer = self._importer, None
        log.info(
            "raft %s: received a snapshot from the leader (%d bytes, %d store files);"
            " installing it",
            self._owner.config.node_id,
            len(blob),
            len(importer.finish()) if importer is not None else 0,
        )
        if self._disk is not None and self._path is not None:
            # Our own writer may still be busy with an older state: stop it, or its rename
            # could land after ours and put the older snapshot back (found by the power-loss
            # stress, which also caught both writers sharing one temp file).
            self.abort_writer()
            try:  # durable before pysyncobj clears the journal
                write_atomic(self._disk, self._path, blob, self._owner.fsync, ".rx.tmp")
            except OSError as e:
                self._owner._fail(StorageError(f"{self._path}: {e}"))
                return False
        self._mem = blob
        self.installed = True
        return True

    def _abort_import(self) -> None:
        importer, self._importer = self._importer, None
        if importer is not None:
            importer.abort()

    def cancelTransmisstion(self, key: Any) -> None:
        tx = self._tx.pop(key, None)
        if tx is not None:
            tx.close()


_END = b"E"


class _Tx:
    """One follower's transfer: the snapshot file in ``S`` parts, then the store files it
    marks in ``F`` parts (an ``Export``, read from the files a frame at a time), then ``E``."""

    def __init__(self, blob: bytes, chunk: int, files: bool) -> None:
        self.blob, self.chunk, self.off, self.files = blob, chunk, 0, files
        self.export: Export | None = None
        self.frames: Iterator[bytes] = iter(())

    def next_part(self, store: Any) -> bytes:
        if self.off < len(self.blob):
            part = self.blob[self.off : self.off + self.chunk]
            self.off += len(part)
            return b"S" + part
        if not self.files:
            return _END
        if self.export is None:
            body = msgpack.unpackb(unseal(self.blob, "snapshot"), raw=False)
            self.export = store.export(Broker.snapshot_marks(body[4]), self.chunk)
            self.frames = iter(self.export)
        frame = next(self.frames, None)
        if frame is None:
            self.close()
            return _END
        return b"F" + frame

    def close(self) -> None:
        if self.export is not None:
            self.export.close()


def _bin_header(size: int) -> bytes:
    """msgpack's header of a bin object of ``size`` bytes."""
    if size < 1 << 8:
        return bytes((0xC4, size))
    if size < 1 << 16:
        return b"\xc5" + size.to_bytes(2, "big")
    return b"\xc6" + size.to_bytes(4, "big")


def _jitter(threshold: float) -> float:
    """Snapshot thresholds vary by +-25 % per node and per snapshot: nodes that apply the same
    entries would otherwise all snapshot at once, which on shared hardware (a local cluster,
    or nodes sharing a disk) cut throughput 3-8x for the ~1.5 s the writers ran."""
    return threshold * random.uniform(0.75, 1.25)
