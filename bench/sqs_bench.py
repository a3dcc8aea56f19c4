"""raftq's SQS endpoint beside moto_server and beside raftq's native API, in one run.

    pip install -e '.[dev,bench]'
    python bench/sqs_bench.py --rounds 4 --n 5000 --secs 5

Sides, all on this box, every server on loopback:
  raftq-sqs   boto3 against the SQS listener of the leader of 3 local nodes (fsync always)
  moto        boto3 against moto_server (moto[server]: one process, in memory, no replication),
              the emulator people run today
  raftq       the native client on the same 3 nodes: `raftq bench` cases (a) one publish at a
              time (beside send-1), (b) pipelined single publishes and (d) streaming consume +
              ack (node/raftq/node/bench.py; --native-n messages, as `raftq bench --n`)
Work of each SQS side, per round (``--size`` byte bodies):
  send-batch    --n messages by SendMessageBatch (10 a request), --threads requests in flight
  recv-delete   the same messages drained by ReceiveMessage(MaxNumberOfMessages=10) then
                DeleteMessageBatch of what came, --threads loops at once
                (both in chunks of --backlog messages: send a chunk, drain it; the times add)
  send-1        one SendMessage at a time, awaiting each, for --secs: rate and p50/p99
Rounds alternate the order of the sides (raftq-sqs, moto, raftq; then backwards), so the box's
drift (±15-40 % between minutes here) hits each side alike; the table gives the median over
rounds and its min..max. boto3 is synchronous: its threads share this process's GIL and the
box's 2 cores with the servers, so the SQS sides are bounded by the client as much as by the
server (the same for moto and raftq). Writes every row as JSON (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import boto3
from botocore.config import Config
from tests.sqs.conftest import SqsCluster
from tests.sqs.moto_server import KEY, SECRET, MotoServer

from raftq.client import AsyncClient
from raftq.node.bench import Results, one_run, pct


class SqsSide:
    """One SQS endpoint and the boto3 clients of the bench's threads."""

    def __init__(self, name: str, url: str, key: str, secret: str, region: str) -> None:
        self.name, self.url = name, url
        session = boto3.session.Session(
            aws_access_key_id=key, aws_secret_access_key=secret, region_name=region
        )
        cfg = Config(max_pool_connections=64, retries={"mode": "standard", "max_attempts": 3})
        self._local = threading.local()
        self._make: Callable[[], Any] = lambda: session.client("sqs", endpoint_url=url, config=cfg)
        self._lock = threading.Lock()  # boto3 sessions are not thread-safe; clients are

    def client(self) -> Any:
        c = getattr(self._local, "client", None)
        if c is None:
            with self._lock:
                c = self._local.client = self._make()
        return c


def send_batch(side: SqsSide, qurl: str, n: int, body: str, threads: int) -> float:
    batches = [min(10, n - i) for i in range(0, n, 10)]

    def one(k: int) -> None:
        entries = [{"Id": str(j), "MessageBody": body} for j in range(k)]
        r = side.client().send_message_batch(QueueUrl=qurl, Entries=entries)
        if r.get("Failed"):
            raise RuntimeError(f"{side.name}: SendMessageBatch failed entries: {r['Failed']}")

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, batches))
    return time.perf_counter() - t0


def receive_delete(side: SqsSide, qurl: str, n: int, threads: int, limit: float) -> float:
    got = 0
    lock = threading.Lock()
    deadline = time.monotonic() + limit

    def loop() -> None:
        nonlocal got
        c = side.client()
        while time.monotonic() < deadline:
            with lock:
                if got >= n:
                    return
            msgs = c.receive_message(QueueUrl=qurl, MaxNumberOfMessages=10,
                                     WaitTimeSeconds=1).get("Messages", [])  # fmt: skip
            if not msgs:
                continue
            entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                       for i, m in enumerate(msgs)]  # fmt: skip
            r = c.delete_message_batch(QueueUrl=qurl, Entries=entries)
            if r.get("Failed"):
                raise RuntimeError(f"{side.name}: DeleteMessageBatch failed: {r['Failed']}")
            with lock:
                got += len(msgs)
                if got >= n:
                    done.append(time.perf_counter())

    done: list[float] = []
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        for f in [pool.submit(loop) for _ in range(threads)]:
            f.result()
    if got < n:
        raise RuntimeError(f"{side.name}: drained {got} of {n} within {limit} s")
    # The clock stops at the last delete, not when the other threads' long polls run out.
    return done[0] - t0


