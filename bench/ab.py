"""Paired A/B of ``raftq bench`` between two checkouts, in one run.

    python bench/ab.py --a /tmp/base --b . --rounds 6 --cases a,b,d
    python bench/ab.py --a . --b . --env-a RAFTQ_AUTH=off --cases a,b   # one setting's cost

Each checkout needs its own venv with raftq installed from it (``make venv`` there; ``--a`` and
``--b`` name the checkouts, their ``.venv/bin/raftq`` runs). Rounds alternate A B B A ... (each
one ``raftq bench --runs 1``: a fresh 3-node cluster, fsync always), so the VM's drift (±15 %
within the hour here) hits both sides alike. Prints, per case, the median rate of each side,
B/A of the medians and B/A of each adjacent pair; writes the rows as JSON (``--out``).

Rates on a shared VM scatter by ±15-40 % per run, so it also prints the CPU each side spent
per message: the CPU time (user + system) of the whole bench run (its nodes and clients, all
child processes) over the messages its cases moved. That cost drifts far less than a rate
does when the box is busy, and it is what a code change moves.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


def run_one(
    checkout: Path, args: argparse.Namespace, out: Path, env: dict[str, str]
) -> list[dict[str, Any]]:
    raftq = checkout / ".venv" / "bin" / "raftq"
    cmd = [str(raftq), "bench", "--runs", "1", "--cases", args.cases, "--sizes", args.sizes,
           "--secs", str(args.secs), "--n", str(args.n), "--fsync", args.fsync,
           "--out", str(out)]  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, check=True, cwd=checkout, stdout=subprocess.DEVNULL, timeout=1800,
                   env={**os.environ, **env})  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rows: list[dict[str, Any]] = json.loads(out.read_text())["runs"]
    moved = sum(int(r.get("n", 0)) for r in rows)
    for r in rows:
        r["cpu_us_per_msg"] = 1e6 * cpu / moved if moved else None  # (the whole run's)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--a", type=Path, required=True, help="checkout A (the baseline)")
    p.add_argument("--b", type=Path, required=True, help="checkout B (the change)")
    p.add_argument("--rounds", type=int, default=6, help="runs per side (even: ABBA pairs)")
    p.add_argument("--cases", default="a,b,d")
    p.add_argument("--sizes", default="100,1024")
    p.add_argument("--secs", type=float, default=5.0)
    p.add_argument("--n", type=int, default=20_000)
    p.add_argument("--fsync", choices=["always", "never"], default="always")
    p.add_argument(
        "--env-a",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment of side A's bench (and so of its nodes)",
    )
    p.add_argument("--env-b", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", type=Path, default=Path("ab-results.json"))
    args = p.parse_args()
    envs = {side: dict(kv.split("=", 1) for kv in getattr(args, f"env_{side.lower()}"))
            for side in ("A", "B")}  # fmt: skip
    rows: list[dict[str, Any]] = []
    order = [("A", "B"), ("B", "A")]
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.rounds):
            for side in order[k % 2]:
                checkout = args.a if side == "A" else args.b
                got = run_one(checkout.resolve(), args, Path(tmp) / f"{side}{k}.json", envs[side])
                rows += [{**r, "side": side, "round": k} for r in got]
                print(f"round {k} {side} done", file=sys.stderr, flush=True)
    args.out.write_text(json.dumps(rows, indent=1, default=str))
    for case in dict.fromkeys(r["case"] for r in rows):
        a = [r for r in rows if r["case"] == case and r["side"] == "A"]
        b = [r for r in rows if r["case"] == case and r["side"] == "B"]
        ma, mb = (statistics.median(x["rate"] for x in side) for side in (a, b))
        pairs = [y["rate"] / x["rate"] for x, y in zip(a, b, strict=True)]
        p50 = ""
        if all("p50_ms" in r for r in a + b):
            pa, pb = (statistics.median(x["p50_ms"] for x in side) for side in (a, b))
            p50 = f"  p50 {pa:.2f} -> {pb:.2f} ms"
        print(f"{case:52s} A {ma:9.0f}/s  B {mb:9.0f}/s  B/A {mb / ma:5.3f}  "
              f"(pairs {' '.join(f'{x:.2f}' for x in pairs)}){p50}")  # fmt: skip
    per_run: dict[tuple[str, int], float] = {
        (r["side"], r["round"]): r["cpu_us_per_msg"] for r in rows if r.get("cpu_us_per_msg")
    }
    cost = {side: [v for (s, _), v in per_run.items() if s == side] for side in "AB"}
    if cost["A"] and cost["B"]:
        ca, cb = (statistics.median(cost[side]) for side in "AB")
        pairs = [per_run[("B", k)] / per_run[("A", k)] for k in range(args.rounds)
                 if ("A", k) in per_run and ("B", k) in per_run]  # fmt: skip
        print(f"CPU per message, whole run: A {ca:.1f} us  B {cb:.1f} us  B/A {cb / ca:5.3f}  "
              f"(pairs {' '.join(f'{x:.2f}' for x in pairs)})")  # fmt: skip
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
