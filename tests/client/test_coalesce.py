"""Natural batching of concurrent publishes (no server: a fake send)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from raftq.client._coalesce import Coalescer
from raftq.client.errors import MessageTooLarge, TopicNotFound


class FakeSend:
    def __init__(self, bad: bytes | None = None, error: Exception | None = None) -> None:
        self.calls: list[list[bytes]] = []
        self.bad = bad
        self.error = error
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, messages: list[dict[str, Any]]) -> list[Any]:
        self.calls.append([m["payload"] for m in messages])
        await self.gate.wait()
        if self.error is not None:
            raise self.error
        if any(m["payload"] == self.bad for m in messages):
            raise MessageTooLarge("too big", status=413)
        return [{"seq": int(m["payload"]), "duplicate": False} for m in messages]


def msg(i: int) -> dict[str, Any]:
    return {"payload": str(i).encode(), "key": f"k{i}"}


async def test_sequential_calls_go_out_alone_at_once() -> None:
    send = FakeSend()
    c = Coalescer(send)
    for i in range(3):
        assert (await c.submit(msg(i)))["seq"] == i
    assert send.calls == [[b"0"], [b"1"], [b"2"]]


async def test_calls_made_while_requests_are_out_share_one_request() -> None:
    send = FakeSend()
    send.gate.clear()
    c = Coalescer(send, max_inflight=1)
    tasks = [asyncio.ensure_future(c.submit(msg(i))) for i in range(50)]
    await asyncio.sleep(0)
    send.gate.set()
    results = await asyncio.gather(*tasks)
    assert [r["seq"] for r in results] == list(range(50))
    assert send.calls == [[b"0"], [str(i).encode() for i in range(1, 50)]]


async def test_a_bad_message_fails_only_its_own_caller() -> None:
    send = FakeSend(bad=b"7")
    send.gate.clear()
    c = Coalescer(send, max_inflight=1)
    tasks = [asyncio.ensure_future(c.submit(msg(i))) for i in range(10)]
    await asyncio.sleep(0)
    send.gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[7], MessageTooLarge)
    ok = [r for i, r in enumerate(results) if i != 7]
    assert [r["seq"] for r in ok if isinstance(r, dict)] == [0, 1, 2, 3, 4, 5, 6, 8, 9]


async def test_a_batch_wide_error_reaches_every_caller() -> None:
    c = Coalescer(FakeSend(error=TopicNotFound("gone", status=404)))
    with pytest.raises(TopicNotFound):
        await c.submit(msg(1))


async def test_a_caller_that_gave_up_before_sending_sends_nothing() -> None:
    send = FakeSend()
    send.gate.clear()
    c = Coalescer(send, max_inflight=1)
    first = asyncio.ensure_future(c.submit(msg(1)))
    await asyncio.sleep(0)
    second = asyncio.ensure_future(c.submit(msg(2)))
    await asyncio.sleep(0)
    second.cancel()
    send.gate.set()
    await first
    await asyncio.sleep(0.01)
    assert send.calls == [[b"1"]]


async def test_callers_woken_by_answers_publish_again_as_one_batch() -> None:
    # As a pipelined producer: requests answered together, then the woken caller publishes
    # more. Each answer used to free a slot that the first new call took alone.
    send = FakeSend()
    send.gate.clear()
    c = Coalescer(send, max_inflight=2)
    first = [c.submit_nowait(msg(i)) for i in range(3)]  # [0] at once, [1, 2] a turn later

    async def refill() -> list[Any]:
        await first[-1]
        return await asyncio.gather(*(c.submit_nowait(msg(i)) for i in range(3, 7)))

    task = asyncio.ensure_future(refill())
    for _ in range(5):  # a few loop turns: the deferred batch is sent by a task of its own
        await asyncio.sleep(0)
    assert send.calls == [[b"0"], [b"1", b"2"]]
    send.gate.set()
    assert [r["seq"] for r in await task] == [3, 4, 5, 6]
    assert send.calls[2:] == [[b"3", b"4", b"5", b"6"]]


async def test_a_queue_longer_than_one_batch_is_split_evenly() -> None:
    send = FakeSend()
    send.gate.clear()
    c = Coalescer(send, max_items=4, max_inflight=3)
    futs = [c.submit_nowait(msg(i)) for i in range(6)]
    for _ in range(5):
        await asyncio.sleep(0)
    send.gate.set()
    assert [r["seq"] for r in await asyncio.gather(*futs)] == list(range(6))
    assert send.calls == [[b"0"], [b"1", b"2", b"3"], [b"4", b"5"]]


async def test_a_lone_call_is_sent_from_its_own_task_and_frees_its_slot_at_once() -> None:
    send = FakeSend(error=TopicNotFound("gone", status=404))
    c = Coalescer(send, max_inflight=1)
    with pytest.raises(TopicNotFound):
        await c.submit(msg(0))
    assert c._inflight == 0 and not c._tasks  # no task was started; the slot is free again
    send.error = None
    for i in range(1, 4):
        assert (await c.submit(msg(i)))["seq"] == i
        assert c._inflight == 0  # the next sequential call goes out at once, not a turn later
    assert send.calls == [[b"0"], [b"1"], [b"2"], [b"3"]]
