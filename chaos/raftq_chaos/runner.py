"""One chaos run end to end: network + cluster up, workload under a nemesis, heal, drain,
final-state checks, the checker, a summary table. ``run(Scenario)`` returns a ``Report``."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raftq_chaos import checker
from raftq_chaos.cluster import Cluster
from raftq_chaos.history import History
from raftq_chaos.nemesis import Nemesis
from raftq_chaos.netns import Net
from raftq_chaos.workload import Workload, WorkloadConfig


@dataclass
class Scenario:
    name: str
    nodes: int = 3
    faults: list[str] = field(default_factory=list)
    duration: float = 30.0  # seconds of faults; the workload runs that long plus the tail
    seed: int = 0
    randomize: bool = False  # pick faults at random from ``faults`` instead of cycling them
    quiet: tuple[float, float] = (2.0, 4.0)
    hold: tuple[float, float] = (3.0, 6.0)
    workload: WorkloadConfig | None = None


@dataclass
class Report:
    scenario: Scenario
    root: Path
    history_path: Path
    result: checker.Result | None = None
    final: dict[str, Any] = field(default_factory=dict)
    faults_done: dict[str, int] = field(default_factory=dict)
    ops: int = 0
    elapsed: float = 0.0
    error: str | None = None
    events: list[dict[str, Any]] = field(default_factory=list, repr=False)
    spec: checker.Spec | None = None

    @property
    def ok(self) -> bool:
        return (
            self.error is None
            and self.result is not None
            and self.result.valid
            and all(v is True or v == "not exposed" for v in self._final_flags().values())
        )

    def _final_flags(self) -> dict[str, Any]:
        keys = ("one_leader", "digests_equal", "replicas_equal", "empty_everywhere", "drained")
        return {k: self.final.get(k) for k in keys}

    def failure(self) -> str:
        lines = [f"chaos scenario {self.scenario.name} FAILED: seed={self.scenario.seed}"]
        lines.append(f"history: {self.history_path}")
        if self.error:
            lines.append(f"error: {self.error}")
        for k, v in self._final_flags().items():
            if v is not True and v != "not exposed":
                lines.append(f"final check {k}: {v} ({self.final.get(k + '_detail', '')})")
        if self.result is not None:
            for a in self.result.anomalies[:20]:
                lines.append(f"  {a.kind}: {a.value}: {a.detail} (events {a.events[:6]})")
        return "\n".join(lines)


def summary_table(reports: list[Report]) -> str:
    cols: list[tuple[str, Callable[[Report], object]]] = [
        ("scenario", lambda r: r.scenario.name),
        ("seed", lambda r: r.scenario.seed),
        ("nodes", lambda r: r.scenario.nodes),
        ("secs", lambda r: f"{r.elapsed:.0f}"),
        ("faults", lambda r: sum(r.faults_done.values())),
        ("ops", lambda r: r.ops),
        ("pub ok/info/fail", _pub),
        ("deliv", lambda r: _c(r, "deliveries")),
        ("acks", lambda r: _c(r, "ack-ok")),
        ("nacks", lambda r: _c(r, "nack-ok")),
        ("dlq", lambda r: _c(r, "dead-lettered")),
        ("dup legit", _legit),
        ("dup illegal", lambda r: _c(r, checker.ILLEGAL_DUPLICATE)),
        ("lost", lambda r: _c(r, checker.LOST)),
        ("unexp", lambda r: _c(r, checker.UNEXPECTED)),
        ("dlq anom", lambda r: _c(r, checker.DEAD_LETTER)),
        ("recov", lambda r: _c(r, "recovered")),
        ("max gap s", _gap),
        ("leader", lambda r: _flag(r.final.get("one_leader"))),
        ("digest", lambda r: _flag(r.final.get("digests_equal"))),
        ("replicas", lambda r: _flag(r.final.get("replicas_equal"))),
        ("empty", lambda r: _flag(r.final.get("empty_everywhere"))),
        ("drain", lambda r: _flag(r.final.get("drained"))),
        ("verdict", lambda r: "PASS" if r.ok else "FAIL"),
    ]
    rows = [[str(name) for name, _ in cols]]
    rows += [[str(fn(r)) for _, fn in cols] for r in reports]
    widths = [max(len(row[i]) for row in rows) for i in range(len(cols))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _c(r: Report, key: str) -> int | str:
    return "-" if r.result is None else r.result.counts.get(key, 0)


def _pub(r: Report) -> str:
    if r.result is None:
        return "-"
    c = r.result.counts
    return f"{c.get('publish-ok', 0)}/{c.get('publish-info', 0)}/{c.get('publish-fail', 0)}"


def _legit(r: Report) -> str:
    if r.result is None:
        return "-"
    d = r.result.legit_duplicates
    short = {"expiry": "exp", "nack": "nack", "release": "rel", "unobserved delivery": "lost-rx"}
    parts = [f"{short.get(k, k)}:{v}" for k, v in sorted(d.items())]
    return ",".join(parts) or "0"


def _gap(r: Report) -> str:
    """Longest stretch without an acknowledged publish while the workload ran (seconds)."""
    times = [e["time"] for e in r.events if e["f"] == "publish" and e["type"] == "ok"]
    if len(times) < 2:
        return "-"
    return f"{max(b - a for a, b in itertools.pairwise(times)) / 1000:.1f}"


def _flag(v: Any) -> str:
    if v is True:
        return "ok"
    if v is None:
        return "-"
    return "n/a" if v == "not exposed" else "FAIL"


# ---------------------------------------------------------------------- final-state checks


async def check_one_leader(cluster: Cluster, timeout: float = 30.0) -> tuple[bool, str]:
    """Every node names the same leader, and exactly one node says it is the leader."""
    last = ""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        st = await cluster.statuses()
        leaders = {s.get("leader") for s in st.values() if s}
        roles = [n for n, s in st.items() if s and s.get("role") == "leader"]
        last = f"named leaders {leaders}, self-declared leaders {roles}, down {_down(st)}"
        one = len(leaders) == 1 and None not in leaders and len(roles) == 1
        if all(st.values()) and one and roles[0] in leaders:
            return True, last
        await asyncio.sleep(0.5)
    return False, last


def _down(st: dict[str, Any]) -> list[str]:
    return [n for n, s in st.items() if not s]


async def check_digests(cluster: Cluster, timeout: float = 30.0) -> tuple[bool | str, str]:
    """Every replica reaches the same state digest (``Broker.digest()``, from ``GET
    /cluster?digest=1``); "not exposed" when no node reports one."""
    last = ""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        ids = list(cluster.nodes)
        got = await asyncio.gather(*(cluster.digest(n) for n in ids))
        seen = {n: d for n, d in zip(ids, got, strict=True) if d is not None}
        if not seen:
            st = await cluster.statuses()
            if all(st.values()):  # every node answers, none reports a digest
                return "not exposed", "neither GET /cluster nor /chaos/digest has a digest"
        last = "; ".join(
            f"{n}: {d['digest'][:12]}@{d.get('applied_index')}" for n, d in seen.items()
        )
        if len(seen) == len(ids) and len({d["digest"] for d in seen.values()}) == 1:
            return True, last
        await asyncio.sleep(0.3)
    return False, last


EMPTY_FIGURES = (
    "raftq_topic_messages",
    "raftq_group_pending",
    "raftq_group_delayed",
    "raftq_group_in_flight",
)


async def check_replicas(cluster: Cluster, timeout: float = 30.0) -> tuple[bool, bool, str]:
    """Every node's local view of the broker (``/metrics``: per-topic and per-group counters,
    retained messages, pending, delayed, in flight) is the same, and shows nothing left.
    Returns (replicas_equal, empty_everywhere, detail)."""
    last = ""
    equal = empty = False
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        ids = list(cluster.nodes)
        figs = await asyncio.gather(*(cluster.broker_figures(n) for n in ids))
        views = {n: v for n, v in zip(ids, figs, strict=True) if v is not None}
        missing = [n for n in ids if n not in views]
        names = sorted({k for v in views.values() for k in v})
        differ = [k for k in names if len({v.get(k) for v in views.values()}) > 1]
        left = sorted(
            f"{n}:{k}={x:g}"
            for n, v in views.items()
            for k, x in v.items()
            if k.startswith(EMPTY_FIGURES) and x
        )
        equal = not missing and not differ
        empty = not missing and not left
        last = f"unreachable {missing}; differing {differ[:6]}; not empty {left[:6]}"
        if equal and empty:
            return True, True, f"{len(names)} figures equal on {len(ids)} nodes, all empty"
        await asyncio.sleep(0.5)
    return equal, empty, last


# ---------------------------------------------------------------------- the run


async def run(scenario: Scenario, root: Path) -> Report:
    await asyncio.to_thread(root.mkdir, parents=True, exist_ok=True)
    report = Report(scenario, root, root / "history.jsonl")
    t0 = time.monotonic()
    net = Net([f"n{i + 1}" for i in range(scenario.nodes)])
    history = History(report.history_path)
    cluster: Cluster | None = None
    try:
        net.up()
        cluster = Cluster(net, root)
        await _run(scenario, cluster, history, report)
    except Exception as e:
        report.error = f"{type(e).__name__}: {e}"
    finally:
        history.close()
        if cluster is not None:
            cluster.close()
            await cluster.aclose()
        errors = net.close()
        if errors:
            report.error = (report.error or "") + f" cleanup errors: {errors}"
        report.elapsed = time.monotonic() - t0
        (root / "report.json").write_text(
            json.dumps(
                {
                    "scenario": scenario.name,
                    "seed": scenario.seed,
                    "ok": report.ok,
                    "error": report.error,
                    "final": report.final,
                    "faults": report.faults_done,
                    "counts": dict(report.result.counts) if report.result else None,
                    "anomalies": [a.as_dict() for a in report.result.anomalies]
                    if report.result
                    else None,
                },
                indent=1,
                default=str,
            )
        )
    return report


async def _run(scenario: Scenario, cluster: Cluster, history: History, report: Report) -> None:
    rng = random.Random(scenario.seed)
    wcfg = scenario.workload or WorkloadConfig(seed=scenario.seed)
    for nid in cluster.nodes:
        cluster.start(nid)
    for nid in cluster.nodes:
        await cluster.wait_up(nid, 30)
    await cluster.wait_leader(30)
    history.note("cluster-up", process="runner")

    wl = Workload(cluster.urls, history, wcfg, token=cluster.token)
    faults = list(scenario.faults)
    if scenario.randomize:
        n_faults = max(
            1, int(scenario.duration / (sum(scenario.quiet) / 2 + sum(scenario.hold) / 2))
        )
        faults = [rng.choice(scenario.faults) for _ in range(n_faults + 1)]
    nemesis = Nemesis(cluster, history, faults, rng, scenario.quiet, scenario.hold)
    try:
        await wl.setup()
        tasks = wl.tasks()
        try:
            await nemesis.run(scenario.duration)
        finally:
            await nemesis.heal_all()
            await asyncio.sleep(2.0)  # a quiet tail under load after the heal
            wl.stop.set()
            _, pending = await asyncio.wait(tasks, timeout=wcfg.client_timeout * 2 + 5)
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    exc = t.exception() if t.done() and not t.cancelled() else None
                    if exc is not None:
                        raise exc
        report.faults_done = dict(nemesis.done)
        await cluster.wait_leader(30)
        report.final["drained"] = await wl.drain()
        ok, detail = await check_one_leader(cluster)
        report.final["one_leader"], report.final["one_leader_detail"] = ok, detail
        eq, empty, detail = await check_replicas(cluster)
        report.final["replicas_equal"], report.final["empty_everywhere"] = eq, empty
        report.final["replicas_equal_detail"] = report.final["empty_everywhere_detail"] = detail
        dig, detail = await check_digests(cluster)
        report.final["digests_equal"], report.final["digests_equal_detail"] = dig, detail
    finally:
        await wl.close()
    report.ops = sum(1 for e in history.events if e["type"] == "invoke")
    spec = checker.Spec(wcfg.topic, wcfg.group, wcfg.dlq_topic, wcfg.max_attempts)
    report.events, report.spec = history.events, spec
    report.result = checker.check(history.events, spec)
