"""The free-disk reserve of one node (``--min-free-disk``): while the file system of its data
directory has less free space than the reserve, the leader refuses publishes with 507
``storage_full`` before proposing anything. Consumers keep draining (acks, nacks, receives and
dead-lettering are never refused here), which frees space as snapshots let the journal go.

Free space is per node and not deterministic, so this is checked by the node, never in
``apply``; the replicated limit on retained bytes is ``max_retained_bytes``
(``raftq.cluster.state``). ``statvfs`` is asked at most once per ``CACHE_S``: publishes come
by the thousand per second. A node without a data directory (``--in-memory``) has no reserve.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from raftq.node.errors import ApiError

log = logging.getLogger("raftq.node")

CACHE_S = 1.0
DEFAULT_MIN_FREE = "1GiB"
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_UNITS.update({"ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30, "ti": 1 << 40})
# Hand-written (a dozen lines) rather than a dependency for one flag: bytes with an optional
# SI or IEC suffix (1GiB, 500MB, 10g), or a percentage of the file system's size.
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(%|[kmgt]i?)?b?\s*", re.IGNORECASE)


@dataclass(frozen=True)
class Reserve:
    """``bytes`` free at least, or ``percent`` of the file system's size."""

    bytes: int = 0
    percent: float | None = None

    def of(self, total: int) -> int:
        return self.bytes if self.percent is None else int(total * self.percent / 100)


def parse_reserve(text: str) -> Reserve:
    """``1GiB``, ``500MB``, ``0`` or ``5%``; ValueError naming the value otherwise."""
    m = _SIZE.fullmatch(text)
    if m is None:
        raise ValueError(f"not a size (e.g. 1GiB, 500MB, 5%): {text!r}")
    number, unit = float(m.group(1)), (m.group(2) or "").lower()
    if unit == "%":
        if number > 100:
            raise ValueError(f"a percentage of the disk is at most 100: {text!r}")
        return Reserve(percent=number)
    return Reserve(bytes=int(number * _UNITS[unit]))


@dataclass(frozen=True)
class DiskSpace:
    free: int  # bytes an unprivileged writer may still use (f_bavail)
    total: int


def statvfs(path: str) -> DiskSpace:
    st = os.statvfs(path)
    return DiskSpace(free=st.f_bavail * st.f_frsize, total=st.f_blocks * st.f_frsize)


class DiskGuard:
    """The reserve of one data directory; ``probe`` is ``statvfs`` (tests give a fake)."""

    def __init__(
        self,
        path: str | None,
        reserve: Reserve,
        probe: Callable[[str], DiskSpace] = statvfs,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.reserve = reserve
        self.probe = probe
        self._clock = clock
        self._sample: DiskSpace | None = None
        self._at = -CACHE_S

    def space(self) -> DiskSpace | None:
        """Free and total bytes, at most ``CACHE_S`` old; None without a data directory or when
        the probe fails (then nothing is refused on its account: the journal's own ENOSPC
        handling still stops the node)."""
        if self.path is None:
            return None
        now = self._clock()
        if now - self._at >= CACHE_S:
            self._at = now
            try:
                self._sample = self.probe(self.path)
            except OSError as e:
                if self._sample is not None:
                    log.warning("free-disk probe of %s failed: %s", self.path, e)
                self._sample = None
        return self._sample

    def status(self) -> dict[str, Any] | None:
        """``{"free_bytes", "min_free_bytes", "ok"}`` (``/readyz``, ``/cluster``, metrics)."""
        sp = self.space()
        if sp is None:
            return None
        need = self.reserve.of(sp.total)
        return {"free_bytes": sp.free, "min_free_bytes": need, "ok": sp.free >= need}

    def check(self, node_id: str) -> None:
        """Raise 507 ``storage_full`` while free space is below the reserve."""
        st = self.status()
        if st is not None and not st["ok"]:
            raise ApiError(
                "storage_full",
                f"node {node_id} has {st['free_bytes']} bytes free on its data disk, below its"
                f" reserve of {st['min_free_bytes']} (--min-free-disk); publishes are refused"
                " until space is freed (consumers keep draining)",
                {
                    "node": node_id,
                    "free_bytes": st["free_bytes"],
                    "min_free_bytes": st["min_free_bytes"],
                },
            )