def send_one(side: SqsSide, qurl: str, secs: float, body: str) -> tuple[int, float, list[float]]:
    c = side.client()
    lats: list[float] = []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < secs:
        a = time.perf_counter()
        c.send_message(QueueUrl=qurl, MessageBody=body)
        lats.append(time.perf_counter() - a)
    return len(lats), time.perf_counter() - t0, lats


def sqs_round(side: SqsSide, args: argparse.Namespace, rnd: int) -> list[dict[str, Any]]:
    c = side.client()
    qurl = c.create_queue(QueueName=f"bench-{uuid.uuid4().hex[:10]}")["QueueUrl"]
    body = "m" * args.size
    rows = []
    # In chunks of --backlog: moto's cost per request grows with the queue's length (a send
    # at 600 queued costs ~4x one at 0; a receive ~0.6 s), so both sides are measured with at
    # most --backlog messages queued.
    sent_secs = recv_secs = 0.0
    for i in range(0, args.n, args.backlog):
        k = min(args.backlog, args.n - i)
        sent_secs += send_batch(side, qurl, k, body, args.threads)
        recv_secs += receive_delete(side, qurl, k, args.threads, limit=120)
    rows.append({"case": "send-batch", "n": args.n, "secs": sent_secs})
    rows.append({"case": "recv-delete", "n": args.n, "secs": recv_secs})
    n, secs, lats = send_one(side, qurl, args.secs, body)
    rows.append({"case": "send-1", "n": n, "secs": secs,
                 "p50_ms": pct(lats, 50) * 1e3, "p99_ms": pct(lats, 99) * 1e3})  # fmt: skip
    c.delete_queue(QueueUrl=qurl)
    for r in rows:
        r.update(side=side.name, round=rnd, rate=r["n"] / r["secs"])
        lat = f" p50={r['p50_ms']:.2f}ms p99={r['p99_ms']:.2f}ms" if "p50_ms" in r else ""
        print(f"  [{side.name}] {r['case']} round {rnd}: {r['rate']:.0f}/s{lat}", flush=True)
    return rows


def native_round(urls: list[str], token: str, args: argparse.Namespace, rnd: int) -> list[
    dict[str, Any]
]:  # fmt: skip
    """Cases (b) and (d) of ``raftq bench`` on the same cluster and the same --n."""
    res = Results()
    ns = argparse.Namespace(n=args.native_n, window=args.window, secs=args.secs)

    async def run() -> None:
        async with AsyncClient(urls, token=token) as c:
            topic = f"bench-{uuid.uuid4().hex[:10]}"
            await c.create_topic(topic)
            await one_run(c, topic, b"m" * args.size, rnd, ns, set(args.native_cases), res)
            await c.delete_topic(topic)

    asyncio.run(run())
    return [{"case": r["case"].split(f" {args.size}B")[0], "n": r["n"], "secs": r["secs"],
             "rate": r["rate"],
             **({"p50_ms": r["p50_ms"], "p99_ms": r["p99_ms"]} if "p50_ms" in r else {}),
             "side": "raftq", "round": rnd} for r in res.rows]  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    out = ["| side | case | median /s (min..max) | p50 / p99 ms (median) |", "|---|---|---|---|"]
    for key in dict.fromkeys((r["side"], r["case"]) for r in rows):
        rs = [r for r in rows if (r["side"], r["case"]) == key]
        rates = [r["rate"] for r in rs]
        lat = ""
        if "p50_ms" in rs[0]:
            p50 = statistics.median(r["p50_ms"] for r in rs)
            p99 = statistics.median(r["p99_ms"] for r in rs)
            lat = f"{p50:.2f} / {p99:.2f}"
        out.append(f"| {key[0]} | {key[1]} | {statistics.median(rates):.0f} "
                   f"({min(rates):.0f}..{max(rates):.0f}) | {lat} |")  # fmt: skip
    return "\n".join(out)


