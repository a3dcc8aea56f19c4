"""Short chaos runs (part of the normal suite; ``make chaos`` runs long randomized ones).

Each scenario starts a real cluster in network namespaces, runs producers / consumers / a poison
producer through the client library under a nemesis, heals, drains, and requires: no lost,
unexpected or illegally duplicated message, dead-letter invariants, exactly one leader, equal
replica digests (when the node reports one) and an empty broker after the drain.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from raftq_chaos.runner import Scenario, run, summary_table

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
        faults=["partition-ring", "rolling-restart", "pause-follower"],
        duration=16,
        quiet=(1.5, 3.0),
        hold=(2.0, 4.0),
    ),
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_scenario_keeps_every_invariant(scenario: Scenario) -> None:
    scenario.seed = SEED
    root = OUT / f"{scenario.name}-seed{SEED}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    report = asyncio.run(run(scenario, root))
    print(summary_table([report]))
    if not report.ok:
        pytest.fail(report.failure() + "\n" + summary_table([report]), pytrace=False)
    shutil.rmtree(root, ignore_errors=True)
    assert report.ops > 50, "the workload barely ran"
    assert sum(report.faults_done.values()) >= 2, report.faults_done
