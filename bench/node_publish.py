"""Publish throughput of a real 3-node raftq cluster on loopback (group commit end to end).

    .venv/bin/python bench/node_publish.py [--seconds 5] [--concurrency 64] [--batch 100]

Starts a fresh cluster (fsync as given, default "always") under a temp dir, then for a few seconds
each: single-message publishes from N concurrent connections to the leader, the same through a
follower (one proxy hop), batch publishes of --batch messages, and finally consumers that receive
up to 100 and ack them in one request. Prints requests/s, messages/s, latency percentiles and the
mean Raft entry size. The load generator shares the machine: numbers on a 2-core box are noisy.
Access control is on: the nodes get the fixture's admin token, and every request sends it.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.node.cluster_fixture import Cluster


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def run(
    url: str, topic: str, seconds: float, conc: int, batch: int, token: str
) -> dict[str, float]:
    payload = base64.b64encode(b"x" * 100).decode()
    if batch > 1:
        path = f"/topics/{topic}/publish"
        body: dict[str, Any] = {"messages": [{"payload": payload}] * batch}
    else:
        path, body = f"/topics/{topic}/messages", {"payload": payload}
    lat: list[float] = []
    errors = 0
    stop = time.monotonic() + seconds

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal errors
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            async with session.post(url + path, json=body) as r:
                await r.read()
                if r.status != 200:
                    errors += 1
            lat.append(time.perf_counter() - t0)

    conn = aiohttp.TCPConnector(limit=conc)
    async with aiohttp.ClientSession(connector=conn, headers=bearer(token)) as session:
        t0 = time.monotonic()
        await asyncio.gather(*(worker(session) for _ in range(conc)))
        took = time.monotonic() - t0
    lat.sort()
    return {
        "req_s": len(lat) / took,
        "msg_s": len(lat) * batch / took,
        "p50_ms": 1000 * lat[len(lat) // 2],
        "p99_ms": 1000 * lat[int(len(lat) * 0.99)],
        "mean_ms": 1000 * statistics.fmean(lat),
        "errors": errors,
    }


async def consume(url: str, topic: str, seconds: float, conc: int, n: int, token: str) -> float:
    """Receive up to ``n`` per request and ack them in one request; returns acked msg/s."""
    acked = 0
    stop = time.monotonic() + seconds

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal acked
        while time.monotonic() < stop:
            path = f"/topics/{topic}/groups/default/receive"
            async with session.post(url + path, json={"max": n, "wait": 1}) as r:
                got = (await r.json())["deliveries"]
            if got:
                receipts = [d["receipt"] for d in got]
                async with session.post(url + "/ack", json={"receipts": receipts}) as r:
                    acked += (await r.json())["acked"]

    async with aiohttp.ClientSession(headers=bearer(token)) as session:
        t0 = time.monotonic()
        await asyncio.gather(*(worker(session) for _ in range(conc)))
        return acked / (time.monotonic() - t0)


async def entry_stats(url: str, token: str) -> tuple[float, float]:
    # (/metrics is open unless the node runs with --auth-observe; the token does no harm)
    async with aiohttp.ClientSession(headers=bearer(token)) as s, s.get(url + "/metrics") as r:
        text = await r.text()
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith("raftq_batch_commands_sum"):
            total = float(line.split()[-1])
        elif line.startswith("raftq_batch_commands_count"):
            count = float(line.split()[-1])
    return total, count


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--fsync", default="always", choices=["always", "never"])
    ap.add_argument("--max-inflight", type=int, default=4)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        c = Cluster(
            Path(d), 3, fsync=args.fsync, extra_args=["--max-inflight", str(args.max_inflight)]
        )
        try:
            c.start()
            lid = c.wait_leader()
            leader, follower = c.url(lid), c.url(c.followers()[0])
            async with (
                aiohttp.ClientSession(headers=bearer(c.token)) as s,
                s.post(leader + "/topics", json={"topic": "bench"}) as r,
            ):
                r.raise_for_status()
            cases = [
                ("single via leader", leader, 1),
                ("single via follower", follower, 1),
                (f"batch {args.batch} via leader", leader, args.batch),
            ]
            print(
                f"3 nodes, fsync={args.fsync}, max-inflight {args.max_inflight}, "
                f"{args.concurrency} connections, 100-byte messages"
            )
            for name, url, batch in cases:
                before = await entry_stats(leader, c.token)
                res = await run(url, "bench", args.seconds, args.concurrency, batch, c.token)
                after = await entry_stats(leader, c.token)
                per_entry = (after[0] - before[0]) / max(1.0, after[1] - before[1])
                print(
                    f"{name:22s} {res['req_s']:8.0f} req/s {res['msg_s']:9.0f} msg/s  "
                    f"p50 {res['p50_ms']:6.1f} ms  p99 {res['p99_ms']:6.1f} ms  "
                    f"{per_entry:5.1f} commands/entry  errors {res['errors']:.0f}"
                )
            rate = await consume(leader, "bench", args.seconds, 8, 100, c.token)
            print(f"{'consume+ack via leader':22s} {rate:9.0f} msg/s (8 consumers, max 100)")
        finally:
            c.close()


if __name__ == "__main__":
    asyncio.run(main())
