"""The node's heap trimming (node/raftq/node/malloc.py)."""

from __future__ import annotations

import asyncio
import ctypes
import itertools
import platform
from collections.abc import Callable
from typing import Any

import pytest

from raftq.node import malloc


def _trim_until(
    monkeypatch: pytest.MonkeyPatch, enough: Callable[[list[int]], bool], **kw: Any
) -> list[int]:
    """``trim_forever(0.001, **kw)`` with a recording trim, until ``enough(calls)`` (each
    check and each trim asks): the trims' pads."""
    calls: list[int] = []

    async def main() -> None:
        done = asyncio.Event()

        def trim(pad: int) -> int:
            calls.append(pad)
            if enough(calls):
                done.set()
            return 1

        monkeypatch.setattr(malloc, "_malloc_trim", lambda: trim)
        task = asyncio.create_task(malloc.trim_forever(0.001, **kw))
        await asyncio.wait_for(done.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    return calls


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_trim_runs_every_period_until_cancelled(monkeypatch: pytest.MonkeyPatch) -> None:
    real = malloc._malloc_trim()
    assert real is not None and real(0) in (0, 1)
    calls = _trim_until(monkeypatch, lambda calls: len(calls) == 3, above=0)
    assert calls[:3] == [0, 0, 0]


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_it_trims_only_when_the_heaps_hold_enough_free_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = malloc._heap_free()
    assert real is not None and real() >= 0
    seen: list[int] = []
    frees = itertools.chain([10, 99, 100, 5, 500], itertools.repeat(1))

    def free() -> int:
        seen.append(next(frees))
        return seen[-1]

    monkeypatch.setattr(malloc, "_heap_free", lambda: free)
    calls = _trim_until(monkeypatch, lambda calls: len(calls) == 2, above=100)
    assert seen[:5] == [10, 99, 100, 5, 500] and calls == [0, 0], "at 100 and 500 only"


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
