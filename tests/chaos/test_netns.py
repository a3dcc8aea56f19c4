"""The private network: a cut drops exactly one link (both ways), heal restores it, and
closing removes every namespace, link and firewall rule the run made."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftq_chaos.netns import Net, sweep

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("iptables") is None,
        reason="needs root, ip and iptables (network namespaces)",
    ),
]

SERVER = """
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 7000))
s.listen()
while True:
    c, _ = s.accept()
    c.close()
"""


@pytest.fixture
def net() -> Iterator[Net]:
    n = Net(["n1", "n2", "n3"]).up()
    servers: list[subprocess.Popen[bytes]] = []
    try:
        for nid in n.node_ids:
            servers.append(subprocess.Popen(n.exec_argv(nid, sys.executable, "-c", SERVER)))
        for nid in n.node_ids:  # wait until each listener answers from the host
            _wait_connect(n, None, n.ip[nid])
        yield n
    finally:
        for s in servers:
            s.kill()
            s.wait(10)
        assert n.close() == []
        assert n.leftovers() == []


def _connects(n: Net, src: str | None, ip: str) -> bool:
    code = f"import socket; socket.create_connection(({ip!r}, 7000), timeout=0.5)"
    argv = [sys.executable, "-c", code]
    if src is not None:
        argv = n.exec_argv(src, *argv)
    return subprocess.run(argv, capture_output=True, timeout=10).returncode == 0


def _wait_connect(n: Net, src: str | None, ip: str) -> None:
    for _ in range(50):
        if _connects(n, src, ip):
            return
    raise AssertionError(f"{ip} never accepted a connection")


def test_cut_drops_one_link_both_ways_and_heal_restores_it(net: Net) -> None:
    ip = net.ip
    assert _connects(net, "n1", ip["n2"]) and _connects(net, "n2", ip["n1"])
    net.cut("n1", "n2")
    assert not _connects(net, "n1", ip["n2"])
    assert not _connects(net, "n2", ip["n1"])
    # every other link, and the host's access to every node, still work
    assert _connects(net, "n1", ip["n3"]) and _connects(net, "n3", ip["n2"])
    assert all(_connects(net, None, ip[x]) for x in net.node_ids)
    net.heal()
    assert _connects(net, "n1", ip["n2"]) and _connects(net, "n2", ip["n1"])


def test_partition_isolates_groups(net: Net) -> None:
    net.partition([["n1"], ["n2", "n3"]])
    assert net.cuts == {frozenset(("n1", "n2")), frozenset(("n1", "n3"))}
    assert not _connects(net, "n2", net.ip["n1"])
    assert _connects(net, "n2", net.ip["n3"])


def test_namespaces_cannot_reach_outside(net: Net) -> None:
    code = "import socket; socket.create_connection(('192.0.2.1', 80), timeout=0.5)"
    res = subprocess.run(net.exec_argv("n1", sys.executable, "-c", code), capture_output=True)
    assert res.returncode != 0
    assert b"unreachable" in res.stderr


def test_a_run_killed_before_cleanup_is_swept_by_the_next() -> None:
    chaos_root = Path(__file__).resolve().parents[2] / "chaos"
    code = (
        f"import sys, time; sys.path.insert(0, {str(chaos_root)!r})\n"
        "from raftq_chaos.netns import Net\n"
        "n = Net(['n1', 'n2']).up()\n"
        "print(n.name, flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        name = proc.stdout.readline().decode().strip()
        assert name.startswith("rq")
        assert any(ns.startswith(name) for ns in subprocess_out("ip", "netns", "list").split())
    finally:
        proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
    assert name in sweep()
    assert not any(ns.startswith(name) for ns in subprocess_out("ip", "netns", "list").split())
    assert name not in subprocess_out("ip", "-o", "link", "show")
    assert name not in subprocess_out("iptables", "-S", "FORWARD")


def subprocess_out(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def test_a_failed_run_still_removes_its_network(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio
    import tempfile

    from raftq_chaos.cluster import Cluster
    from raftq_chaos.runner import Scenario, run

    def broken(self: Cluster, node: object) -> list[str]:
        return ["false"]  # the node process exits at once

    monkeypatch.setattr(Cluster, "command", broken)
    before = set(subprocess_out("ip", "netns", "list").split())
    with tempfile.TemporaryDirectory() as d:
        report = asyncio.run(run(Scenario("broken", nodes=3, faults=[]), Path(d)))
    assert report.error is not None and "exited" in report.error
    assert not report.ok
    new = set(subprocess_out("ip", "netns", "list").split()) - before
    assert not [ns for ns in new if ns.startswith("rq")]
    assert "seed=0" in report.failure()
