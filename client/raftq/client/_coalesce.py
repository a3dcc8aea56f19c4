"""Natural batching for ``AsyncClient.publish``: concurrent single publishes share requests.

The first call goes out at once (no added latency when calls are sequential); calls made while
``max_inflight`` requests are already out wait and leave together as one batch request, up to
``max_items`` messages or ``max_bytes``. Each caller gets its own result. When a batch is refused
for something one message may have caused (bad input, topic full), its messages are sent again
one by one so that every caller learns its own definite outcome; the idempotency keys make that
resend safe.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from raftq.client.errors import InvalidArgument, TopicFull

Send = Callable[[list[dict[str, Any]]], Awaitable[list[Any]]]
SPLIT_ON = (InvalidArgument, TopicFull)


class Coalescer:
    def __init__(
        self,
        send: Send,
        *,
        max_items: int = 256,
        max_bytes: int = 4 << 20,
        max_inflight: int = 4,
    ) -> None:
        self._send = send
        self.max_items = max_items
        self.max_bytes = max_bytes
        self.max_inflight = max_inflight
        self._queue: deque[tuple[dict[str, Any], int, asyncio.Future[Any]]] = deque()
        self._inflight = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, message: dict[str, Any]) -> Any:
        return await self.submit_nowait(message)

    def submit_nowait(self, message: dict[str, Any]) -> asyncio.Future[Any]:
        """Queue ``message``; the future resolves with its result (cancel it to unsend it while
        it is still queued)."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append((message, len(message["payload"]) + 64, fut))
        self._kick()
        return fut

    def _kick(self) -> None:
        while self._queue and self._inflight < self.max_inflight:
            batch: list[tuple[dict[str, Any], int, asyncio.Future[Any]]] = []
            size = 0
            while self._queue and len(batch) < self.max_items:
                item = self._queue[0]
                if batch and size + item[1] > self.max_bytes:
                    break
                self._queue.popleft()
                if item[2].cancelled():
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
