"""An in-memory ``Disk`` for the segment store of a Broker without a data directory.

``Broker()`` without a store (unit tests, the test harness, the local single-process node)
keeps its payloads in a ``SegmentStore`` over a ``MemDisk``: the same code paths as on disk,
nothing written to the real file system. Files are ``bytearray``s by path; a directory is a
path prefix (``makedirs`` creates nothing). Syncs do nothing: there is no power to lose.
Not thread-safe beyond what the store itself guarantees (it reads and writes on one thread,
an export reads with handles of its own, which is fine for bytearrays under the GIL).
"""

from __future__ import annotations

import posixpath

from raftq.cluster.storage import DiskFile, ReadFile


class _MemFile:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytearray) -> None:
        self.data = data
        self.pos = 0

    def write(self, data: bytes | memoryview) -> None:
        self.write_at(self.pos, bytes(data))
        self.pos += len(data)

    def write_at(self, offset: int, data: bytes | bytearray) -> None:
        buf = self.data
        if offset > len(buf):
            buf.extend(bytes(offset - len(buf)))
        buf[offset : offset + len(data)] = data

    def truncate(self, size: int) -> None:
        buf = self.data
        if size < len(buf):
            del buf[size:]
        else:
            buf.extend(bytes(size - len(buf)))

    def sync(self) -> None:
        pass

    def start_writeback(self, offset: int, size: int) -> None:
        pass

    def close(self) -> None:
        pass


class _MemReader:
    __slots__ = ("data",)

    def __init__(self, data: bytearray) -> None:
        self.data = data

    def pread(self, size: int, offset: int) -> bytes:
        return bytes(self.data[offset : offset + size])

    def will_need(self, offset: int, size: int) -> None:
        pass

    def close(self) -> None:
        pass


class MemDisk:
    """Files in a dict, for ``SegmentStore`` (the ``StoreDisk`` protocol)."""

    def __init__(self) -> None:
        self.files: dict[str, bytearray] = {}

    def makedirs(self, path: str) -> None:
        """Directories are prefixes here: nothing to create (keeps the store off the disk)."""

    def open_read(self, path: str) -> ReadFile:
        data = self.files.get(path)
        if data is None:
            raise FileNotFoundError(path)
        return _MemReader(data)

    def read(self, path: str) -> bytes | None:
        data = self.files.get(path)
        return None if data is None else bytes(data)

    def open(self, path: str) -> DiskFile:
        return _MemFile(self.files.setdefault(path, bytearray()))

    def create(self, path: str) -> DiskFile:
        data = self.files[path] = bytearray()
        return _MemFile(data)

    def rename(self, src: str, dst: str) -> None:
        data = self.files.pop(src, None)
        if data is None:
            raise FileNotFoundError(src)
        self.files[dst] = data

    def remove(self, path: str) -> None:
        self.files.pop(path, None)

    def remove_slowly(self, path: str) -> None:
        self.remove(path)

    def sync_dir(self, path: str) -> None:
        pass

    def listdir(self, path: str) -> list[str]:
        return [posixpath.basename(p) for p in self.files if posixpath.dirname(p) == path]

    def nbytes(self) -> int:
        """Bytes held over every file."""
        return sum(len(d) for d in self.files.values())
