"""deploy/grafana-dashboard.json and deploy/prometheus-alerts.yml use only series a node
exports, and the alerts cover what an operator must be woken for."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from raftq.cluster.raft import RaftConfig, RaftNode
from raftq.node.app import SERVICE
from raftq.node.diskguard import Reserve
from raftq.node.local import LocalRaft
from tests.node.inprocess import admin_client, app

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARD = DEPLOY / "grafana-dashboard.json"
ALERTS = DEPLOY / "prometheus-alerts.yml"
# Prometheus adds these itself, for every target.
SYNTHETIC = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or"}
KEYWORDS |= {"unless", "bool", "offset", "inf", "nan"}


async def exported() -> set[str]:
    """Every sample name a node with a topic, a message and HTTP traffic exports, the Raft
    binding's real stats included."""
    raft = LocalRaft()
    cfg = RaftConfig("n1", "127.0.0.1:1", "127.0.0.1:2", {}, None, None, insecure=True)
    raft.stats = RaftNode(cfg).stats  # type: ignore[attr-defined]
    data = tempfile.mkdtemp()  # (a node with a data dir exports its disk's series)
    application = app(raft, data_dir=data, min_free_disk=Reserve(bytes=0))
    async with admin_client(application) as client:
        r = await client.patch("/cluster/settings", json={"max_retained_bytes": 1 << 30})
        assert r.status == 200
        assert (await client.post("/topics", json={"topic": "t"})).status == 201
        payload = base64.b64encode(b"m").decode()
        assert (await client.post("/topics/t/messages", json={"payload": payload})).status == 200
    text = application[SERVICE].metrics.render().decode()
    os.rmdir(data)
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def series(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (label lists, matchers and ranges removed)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        rest = expr[m.end() :].lstrip()
        if rest.startswith("(") or m.group().lower() in KEYWORDS:
            continue  # a function or an operator
        names.add(m.group())
    return names


def dashboard_exprs(dash: dict[str, Any]) -> list[str]:
    out = []
    for panel in dash["panels"]:
        out += [t["expr"] for t in panel.get("targets", [])]
    for var in dash["templating"]["list"]:
        q = var.get("query")
        if isinstance(q, dict):
            m = re.fullmatch(r"label_values\((\w+),\s*\w+\)", q["query"])
            assert m, q
            out.append(m.group(1))
    return out


def test_the_expression_reader_finds_the_series() -> None:
    e = 'histogram_quantile(0.99, sum by (le, route) (rate(a_bucket{job="$j"}[5m]))) / b > 0'
    assert series(e) == {"a_bucket", "b"}
    assert series("max without (instance) (raftq_x) == 0 and on (job) up") == {"raftq_x", "up"}


async def test_every_series_the_dashboard_and_alerts_use_is_exported() -> None:
    names = await exported()
    dash = json.loads(DASHBOARD.read_text())
    rules = [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]
    used: dict[str, set[str]] = {}
    for where, exprs in (
        ("dashboard", dashboard_exprs(dash)),
        ("alerts", [r["expr"] for r in rules]),
    ):
        for e in exprs:
            for name in series(e):
                used.setdefault(name, set()).add(where)
    missing = {n: sorted(w) for n, w in used.items() if n not in names | SYNTHETIC}
    assert missing == {}
    assert len(used) > 20  # (the reader found the series at all)
    alerts = {r["alert"] for r in rules}
    for must in ("NoLeader", "NodeNotReady", "BacklogAge", "DeadLetters", "SlowFsync"):
        assert f"Raftq{must}" in alerts
    assert all(r["labels"]["severity"] in ("warning", "critical") for r in rules)
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


async def test_promtool_accepts_the_alert_rules() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:  # (Debian's `prometheus` package has it)
        return
    res = await asyncio.to_thread(
        subprocess.run,
        [promtool, "check", "rules", str(ALERTS)],
        capture_output=True,
        timeout=30,
    )
    assert res.returncode == 0, res.stdout + res.stderr
