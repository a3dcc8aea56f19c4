"""Test-only ``Disk`` that breaks on demand: EIO on reads of the payload store, ENOSPC on
writes to chosen files. Flags are checked at every call (the store keeps files open), so a
test arms a fault on a running node and removes it ("space freed") before a restart."""

from __future__ import annotations

import errno
import os

from raftq.cluster.storage import DiskFile, OsDisk, ReadFile
from tests.raft.simdisk import FileWrapper

STORE = os.sep + "store" + os.sep  # in the paths of the payload store's files


class _Reader:
    def __init__(self, r: ReadFile, disk: FaultDisk) -> None:
        self.r, self.disk = r, disk

    def pread(self, size: int, offset: int) -> bytes:
        if self.disk.eio_reads:
            raise OSError(errno.EIO, "Input/output error")
        return self.r.pread(size, offset)

    def will_need(self, offset: int, size: int) -> None:
        self.r.will_need(offset, size)

    def close(self) -> None:
        self.r.close()


class _Writer(FileWrapper):
    def __init__(self, f: DiskFile, disk: FaultDisk, path: str) -> None:
        super().__init__(f)
        self.disk, self.path = disk, path

    def write(self, data: bytes | memoryview) -> None:
        self.disk.check_space(self.path)
        self.f.write(data)

    def write_at(self, offset: int, data: bytes | bytearray) -> None:
        self.disk.check_space(self.path)
        self.f.write_at(offset, data)


class FaultDisk(OsDisk):
    """The real files. While ``eio_reads``: reads of store files fail with EIO. While ``full``
    is set: writes to files whose path contains it, and creating such store files, fail with
    ENOSPC (``refused`` lists their paths)."""

    def __init__(self) -> None:
        self.eio_reads = False
        self.full: str | None = None
        self.refused: list[str] = []

    def check_space(self, path: str) -> None:
        if self.full is not None and self.full in path:
            self.refused.append(path)
            raise OSError(errno.ENOSPC, "No space left on device")

    def open_read(self, path: str) -> ReadFile:
        if STORE not in path:
            return super().open_read(path)
        if self.eio_reads:
            raise OSError(errno.EIO, "Input/output error")
        return _Reader(super().open_read(path), self)

    def open(self, path: str) -> DiskFile:
        return _Writer(super().open(path), self, path)

    def create(self, path: str) -> DiskFile:
        if STORE in path:  # (a new file needs a block of its directory)
            self.check_space(path)
        return _Writer(super().create(path), self, path)
