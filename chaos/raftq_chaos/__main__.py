"""``python -m raftq_chaos``: long randomized chaos runs (``make chaos``).

    python -m raftq_chaos --duration 300 --seed 7 --nodes 5 --runs 2

Each run draws its faults at random from ``--faults`` (default: all), prints a summary table,
and on failure the seed and the history path. Exit status 1 when any run failed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from raftq_chaos.nemesis import FAULTS, SKIPPED
from raftq_chaos.runner import Report, Scenario, run, summary_table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m raftq_chaos", description=__doc__.split("\n")[0])
    env = os.environ.get
    p.add_argument(
        "--duration",
        type=float,
        default=float(env("DURATION", 120)),
        help="seconds of faults per run [DURATION] (default 120)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=int(env("SEED", 0) or 0) or None,
        help="seed of the first run [SEED] (default random; run i uses seed + i)",
    )
    p.add_argument(
        "--nodes", type=int, default=int(env("NODES", 3)), help="cluster size [NODES] (3)"
    )
    p.add_argument("--runs", type=int, default=int(env("RUNS", 1)), help="runs [RUNS] (1)")
    p.add_argument("--faults", default=env("FAULTS", "all"), help="comma list or all [FAULTS]")
    p.add_argument("--quiet", default="2,4", help="quiet period between faults, lo,hi seconds")
    p.add_argument("--hold", default="3,6", help="how long a fault lasts, lo,hi seconds")
    p.add_argument("--out", default=env("CHAOS_OUT"), help="run directory root [CHAOS_OUT]")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        print("chaos runs need root (network namespaces)", file=sys.stderr)
        return 2
    faults = list(FAULTS) if args.faults == "all" else args.faults.split(",")
    unknown = [f for f in faults if f not in FAULTS and f not in SKIPPED]
    if unknown:
        p.error(f"unknown faults {unknown}; known: {', '.join(FAULTS)}")
    for f, why in SKIPPED.items():
        print(f"note: fault {f} is skipped: {why}")  # none at present
    seed = args.seed if args.seed is not None else random.randrange(1, 1 << 31)
    out = Path(args.out or tempfile.mkdtemp(prefix="raftq-chaos-"))
    reports: list[Report] = []
    for i in range(args.runs):
        sc = Scenario(
            name=f"random-{i + 1}",
            nodes=args.nodes,
            faults=faults,
            duration=args.duration,
            seed=seed + i,
            randomize=True,
            quiet=_range(args.quiet),
            hold=_range(args.hold),
        )
        print(f"run {i + 1}/{args.runs}: seed {sc.seed}, {args.nodes} nodes, {args.duration:.0f} s")
        t = time.monotonic()
        rep = asyncio.run(run(sc, out / f"{sc.name}-seed{sc.seed}"))
        print(f"  done in {time.monotonic() - t:.0f} s: {'PASS' if rep.ok else 'FAIL'}")
        reports.append(rep)
        if not rep.ok:
            print(rep.failure())
    print(summary_table(reports))
    print(f"histories and node logs under {out}")
    return 0 if all(r.ok for r in reports) else 1


def _range(text: str) -> tuple[float, float]:
    lo, _, hi = text.partition(",")
    return float(lo), float(hi or lo)


if __name__ == "__main__":
    sys.exit(main())
