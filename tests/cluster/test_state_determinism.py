"""Replicas fed the same log end byte-identical, whatever their hash seed or restore point.

The log is a random stream of raft entries (``entry.encode_entry``) built against one broker,
so that its receipts are real. Another Python process with a different ``PYTHONHASHSEED``
applies the same bytes, once straight through and once restoring from a snapshot taken half
way; every snapshot and every result must match.
"""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgpack
import pytest
from state_harness import check_invariants  # type: ignore[import-not-found]

from raftq.cluster.entry import apply_entry, encode_entry
from raftq.cluster.state import Broker

TOPICS = {
    "orders": {"max_messages": 40, "overflow": "drop_oldest", "dedup_window": 3},
    "jobs": {"max_messages": 60, "overflow": "reject", "max_age": 20},
    "events": {},
}
PATTERNS = ["*", "orders", "orders.*", "jobs", "jobs.*", "events", "o.*", "orders.dlq"]
ACTIONS = ["publish", "consume", "admin"]


def make_log(seed: int, entries: int) -> list[bytes]:
    """A random but realistic command stream: receipts come from earlier results."""
    rng = random.Random(seed)
    b = Broker()
    now = 1_700_000_000_000
    receipts: list[str] = []
    groups: dict[str, list[str]] = {}
    log: list[bytes] = []

    def first() -> list[dict[str, Any]]:
        cmds: list[dict[str, Any]] = []
        for t, cfg in TOPICS.items():
            gs = [f"g{i}" for i in range(rng.randint(1, 3))]
            groups[t] = gs
            gcfgs = [
                {
                    "group": g,
                    "config": {
                        "visibility_timeout": rng.choice([1, 2.5, 5]),
                        "max_attempts": rng.choice([0, 1, 1, 2, 3]),
                        "backoff": rng.choice([[], [0.5], [1, 2]]),
                        "ordered": rng.random() < 0.5,
                    },
                }
                for g in gs
            ]
            cmds.append({"op": "create_topic", "topic": t, "config": cfg, "groups": gcfgs})
        return cmds

    def command() -> dict[str, Any]:
        t = rng.choice(list(TOPICS))
        g = rng.choice(groups[t])
        r = rng.random()
        some = rng.sample(receipts, min(len(receipts), rng.randint(1, 4))) or ["x:y:1:1:z"]
        if r < 0.3:
            msgs = []
            for _ in range(rng.randint(1, 6)):
                m: dict[str, Any] = {"payload": rng.randbytes(rng.randint(0, 40))}
                if rng.random() < 0.3:
                    m["key"] = f"k{rng.randint(0, 30)}"
                if rng.random() < 0.2:
                    m["delay"] = rng.choice([0.3, 1, 4])
                if rng.random() < 0.2:
                    m["headers"] = {f"h{rng.randint(0, 9)}": "v" for _ in range(3)}
                if rng.random() < 0.5:
                    m["ordering_key"] = f"o{rng.randint(0, 3)}"
                msgs.append(m)
            return {"op": "publish", "topic": t, "messages": msgs}
        if r < 0.55:
            cmd = {
                "op": "receive",
                "topic": t,
                "group": g,
                "consumer": f"c{rng.randint(0, 2)}",
                "max": rng.randint(1, 8),
                "token": rng.randbytes(16),
            }
            if rng.random() < 0.2:
                cmd["visibility"] = rng.choice([0.5, 3])
            return cmd
        if r < 0.7:
            return {"op": "ack", "receipts": some}
        if r < 0.77:
            return {"op": "nack", "receipts": some, "delay": rng.choice([None, 0, 0.7])}
        if r < 0.81:
            return {"op": "extend", "receipts": some, "seconds": rng.choice([0.5, 2, 6])}
        if r < 0.84:
            return {"op": "term", "receipts": some, "reason": "bad"}
        if r < 0.88:
            cmd = {"op": "release", "consumer": f"c{rng.randint(0, 2)}"}
            if rng.random() < 0.5:
                cmd["topics"] = rng.sample(PATTERNS, rng.randint(0, 2))
            return cmd
        if r < 0.89:
            return {"op": "redrive", "topic": f"{t}.dlq", "max": rng.randint(1, 5)}
        if r < 0.9:
            return {"op": "purge", "topic": t, **({"group": g} if rng.random() < 0.7 else {})}
        if r < 0.92:
            name = f"n{rng.randint(0, 3)}"
            if name in groups[t]:
                groups[t].remove(name)
                return {"op": "delete_group", "topic": t, "group": name}
            groups[t].append(name)
            start = rng.choice(["earliest", "latest"])
            return {"op": "create_group", "topic": t, "group": name, "start": start}
        if r < 0.93:
            gcfg: dict[str, Any] = {"max_attempts": 2}
            if rng.random() < 0.5:
                gcfg = {"ordered": rng.random() < 0.5}
            return {"op": "update_group", "topic": t, "group": g, "config": gcfg}
        if r < 0.94:
            config: dict[str, Any] = {
                "max_age": rng.choice([None, 2, 30]),
                "dedup_window": rng.choice([1, 3, 10]),
            }
            if rng.random() < 0.3:
                config = {"labels": {f"l{i}": "v" * i for i in range(rng.randint(0, 3))}}
            return {"op": "update_topic", "topic": t, "config": config}
        if r < 0.95:
            return {"op": rng.choice(["nope", "publish", "receive"]), "topic": 7}
        if r < 0.97:
            return token_command()
        if r < 0.975:  # the node-wide limit, around what the log retains
            limit = rng.choice([None, 300, 1500, 3000])
            return {"op": "cluster_settings", "config": {"max_retained_bytes": limit}}
        return {"op": "tick"}

    def token_command() -> dict[str, Any]:
        """Ids and names from small pools, so that creates collide and updates rename into
        taken names; the hash is random bytes, 31 of them now and then."""
        tid = f"tok{rng.randint(0, 4)}"
        r = rng.random()
        fields: dict[str, Any] = {}
        if r < 0.4 or rng.random() < 0.3:
            fields["name"] = f"n{rng.randint(0, 4)}"
        if r < 0.4 or rng.random() < 0.3:
            fields["grants"] = [
                {"topics": rng.choice(PATTERNS), "actions": rng.sample(ACTIONS, rng.randint(1, 3))}
                for _ in range(rng.randint(0, 3))
            ]
        for f in ("cluster", "disabled"):
            if rng.random() < 0.3:
                fields[f] = rng.random() < 0.5
        if rng.random() < 0.3:
            fields["expires_at"] = rng.choice([None, now + rng.randint(0, 10**6)])
        if r < 0.4:
            fields.pop("disabled", None)
            digest = rng.randbytes(32 if rng.random() < 0.9 else 31)
            return {"op": "token_create", "id": tid, "hash": digest, **fields}
        if r < 0.85:
            return {"op": "token_update", "id": tid, **fields}
        return {"op": "token_revoke", "id": tid}

    for i in range(entries):
        now += rng.choice([0, 0, 1, 50, 400, 1500, 4000])
        cmds = first() if i == 0 else [command() for _ in range(rng.randint(1, 5))]
        data = encode_entry(now, cmds)
        log.append(data)
        for res in apply_entry(b, data):
            for d in res.get("deliveries", ()):
                receipts.append(d["receipt"])
        del receipts[:-60]
    return log


