"""A reusable N-node cluster of real ``raftq node`` processes on loopback, for tests.

``Cluster(tmp_path, n)`` allocates free ports, starts each node (``python -m raftq.node node``) in
its own process group with its own data dir and log file, and ``close()`` stops every process it
started (SIGTERM, then SIGKILL of the group). Access control is on: every node gets the bootstrap
admin token ``Cluster.token`` (``tests.support.ADMIN_TOKEN`` by default) in its environment, and
``http()`` sends it unless told otherwise. Pytest fixtures ``cluster3`` (per test) and
``shared_cluster3`` (per module) are defined in ``tests/node/conftest.py``.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, TypeVar

from tests.support import ADMIN_TOKEN
from tests.support import free_ports as free_ports
from tests.support import wait_for as wait_for

T = TypeVar("T")


def http(
    method: str,
    url: str,
    body: Any = None,
    timeout: float = 10.0,
    token: str | None = ADMIN_TOKEN,
) -> tuple[int, Any]:
    """One JSON request, with ``token`` as its bearer credential (None: no Authorization
    header); returns (status, decoded JSON body, or raw bytes when not JSON)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            if "json" not in r.headers.get("Content-Type", "json"):
                return r.status, raw  # e.g. /metrics text
            return r.status, (json.loads(raw) if raw else None)
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, raw


class Node:
    def __init__(self, node_id: str, api: str, raft: str, data_dir: Path) -> None:
        self.id = node_id
        self.api = api
        self.raft = raft
        self.data_dir = data_dir
        self.log = data_dir / "node.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.api}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Cluster:
    def __init__(
        self,
        root: Path,
        n: int = 3,
        fsync: str = "never",
        extra_args: list[str] | None = None,
        token: str = ADMIN_TOKEN,
    ) -> None:
        self.extra_args = list(extra_args or [])
        ports = free_ports(2 * n)
        self.root = root
        self.fsync = fsync
        self.secret = secrets.token_urlsafe(16)
        self.token = token  # every node's bootstrap admin token
        self.nodes: dict[str, Node] = {}
        for i in range(n):
            nid = f"n{i + 1}"
            d = root / nid
            d.mkdir(parents=True, exist_ok=True)
            self.nodes[nid] = Node(
                nid, f"127.0.0.1:{ports[2 * i]}", f"127.0.0.1:{ports[2 * i + 1]}", d
            )

    # ------------------------------------------------------------------ processes

    def command(self, node: Node) -> list[str]:
        peers = ",".join(f"{o.id}={o.raft}/{o.api}" for o in self.nodes.values() if o.id != node.id)
        return [
            sys.executable, "-m", "raftq.node", "node", "--id", node.id, "--listen", node.api,
            "--raft", node.raft, "--peers", peers, "--data-dir", str(node.data_dir / "data"),
            "--fsync", self.fsync, "--log-level", "INFO", *self.extra_args,
        ]  # fmt: skip

    def start_node(self, nid: str) -> None:
        node = self.nodes[nid]
        assert not node.alive
        log = open(node.log, "ab")  # noqa: SIM115 - handed to the child
        # The admin token goes in the environment, never in argv (which ps shows).
        env = dict(
            os.environ, RAFTQ_SECRET=self.secret, RAFTQ_ADMIN_TOKEN=self.token, PYTHONUNBUFFERED="1"
        )
        env.pop("RAFTQ_ADMIN_TOKEN_FILE", None)
        node.proc = subprocess.Popen(
            self.command(node), stdout=log, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )  # fmt: skip
        log.close()
        wait_for(f"{nid} to answer /healthz", lambda: self._healthy(node), 20)

    def _healthy(self, node: Node) -> bool:
        if not node.alive:
            raise AssertionError(f"{node.id} exited:\n{self.tail(node.id)}")
        return http("GET", node.url + "/healthz", timeout=1, token=None)[0] == 200

    def start(self) -> Cluster:
        for nid in self.nodes:
            self.start_node(nid)
        lid = self.wait_leader()
        # A node started last may not have heard the leader yet (it answers no_leader): tests
        # talk to every node at once, so wait until all of them know it.
        wait_for(
            f"every node to know leader {lid}",
            lambda: all(self.status(n).get("leader") == lid for n in self.nodes),
            15,
            every=0.05,
        )
        return self

    def signal(self, nid: str, sig: int) -> None:
        node = self.nodes[nid]
        if node.alive:
            assert node.proc is not None
            os.killpg(node.proc.pid, sig)

    def kill(self, nid: str) -> None:
        """kill -9 the node's process group."""
        self.signal(nid, signal.SIGKILL)
        proc = self.nodes[nid].proc
        assert proc is not None
        proc.wait(10)

    def stop_node(self, nid: str, timeout: float = 20.0) -> int:
        """SIGTERM and wait; returns the exit code (kills and fails the wait if it hangs)."""
        node = self.nodes[nid]
        assert node.proc is not None
        self.signal(nid, signal.SIGTERM)
        try:
            return node.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.signal(nid, signal.SIGKILL)
            node.proc.wait(10)
            raise AssertionError(f"{nid} ignored SIGTERM for {timeout} s") from None

    def close(self) -> None:
        for nid in self.nodes:
            self.signal(nid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for nid, node in self.nodes.items():
            if node.proc is None:
                continue
            try:
                node.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.signal(nid, signal.SIGKILL)
                node.proc.wait(10)

    def tail(self, nid: str, lines: int = 40) -> str:
        try:
            return "\n".join(self.nodes[nid].log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # ------------------------------------------------------------------ cluster state

    def status(self, nid: str) -> dict[str, Any]:
        code, body = http("GET", self.nodes[nid].url + "/cluster", timeout=2, token=self.token)
        assert code == 200, body
        result: dict[str, Any] = body
        return result

    def leader(self) -> str | None:
        """The leader as reported by a majority of the running nodes, if any."""
        votes: dict[str, int] = {}
        for nid, node in self.nodes.items():
            if not node.alive:
                continue
            try:
                st = self.status(nid)
            except (OSError, AssertionError):
                continue
            if st.get("leader"):
                votes[st["leader"]] = votes.get(st["leader"], 0) + 1
        for lid, n in votes.items():
            if n > len(self.nodes) // 2 and self.nodes[lid].alive:
                return lid
        return None

    def wait_leader(self, timeout: float = 30.0, not_: str | None = None) -> str:
        return wait_for(
            "a leader" + (f" other than {not_}" if not_ else ""),
            lambda: lid if (lid := self.leader()) and lid != not_ else None,
            timeout,
            every=0.1,
        )

    def followers(self) -> list[str]:
        lid = self.leader()
        return [n for n, node in self.nodes.items() if n != lid and node.alive]

    def url(self, nid: str) -> str:
        return self.nodes[nid].url
