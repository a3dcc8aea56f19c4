"""/metrics follows Prometheus' conventions (what ``promtool check metrics`` checks, and
``promtool`` itself when it is installed), registers the process, GC and platform collectors,
and reports the age of each group's oldest unsettled message by the node's clock."""

from __future__ import annotations

import asyncio
import base64
import re
import shutil
import subprocess
import time

from prometheus_client.parser import text_string_to_metric_families

from raftq.node.app import SERVICE
from raftq.node.local import LocalRaft
from tests.node.inprocess import admin_client, app

# Abbreviated or non-base units (promtool's lint: seconds and bytes, spelled out).
BAD_UNIT = re.compile(
    r"_(ms|us|ns|sec|secs|millis|micros|milliseconds|microseconds|nanoseconds|minutes|hours"
    r"|days|kb|mb|gb|kib|mib|gib|kilobytes|megabytes)(_|$)"
)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def scrape(raft: LocalRaft) -> str:
    raft.stats = {"syncs": 3, "sync_us": 2500, "max_tick_ms": 40, "snapshots": 1}  # type: ignore[attr-defined]
    application = app(raft)
    async with admin_client(application) as client:
        assert (await client.post("/topics", json={"topic": "orders"})).status == 201
        r = await client.post("/topics/orders/messages", json={"payload": b64(b"m")})
        assert r.status == 200
        assert (await client.get("/metrics")).status == 200  # an HTTP series too
        sqs = {"X-Amz-Target": "AmazonSQS.ListQueues", "Content-Type": "application/x-amz-json-1.0"}
        assert (await client.post("/sqs", data=b"{}", headers=sqs)).status == 400  # not signed
        return await (await client.get("/metrics")).text()


def lint(text: str) -> list[str]:
    problems = []
    for family in text_string_to_metric_families(text):
        name = family.name
        if not family.documentation:
            problems.append(f"{name}: no help")
        if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
            problems.append(f"{name}: not snake_case")
        if BAD_UNIT.search(name):
            problems.append(f"{name}: abbreviated or non-base unit")
        for s in family.samples:
            if family.type == "counter" and not s.name.endswith(("_total", "_created")):
                problems.append(f"{s.name}: a counter without _total")
            if family.type == "gauge" and s.name.endswith("_total"):
                problems.append(f"{s.name}: a gauge named like a counter")
    return problems


async def test_metrics_follow_prometheus_naming_rules() -> None:
    text = await scrape(LocalRaft())
    assert lint(text) == []
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"raftq_raft_fsyncs", "raftq_raft_fsync_seconds", "raftq_raft_snapshots"} <= names
    assert "raftq_raft_max_tick_seconds" in names
    assert "raftq_group_pending" in names and not any("backlog" in n for n in names)
    sqs = [
        s for f in text_string_to_metric_families(text) if f.name == "raftq_sqs_requests"
        for s in f.samples if s.name.endswith("_total")
    ]  # fmt: skip
    assert [(s.labels["action"], s.value) for s in sqs] == [("ListQueues", 1.0)], sqs
    assert sqs[0].labels["outcome"] in ("IncompleteSignature", "MissingAuthenticationToken")
    promtool = shutil.which("promtool")
    if promtool is not None:  # (Debian's `prometheus` package has it)
        res = await asyncio.to_thread(
            subprocess.run,
            [promtool, "check", "metrics"],
            input=text.encode(),
            capture_output=True,
            timeout=30,
        )
        assert (res.returncode, res.stdout + res.stderr) == (0, b"")


async def test_metrics_have_process_gc_and_platform_collectors_and_the_node_id() -> None:
    text = await scrape(LocalRaft())
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"process_cpu_seconds", "process_resident_memory_bytes"} <= names
    assert {"python_gc_collections", "python_info"} <= names
    assert 'raftq_node_info{node="n1"} 1.0' in text


async def test_oldest_unsettled_age_grows_by_the_node_clock_while_the_state_stands_still() -> None:
    published = int(time.time() * 1000) - 90_000
    raft = LocalRaft(clock=lambda: published)  # every entry stamped 90 s ago
    application = app(raft)
    async with admin_client(application) as client:
        for topic in ("busy", "idle"):
            assert (await client.post("/topics", json={"topic": topic})).status == 201
        r = await client.post("/topics/busy/messages", json={"payload": b64(b"m")})
        assert r.status == 200
        r = await client.post("/topics/busy/groups/default/receive", json={"max": 1})
        assert r.status == 200 and len((await r.json())["deliveries"]) == 1  # in flight
    text = application[SERVICE].metrics.render().decode()
    ages = {
        s.labels["topic"]: s.value
        for f in text_string_to_metric_families(text)
        if f.name == "raftq_group_oldest_unsettled_age_seconds"
        for s in f.samples
    }
    assert 90 <= ages["busy"] < 150 and ages["idle"] == 0