def run(log: list[bytes], restore_at: int | None = None, leader: bool = False) -> tuple[bytes, str]:
    """Apply the log; optionally move to a restored copy after ``restore_at`` entries, or
    ask ``next_due()`` after each entry as the leader does (it tidies internal heaps).
    Returns the final snapshot and a digest of every result."""
    b = Broker()
    h = hashlib.blake2b(digest_size=16)
    for i, data in enumerate(log):
        if i == restore_at:
            copy = Broker()
            copy.restore(b.snapshot())
            b = copy
        h.update(msgpack.packb(apply_entry(b, data), use_bin_type=True))
        if leader:
            b.next_due()
    return b.snapshot(), h.hexdigest()


CHILD = """
import sys, msgpack
from test_state_determinism import run
log = msgpack.unpackb(open(sys.argv[1], "rb").read())
half = len(log) // 2
snap1, res1 = run(log)
snap2, res2 = run(log, restore_at=half)
open(sys.argv[2], "wb").write(msgpack.packb([snap1, res1, snap2, res2]))
"""


@pytest.mark.parametrize("seed", [1, 2])
def test_replicas_with_other_hash_seeds_and_restore_points_end_byte_identical(
    seed: int, tmp_path: Path
) -> None:
    log = make_log(seed, 800)
    snap, results = run(log)
    assert run(log) == (snap, results)  # same process, fresh broker
    assert run(log, restore_at=len(log) // 3) == (snap, results)
    assert run(log, leader=True) == (snap, results)

    log_file, out_file = tmp_path / "log", tmp_path / "out"
    log_file.write_bytes(msgpack.packb(log))
    env = {**os.environ, "PYTHONHASHSEED": str(4242 + seed)}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).parent), *filter(None, [env.get("PYTHONPATH")])]
    )
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(log_file), str(out_file)],
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    snap1, res1, snap2, res2 = msgpack.unpackb(out_file.read_bytes())
    assert (snap1, res1) == (snap, results)
    assert (snap2, res2) == (snap, results)


def test_the_random_log_keeps_the_bookkeeping_consistent_and_exercises_every_path() -> None:
    """Internal invariants hold after every entry; and the generator reaches the interesting
    paths (a log that never dead-letters or times out proves little)."""
    b = Broker()
    blocked = 0  # most messages an ordered group held back at once behind their key
    codes: dict[str, int] = {}
    for data in make_log(1, 800):
        for res in apply_entry(b, data):
            if "error" in res:
                codes[res["error"]["code"]] = codes.get(res["error"]["code"], 0) + 1
        check_invariants(b)
        for topic in b.topics.values():
            for g in topic.groups.values():
                if g.kq is not None:
                    blocked = max(blocked, sum(len(q) - 1 for q in g.kq.values()))
    totals: dict[str, int] = {}
    for t in TOPICS:
        for g in b.topic_stats(t)["groups"]:
            for k, n in g.items():
                if k.endswith("_total"):
                    totals[k] = totals.get(k, 0) + n
    for k in ("acked_total", "timed_out_total", "dead_lettered_total", "redelivered_total"):
        assert totals[k] > 10, (k, totals)
    assert any(t.endswith(".dlq") for t in b.list_topics())
    assert b.tokens(), "some tokens are left for the snapshots to carry"
    assert blocked > 3, blocked
    assert codes.get("storage_full", 0) > 3, codes
