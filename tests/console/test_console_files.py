"""The console's files as a node serves them (in process, no browser): a strict
Content-Security-Policy on every console answer, no inline code a policy would block, only
known files; and the API fields the pages rely on (``GET /cluster``'s ``you`` and member
``figures``, ``GET /topics?stats=1``). Also: a built wheel ships the files."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from raftq.node import console
from raftq.node.local import LocalRaft
from tests.node.inprocess import admin_client, app, topic_of

Client = TestClient[web.Request, web.Application]
ROOT = Path(__file__).resolve().parents[2]
UI = ROOT / "node" / "raftq" / "node" / "ui"


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    async with admin_client(app(LocalRaft())) as c:
        yield c


async def test_every_console_file_is_served_with_a_strict_policy(client: Client) -> None:
    names = sorted(p.name for p in UI.iterdir())
    assert {"index.html", "app.js", "style.css"} <= set(names)
    for name in names:
        r = await client.get(f"/ui/{name}", headers={"Authorization": ""})  # (public files)
        assert r.status == 200, name
        assert r.headers["Content-Security-Policy"] == console.CSP
        assert "'unsafe-inline'" not in console.CSP and "'unsafe-eval'" not in console.CSP
        assert r.headers["X-Content-Type-Options"] == "nosniff"
        assert r.content_type == console.FILES[name][1]
        assert await r.read() == (UI / name).read_bytes()
        again = await client.get(f"/ui/{name}", headers={"If-None-Match": r.headers["ETag"]})
        assert again.status == 304
    assert (await client.get("/ui/app.js")).content_type == "text/javascript"  # (ES modules)
    index = await client.get("/ui/")
    assert index.status == 200 and index.content_type == "text/html"
    assert index.headers["Content-Security-Policy"] == console.CSP


async def test_the_console_root_redirects_and_unknown_files_are_404(client: Client) -> None:
    r = await client.get("/ui", allow_redirects=False)
    assert r.status == 308 and r.headers["Location"] == "/ui/"
    for name in ("nope.js", "..%2Fapp.py", ".app.js"):
        r = await client.get(f"/ui/{name}")
        assert r.status == 404, name
        assert (await r.json())["code"] == "route_not_found"
        assert r.headers["Content-Security-Policy"] == console.CSP
    assert (await client.get("/ui/../app.py")).status == 404  # (that is /app.py: no route)
    r = await client.get("/ui/a/b")  # (no route: the router's 404, with the same headers)
    assert r.status == 404 and r.headers["Content-Security-Policy"] == console.CSP


def test_the_pages_have_no_inline_code_and_fetch_nothing_from_elsewhere() -> None:
    html = (UI / "index.html").read_text()
    scripts = re.findall(r"<script\b[^>]*>", html)
    assert scripts and all('src="' in s and 'type="module"' in s for s in scripts)
    assert all(
        not body.strip() for body in re.findall(r"<script\b[^>]*>(.*?)</script>", html, re.S)
    )
    assert not re.search(r"\son[a-z]+=", html) and " style=" not in html and "<style" not in html
    for path in UI.iterdir():
        text = path.read_text()
        urls = set(re.findall(r"https?://[^\s\"'`)]+", text))
        assert urls <= {"http://www.w3.org/2000/svg"}, (path.name, urls)  # (a namespace)
        if path.suffix == ".js":
            for banned in ("innerHTML", "outerHTML", "eval(", "new Function", "document.write"):
                assert banned not in text, (path.name, banned)
            for imported in re.findall(r'from "\./([^"]+)"', text):
                assert (UI / imported).is_file(), (path.name, imported)


async def test_the_cluster_view_says_who_calls_and_each_members_figures(client: Client) -> None:
    body = await (await client.get("/cluster")).json()
    assert body["you"] == {"name": "admin", "cluster": True, "all": True, "grants": []}
    me = body["members"][body["node"]]
    assert me["answers"] is True
    figures = me["figures"]
    assert figures["role"] == "leader" and figures["applied_index"] >= 0
    assert figures["rss_bytes"] is None or figures["rss_bytes"] > 1 << 20
    health = await (await client.get("/healthz")).json()
    assert health["figures"]["role"] == "leader"
    grants = [{"topics": "only-this", "actions": ["consume"]}]
    made = await (await client.post("/tokens", json={"name": "narrow", "grants": grants})).json()
    r = await client.get("/cluster", headers={"Authorization": f"Bearer {made['token']}"})
    you = (await r.json())["you"]
    assert you == {"name": "narrow", "cluster": False, "all": False, "grants": grants}


async def test_health_shows_no_figures_when_observing_needs_a_token() -> None:
    async with admin_client(app(LocalRaft(), auth_observe=True)) as c:
        health = await (await c.get("/healthz", headers={"Authorization": ""})).json()
        assert health["ok"] is True and "figures" not in health


async def test_topic_stats_in_the_list_sum_each_topics_groups(client: Client) -> None:
    topic = await topic_of(client)
    await client.post(f"/topics/{topic}/groups", json={"group": "second"})
    await client.post(
        f"/topics/{topic}/publish", json={"messages": [{"text": "a"}, {"text": "bb"}]}
    )
    r = await client.post(f"/topics/{topic}/groups/default/receive", json={"max": 1})
    assert len((await r.json())["deliveries"]) == 1
    other = await topic_of(client)
    page = await (await client.get("/topics?stats=1&limit=1")).json()
    assert len(page["topics"]) == 1 and len(page["stats"]) == 1 and page["next"]
    body = await (await client.get("/topics?stats=true")).json()
    by_name = {s["topic"]: s for s in body["stats"]}
    assert [s["topic"] for s in body["stats"]] == body["topics"] and other in by_name
    s = by_name[topic]
    assert (s["messages"], s["bytes"], s["groups"]) == (2, 3, 2)
    assert (s["pending"], s["in_flight"], s["delayed"]) == (3, 1, 0)
    assert s["counters"]["published"] == 2 and s["group_counters"]["delivered"] == 1
    assert "stats" not in await (await client.get("/topics")).json()


@pytest.mark.slow
def test_a_built_wheel_ships_the_console(tmp_path: Path) -> None:
    """python -m build (fetches hatchling from the package index: skipped without one)."""
    out = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if out.returncode != 0:
        if "Could not find a version" in out.stderr or "NewConnectionError" in out.stderr:
            pytest.skip(f"no package index: {out.stderr[-300:]}")
        raise AssertionError(out.stderr[-2000:])
    (wheel,) = tmp_path.glob("raftq-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for path in UI.iterdir():
        assert f"raftq/node/ui/{path.name}" in names


def test_a_members_figures_say_when_and_how_long_its_last_snapshot_was() -> None:
    from types import SimpleNamespace

    from raftq.node import ops

    status = SimpleNamespace(role="leader", term=2, commit_index=9, applied_index=9)
    stats = {"snapshots": 0, "last_snapshot_ms": 0, "last_snapshot_timestamp_ms": 0}
    raft = SimpleNamespace(status=lambda: status, stats=stats)
    svc: Any = SimpleNamespace(raft=raft)
    none_yet = ops.figures(svc)
    assert none_yet["snapshots"] == 0 and none_yet["last_snapshot_at"] is None
    stats.update(snapshots=1, last_snapshot_ms=80, last_snapshot_timestamp_ms=1_796_000_000_123)
    one = ops.figures(svc)
    assert one["last_snapshot_at"] == 1_796_000_000.123 and one["last_snapshot_seconds"] == 0.08
