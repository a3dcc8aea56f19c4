"""Test-only process running one RaftNode, driven by JSON lines on stdin/stdout.

Requests ``{"id": 1, "op": "propose", "commands": [...], "timeout": 5}`` (a ``payload`` string
in a publish message and a receive's ``token`` are sent as UTF-8 bytes), ``status``,
``payloads`` (every payload of a topic), ``digest``, ``stats``, ``transfer``, ``compact``,
``candidates`` (the store compactions a leader would propose now), ``add_member``,
``remove_member``, ``stop``. Every answer is ``{"id": 1, "ok": ...}`` or
``{"id": 1, "error": "<Class>", ...}``. Prints ``{"ready": true}`` once started, or
``{"fatal": "..."}`` and exits 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from dataclasses import asdict
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from raftq.cluster.raft import RaftConfig, RaftError, RaftNode
from raftq.cluster.raft._tuning import COOL_BYTES, INLINE_SNAPSHOT_US
from raftq.cluster.segstore import SEGMENT_BYTES
from raftq.cluster.state import Broker
from raftq.cluster.storage import Disk


def _out(obj: dict[str, Any]) -> None:
    def default(o: Any) -> Any:
        if isinstance(o, bytes):
            return o.decode("utf-8", "replace")
        raise TypeError(type(o).__name__)

    sys.stdout.write(json.dumps(obj, default=default) + "\n")
    sys.stdout.flush()


def _bytes_payloads(commands: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for c in commands:
        if c.get("op") == "receive" and isinstance(c.get("token"), str):
            c["token"] = c["token"].encode()
        for m in c.get("messages", []) if c.get("op") == "publish" else []:
            if isinstance(m.get("payload"), str):
                m["payload"] = m["payload"].encode()
    return commands


def _payloads(b: Broker, topic: str) -> list[str]:
    if topic not in b.topics:
        return []
    out: list[str] = []
    seq = None
    while True:
        page = b.peek(topic, seq, 1000)
        if not page:
            return out
        out.extend(m["payload"].decode() for m in page)
        seq = page[-1]["seq"] + 1


async def bench(node: RaftNode, req: dict[str, Any]) -> dict[str, Any]:
    """Sequential (per worker) proposals of ``batch`` messages of ``size`` bytes, in-process."""
    topic, batch, size = req["topic"], req["batch"], req["size"]
    n, workers = req["batches"], req.get("concurrency", 1)
    cmd = [{"op": "publish", "topic": topic, "messages": [{"payload": b"x" * size}] * batch}]
    lat: list[float] = []

    async def worker(k: int) -> None:
        for _ in range(k):
            t0 = time.perf_counter()
            await node.propose(cmd, 10.0)
            lat.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(n // workers) for _ in range(workers)))
    elapsed = time.perf_counter() - t0
    lat.sort()
    return {
        "msgs_per_s": len(lat) * batch / elapsed,
        "p50_ms": lat[len(lat) // 2] * 1000,
        "p99_ms": lat[int(len(lat) * 0.99)] * 1000,
        "proposals": len(lat),
    }


async def handle(node: RaftNode, req: dict[str, Any], stop: asyncio.Event) -> None:
    rid, op = req.get("id"), req["op"]
    try:
        if op == "propose":
            res: Any = await node.propose(_bytes_payloads(req["commands"]), req.get("timeout", 5.0))
        elif op == "status":
            res = asdict(node.status())
        elif op == "payloads":
            res = node.read(lambda b: _payloads(b, req["topic"]))
        elif op == "candidates":
            res = node.read(lambda b: b.compaction_candidates())
        elif op == "digest":
            res = node.read(lambda b: b.digest())
        elif op == "stats":
            res = {**node.stats, "log_len": len(node._journal) if node._journal is not None else 0}
            if req.get("reset"):
                node.stats["max_tick_ms"] = 0
        elif op == "transfer":
            res = await node.transfer_leadership(req.get("timeout", 5.0))
        elif op == "compact":
            node.force_compaction()
            res = True
        elif op == "add_member":
            await node.add_member(req["node_id"], req["raft"], req["api"], req.get("timeout", 10))
            res = True
        elif op == "remove_member":
            await node.remove_member(req["node_id"], req.get("timeout", 10))
            res = True
        elif op == "bench":
            res = await bench(node, req)
        elif op == "stop":
            await node.stop()
            stop.set()
            res = True
        else:
            raise ValueError(f"unknown op {op!r}")
        _out({"id": rid, "ok": res})
    except RaftError as e:
        _out(
            {
                "id": rid,
                "error": type(e).__name__,
                "message": str(e),
                "leader": getattr(e, "leader_id", None),
            }
        )
    except Exception as e:
        _out({"id": rid, "error": type(e).__name__, "message": repr(e)})


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--id", required=True)
    ap.add_argument("--raft", required=True)
    ap.add_argument("--api", required=True)
    ap.add_argument("--peers", required=True, help="JSON {id: [raft, api]}")
    ap.add_argument("--data", required=True)
    ap.add_argument("--fsync", default="always")
    ap.add_argument("--shadow", default=None, help="power-loss model dir (SimDisk)")
    ap.add_argument("--secret", default="test-secret")
    ap.add_argument("--compaction-entries", type=int, default=10_000)
    ap.add_argument("--no-ack-fix", action="store_true")
    ap.add_argument("--segment-bytes", type=int, default=SEGMENT_BYTES, help="store segments")
    ap.add_argument("--cool-bytes", type=int, default=COOL_BYTES, help="Journal.cool's period")
    ap.add_argument("--inline-snapshot-us", type=int, default=INLINE_SNAPSHOT_US,
                    help="-1: every snapshot by a forked writer")  # fmt: skip
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    disk: Disk | None = None
    if args.shadow:
        from tests.raft.simdisk import SimDisk

        disk = SimDisk(args.shadow)
    peers = {k: (v[0], v[1]) for k, v in json.loads(args.peers).items()}
    cfg = RaftConfig(args.id, args.raft, args.api, peers, args.data, args.secret, fsync=args.fsync)
    node = RaftNode(
        cfg,
        disk=disk,
        compaction_entries=args.compaction_entries,
        store_segment_bytes=args.segment_bytes,
        inline_snapshot_us=args.inline_snapshot_us,
        cool_bytes=args.cool_bytes,
        fix_stale_acks=not args.no_ack_fix,
    )
    try:
        node.start()
    except Exception as e:
        _out({"fatal": f"{type(e).__name__}: {e}"})
        sys.exit(2)
    _out({"ready": True})
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    stop = asyncio.Event()
    tasks: set[asyncio.Task[None]] = set()
    while not stop.is_set():
        line = await reader.readline()
        if not line:
            break
        t = asyncio.create_task(handle(node, json.loads(line), stop))
        tasks.add(t)
        t.add_done_callback(tasks.discard)
    if not stop.is_set():
        await node.stop()


if __name__ == "__main__":
    asyncio.run(main())
