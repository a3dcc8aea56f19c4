"""The read side with many topics: the size and time of a ``/metrics`` scrape and of a
``GET /topics`` page, on one in-process node (``LocalRaft``, real HTTP on 127.0.0.1).

    .venv/bin/python bench/read_side.py [--topics 10000] [--metrics-topics N|all] [--runs 30]

Every tenth topic holds one message (a backlog); the rest are empty. Without
``--metrics-topics`` the node's default applies. Timings on a shared 2-core box are noisy:
compare medians and minimums, and the render's CPU time (``time.process_time``: what other
processes on the box do not change). To compare with an older checkout, run this script
with ``PYTHONPATH=<old>/cluster:<old>/node:<old>/client``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from raftq.node.app import SERVICE, NodeSettings, build_app
from raftq.node.local import LocalRaft


async def timed(client: TestClient[web.Request, web.Application], path: str, runs: int) -> str:
    await (await client.get(path)).read()  # (warm)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        body = await (await client.get(path)).read()
        times.append(time.perf_counter() - t)
    return (
        f"GET {path}: {len(body):,} bytes, median {statistics.median(times) * 1000:.1f} ms,"
        f" min {min(times) * 1000:.1f} ms"
    )


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--topics", type=int, default=10_000)
    p.add_argument("--metrics-topics", default=None)
    p.add_argument("--runs", type=int, default=30)
    args = p.parse_args()
    raft = LocalRaft()
    for i in range(args.topics):
        topic = f"topic-{i:05d}"
        raft.broker.apply({"op": "create_topic", "topic": topic, "now": 1})
        if i % 10 == 0:
            msg = {"op": "publish", "topic": topic, "now": 1, "messages": [{"payload": b"x"}]}
            raft.broker.apply(msg)
    settings = NodeSettings(auth=False)
    if args.metrics_topics is not None:
        n = args.metrics_topics
        settings = NodeSettings(auth=False, metrics_topics=None if n == "all" else int(n))
    # (getattr: the script runs on versions before --metrics-topics too, to compare)
    shown = getattr(settings, "metrics_topics", "all")
    print(f"{args.topics} topics, metrics_topics={shown}")
    application = build_app(raft, settings)
    async with TestClient(TestServer(application, host="127.0.0.1")) as client:
        for path in ("/metrics", "/topics"):
            print(await timed(client, path, args.runs))
    metrics = application[SERVICE].metrics
    cpu = []
    for _ in range(args.runs):
        t = time.process_time()
        metrics.render()
        cpu.append(time.process_time() - t)
    print(
        f"/metrics render, CPU time: median {statistics.median(cpu) * 1000:.1f} ms,"
        f" min {min(cpu) * 1000:.1f} ms"
    )


if __name__ == "__main__":
    asyncio.run(main())
