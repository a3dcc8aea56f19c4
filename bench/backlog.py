"""Backlogs larger than memory (issue 22): what a retained backlog costs a 3-node cluster.

    .venv/bin/python bench/backlog.py                      # the issue's sizes (hours)
    .venv/bin/python bench/backlog.py --loads 1000000x100,200000x1024 --topics 1,100
    .venv/bin/python bench/backlog.py --quick              # a smoke test (seconds)

It measures the raftq its interpreter imports: to measure another checkout, run this file with
that checkout's venv (``/path/to/other/.venv/bin/python bench/backlog.py``); the JSON records
that checkout's commit.

Each load (N messages x S bytes, spread over T topics: every pair of --loads and --topics) gets a
fresh local cluster of 3 nodes, fsync always, access control on (``raftq.node.bench``):

- fill: N x S published in batches; RSS per node at the end of the fill (peak: ``VmHWM``) and
  settled (``VmRSS`` --settle s after every node has applied everything); data on disk per
  node (the whole data dir: journal, snapshots, a payload store if there is one) and the
  snapshot's size;
- restart: every node stopped (SIGTERM) and started: seconds until a publish is accepted and
  until every node is ready; RSS after;
- cold and warm consume, --settle s after the restart: --rounds pairs of consumes of --consume
  messages each (stream, prefetch 100, acked; rate until the acks are applied), one cold (the
  page cache dropped just before: ``/proc/sys/vm/drop_caches``, when permitted; the report
  says when not) and one warm (every node's data dir read just before), alternating
  cold-warm, warm-cold, ...; each pair's cold/warm and the ratio of the medians;
- join: the consumed messages published again (N retained), then a new empty node started and
  added as a member; seconds until it has applied the leader's commit index, peak RSS of the
  new node and of the leader meanwhile.

Then the memory-cap case (--cap-mb, default 512): a fresh cluster whose every node runs in a
memory cgroup of that size (v2 ``memory.max``, else v1 ``memory.limit_in_bytes``; no cgroup:
the case is reported as skipped, naming why) is published --cap-factor x cap bytes of backlog
while a consumer drains a share of it. Survived = the backlog reached its target with no node
killed (exit status, the cgroup's OOM-kill count); it ends at the first node lost or at
--cap-timeout, never hangs.

Prints a markdown table and writes JSON (--out). Not a test: numbers on a shared VM scatter.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import raftq.node.bench as local_cluster_module
from raftq.client import AsyncClient, RaftqError
from raftq.node.bench import LocalCluster, free_ports, pipelined
from raftq.node.devcluster import get_json

MB = 1 << 20
UNLIMITED = {"max_messages": None, "max_bytes": None}  # (the defaults would refuse the backlog)


def topic_config(args: argparse.Namespace) -> dict[str, Any]:
    """The backlog's topics: unlimited, and --dedup-window if given. Every publish of the
    clients carries an idempotency key, kept for the topic's dedup window (120 s by default):
    at the fill's rate that is millions of keys, whose memory and snapshot bytes follow the
    rate times the window, not the backlog; a short window measures the backlog's own cost."""
    if args.dedup_window is None:
        return UNLIMITED
    return {**UNLIMITED, "dedup_window": args.dedup_window}


# ---------------------------------------------------------------------- process memory


def proc_mem_mb(pid: int) -> dict[str, float]:
    """A process's ``VmRSS`` and ``VmHWM`` (its peak RSS since it started), in MB."""
    out = {}
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
        for line in f:
            key = line.split(":", 1)[0]
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(line.split()[1]) / 1024
    return out


def rss(cl: LocalCluster, key: str = "VmRSS") -> dict[str, float]:
    return {nid: round(proc_mem_mb(p.pid).get(key, 0.0), 1) for nid, p in cl.procs.items()}


