"""The node process's allocator setting: big blocks go back to the kernel when freed.

glibc serves blocks of at least its mmap threshold with their own mapping, unmapped on free, and
the rest from its heaps. By default the threshold grows to the largest such block freed so far
(up to 32 MiB): after the first ~1 MB Raft entries come and go, every later entry, batch buffer
and snapshot part is carved from the heaps, which fragment and never shrink. Measured with
``bench/backlog.py --loads 10000000x100 --topics 1 --dedup-window 5`` (3 nodes, the fill's peak
RSS of the largest node): 510 MB with the default, 362 MB with a fixed 128 KiB threshold
(``MALLOC_MMAP_THRESHOLD_=131072``), which also turns the growth off. Done with ``mallopt``
at start, so it holds however the node is launched (compose, Kubernetes, ``raftq node``).
"""

from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc <malloc.h>
MMAP_THRESHOLD = 128 << 10  # glibc's initial value, kept fixed


def fix_mmap_threshold() -> bool:
    """Fix glibc's mmap threshold at 128 KiB unless the environment sets one
    (``MALLOC_MMAP_THRESHOLD_``); False where there is no glibc ``mallopt`` (musl, macOS)."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok: bool = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    if not ok:
        log.debug("mallopt(M_MMAP_THRESHOLD) refused; the allocator keeps its defaults")
    return ok
