"""Group commit: batching, pipelining, cancellation and splitting, with a fake propose."""

from __future__ import annotations

import asyncio
from typing import Any

from raftq.node.batcher import Batcher
from raftq.node.raftapi import EntryTooLarge, NotLeader, QueueFull
from raftq.node.service import splittable


class FakePropose:
    def __init__(self, delay: float = 0.0, max_cmds: int | None = None) -> None:
        self.delay = delay
        self.max_cmds = max_cmds
        self.batches: list[list[dict[str, Any]]] = []
        self.inflight = 0
        self.peak = 0
        self.fail: Exception | None = None

    async def __call__(
        self, commands: list[dict[str, Any]], timeout: float
    ) -> list[dict[str, Any]]:
        if self.fail is not None:
            raise self.fail
        if self.max_cmds is not None and len(commands) > self.max_cmds:
            raise EntryTooLarge(f"{len(commands)} commands")
        self.inflight += 1
        self.peak = max(self.peak, self.inflight)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.inflight -= 1
        self.batches.append(commands)
        return [{"echo": c["n"]} for c in commands]


async def test_each_request_gets_its_own_result_from_a_shared_entry() -> None:
    fake = FakePropose(delay=0.01)
    b = Batcher(fake, max_inflight=1)
    b.start()
    try:
        results = await asyncio.gather(*(b.submit({"n": i}) for i in range(50)))
    finally:
        await b.stop()
    assert [r["echo"] for r in results] == list(range(50))
    assert len(fake.batches) < 10


async def test_several_proposes_are_in_flight_at_once() -> None:
    fake = FakePropose(delay=0.05)
    b = Batcher(fake, max_ops=1, max_inflight=4)
    b.start()
    try:
        await asyncio.gather(*(b.submit({"n": i}) for i in range(8)))
    finally:
        await b.stop()
    assert fake.peak == 4


async def test_a_request_cancelled_before_proposing_is_dropped() -> None:
    fake = FakePropose(delay=0.05)
    b = Batcher(fake, max_inflight=1, linger=0)
    b.start()
    try:
        first = asyncio.ensure_future(b.submit({"n": 0}))
        await asyncio.sleep(0.01)  # the first batch is in flight, the slot is taken
        doomed = asyncio.ensure_future(b.submit({"n": 1}))
        kept = asyncio.ensure_future(b.submit({"n": 2}))
        await asyncio.sleep(0)
        doomed.cancel()
        assert (await first)["echo"] == 0 and (await kept)["echo"] == 2
    finally:
        await b.stop()
    assert [c["n"] for batch in fake.batches for c in batch] == [0, 2]


async def test_a_batch_too_large_for_one_entry_is_split() -> None:
    fake = FakePropose(max_cmds=3)
    b = Batcher(fake, max_inflight=1, splittable=splittable)
    b.start()
    try:
        results = await asyncio.gather(*(b.submit({"n": i}) for i in range(20)))
    finally:
        await b.stop()
    assert [r["echo"] for r in results] == list(range(20))
    assert all(len(batch) <= 3 for batch in fake.batches)


async def test_a_refused_batch_fails_every_request_in_it() -> None:
    fake = FakePropose()
    fake.fail = QueueFull("full")
    b = Batcher(fake)
    b.start()
    try:
        results = await asyncio.gather(
            *(b.submit({"n": i}) for i in range(5)), return_exceptions=True
        )
    finally:
        await b.stop()
    assert all(isinstance(r, QueueFull) for r in results)


async def test_a_batch_refused_by_a_node_no_longer_leader_fails_every_request_at_once() -> None:
    # Not splittable: every request gets the refusal itself, promptly (a predicate that
    # raised here left the requests waiting for their own timeouts).
    fake = FakePropose()
    fake.fail = NotLeader("not the leader; leader is n3")
    b = Batcher(fake, splittable=splittable)
    b.start()
    try:
        async with asyncio.timeout(2):
            results = await asyncio.gather(
                *(b.submit({"n": i}) for i in range(5)), return_exceptions=True
            )
    finally:
        await b.stop()
    assert all(isinstance(r, NotLeader) for r in results), results
    assert len(fake.batches) == 0


def test_only_refusals_before_anything_was_appended_split_a_batch() -> None:
    assert splittable(EntryTooLarge("2 MB"))
    assert splittable(TypeError("can not serialize 'set' object"))
    assert splittable(OverflowError("Integer value out of range"))
    assert not splittable(NotLeader("not the leader"))
    assert not splittable(QueueFull("full"))
    assert not splittable(TimeoutError())


async def test_a_request_cancelled_while_its_batch_is_split_is_never_proposed() -> None:
    # The batch is refused as a whole; its first half goes alone. A request of the second
    # half cancelled meanwhile (its client went away, and its consumer is being released)
    # must not be proposed after that: it would apply after the release.
    fake = FakePropose(delay=0.1, max_cmds=1)
    b = Batcher(fake, max_inflight=1, splittable=splittable)
    b.start()
    try:
        first = asyncio.ensure_future(b.submit({"n": 1}))
        second = asyncio.ensure_future(b.submit({"n": 2}))
        await asyncio.sleep(0.05)  # both in one batch, refused, the first half in flight
        second.cancel()
        assert (await first)["echo"] == 1
        await asyncio.sleep(0.2)
    finally:
        await b.stop()
    assert [[c["n"] for c in batch] for batch in fake.batches] == [[1]]


async def test_commands_past_the_queue_bound_are_refused_at_once_not_queued() -> None:
    fake = FakePropose(delay=0.2)
    b = Batcher(fake, max_ops=1, max_inflight=1, max_queue=3)
    b.start()
    try:
        outcomes = await asyncio.gather(
            *(b.submit({"n": i}) for i in range(10)), return_exceptions=True
        )
        # The node's own commands (ticks, releases) are not refused.
        internal = await asyncio.gather(*(b.submit({"n": i}, bounded=False) for i in range(5)))
    finally:
        await b.stop()
    refused = [o for o in outcomes if isinstance(o, QueueFull)]
    done = [o for o in outcomes if isinstance(o, dict)]
    assert len(refused) == 7 and len(done) == 3  # 3 waited; the rest were told at once
    assert [r["echo"] for r in internal] == list(range(5))
    assert sum(len(batch) for batch in fake.batches) == 3 + 5  # refused ones never proposed