class PeakSampler:
    """Samples the RSS of some processes every 0.1 s on a thread; ``peak`` per name (what
    ``VmHWM`` cannot give for a window that starts after the process did)."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.peak: dict[str, float] = dict.fromkeys(pids, 0.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, pid in self.pids.items():
                now = proc_mem_mb(pid).get("VmRSS", 0.0)
                self.peak[name] = max(self.peak[name], round(now, 1))
            self._stop.wait(0.1)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def du_mb(path: Path) -> float:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return round(total / MB, 1)


def snapshot_mb(path: Path) -> float | None:
    """The node's snapshot file(s) (``snapshot*`` anywhere in its data dir, not a ``.tmp``
    being written), None if none."""
    sizes = [
        p.stat().st_size
        for p in path.rglob("snapshot*")
        if p.is_file() and not p.name.endswith(".tmp")
    ]
    return round(sum(sizes) / MB, 3) if sizes else None


def drop_page_cache() -> str:
    """Drops the page cache if this process may; says what happened."""
    try:
        subprocess.run(["sync"], check=False, timeout=120)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "dropped"
    except OSError as e:
        return f"not dropped ({e.strerror or e}: not permitted here); cold = after restart only"


def read_through(dirs: list[Path]) -> float:
    """Reads every file under ``dirs`` (one thread each) so the page cache holds them; MB."""

    def one(d: Path) -> int:
        total = 0
        for path in d.rglob("*"):
            with contextlib.suppress(OSError), open(path, "rb", buffering=0) as f:
                while chunk := f.read(8 * MB):
                    total += len(chunk)
        return total

    with concurrent.futures.ThreadPoolExecutor(len(dirs) or 1) as pool:
        return round(sum(pool.map(one, dirs)) / MB, 1)


async def cold_and_warm(
    cl: LocalCluster, topics: list[str], count: int, rounds: int
) -> dict[str, Any]:
    """``rounds`` pairs of consumes of ``count`` messages each, one cold (the page cache
    dropped just before) and one warm (every node's data dir read just before), in the order
    cold-warm, warm-cold, ... so a drift of the VM's speed falls on both alike. Each consume
    takes the next messages (topics in order), which no one has read since the restart.
    Reported: the rates, each pair's cold/warm and the ratio of the medians."""
    rates: dict[str, list[int]] = {"cold": [], "warm": []}
    out: dict[str, Any] = {"consumed_each": count, "rounds": rounds, "warmed_mb": []}
    for r in range(rounds):
        for kind in ("cold", "warm") if r % 2 == 0 else ("warm", "cold"):
            if kind == "cold":
                out["page_cache"] = await asyncio.to_thread(drop_page_cache)
            else:
                dirs = [cl.dir / nid for nid in cl.procs]
                out["warmed_mb"].append(await asyncio.to_thread(read_through, dirs))
            async with cl.client(cl.urls(), timeout=120) as c:
                rates[kind].append(round(count / await consume(c, topics, count)))
    out["cold_consume_rates"], out["warm_consume_rates"] = rates["cold"], rates["warm"]
    pairs = zip(rates["cold"], rates["warm"], strict=True)
    out["cold_over_warm_pairs"] = [round(c / w, 2) for c, w in pairs]
    out["cold_consume_rate"] = statistics.median(rates["cold"])
    out["warm_consume_rate"] = statistics.median(rates["warm"])
    out["cold_over_warm"] = round(out["cold_consume_rate"] / out["warm_consume_rate"], 2)
    return out


# ---------------------------------------------------------------------- memory cgroups


@dataclass
class MemCap:
    """One memory cgroup capped at ``limit`` bytes (v2 ``memory.max``, else v1
    ``memory.limit_in_bytes``), with its OOM-kill count and peak usage. ``MemCap.make`` answers
    None and why when neither can be made here."""

    path: Path
    v2: bool

    @staticmethod
    def make(name: str, limit: int) -> tuple[MemCap | None, str]:
        errors = []
        for root, v2 in ((Path("/sys/fs/cgroup"), True), (Path("/sys/fs/cgroup/unified"), True),
                         (Path("/sys/fs/cgroup/memory"), False)):  # fmt: skip
            if v2 and "memory" not in _read(root / "cgroup.controllers").split():
                errors.append(f"{root}: no cgroup v2 memory controller")
                continue
            if not v2 and not (root / "memory.limit_in_bytes").exists():
                errors.append(f"{root}: no cgroup v1 memory hierarchy")
                continue
            path = root / name
            try:
                if v2:
                    with contextlib.suppress(OSError):  # (may be on already, or not ours to set)
                        (root / "cgroup.subtree_control").write_text("+memory")
                path.mkdir(exist_ok=True)
                if v2:
                    (path / "memory.max").write_text(str(limit))
                    with contextlib.suppress(OSError):
                        (path / "memory.swap.max").write_text("0")
                else:
                    (path / "memory.limit_in_bytes").write_text(str(limit))
                    with contextlib.suppress(OSError):  # (no swap accounting: nothing to cap)
                        (path / "memory.memsw.limit_in_bytes").write_text(str(limit))
                return MemCap(path, v2), f"cgroup {'v2' if v2 else 'v1'} {path}"
            except OSError as e:
                errors.append(f"{path}: {e.strerror or e}")
                with contextlib.suppress(OSError):
                    path.rmdir()
        return None, "; ".join(errors)

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def oom_kills(self) -> int:
        name = "memory.events" if self.v2 else "memory.oom_control"
        for line in _read(self.path / name).splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def peak_mb(self) -> float | None:
        text = _read(self.path / ("memory.peak" if self.v2 else "memory.max_usage_in_bytes"))
        return round(int(text) / MB, 1) if text.strip().isdigit() else None

    def remove(self) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)  # (a killed process leaves its cgroup a moment later)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


