"""The web console's budget on a real 3-node cluster on loopback (fsync always): how soon the
overview is drawn with 100 topics, and how much CPU five open consoles cost the leader.

    .venv/bin/python bench/console.py [--topics 100] [--loads 10] [--seconds 60] [--consoles 5]

Needs Debian's Chromium (tests/install-debian-tools.sh) and Playwright (the dev extra).
Paint: each of ``--loads`` fresh tabs (a new browser context: nothing cached) opens
``/ui/#/overview`` already signed in; reported are the first contentful paint and the time
until the overview has drawn its data (the ``overview-drawn`` mark, after ``GET /cluster`` and
``GET /topics?stats=1``), both from navigation start. CPU: the leader's process CPU time
(``/proc/<pid>/stat``, user + system) over ``--seconds`` with no console open, then with
``--consoles`` tabs on the overview of the leader (each polls every 3 s), in percent of one core.
The box is shared: run it twice, compare the differences, not single numbers.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from playwright.sync_api import Browser, sync_playwright
from tests.node.cluster_fixture import Cluster, http

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def cpu_share(pid: int, seconds: float) -> float:
    c0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return 100 * (cpu_seconds(pid) - c0) / (time.monotonic() - t0)


def cpu_per_request(pid: int, url: str, path: str, token: str, n: int = 200) -> float:
    """The leader's CPU milliseconds per ``GET path`` (sequential requests from here)."""
    c0 = cpu_seconds(pid)
    for _ in range(n):
        code, _ = http("GET", url + path, token=token)
        assert code == 200, (path, code)
    return 1000 * (cpu_seconds(pid) - c0) / n


def signed_in_page(browser: Browser, url: str, token: str) -> Any:
    ctx = browser.new_context(viewport={"width": 1366, "height": 820})
    ctx.add_init_script(f"sessionStorage.setItem('raftq.token', {token!r})")
    return ctx.new_page()


def wait_drawn(page: Any, timeout: float = 30.0) -> None:
    """Until the overview has drawn its data once (polled from here: the page's CSP forbids the
    string evaluation that Playwright's wait_for_function would do in it)."""
    deadline = time.monotonic() + timeout
    while not page.evaluate("performance.getEntriesByName('overview-drawn').length"):
        if time.monotonic() > deadline:
            raise TimeoutError("the overview was not drawn")
        time.sleep(0.01)


def paint(browser: Browser, url: str, token: str) -> tuple[float, float, str]:
    page = signed_in_page(browser, url, token)
    page.goto(f"{url}/ui/#/overview")
    wait_drawn(page)
    fcp, drawn = page.evaluate(
        "[performance.getEntriesByName('first-contentful-paint')[0]?.startTime ?? -1,"
        " performance.getEntriesByName('overview-drawn')[0].startTime]"
    )
    rows = page.locator("[data-total=topics] .value").inner_text()
    page.context.close()
    return float(fcp), float(drawn), rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--topics", type=int, default=100)
    p.add_argument("--loads", type=int, default=10)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--consoles", type=int, default=5)
    p.add_argument("--chromium", default=shutil.which("chromium-headless-shell") or "chromium")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster(Path(tmp), 3).start()
        try:
            leader = cluster.wait_leader()
            url = cluster.url(leader)
            for i in range(args.topics):
                topic = f"bench-{i:03d}"
                http(
                    "POST",
                    f"{url}/topics",
                    {"topic": topic, "groups": [{"group": "a"}, {"group": "b"}]},
                )
                msgs = [{"text": f"m{j}"} for j in range(i % 7)]
                if msgs:
                    http("POST", f"{url}/topics/{topic}/publish", {"messages": msgs})
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=args.chromium, headless=True)
                paint(browser, url, cluster.token)  # (warm: the node's first answers)
                runs = [paint(browser, url, cluster.token) for _ in range(args.loads)]
                fcp = [r[0] for r in runs]
                drawn = [r[1] for r in runs]
                print(f"overview with {runs[0][2]} topics, {args.loads} fresh tabs:")
                print(
                    f"  first contentful paint: median {statistics.median(fcp):.0f} ms, "
                    f"max {max(fcp):.0f} ms"
                )
                print(
                    f"  data drawn: median {statistics.median(drawn):.0f} ms, "
                    f"max {max(drawn):.0f} ms"
                )
                pid = cluster.nodes[leader].proc.pid  # type: ignore[union-attr]
                for path in ("/cluster", "/topics?stats=1", "/healthz"):
                    ms = cpu_per_request(pid, url, path, cluster.token)
                    print(f"  leader CPU per GET {path}: {ms:.2f} ms")
                idle = cpu_share(pid, args.seconds)
                pages = [signed_in_page(browser, url, cluster.token) for _ in range(args.consoles)]
                for page in pages:
                    page.goto(f"{url}/ui/#/overview")
                    wait_drawn(page)
                busy = cpu_share(pid, args.seconds)
                polls = [
                    page.evaluate("performance.getEntriesByName('overview-drawn').length")
                    for page in pages
                ]
                print(f"leader {leader} CPU over {args.seconds:.0f} s (percent of one core):")
                print(
                    f"  no console: {idle:.2f} %; {args.consoles} consoles: {busy:.2f} %; "
                    f"difference {busy - idle:+.2f} points ({sum(polls)} overview refreshes)"
                )
                browser.close()
        finally:
            cluster.close()


if __name__ == "__main__":
    main()
