"""Natural batching for ``AsyncClient.publish``: concurrent single publishes share requests.

The first call goes out at once when nothing is in flight (no added latency when calls are
sequential; ``submit`` then sends from the caller's own task). Calls made while requests are
out leave together, one loop turn later or when a slot frees, in batches of up to
``max_items`` messages or ``max_bytes`` (a longer queue is split into equal shares), at most
``max_inflight`` requests at once. Each caller gets its own result. When a batch is refused
for something one message may have caused (bad input, topic full), its messages are sent
again one by one so that every caller learns its own definite outcome; the idempotency keys
make that resend safe.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from raftq.client.errors import InvalidArgument, TopicFull

Send = Callable[[list[dict[str, Any]]], Awaitable[list[Any]]]
SPLIT_ON = (InvalidArgument, TopicFull)


class Pending:
    """How many queued messages await their answer, across a client's coalescers, and a wait
    for room below ``limit`` (``AsyncClient``'s ``max_pending``). Counted per batch, not per
    message: a callback per future cost a third of ``publish_nowait``'s throughput."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.count = 0
        self._room = asyncio.Event()

    async def room(self) -> None:
        while self.limit is not None and self.count >= self.limit:
            self._room.clear()
            await self._room.wait()

    def answered(self, n: int) -> None:
        self.count -= n
        if self.limit is not None and self.count < self.limit:
            self._room.set()


class Coalescer:
    def __init__(
        self,
        send: Send,
        *,
        max_items: int = 256,
        max_bytes: int = 4 << 20,
        max_inflight: int = 4,
        pending: Pending | None = None,
    ) -> None:
        self._send = send
        self._pending = pending or Pending(None)
        self.max_items = max_items
        self.max_bytes = max_bytes
        self.max_inflight = max_inflight
        self._queue: deque[tuple[dict[str, Any], int, asyncio.Future[Any]]] = deque()
        self._inflight = 0
        self._kick_soon = False
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, message: dict[str, Any]) -> Any:
        if self._inflight or self._queue:
            return await self.submit_nowait(message)
        # Alone: send from the caller's own task (no task to start, no future to hand over).
        self._inflight += 1
        try:
            [res] = await self._send([message])
        finally:
            if self._queue:  # others came meanwhile: free the slot as ``_run`` does
                asyncio.get_running_loop().call_soon(self._release)
            else:  # free it now, so that the caller's next publish goes out alone at once
                self._inflight -= 1
        return res

    def submit_nowait(self, message: dict[str, Any]) -> asyncio.Future[Any]:
        """Queue ``message``; the future resolves with its result (cancel it to unsend it while
        it is still queued)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._queue.append((message, len(message["payload"]) + 64, fut))
        self._pending.count += 1
        if not self._inflight:
            self._kick()  # a lone call goes out at once
        elif not self._kick_soon:
            # Others are out: wait one loop turn, so that callers woken together join one batch
            # instead of the first taking a free slot alone.
            self._kick_soon = True
            loop.call_soon(self._deferred_kick)
        return fut

    async def flush(self, timeout: float) -> None:
        """Send what is queued and wait, up to ``timeout``, for every request in flight (a
        client closing must not drop ``publish_nowait`` messages it accepted)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while self._queue or self._tasks:
            self._kick()
            left = end - loop.time()
            if left <= 0:
                return
            if self._tasks:
                await asyncio.wait(set(self._tasks), timeout=left)
            else:  # the slots are held by callers sending from their own tasks
                await asyncio.sleep(min(0.01, left))

    def _deferred_kick(self) -> None:
        self._kick_soon = False
        self._kick()

    def _kick(self) -> None:
        while self._queue and self._inflight < self.max_inflight:
            # Equal shares rather than full batches and a small rest: 257 queued go as 129 + 128.
            share = math.ceil(len(self._queue) / math.ceil(len(self._queue) / self.max_items))
            batch: list[tuple[dict[str, Any], int, asyncio.Future[Any]]] = []
            size = 0
            while self._queue and len(batch) < share:
                item = self._queue[0]
                if batch and size + item[1] > self.max_bytes:
                    break
                self._queue.popleft()
                if item[2].cancelled():
                    self._pending.answered(1)
                    continue  # its caller gave up before it was sent: not sent at all
                batch.append(item)
                size += item[1]
            if not batch:
                continue
            self._inflight += 1
            task = asyncio.ensure_future(self._run(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: list[tuple[dict[str, Any], int, asyncio.Future[Any]]]) -> None:
        try:
            try:
                results = await self._send([m for m, _, _ in batch])
            except SPLIT_ON as e:
                if len(batch) == 1:
                    raise
                del e
                await asyncio.gather(*(self._one(item) for item in batch))
                return
            for (_, _, fut), res in zip(batch, results, strict=True):
                if not fut.done():
                    fut.set_result(res)
        except BaseException as e:
            for _, _, fut in batch:
                if not fut.done():
                    fut.set_exception(e)
            if not isinstance(e, Exception):
                raise
        finally:
            self._pending.answered(len(batch))
            # The slot frees once the callers just woken have run, so that what they publish
            # next leaves as one batch: requests answered together each freed a slot that the
            # first new call then took alone.
            asyncio.get_running_loop().call_soon(self._release)

    def _release(self) -> None:
        self._inflight -= 1
        self._kick()

    async def _one(self, item: tuple[dict[str, Any], int, asyncio.Future[Any]]) -> None:
        message, _, fut = item
        try:
            [res] = await self._send([message])
        except Exception as e:
            if not fut.done():
                fut.set_exception(e)
        else:
            if not fut.done():
                fut.set_result(res)
