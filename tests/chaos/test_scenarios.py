"""Short chaos runs (part of the normal suite; ``make chaos`` runs long randomized ones).

Each scenario starts a real cluster in network namespaces, runs producers / consumers / a poison
producer through the client library under a nemesis, heals, drains, and requires: no lost,
unexpected or illegally duplicated message, dead-letter invariants, exactly one leader, equal
replica digests (when the node reports one) and an empty broker after the drain.
"""

from __future__ import annotations

import asyncio
import copy
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from raftq_chaos import checker
from raftq_chaos.runner import Report, Scenario, run, summary_table

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("iptables") is None,
        reason="needs root, ip and iptables (network namespaces)",
    ),
]

SEED = int(os.environ.get("CHAOS_SEED", "0") or 0) or 20261129
# Not tmp_path: pytest prunes old tmp dirs (other runs on this machine would delete a failing
# run's history before anyone reads it). Passing runs are removed, failing ones kept.
OUT = Path(os.environ.get("CHAOS_OUT") or Path(tempfile.gettempdir()) / "raftq-chaos")

SCENARIOS = [
    Scenario(
        "kills",
        nodes=3,
        faults=["kill-follower", "kill-leader", "kill-minority", "kill-all"],
        duration=24,
        quiet=(1.5, 3.0),
        hold=(2.0, 4.0),
    ),
    Scenario(
        "pauses-partitions",
        nodes=3,
        faults=["pause-leader", "partition-leader", "partition-half", "partition-bridge"],
        duration=24,
        quiet=(1.5, 3.0),
        hold=(2.0, 4.0),
    ),
    Scenario(
        "rolling-ring-5",
        nodes=5,
        faults=["partition-ring", "membership", "rolling-restart", "pause-follower"],
        duration=16,
        quiet=(1.5, 3.0),
        hold=(2.0, 4.0),
    ),
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_scenario_keeps_every_invariant(scenario: Scenario, chaos_reports: list[Report]) -> None:
    scenario.seed = SEED
    root = OUT / f"{scenario.name}-seed{SEED}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    report = asyncio.run(run(scenario, root))
    chaos_reports.append(report)
    if not report.ok:
        pytest.fail(report.failure() + "\n" + summary_table([report]), pytrace=False)
    shutil.rmtree(root, ignore_errors=True)
    assert report.ops > 50, "the workload barely ran"
    assert sum(report.faults_done.values()) >= 2, report.faults_done
    assert_checker_sees_injected_anomalies(report)


def _receives(events: list[dict[str, Any]], topic: str) -> list[dict[str, Any]]:
    return [
        e
        for e in events
        if e["f"] == "receive" and e["type"] == "ok" and e["value"]["topic"] == topic
    ]


def assert_checker_sees_injected_anomalies(report: Report) -> None:
    """The real history passed; the same history with one anomaly planted must not. This ties
    the checker to what the workload really writes (field names, units, topics)."""
    spec = report.spec
    assert spec is not None and report.result is not None
    acked = {
        e["value"]["value"]
        for e in report.events
        if e["f"] == "ack" and e["type"] == "ok" and e["value"]["topic"] == spec.topic
    }
    published_ok = {  # single publishes (batches carry "values")
        e["value"]["value"]: e
        for e in report.events
        if e["f"] == "publish" and e["type"] == "ok" and "value" in e["value"]
    }
    work = _receives(report.events, spec.topic)
    victim = next(
        d
        for e in work
        for d in e["value"]["deliveries"]
        if d["value"] in acked and d["value"] in published_ok
    )
    value = victim["value"]

    # lost: every delivery of one acknowledged publish vanishes
    events = copy.deepcopy(report.events)
    for e in _receives(events, spec.topic):
        e["value"]["deliveries"] = [d for d in e["value"]["deliveries"] if d["value"] != value]
    lost = checker.check(events, spec).by_kind(checker.LOST)
    assert [a.value for a in lost] == [value]

    # illegal duplicate: the acked message comes back, long after its lease
    events = copy.deepcopy(report.events)
    last = max(
        (d for e in _receives(events, spec.topic) for d in e["value"]["deliveries"]),
        key=lambda d: d["deadline"],
    )
    rx = copy.deepcopy(next(e for e in work if victim in e["value"]["deliveries"]))
    rx["index"] = len(events) + 1
    again = {**victim, "attempt": 99, "receipt": "forged", "deadline": last["deadline"] + 10**6}
    rx["value"]["deliveries"] = [again]
    rx["process"] = "forger"
    inv = {**copy.deepcopy(rx), "type": "invoke", "index": len(events)}
    events += [inv, rx]
    dups = checker.check(events, spec).by_kind(checker.ILLEGAL_DUPLICATE)
    assert [a.value for a in dups] == [value] and "acknowledged ack" in dups[0].detail

    # unexpected: the publish is said to have failed
    events = copy.deepcopy(report.events)
    pub = events[published_ok[value]["index"]]
    pub["type"], pub["error"] = "fail", "planted"
    unexpected = checker.check(events, spec).by_kind(checker.UNEXPECTED)
    assert [a.value for a in unexpected] == [value]

    # dead letter: a dead letter claims fewer attempts than max_attempts
    events = copy.deepcopy(report.events)
    dlq = [d for e in _receives(events, spec.dlq_topic) for d in e["value"]["deliveries"]]
    if dlq:
        dlq[0]["headers"][checker.DLQ_ATTEMPTS] = "1"
        dlq[0]["headers"][checker.DLQ_REASON] = "nack"
        bad = checker.check(events, spec).by_kind(checker.DEAD_LETTER)
        assert dlq[0]["value"] in [a.value for a in bad]
