"""Group commit: gather commands from concurrent requests into one Raft entry.

``submit(command)`` queues a command and resolves with its own result once the entry carrying it
is committed and applied. The run loop takes whatever is queued (at once when nothing is in
flight, else after a short linger; up to ``max_ops`` commands or ``max_bytes``) and proposes it
as one entry, with up to ``max_inflight`` proposes outstanding at once, so throughput is not
bounded by one replication round trip.
A request cancelled before its command was proposed is dropped from the batch: its outcome is
then "not done", which keeps every outcome definite.

The queue is bounded (``max_queue`` commands waiting to be proposed): beyond it ``submit``
raises ``QueueFull`` at once (the node answers 503 ``overloaded`` with ``Retry-After``), so
under more load than Raft can commit, callers are told to back off instead of each waiting
longer than the last. Internal commands (ticks, releases) pass ``bounded=False``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from raftq.node.raftapi import QueueFull

Propose = Callable[[list[dict[str, Any]], float], Awaitable[list[dict[str, Any]]]]
OnBatch = Callable[[int, float], None]


class BatchMismatch(RuntimeError):
    """The binding returned a different number of results than commands (a bug)."""


class Batcher:
    def __init__(
        self,
        propose: Propose,
        *,
        max_ops: int = 512,
        max_bytes: int = 4 << 20,
        linger: float = 0.001,
        max_inflight: int = 4,
        max_queue: int = 2048,
        timeout: float = 5.0,
        on_batch: OnBatch | None = None,
        splittable: Callable[[BaseException], bool] = lambda e: False,
    ) -> None:
        self._splittable = splittable
        self._propose = propose
        self.max_ops = max_ops
        self.max_bytes = max_bytes
        self.linger = linger
        self.max_queue = max_queue
        self.timeout = timeout
        self._on_batch = on_batch
        self._queue: deque[tuple[dict[str, Any], int, asyncio.Future[dict[str, Any]]]] = deque()
        self._wake = asyncio.Event()
        self._slots = asyncio.Semaphore(max_inflight)
        self._tasks: set[asyncio.Task[None]] = set()
        self._runner: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._runner = asyncio.get_running_loop().create_task(self._run())

    async def stop(self, timeout: float | None = None) -> None:
        """Stop taking new batches; wait (by default bounded by the propose timeout) for those
        in flight."""
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        if self._tasks:
            await asyncio.wait(
                set(self._tasks), timeout=self.timeout + 1 if timeout is None else timeout
            )
        while self._queue:
            _, _, fut = self._queue.popleft()
            if not fut.done():
                fut.cancel()

    async def submit(
        self, command: dict[str, Any], size: int = 0, bounded: bool = True
    ) -> dict[str, Any]:
        if bounded and len(self._queue) >= self.max_queue:
            raise QueueFull(f"{len(self._queue)} commands already wait for group commit")
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._queue.append((command, size, fut))
        self._wake.set()
        return await fut

    async def _run(self) -> None:
        while True:
            await self._slots.acquire()
            try:
                while not self._queue:
                    self._wake.clear()
                    await self._wake.wait()
                # Natural batching: with nothing in flight, send at once (a lone request pays no
                # linger); while entries are in flight, linger so the next one carries more.
                if self._tasks and self.linger and len(self._queue) < self.max_ops:
                    await asyncio.sleep(self.linger)
                batch = self._take()
            except BaseException:
                self._slots.release()
                raise
            if not batch:
                self._slots.release()
                continue
            task = asyncio.get_running_loop().create_task(self._send(batch))
            self._tasks.add(task)
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slots.release()

    def _take(self) -> list[tuple[dict[str, Any], asyncio.Future[dict[str, Any]]]]:
        batch: list[tuple[dict[str, Any], asyncio.Future[dict[str, Any]]]] = []
        size = 0
        q = self._queue
        while q and len(batch) < self.max_ops:
            cmd, n, fut = q[0]
            if batch and size + n > self.max_bytes:
                break
            q.popleft()
            if fut.done():  # cancelled before it was proposed: definitely not done
                continue
            batch.append((cmd, fut))
            size += n
        return batch

    async def _send(
        self, batch: list[tuple[dict[str, Any], asyncio.Future[dict[str, Any]]]]
    ) -> None:
        # A half retried after a split may hold requests cancelled meanwhile: leave them out
        # (not proposed, so "not done"), or one could apply after what its cancellation did
        # (a receive after the release of its consumer).
        batch = [(cmd, fut) for cmd, fut in batch if not fut.done()]
        if not batch:
            return
        commands = [cmd for cmd, _ in batch]
        t0 = time.perf_counter()
        try:
            results = await self._propose(commands, self.timeout)
            if len(results) != len(commands):
                raise BatchMismatch(f"{len(commands)} commands, {len(results)} results")
        except Exception as e:
            if len(batch) > 1 and self._splittable(e):
                # Refused as a whole and definitely not applied: retry in halves, in order, so
                # only a command that is too large on its own fails.
                half = len(batch) // 2
                await self._send(batch[:half])
                await self._send(batch[half:])
                return
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(e)
            return
        else:
            if self._on_batch is not None:
                self._on_batch(len(commands), time.perf_counter() - t0)
        for (_, fut), result in zip(batch, results, strict=True):
            if not fut.done():
                fut.set_result(result)