# ---------------------------------------------------------------------- one load


def parse_loads(text: str) -> list[tuple[int, int]]:
    out = []
    for item in text.split(","):
        n, _, size = item.lower().partition("x")
        out.append((int(float(n)), int(size)))
    return out


async def fill(c: AsyncClient, topics: list[str], n: int, size: int, window: int = 4) -> float:
    """``n`` messages of ``size`` bytes over ``topics`` (round robin, batches of at most 1 MiB
    and 1000 messages); seconds taken."""
    per = max(1, min(1000, MB // max(1, size)))
    payload = b"b" * size
    left = n
    batches: list[tuple[str, int]] = []
    k = 0
    while left > 0:
        take = min(per, left)
        batches.append((topics[k % len(topics)], take))
        left -= take
        k += 1
    it = iter(batches)

    async def one() -> None:
        topic, take = next(it)
        await c.publish_batch(topic, [payload] * take)

    secs, _ = await pipelined(len(batches), window, one)
    return secs


async def consume(c: AsyncClient, topics: list[str], count: int) -> float:
    """Receive (stream, prefetch 100) and ack ``count`` messages, taking the topics in order;
    seconds until the acks are applied (the topics' backlog fell by ``count``)."""
    before = {t: int((await c.topic(t))["messages"]) for t in topics}
    target = sum(before.values()) - count
    t0 = time.perf_counter()
    left = count
    for t in topics:
        if left <= 0:
            break
        take = min(left, before[t])
        got = 0
        if take:
            async with asyncio.timeout(600):  # (bounded: a stalled stream fails the load)
                async for msg in c.consume(t, prefetch=100, stream=True):
                    msg.ack_nowait()
                    got += 1
                    if got >= take:
                        break
        left -= got
    deadline = time.perf_counter() + 60
    while time.perf_counter() < deadline:
        now = sum([int((await c.topic(t))["messages"]) for t in topics])
        if now <= target:
            break
        await asyncio.sleep(0.01)
    return time.perf_counter() - t0


class NodeDied(RuntimeError):
    pass


async def ready(cl: LocalCluster, timeout: float) -> bool:
    """Every node ready and caught up (``all_ready``) within ``timeout``; a node that exits
    meanwhile ends the wait at once (``NodeDied``, naming it and its log's last line)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dead = {nid: p.returncode for nid, p in cl.procs.items() if p.poll() is not None}
        if dead:
            last = {nid: _last_line(cl.dir / f"{nid}.log") for nid in dead}
            raise NodeDied(f"node(s) exited {dead}: {last}")
        if await asyncio.to_thread(cl.all_ready, 2):
            return True
    return False


def _last_line(path: Path) -> str:
    lines = _read(path).strip().splitlines()
    return lines[-1][:300] if lines else ""


def caught_up(cl: LocalCluster, nid: str) -> bool:
    leader = cl.leader()
    try:
        commit = int(get_json(f"{cl.url_of(leader)}/cluster", 2, cl.token)["commit_index"])
        applied = int(get_json(f"{cl.url_of(nid)}/cluster", 2, cl.token)["applied_index"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return applied >= commit


async def one_load(n: int, size: int, ntopics: int, args: argparse.Namespace) -> dict[str, Any]:
    row: dict[str, Any] = {"messages": n, "size": size, "topics": ntopics,
                           "backlog_mb": round(n * size / MB, 1)}  # fmt: skip
    label = f"{n} x {size} B over {ntopics} topic(s)"
    print(f"== {label}", flush=True)
    cl = LocalCluster("always")
    topics = [f"backlog-{k:03d}" for k in range(ntopics)]
    try:
        cl.start()
        async with cl.client(cl.url_of(cl.leader()), timeout=120) as c:
            for t in topics:
                await c.create_topic(t, topic_config(args))
            row["fill_s"] = round(await fill(c, topics, n, size), 2)
            row["fill_rate"] = round(n / row["fill_s"])
        await ready(cl, 300)
        row["rss_peak_mb"] = rss(cl, "VmHWM")
        await asyncio.sleep(args.settle)
        row["rss_settled_mb"] = rss(cl)
        row["disk_mb"] = {nid: du_mb(cl.dir / nid) for nid in cl.procs}
        row["snapshot_mb"] = {nid: snapshot_mb(cl.dir / nid) for nid in cl.procs}
        print(f"  fill {row['fill_s']} s ({row['fill_rate']}/s); RSS peak {row['rss_peak_mb']}"
              f" settled {row['rss_settled_mb']}; disk MB {row['disk_mb']}; snapshot MB "
              f"{row['snapshot_mb']}", flush=True)  # fmt: skip
        count = max(1, min(args.consume, n // (2 * args.rounds)))
        t0 = time.perf_counter()
        cl.stop(remove=False)
        row["stop_s"] = round(time.perf_counter() - t0, 2)
        t0 = time.perf_counter()
        cl.start()
        async with cl.client(cl.urls(), timeout=300) as c:
            await c.publish(topics[-1], b"after restart")
            row["restart_publish_s"] = round(time.perf_counter() - t0, 2)
        ok = await ready(cl, 300)
        row["restart_ready_s"] = round(time.perf_counter() - t0, 2) if ok else None
        row["rss_after_restart_mb"] = rss(cl)
        await asyncio.sleep(args.settle)
        row.update(await cold_and_warm(cl, topics, count, args.rounds))
        print(f"  consume+ack warm {row['warm_consume_rates']}/s, cold {row['cold_consume_rates']}"
              f"/s ({row['page_cache']}): cold/warm per pair {row['cold_over_warm_pairs']}, of "
              f"the medians {row['cold_over_warm']}; restart -> publish "
              f"{row['restart_publish_s']} s, -> all ready {row['restart_ready_s']} s",
              flush=True)  # fmt: skip
        if not args.no_join:  # of the whole backlog: the consumed messages published again
            async with cl.client(cl.urls(), timeout=120) as c:
                await fill(c, topics, 2 * args.rounds * count, size)
            await ready(cl, 300)
            row.update(await join(cl))
            print(f"  join: caught up in {row['join_s']} s; peak RSS new {row['join_rss_new_mb']}"
                  f" MB, leader {row['join_rss_leader_mb']} MB", flush=True)  # fmt: skip
    except (RaftqError, RuntimeError, TimeoutError) as e:
        row["error"] = f"{type(e).__name__}: {e}"
        print(f"  FAILED: {row['error']} (logs in {cl.dir})", flush=True)
    finally:
        dead = {nid: p.returncode for nid, p in cl.procs.items() if p.poll() is not None}
        if dead:
            row["nodes_exited"] = dead
        cl.stop(remove=not args.keep)
    return row


async def join(cl: LocalCluster) -> dict[str, Any]:
    """A fourth, empty node started (peers: the members) and added; until it caught up."""
    api, raft = free_ports(2)
    new = {"id": f"n{len(cl.layout) + 1}", "api": f"127.0.0.1:{api}", "raft": f"127.0.0.1:{raft}"}
    cl.layout.append(new)
    leader = cl.leader()
    cl.start(new["id"])
    pids = {"new": cl.procs[new["id"]].pid, "leader": cl.procs[leader].pid}
    with PeakSampler(pids) as sampler:
        t0 = time.perf_counter()
        async with cl.client(cl.urls()[:-1], timeout=120) as c:
            deadline = time.monotonic() + 60
            while True:  # (it refuses until the new node answers on its Raft port)
                try:
                    await c.add_member(new["id"], new["raft"], new["api"])
                    break
                except RaftqError:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.2)
        deadline = time.monotonic() + 1800
        while not caught_up(cl, new["id"]):
            if time.monotonic() > deadline or cl.procs[new["id"]].poll() is not None:
                raise RuntimeError(f"{new['id']} did not catch up")
            await asyncio.sleep(0.1)
        secs = time.perf_counter() - t0
    return {"join_s": round(secs, 2), "join_rss_new_mb": sampler.peak["new"],
            "join_rss_leader_mb": sampler.peak["leader"]}  # fmt: skip


# ---------------------------------------------------------------------- memory cap


async def memory_cap(args: argparse.Namespace) -> dict[str, Any]:
    cap = args.cap_mb * MB
    target = args.cap_factor * cap
    size = args.cap_payload
    row: dict[str, Any] = {"cap_mb": args.cap_mb, "target_backlog_mb": round(target / MB),
                           "payload": size}  # fmt: skip
    print(f"== memory cap {args.cap_mb} MB per node, backlog target {target // MB} MB", flush=True)
    cl = LocalCluster("always")
    caps: dict[str, MemCap] = {}
    for n in cl.layout:
        made, how = MemCap.make(f"raftq-backlog-{os.getpid()}-{n['id']}", cap)
        if made is None:
            for each in caps.values():
                each.remove()
            row.update(survived=None, skipped=f"no memory cgroup here: {how}")
            print(f"  skipped: {row['skipped']}", flush=True)
            return row
        caps[n["id"]] = made
        row["cgroup"] = how.rsplit("/", 1)[0]
    topics = [f"capped-{k}" for k in range(4)]
    published = consumed = 0
    lost: dict[str, int | None] = {}
    kills: dict[str, int] = {}
    first_kill: dict[str, float] = {}
    deaths: dict[str, dict[str, float]] = {}
    errors: list[str] = []
    reached = False
    t0 = time.perf_counter()
    try:
        cl.start()
        for nid, p in cl.procs.items():
            caps[nid].add(p.pid)
        cl.leader()

        def losses() -> dict[str, int | None]:
            """Nodes whose process ended (exit status); notes the cgroups' OOM kills (a
            node, or a child of it such as the snapshot writer) and when the first came."""
            for nid in cl.procs:
                kills[nid] = caps[nid].oom_kills()
            if any(kills.values()) and not first_kill:
                first_kill.update(s=round(time.perf_counter() - t0, 1),
                                  published_mb=round(published * size / MB))  # fmt: skip
            out = {nid: p.returncode for nid, p in cl.procs.items() if p.poll() is not None}
            for nid in out.keys() - deaths.keys():
                deaths[nid] = {"s": round(time.perf_counter() - t0, 1),
                               "published_mb": round(published * size / MB)}  # fmt: skip
            return out

        async def publish(c: AsyncClient) -> None:
            nonlocal published
            per = max(1, MB // size)
            payload = b"c" * size
            k = 0
            while published * size < target:
                await c.publish_batch(topics[k % len(topics)], [payload] * per)
                published += per
                k += 1

        async def drain(c: AsyncClient) -> None:
            nonlocal consumed
            k = 0
            while True:  # one message in --cap-drain-every published is consumed and acked
                if consumed * args.cap_drain_every >= published:
                    await asyncio.sleep(0.05)
                    continue
                got = await c.receive(topics[k % len(topics)], max=50, wait=0.5)
                k += 1
                for msg in got:
                    msg.ack_nowait()
                consumed += len(got)

        async with cl.client(cl.urls(), timeout=30) as c:
            for t in topics:
                await c.create_topic(t, topic_config(args))
            tasks = [asyncio.ensure_future(publish(c)) for _ in range(2)]
            drainer = asyncio.ensure_future(drain(c))
            deadline = time.monotonic() + args.cap_timeout
            try:
                while not all(t.done() for t in tasks):
                    lost = losses()  # (on until the majority is gone: how far does it get?)
                    if 2 * len(lost) > len(cl.procs) or time.monotonic() > deadline:
                        break
                    await asyncio.wait(tasks, timeout=0.5)
            finally:
                for task in (*tasks, drainer):
                    task.cancel()
                await asyncio.gather(*tasks, drainer, return_exceptions=True)
            errors = [repr(t.exception()) for t in tasks if not t.cancelled() and t.exception()]
            lost = losses()
            reached = published * size >= target and not errors
            if reached and not lost:  # still serving once the backlog is there?
                with contextlib.suppress(RaftqError):
                    await asyncio.wait_for(c.publish(topics[0], b"still here"), 30)
                    got = await asyncio.wait_for(c.receive(topics[0], max=1, wait=5), 30)
                    row["serves_after"] = bool(got)
        await asyncio.sleep(2)  # (the others' fate: they hold the same state)
        lost = losses()
        row["oom_victims"] = oom_victims(caps, {nid: p.pid for nid, p in cl.procs.items()})
        if lost:
            row["restart_under_cap"] = await restart_capped(cl, caps)
    finally:
        row["rss_mb"] = rss(cl)
        row["cgroup_peak_mb"] = {nid: m.peak_mb() for nid, m in caps.items()}
        cl.stop()
        for m in caps.values():
            m.remove()
    row.update(
        seconds=round(time.perf_counter() - t0, 1), published_mb=round(published * size / MB),
        consumed=consumed, nodes_exited=lost, node_deaths=deaths, oom_kills=kills,
        first_oom_kill=first_kill or None, errors=errors, reached_target=reached,
        survived=bool(reached and not lost and not any(kills.values())
                      and row.get("serves_after")),
    )  # fmt: skip
    verdict = "SURVIVED" if row["survived"] else "FAILED"
    print(f"  {verdict}: published {row['published_mb']} MB of {row['target_backlog_mb']} MB in "
          f"{row['seconds']} s, consumed {consumed}; nodes exited {lost or 'none'} ({deaths}); "
          f"OOM kills {kills} (first: {first_kill or '-'}; victims {row.get('oom_victims')}); "
          f"cgroup peak MB {row['cgroup_peak_mb']}; restart under the cap: "
          f"{row.get('restart_under_cap', '-')}", flush=True)  # fmt: skip
    return row


async def restart_capped(cl: LocalCluster, caps: dict[str, MemCap]) -> str:
    """The whole capped cluster stopped and started again in its cgroups: does it come back
    (every node ready), or does replaying the journal hit the cap again? Bounded."""
    cl.stop(remove=False)
    t0 = time.perf_counter()
    cl.start()
    for nid, p in cl.procs.items():
        caps[nid].add(p.pid)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        dead = sorted(nid for nid, p in cl.procs.items() if p.poll() is not None)
        if dead:
            return f"{', '.join(dead)} killed again after {time.perf_counter() - t0:.1f} s"
        if await asyncio.to_thread(cl.all_ready, 1):
            return f"every node ready after {time.perf_counter() - t0:.1f} s"
    return "not ready within 180 s (no node exited)"


def oom_victims(caps: dict[str, MemCap], nodes: dict[str, int]) -> list[str]:
    """The kernel log's OOM kills in these cgroups: a node, or another process of its cgroup
    (its forked snapshot writer is one); best effort, empty when the log cannot be read."""
    try:
        log = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    by_cgroup = {m.path.name: nid for nid, m in caps.items()}
    out = []
    for m in re.finditer(r"oom_memcg=/([^,]+),.*?,pid=(\d+)", log):
        cgroup, pid = m.groups()
        nid = by_cgroup.get(cgroup.rsplit("/", 1)[-1])
        if nid is not None:
            what = "the node" if int(pid) == nodes[nid] else f"pid {pid}, a child of the node"
            out.append(f"{nid}: {what}")
    return out


# ---------------------------------------------------------------------- report


def table(rows: list[dict[str, Any]]) -> str:
    def worst(d: Any) -> str:
        if not isinstance(d, dict) or not d:
            return "-"
        vals = [v for v in d.values() if v is not None]
        return f"{max(vals):.0f}" if vals else "-"

    def snap(d: Any) -> str:
        vals = [v for v in (d or {}).values() if v is not None] if isinstance(d, dict) else []
        return f"{max(vals):.2f}" if vals else "none"

    head = ("| load | backlog MB | RSS peak / settled MB (max node) | disk MB/node | snapshot MB"
            " | restart -> publish s | join s (RSS new / leader MB) | consume+ack warm / cold /s"
            " |\n|---|---|---|---|---|---|---|---|")  # fmt: skip
    lines = [head] if any("cap_mb" not in r for r in rows) else []
    for r in rows:
        if "cap_mb" in r:
            continue
        load = f"{r['messages']:,} x {r['size']} B, {r['topics']} topic(s)"
        join = (f"{r['join_s']} ({r['join_rss_new_mb']:.0f} / {r['join_rss_leader_mb']:.0f})"
                if "join_s" in r else "-")  # fmt: skip
        consumed = (f"{r['warm_consume_rate']} / {r['cold_consume_rate']} "
                    f"({r['cold_over_warm']}x)" if "cold_over_warm" in r else "-")  # fmt: skip
        lines.append(
            f"| {load} | {r['backlog_mb']} | {worst(r.get('rss_peak_mb'))} / "
            f"{worst(r.get('rss_settled_mb'))} | {worst(r.get('disk_mb'))} | "
            f"{snap(r.get('snapshot_mb'))} | {r.get('restart_publish_s', '-')} | {join} | "
            f"{consumed} |"
        )
    failed = [r for r in rows if "error" in r]
    for r in failed:  # (what was measured before it is in the row above)
        lines.append(f"\n{r['messages']:,} x {r['size']} B, {r['topics']} topic(s) failed: "
                     f"{r['error']}")  # fmt: skip
    for r in rows:
        if "cap_mb" not in r:
            continue
        if r.get("skipped"):
            lines.append(f"\nMemory cap {r['cap_mb']} MB: skipped ({r['skipped']}).")
            continue
        lines.append(
            f"\nMemory cap {r['cap_mb']} MB/node ({r.get('cgroup')}), backlog target "
            f"{r['target_backlog_mb']} MB of {r['payload']} B messages: "
            f"**{'survived' if r['survived'] else 'did not survive'}**; published "
            f"{r['published_mb']} MB in {r['seconds']} s, consumed {r['consumed']}; node "
            f"processes exited {r['nodes_exited'] or 'none'} ({r['node_deaths']}); OOM kills "
            f"in the cgroups {r['oom_kills']} (first after {r['first_oom_kill'] or '-'}; victims "
            f"{r.get('oom_victims') or '?'}); cgroup peak MB {r['cgroup_peak_mb']}; restart "
            f"under the cap: {r.get('restart_under_cap', '-')}."
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--loads", default="10000000x100,2000000x1024",
                   help="N x S backlogs (default: the issue's)")  # fmt: skip
    p.add_argument("--topics", default="1,100", help="spread each load over this many topics")
    p.add_argument("--consume", type=int, default=100_000,
                   help="messages consumed in each cold and each warm round")  # fmt: skip
    p.add_argument("--rounds", type=int, default=3,
                   help="pairs of cold and warm consumes after the restart")  # fmt: skip
    p.add_argument(
        "--settle",
        type=float,
        default=10.0,
        help="seconds after the fill before the settled RSS, and after the restart",
    )
    p.add_argument("--no-join", action="store_true", help="skip adding a fourth node")
    p.add_argument(
        "--dedup-window",
        type=float,
        default=None,
        help="the topics' dedup window in seconds (default: the topic default)",
    )
    p.add_argument("--cap-mb", type=int, default=512, help="memory cap per node; 0: skip")
    p.add_argument("--cap-factor", type=int, default=3, help="backlog = this x the cap")
    p.add_argument("--cap-payload", type=int, default=16384, help="message size, cap case")
    p.add_argument("--cap-drain-every", type=int, default=10,
                   help="cap case: one message consumed per this many published")  # fmt: skip
    p.add_argument("--cap-timeout", type=float, default=1800, help="bound of the cap case (s)")
    p.add_argument("--only-cap", action="store_true", help="the memory-cap case alone")
    p.add_argument("--quick", action="store_true",
                   help="smoke: 3000 x 100 B over 2 topics, 2 rounds, no cap case")  # fmt: skip
    p.add_argument("--keep", action="store_true", help="keep the data dirs (printed)")
    p.add_argument("--out", default="backlog-results.json")
    args = p.parse_args()
    if args.quick:
        args.loads, args.topics, args.consume, args.settle = "3000x100", "2", 200, 0.2
        args.rounds = 2
        args.cap_mb = 0
    rows: list[dict[str, Any]] = []
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    meta = {"fsync": "always", "nodes": 3, "cpus": os.cpu_count(), "argv": sys.argv[1:],
            "args": vars(args), "started": started}  # fmt: skip
    with contextlib.suppress(OSError):
        meta["commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
            cwd=Path(local_cluster_module.__file__).parent,  # (the raftq measured)
        ).stdout.strip()  # fmt: skip
    if not args.only_cap:
        for n, size in parse_loads(args.loads):
            for ntopics in (int(t) for t in args.topics.split(",")):
                rows.append(asyncio.run(one_load(n, size, ntopics, args)))
    if args.cap_mb:
        rows.append(asyncio.run(memory_cap(args)))
    md = table(rows)
    print("\n" + md)
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows, "table": md}, indent=1))
    print(f"\nwrote {args.out}")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