# (numerator side, case), (denominator side, case): ratios taken within each round.
PAIRS = [
    (("raftq-sqs", "send-batch"), ("moto", "send-batch")),
    (("raftq-sqs", "recv-delete"), ("moto", "recv-delete")),
    (("raftq-sqs", "send-1"), ("moto", "send-1")),
    (("raftq-sqs", "send-batch"), ("raftq", "(b) pipelined publish")),
    (("raftq-sqs", "recv-delete"), ("raftq", "(d) consume+ack")),
    (("raftq-sqs", "send-1"), ("raftq", "(a) sync publish")),
]


def paired(rows: list[dict[str, Any]]) -> str:
    """Rate ratios of the same round (the box's drift cancels), median and range."""
    out = ["| rate ratio | median of rounds (min..max) |", "|---|---|"]
    for a, b in PAIRS:
        ra = {r["round"]: r["rate"] for r in rows if (r["side"], r["case"]) == a}
        rb = {r["round"]: r["rate"] for r in rows if (r["side"], r["case"]) == b}
        ratios = [ra[k] / rb[k] for k in ra if rb.get(k)]
        if ratios:
            out.append(f"| {a[0]} {a[1]} / {b[0]} {b[1]} | {statistics.median(ratios):.2f} "
                       f"({min(ratios):.2f}..{max(ratios):.2f}) |")  # fmt: skip
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--n", type=int, default=5000, help="messages per throughput case")
    p.add_argument("--backlog", type=int, default=200, help="at most this many queued (chunks)")
    p.add_argument("--size", type=int, default=100, help="message body bytes")
    p.add_argument("--secs", type=float, default=5.0, help="duration of send-1")
    p.add_argument("--threads", type=int, default=8, help="boto3 requests in flight")
    p.add_argument("--window", type=int, default=100, help="native (b): publishes in flight")
    p.add_argument("--native-cases", default="a,b,d", help="`raftq bench` cases (a, b, c, d)")
    p.add_argument("--native-n", type=int, default=20_000, help="native (b), (d): messages")
    p.add_argument("--sides", default="raftq-sqs,moto,raftq")
    p.add_argument("--out", type=Path, default=Path("sqs-bench.json"))
    p.add_argument("--tables", type=Path, help="only print the tables of an earlier --out")
    args = p.parse_args()
    if args.tables:
        earlier = json.loads(args.tables.read_text())
        print(table(earlier) + "\n\n" + paired(earlier))
        return 0
    sides = args.sides.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="raftq-sqs-bench-"))
    moto = MotoServer(tmp / "moto.log").start() if "moto" in sides else None
    cluster = start_cluster(tmp) if {"raftq-sqs", "raftq"} & set(sides) else None
    rows: list[dict[str, Any]] = []
    try:
        runs: dict[str, Callable[[int], list[dict[str, Any]]]] = {}
        if moto is not None:
            m = SqsSide("moto", moto.url, KEY, SECRET, "us-east-1")
            runs["moto"] = lambda k: sqs_round(m, args, k)
        if cluster is not None:
            cr = cluster.credentials()
            leader = cluster.sqs_url(cluster.wait_leader())
            r = SqsSide("raftq-sqs", leader, cr["access_key_id"], cr["secret_access_key"],
                        cr["region"])  # fmt: skip
            runs["raftq-sqs"] = lambda k: sqs_round(r, args, k)
            urls = [cluster.url(nid) for nid in cluster.nodes]
            runs["raftq"] = lambda k: native_round(urls, cluster.token, args, k)
        order = [s for s in sides if s in runs]
        for k in range(args.rounds):
            for s in order if k % 2 == 0 else order[::-1]:
                rows += runs[s](k)
    finally:
        if moto is not None:
            moto.stop()
        if cluster is not None:
            cluster.close()
    args.out.write_text(json.dumps(rows, indent=1))
    print(f"\n{args.rounds} rounds, {args.n} x {args.size} B, {args.threads} boto3 threads, "
          f"sides interleaved (order alternates each round); rows in {args.out}\n")  # fmt: skip
    print(table(rows) + "\n\n" + paired(rows))
    return 0


def start_cluster(tmp: Path) -> SqsCluster:
    cluster = SqsCluster(tmp, 3, fsync="always")
    cluster.start()
    return cluster


if __name__ == "__main__":
    os.environ.setdefault("AWS_CONFIG_FILE", os.devnull)
    os.environ.setdefault("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    sys.exit(main())
