"""Test-only file layer that remembers what was made durable, to simulate a power loss.

``SimDisk(shadow_dir)`` does every operation on the real files (so a kill -9 behaves as usual)
and records, in ``shadow_dir``, the model of a strict POSIX file system:

* ``fsync(file)`` makes the file's current bytes durable (a copy is kept per inode);
* a name (create, rename, remove) becomes durable only when its directory is fsynced.

``power_loss(shadow_dir, data_dir)`` then rebuilds ``data_dir`` from durable state only: every
unsynced byte and every unsynced name change is dropped. The model lives in files guarded by a
lock, so it survives kill -9 and is shared with the forked snapshot writer.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from raftq.cluster.storage import DiskFile, OsDisk, ReadFile


class SimDisk:
    def __init__(self, shadow_dir: str) -> None:
        self.shadow = shadow_dir
        os.makedirs(shadow_dir, exist_ok=True)
        self.real = OsDisk()
        self._pid, self._tlock = os.getpid(), threading.Lock()

    @contextmanager
    def _state(self) -> Iterator[dict[str, Any]]:
        # Threads of one process (the tick thread, the journal's zero-filler) take a thread
        # lock; processes a POSIX record lock, which a forked snapshot writer does not inherit
        # (an inherited flock held by a parent thread at fork time would never be released).
        if self._pid != os.getpid():
            self._pid, self._tlock = os.getpid(), threading.Lock()
        with self._tlock, open(os.path.join(self.shadow, "lock"), "a") as lock:
            fcntl.lockf(lock, fcntl.LOCK_EX)
            path = os.path.join(self.shadow, "state.json")
            try:
                with open(path) as f:
                    state: dict[str, Any] = json.load(f)
            except FileNotFoundError:
                state = {"next": 0, "cur": {}, "dur": {}}
            yield state
            tmp = path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(state, f)
            os.replace(tmp, path)

    def _ino(self, state: dict[str, Any], path: str) -> str:
        ino = state["cur"].get(path)
        if ino is None:
            ino = f"{os.getpid()}-{state['next']}"
            state["next"] += 1
            state["cur"][path] = ino
        return str(ino)

    def snapshot_inode(self, path: str) -> None:
        path = os.path.abspath(path)
        with self._state() as state:
            ino = self._ino(state, path)
            data = self.real.read(path) or b""
            tmp = os.path.join(self.shadow, f"ino-{ino}.tmp")
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, os.path.join(self.shadow, f"ino-{ino}"))

    def read(self, path: str) -> bytes | None:
        return self.real.read(path)

    def listdir(self, path: str) -> list[str]:
        return self.real.listdir(path)

    def open_read(self, path: str) -> ReadFile:
        return self.real.open_read(path)

    def open(self, path: str) -> DiskFile:
        path = os.path.abspath(path)
        f = self.real.open(path)
        with self._state() as state:
            self._ino(state, path)
        return _SimFile(self, path, f)

    def create(self, path: str) -> DiskFile:
        path = os.path.abspath(path)
        f = self.real.create(path)
        with self._state() as state:
            self._ino(state, path)
        return _SimFile(self, path, f)

    def rename(self, src: str, dst: str) -> None:
        src, dst = os.path.abspath(src), os.path.abspath(dst)
        self.real.rename(src, dst)
        with self._state() as state:
            state["cur"][dst] = self._ino(state, src)
            del state["cur"][src]

    def remove(self, path: str) -> None:
        path = os.path.abspath(path)
        self.real.remove(path)
        with self._state() as state:
            state["cur"].pop(path, None)

    def remove_slowly(self, path: str) -> None:
        self.remove(path)

    def sync_dir(self, path: str) -> None:
        self.real.sync_dir(path)
        d = os.path.abspath(path)
        with self._state() as state:
            dur = {p: i for p, i in state["dur"].items() if os.path.dirname(p) != d}
            dur.update({p: i for p, i in state["cur"].items() if os.path.dirname(p) == d})
            state["dur"] = dur


class FileWrapper:
    """A ``DiskFile`` that passes every call on to ``f``; test layers override what they
    watch or break."""

    def __init__(self, f: DiskFile) -> None:
        self.f = f

    def write(self, data: bytes | memoryview) -> None:
        self.f.write(data)

    def write_at(self, offset: int, data: bytes | bytearray) -> None:
        self.f.write_at(offset, data)

    def truncate(self, size: int) -> None:
        self.f.truncate(size)

    def sync(self) -> None:
        self.f.sync()

    def start_writeback(self, offset: int, size: int) -> None:
        self.f.start_writeback(offset, size)  # (not durable: the simulation counts syncs)

    def close(self) -> None:
        self.f.close()


class _SimFile(FileWrapper):
    def __init__(self, disk: SimDisk, path: str, f: DiskFile) -> None:
        super().__init__(f)
        self.disk, self.path = disk, path

    def sync(self) -> None:
        self.f.sync()
        self.disk.snapshot_inode(self.path)


def power_loss(shadow_dir: str, data_dir: str, torn: random.Random | None = None) -> dict[str, int]:
    """Rebuild ``data_dir`` from durable state only; returns the surviving files' sizes (by
    path relative to ``data_dir``). Directories are kept as they are.

    With ``torn``, a file whose unsynced changes only add bytes (appended, or written over
    zero-filled space) keeps a random prefix of them, as a disk may write back part of the
    page cache before the power goes."""
    with open(os.path.join(shadow_dir, "state.json")) as f:
        state = json.load(f)
    d = os.path.abspath(data_dir)
    current: dict[str, bytes] = {}
    for root, _, names in os.walk(d):  # (the payload store is a subdirectory)
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                current[path] = f.read()
            os.unlink(path)
    sizes = {}
    for path, ino in state["dur"].items():
        if not path.startswith(d + os.sep):
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            with open(os.path.join(shadow_dir, f"ino-{ino}"), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = b""  # the name survived but none of its bytes were ever synced
        now = current.get(path, b"")
        if torn is not None and state["cur"].get(path) == ino and len(now) >= len(data):
            same = _common_prefix(data, now)
            # Only new bytes tear: appended, or written over zero-filled space.
            if same < len(now) and data.count(0, same) == len(data) - same:
                cut = torn.randint(same, len(now))
                data = now[:cut] + data[cut:]
        with open(path, "wb") as f:
            f.write(data)
        sizes[os.path.relpath(path, d)] = len(data)
    state["cur"] = dict(state["dur"])
    with open(os.path.join(shadow_dir, "state.json"), "w") as f:
        json.dump(state, f)
    return sizes


def _common_prefix(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    lo = 0
    step = 1 << 16
    while lo < n and a[lo : lo + step] == b[lo : lo + step]:
        lo += step
    while lo < n and a[lo] == b[lo]:
        lo += 1
    return min(lo, n)
