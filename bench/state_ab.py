"""Paired A/B of two versions of the state machine in one process (not a test).

    git show main:cluster/raftq/cluster/state.py > /tmp/base_state.py
    .venv/bin/python bench/state_ab.py /tmp/base_state.py [--rounds 30] [--batches 300]

Loads the given ``state.py`` as A (its imports of ``raftq.cluster.*`` resolve to this
checkout's: a change to ``topics.py``, ``snapshot.py`` or any other module shows on both sides
alike, so measure those with ``bench/ab.py``) and this checkout's ``raftq.cluster.state`` as B,
then alternates A B / B A over the same decoded entries of ``bench/state_machine.py``: publish
of 100 x 100 B messages per entry, and receive max=100 + ack; then (unless ``--no-keyed``) the
same publishes with an idempotency key (uuid-shaped) on every message, to a fresh broker each
round (so the keys' table grows from empty: 30k keys). It keeps each side's least CPU time
(``process_time``) over the rounds: on a shared VM a rate scatters by 15-40 % from run to run,
the best of many paired rounds far less. Prints the rates and B/A.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import state_machine as sm  # type: ignore[import-not-found]

from raftq.cluster import state as this_state
from raftq.cluster.entry import decode_entry


def load(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("raftq_state_a", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def publish(mod: Any, entries: list[tuple[int, list[Any]]]) -> tuple[float, Any]:
    b = mod.Broker()
    b.apply({"op": "create_topic", "topic": "t", "now": sm.NOW})
    gc.collect()
    t0 = time.process_time()
    for now, cmds in entries:
        b.apply_batch(now, cmds)
    return time.process_time() - t0, b


def receive_ack(b: Any, n: int) -> float:
    now = sm.NOW + 10**6
    token = b"\x07" * 16
    gc.collect()
    t0 = time.process_time()
    for _ in range(n):
        now += 1
        cmd = {"op": "receive", "topic": "t", "group": "default", "consumer": "c1", "max": 100}
        res = b.apply_batch(now, [{**cmd, "token": token}])
        receipts = [d["receipt"] for d in res[0]["deliveries"]]
        b.apply_batch(now, [{"op": "ack", "receipts": receipts}])
    return time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("base", help="the state.py of side A")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--batches", type=int, default=300, help="entries of 100 per case")
    ap.add_argument("--no-keyed", dest="keyed", action="store_false", help="skip keyed publish")
    args = ap.parse_args()
    sides = {"A": load(args.base), "B": this_state}
    entries = [decode_entry(e) for e in sm.publish_entries(args.batches)]
    keyed = [decode_entry(e) for e in sm.publish_entries(args.batches, keyed=True)]
    best: dict[tuple[str, str], float] = {}
    for r in range(args.rounds):
        for name in ("A", "B") if r % 2 == 0 else ("B", "A"):
            dt, b = publish(sides[name], entries)
            best[name, "publish"] = min(best.get((name, "publish"), dt), dt)
            dt = receive_ack(b, args.batches)
            best[name, "receive+ack"] = min(best.get((name, "receive+ack"), dt), dt)
            if args.keyed:
                del b
                dt, _ = publish(sides[name], keyed)
                best[name, "publish keyed"] = min(best.get((name, "publish keyed"), dt), dt)
    n = args.batches * sm.BATCH
    for case in ("publish", "receive+ack", "publish keyed")[: 3 if args.keyed else 2]:
        a, b = best["A", case], best["B", case]
        print(
            f"{case:<13} A {n / a:>12,.0f}/s   B {n / b:>12,.0f}/s   B/A {a / b:.3f}"
            f"   B-A {(b - a) / n * 1e6:+.3f} us/message"
        )


if __name__ == "__main__":
    main()
