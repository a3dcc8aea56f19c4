"""The node's heap trimming (node/raftq/node/malloc.py)."""

from __future__ import annotations

import asyncio
import ctypes
import platform

import pytest

from raftq.node import malloc


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_trim_runs_every_period_until_cancelled(monkeypatch: pytest.MonkeyPatch) -> None:
    real = malloc._malloc_trim()
    assert real is not None and real(0) in (0, 1)
    calls: list[int] = []

    async def main() -> None:
        third = asyncio.Event()

        def trim(pad: int) -> int:
            calls.append(pad)
            if len(calls) == 3:
                third.set()
            return 1

        monkeypatch.setattr(malloc, "_malloc_trim", lambda: trim)
        task = asyncio.create_task(malloc.trim_forever(0.001, above=0))
        await asyncio.wait_for(third.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert calls[:3] == [0, 0, 0]


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_it_trims_only_when_the_heaps_hold_enough_free_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = malloc._heap_free()
    assert real is not None and real() >= 0
    frees = iter([10, 99, 100, 5, 500])
    calls: list[int] = []

    async def main() -> None:
        done = asyncio.Event()

        def free() -> int:
            try:
                return next(frees)
            except StopIteration:
                done.set()
                return 0

        def trim(pad: int) -> int:
            calls.append(pad)
            return 1

        monkeypatch.setattr(malloc, "_malloc_trim", lambda: trim)
        monkeypatch.setattr(malloc, "_heap_free", lambda: free)
        task = asyncio.create_task(malloc.trim_forever(0.001, above=100))
        await asyncio.wait_for(done.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert len(calls) == 2, "at 100 and 500 free bytes, not at 10, 99 or 5"


def test_without_malloc_trim_it_returns_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoLibc:
        def __init__(self, name: object) -> None:
            raise OSError("no such library")

    monkeypatch.setattr(ctypes, "CDLL", NoLibc)
    assert malloc._malloc_trim() is None
    asyncio.run(asyncio.wait_for(malloc.trim_forever(0.001), 5))


def test_tuned_gc_freezes_and_sets_thresholds_for_its_span_only() -> None:
    import gc

    before = gc.get_threshold()
    with malloc.tuned_gc((12_345, 7, 9)):
        assert gc.get_threshold() == (12_345, 7, 9)
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
