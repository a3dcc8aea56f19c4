"""The node process's memory: freed heap memory goes back to the kernel (glibc
``malloc_trim``), and Python's cyclic garbage collector runs less often (``tuned_gc``).

A node allocates and frees big blocks all the time (Raft entries of up to a few MB, request
bodies, read batches). glibc serves them from its heaps once its mmap threshold has grown past
them (it grows to the largest mapped block freed, up to 32 MiB), and a heap whose free space is
scattered between live objects never shrinks: the RSS stays at its high-water mark. Measured
with ``bench/backlog.py --loads 10000000x100 --topics 1 --dedup-window 5`` (3 nodes, the fill's
peak RSS of the largest node): 510 MB by default. A fixed 128 KiB threshold
(``MALLOC_MMAP_THRESHOLD_=131072``) gave 362 MB but cost 40 % of the 1 KiB pipelined and batch
publish rates in a paired A/B (a mapping, page faults and zeroing for every big block);
``malloc_trim(0)`` every few seconds releases the free pages inside the heaps instead (290 MB
in the same run, with the idempotency keys compact as well: 284 with the fixed threshold), and
leaves allocation as it was. It trims only when the heaps hold ``TRIM_ABOVE`` free bytes or
more (glibc's ``mallinfo2``): a trim takes the arenas' locks and the pages it releases fault
back in when reused, ~1.6 % CPU a message and 3-5 % of the 1 KiB publish rates in a paired A/B
when run every 5 s regardless.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
from collections.abc import Callable, Iterator

log = logging.getLogger(__name__)

TRIM_EVERY_S = 5.0
TRIM_ABOVE = 16 << 20  # free bytes in the heaps (mallinfo2's fordblks) worth a trim


_MALLINFO2 = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in _MALLINFO2.split()]


def _heap_free() -> Callable[[], int] | None:
    """The free bytes in glibc's heaps (``mallinfo2``, glibc >= 2.33), or None."""
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    fn.argtypes = []
    fn.restype = _MallInfo2

    def free() -> int:
        return int(fn().fordblks)

    return free


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None (musl, macOS: nothing to do)."""
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


async def trim_forever(every: float = TRIM_EVERY_S, above: int = TRIM_ABOVE) -> None:
    """Every ``every`` seconds, give the heaps' free pages back if they hold ``above`` free
    bytes or more (always, without ``mallinfo2``), until cancelled (a ctypes call releases
    the GIL: other threads run meanwhile)."""
    trim = _malloc_trim()
    if trim is None:
        log.debug("no malloc_trim here: the heap is left as it is")
        return
    free = _heap_free()
    while True:
        await asyncio.sleep(every)
        if free is None or free() >= above:
            trim(0)


# Young collections after this many new container objects (default 700), the middle and old
# generations as often as not (default 10, 10). A node allocates a dict or two per message
# (decoded entries, commands, results) that reference counting frees at once: at 700 the
# collector ran every few entries for nothing. Paired A/B against the defaults (bench/ab.py,
# 4 rounds of cases a-d, with gc.freeze): CPU a message -3.3 %, 1 KiB pipelined and batch
# publish rates +15 % / +13 %.
GC_THRESHOLDS = (20_000, 20, 20)


@contextlib.contextmanager
def tuned_gc(thresholds: tuple[int, int, int] = GC_THRESHOLDS) -> Iterator[None]:
    """For the node's lifetime: what was loaded at start (modules, classes) is left out of
    every collection (``gc.freeze``) and collections run per ``thresholds``; restored after
    (a node run in a test's process)."""
    before = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*thresholds)
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
