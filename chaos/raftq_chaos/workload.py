"""The workload: producers, consumers, a poison producer and the final drain, all through
``raftq.client.AsyncClient``, every operation recorded in the ``History``.

- producers publish ``p<i>-<n>`` (unique, increasing per producer); the client retries each
  publish under one idempotency key until its timeout; an unclear end is ``info`` and the
  producer continues as a new process with the next value (a value is never published twice);
- a batch producer publishes ``b-<n>`` values 1-8 at a time in one request;
- the poison producer publishes ``poison-<n>``; every consumer nacks those, so they must reach
  the dead-letter topic after ``max_attempts`` deliveries;
- consumers receive with a fixed visibility (so the checker can read server time off each
  deadline) and ack; the "nacker" nacks some and terms a few, the "crasher" sometimes drops
  the rest of a batch without settling it (a simulated crash: new consumer id, leases left to
  expire); the "acker" sometimes extends a lease first, or acks only after it ran out;
- a WebSocket stream consumer acks (poison: nacks) and drops a few;
- a dead-letter consumer acks what reaches the dead-letter topic;
- ``drain`` (after healing) receives and acks (poison: nacks) until both groups are empty.

Every client sends ``Workload.token`` (the cluster's admin token; None: ``RAFTQ_TOKEN``).

Outcome rules: a definite domain error is ``fail``; anything else (unavailable, timeouts,
unknown outcome, a stale receipt that may come from a retried settle) is ``info``. A consumer
whose receive ends badly switches to a new consumer id (the node may release the old one).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import secrets
import time
from dataclasses import dataclass, field

from raftq.client import AsyncClient, AsyncMessage, RaftqError, ReceiptError, Unavailable
from raftq_chaos.history import History, Op


@dataclass(frozen=True)
class WorkloadConfig:
    topic: str = "work"
    group: str = "g"
    max_attempts: int = 3
    visibility: float = 3.0
    producers: int = 3
    consumers: int = 3
    publish_interval: float = 0.03
    poison_interval: float = 0.25
    client_timeout: float = 6.0
    nack_rate: float = 0.2
    term_rate: float = 0.03
    extend_rate: float = 0.05
    slow_rate: float = 0.01
    batch_interval: float = 0.1
    stream_consumer: bool = True
    drop_rate: float = 0.08
    seed: int = 0

    @property
    def dlq_topic(self) -> str:
        return f"{self.topic}.dlq"


def _outcome(err: BaseException) -> str:
    """``fail`` only when the error says the operation definitely did not happen."""
    if isinstance(err, Unavailable | ReceiptError) or not isinstance(err, RaftqError):
        return "info"
    return "fail"


def _err(err: BaseException) -> str:
    code = getattr(err, "code", type(err).__name__)
    return f"{code}: {err}"[:300]


@dataclass
class Workload:
    urls: list[str]
    history: History
    cfg: WorkloadConfig
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    stats: dict[str, int] = field(default_factory=dict)
    token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.cfg.seed)
        self._clients: list[AsyncClient] = []

    def client(self) -> AsyncClient:
        c = AsyncClient(self.urls, timeout=self.cfg.client_timeout, token=self.token)
        self._clients.append(c)
        return c

    async def close(self) -> None:
        for c in self._clients:
            with contextlib.suppress(Exception):
                await c.close()
        self._clients.clear()

    def _count(self, key: str) -> None:
        self.stats[key] = self.stats.get(key, 0) + 1

    # ------------------------------------------------------------------ setup

    async def setup(self, timeout: float = 60.0) -> None:
        c = self.client()
        cfg = self.cfg
        group = {
            "group": cfg.group,
            "config": {"max_attempts": cfg.max_attempts, "visibility_timeout": cfg.visibility},
        }
        deadline = time.monotonic() + timeout
        while True:
            try:
                await c.create_topic(cfg.topic, groups=[group], if_not_exists=True)
                await c.group(cfg.topic, cfg.group)
                return
            except RaftqError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)

    # ------------------------------------------------------------------ producers

    async def producer(self, name: str, interval: float) -> None:
        c = self.client()
        h = self.history
        proc = h.new_process()
        n = 0
        while not self.stop.is_set():
            n += 1
            value = f"{name}-{n}"
            op = h.invoke(proc, "publish", {"topic": self.cfg.topic, "value": value})
            try:
                seq = await c.publish(self.cfg.topic, value.encode())
            except Exception as e:
                proc = self._publish_failed(op, proc, e)
            else:
                h.ok(op, {"topic": self.cfg.topic, "value": value, "seq": seq})
                self._count("publish-ok")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), interval)

    def _publish_failed(self, op: Op, proc: int, e: Exception) -> int:
        """Record a failed or unknown publish; after ``info`` the logical client is a new
        process (Jepsen's convention). Returns the process to go on with."""
        kind = _outcome(e)
        self.history.complete(op, kind, error=_err(e))
        self._count(f"publish-{kind}")
        return self.history.new_process() if kind == "info" else proc

    async def batch_producer(self, name: str, interval: float) -> None:
        """Publishes batches of 1-8 values in one request (one ``publish`` op with ``values``)."""
        c = self.client()
        h = self.history
        proc = h.new_process()
        rng = random.Random(f"{self.cfg.seed}-{name}")
        n = 0
        while not self.stop.is_set():
            values = [f"{name}-{n + j + 1}" for j in range(rng.randint(1, 8))]
            n += len(values)
            op = h.invoke(proc, "publish", {"topic": self.cfg.topic, "values": values})
            try:
                seqs = await c.publish_batch(self.cfg.topic, [v.encode() for v in values])
            except Exception as e:
                proc = self._publish_failed(op, proc, e)
            else:
                h.ok(op, {"topic": self.cfg.topic, "values": values, "seqs": seqs})
                self._count("publish-ok")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), interval)

    # ------------------------------------------------------------------ consumers

    async def _receive(
        self, c: AsyncClient, proc: int, consumer: str, topic: str, group: str, wait: float
    ) -> tuple[list[AsyncMessage] | None, int]:
        """One receive; returns (messages or None when it did not end ``ok``, next process)."""
        h = self.history
        v = {
            "topic": topic,
            "group": group,
            "consumer": consumer,
            "visibility": self.cfg.visibility,
            "max": 5,
        }
        op = h.invoke(proc, "receive", v)
        try:
            msgs = await c.receive(
                topic,
                group,
                max=5,
                wait=wait,
                visibility=self.cfg.visibility,
                consumer=consumer,
            )
        except Exception as e:
            kind = _outcome(e)
            h.complete(op, kind, error=_err(e))
            self._count(f"receive-{kind}")
            return None, (h.new_process() if kind == "info" else proc)
        ds = [
            {
                "value": m.payload.decode("utf-8", "replace"),
                "seq": m.seq,
                "attempt": m.attempt,
                "receipt": m.receipt,
                "deadline": m.deadline_ms,
                **({"headers": m.headers} if topic != self.cfg.topic else {}),
            }
            for m in msgs
        ]
        h.ok(op, {**v, "deliveries": ds})
        self._count("receive-ok")
        return msgs, proc

    async def _settle(self, proc: int, f: str, m: AsyncMessage, topic: str) -> int:
        h = self.history
        op: Op = h.invoke(
            proc, f, {"topic": topic, "receipt": m.receipt, "value": m.payload.decode()}
        )
        try:
            if f == "ack":
                await m.ack()
            elif f == "nack":
                await m.nack()
            else:
                await m.term("chaos")
        except Exception as e:
            kind = _outcome(e)
            h.complete(op, kind, error=_err(e))
            self._count(f"{f}-{kind}")
            return h.new_process() if kind == "info" else proc
        h.ok(op)
        self._count(f"{f}-ok")
        return proc

    async def _extend(self, c: AsyncClient, proc: int, m: AsyncMessage, seconds: float) -> int:
        h = self.history
        v = {"topic": self.cfg.topic, "receipt": m.receipt, "value": m.payload.decode()}
        op = h.invoke(proc, "extend", {**v, "seconds": seconds})
        try:
            res = await c.extend([m.receipt], seconds)
        except Exception as e:
            kind = _outcome(e)
            h.complete(op, kind, error=_err(e))
            self._count(f"extend-{kind}")
            return h.new_process() if kind == "info" else proc
        h.ok(op, {**v, "seconds": seconds, "deadline": res["deadline"]})
        self._count("extend-ok")
        return proc

    def _new_consumer(self, name: str) -> str:
        return f"{name}-{secrets.token_hex(3)}"

    async def consumer(self, name: str, style: str) -> None:
        c = self.client()
        proc = self.history.new_process()
        cid = self._new_consumer(name)
        rng = random.Random(f"{self.cfg.seed}-{name}")
        while not self.stop.is_set():
            msgs, nproc = await self._receive(c, proc, cid, self.cfg.topic, self.cfg.group, 1.0)
            if msgs is None:
                proc, cid = nproc, self._new_consumer(name)
                await asyncio.sleep(0.1)
                continue
            for i, m in enumerate(msgs):
                value = m.payload.decode("utf-8", "replace")
                if style == "crasher" and rng.random() < self.cfg.drop_rate:
                    self.history.note(
                        "drop",
                        {"consumer": cid, "receipts": [x.receipt for x in msgs[i:]]},
                        process=f"consumer-{name}",
                    )
                    self._count("dropped")
                    cid = self._new_consumer(name)
                    break
                if style == "acker" and rng.random() < self.cfg.extend_rate:
                    proc = await self._extend(c, proc, m, self.cfg.visibility)
                if style == "acker" and rng.random() < self.cfg.slow_rate:
                    self._count("slow")
                    await asyncio.sleep(self.cfg.visibility + 0.2)  # acks after the lease
                roll = rng.random() if style == "nacker" else 1.0
                if value.startswith("poison") or roll < self.cfg.nack_rate:
                    f = "nack"
                elif roll < self.cfg.nack_rate + self.cfg.term_rate:
                    f = "term"
                else:
                    f = "ack"
                proc = await self._settle(proc, f, m, self.cfg.topic)

    async def stream_consumer(self, name: str) -> None:
        """A WebSocket consumer (``consume(stream=True)``), which reconnects by itself; the node
        releases a stream's deliveries whenever its socket closes, which this side cannot see,
        so each delivery is logged as its own ``receive`` marked ``stream`` (the checker then
        treats a later redelivery as legitimate unless it follows an acknowledged ack)."""
        inner = asyncio.create_task(self._stream_loop(name))
        await self.stop.wait()
        inner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await inner

    async def _stream_loop(self, name: str) -> None:
        c = self.client()
        h = self.history
        proc = h.new_process()
        rng = random.Random(f"{self.cfg.seed}-{name}")
        topic, group, k = self.cfg.topic, self.cfg.group, 0
        while True:
            k += 1
            cid = f"{name}-{k}-{secrets.token_hex(3)}"
            v = {"topic": topic, "group": group, "consumer": cid, "stream": True}
            v["visibility"] = self.cfg.visibility
            try:
                async for m in c.consume(
                    topic, group, prefetch=5, visibility=self.cfg.visibility, stream=True
                ):
                    value = m.payload.decode("utf-8", "replace")
                    op = h.invoke(proc, "receive", v)
                    d = {
                        "value": value,
                        "seq": m.seq,
                        "attempt": m.attempt,
                        "receipt": m.receipt,
                        "deadline": m.deadline_ms,
                    }
                    h.ok(op, {**v, "deliveries": [d]})
                    self._count("stream-delivery")
                    if rng.random() < self.cfg.drop_rate / 2:
                        self._count("dropped")
                        continue
                    f = "nack" if value.startswith("poison") else "ack"
                    proc = await self._settle(proc, f, m, topic)
            except RaftqError as e:
                h.note("stream-error", {"consumer": cid, "error": _err(e)}, process=name)
                await asyncio.sleep(0.2)

    async def dead_letter_consumer(self) -> None:
        c = self.client()
        proc = self.history.new_process()
        cid = self._new_consumer("dlq")
        while not self.stop.is_set():
            msgs, nproc = await self._receive(c, proc, cid, self.cfg.dlq_topic, "default", 1.0)
            if msgs is None:
                proc, cid = nproc, self._new_consumer("dlq")
                await asyncio.sleep(0.2)
                continue
            for m in msgs:
                proc = await self._settle(proc, "ack", m, self.cfg.dlq_topic)

    def tasks(self) -> list[asyncio.Task[None]]:
        cfg = self.cfg
        styles = ["acker", "nacker", "crasher"]
        out = [
            asyncio.create_task(self.producer(f"p{i}", cfg.publish_interval))
            for i in range(cfg.producers)
        ]
        out.append(asyncio.create_task(self.batch_producer("b", cfg.batch_interval)))
        out.append(asyncio.create_task(self.producer("poison", cfg.poison_interval)))
        out += [
            asyncio.create_task(self.consumer(f"c{i}", styles[i % len(styles)]))
            for i in range(cfg.consumers)
        ]
        if cfg.stream_consumer:
            out.append(asyncio.create_task(self.stream_consumer("s0")))
        out.append(asyncio.create_task(self.dead_letter_consumer()))
        return out

    # ------------------------------------------------------------------ final drain

    async def _empty(self, c: AsyncClient) -> bool:
        for topic, group in ((self.cfg.topic, self.cfg.group), (self.cfg.dlq_topic, "default")):
            try:
                t = await c.topic(topic)
            except RaftqError as e:
                if getattr(e, "code", "") == "topic_not_found" and topic == self.cfg.dlq_topic:
                    continue
                raise
            g = next((x for x in t["groups"] if x["group"] == group), None)
            if t["messages"] or g is None or g["pending"] or g["in_flight"] or g["delayed"]:
                return False
        return True

    async def drain(self, timeout: float = 90.0) -> bool:
        """Receive and ack everything on both groups until both are empty; False on timeout."""
        c = self.client()
        proc = self.history.new_process()
        cid = self._new_consumer("drain")
        deadline = time.monotonic() + timeout
        self.history.note("drain-start", process="workload")
        while time.monotonic() < deadline:
            got = 0
            for topic, group in ((self.cfg.topic, self.cfg.group), (self.cfg.dlq_topic, "default")):
                msgs, nproc = await self._receive(c, proc, cid, topic, group, 0.5)
                if msgs is None:
                    proc, cid = nproc, self._new_consumer("drain")
                    got += 1
                    continue
                for m in msgs:
                    poison = topic == self.cfg.topic and m.payload.startswith(b"poison")
                    proc = await self._settle(proc, "nack" if poison else "ack", m, topic)
                got += len(msgs)
            if got == 0:
                try:
                    if await self._empty(c):
                        self.history.note("drain-done", process="workload")
                        return True
                except RaftqError:
                    pass
        self.history.note("drain-timeout", process="workload")
        return False
