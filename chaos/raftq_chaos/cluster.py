"""``raftq node`` processes, one per network namespace of a ``netns.Net``.

Each node listens on its namespace address (API :8000, Raft :9000), has its own data dir that
survives restarts, and runs in its own process group so kill -9 / SIGSTOP / SIGCONT hit exactly
that node. ``close()`` kills every process it started (SIGCONT first, so paused ones die too).
Status helpers are async (aiohttp) so they can run beside the workload. Access control is on, as
in production: every node gets the run's bootstrap admin token (``Cluster.token``) in its
environment, and every call of the harness (status, metrics, ``client()``) sends it.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from raftq.client import AsyncClient
from raftq.node.devcluster import new_admin_token
from raftq_chaos.netns import Net

API_PORT = 8000
RAFT_PORT = 9000


class NodeExited(RuntimeError):
    """A node process we wait for is gone: waiting longer cannot help."""


class Refused(RuntimeError):
    """A node refused the harness's token (401 / 403): a broken setup, not a fault."""


@dataclass
class Node:
    id: str
    ip: str
    data_dir: Path
    proc: subprocess.Popen[bytes] | None = None
    paused: bool = False
    starts: int = 0
    exits: list[int] = field(default_factory=list)

    @property
    def api(self) -> str:
        return f"{self.ip}:{API_PORT}"

    @property
    def raft(self) -> str:
        return f"{self.ip}:{RAFT_PORT}"

    @property
    def url(self) -> str:
        return f"http://{self.api}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def log(self) -> Path:
        return self.data_dir / "node.log"


class Cluster:
    def __init__(self, net: Net, root: Path, fsync: str = "never") -> None:
        self.net = net
        self.root = root
        self.fsync = fsync
        self.secret = secrets.token_urlsafe(16)
        self.token = new_admin_token()  # the nodes' bootstrap admin token; the harness's
        self.nodes = {
            nid: Node(nid, net.ip[nid], root / nid) for nid in net.node_ids
        }  # fmt: skip
        for n in self.nodes.values():
            n.data_dir.mkdir(parents=True, exist_ok=True)
        self._session: aiohttp.ClientSession | None = None
        atexit.register(self.close)  # last resort; close() is idempotent

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes.values()]

    # ------------------------------------------------------------------ processes

    def command(self, node: Node) -> list[str]:
        peers = ",".join(f"{o.id}={o.raft}/{o.api}" for o in self.nodes.values() if o.id != node.id)
        argv = [
            sys.executable, "-m", "raftq.node", "node", "--id", node.id, "--listen", node.api,
            "--raft", node.raft, "--peers", peers, "--data-dir", str(node.data_dir / "data"),
            "--fsync", self.fsync, "--log-level", "INFO",
        ]  # fmt: skip
        return self.net.exec_argv(node.id, *argv)

    def start(self, nid: str) -> None:
        node = self.nodes[nid]
        if node.alive:
            return
        with node.log.open("ab") as log:
            log.write(f"---- start {node.starts + 1} at {time.time():.3f}\n".encode())
            log.flush()
            # (the token in the environment, never in argv: ps shows that)
            env = dict(
                os.environ,
                RAFTQ_SECRET=self.secret,
                RAFTQ_ADMIN_TOKEN=self.token,
                PYTHONUNBUFFERED="1",
            )
            env.pop("RAFTQ_ADMIN_TOKEN_FILE", None)
            chaos_root = str(Path(__file__).resolve().parents[1])
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (chaos_root, os.environ.get("PYTHONPATH")) if p
            )
            node.proc = subprocess.Popen(
                self.command(node),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        node.starts += 1
        node.paused = False

    def _signal(self, nid: str, sig: int) -> bool:
        node = self.nodes[nid]
        if not node.alive:
            return False
        assert node.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.proc.pid, sig)
        return True

    def kill(self, nid: str) -> None:
        """kill -9 the node's process group and reap it."""
        node = self.nodes[nid]
        if self._signal(nid, signal.SIGKILL):
            assert node.proc is not None
            node.exits.append(node.proc.wait(10))
        node.paused = False

    def stop(self, nid: str, timeout: float = 20.0) -> int | None:
        """Graceful stop (SIGTERM); kill -9 after ``timeout``. Returns the exit code."""
        node = self.nodes[nid]
        if node.paused:
            self.resume(nid)
        if not self._signal(nid, signal.SIGTERM):
            return None
        assert node.proc is not None
        try:
            code = node.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill(nid)
            return None
        node.exits.append(code)
        return code

    def pause(self, nid: str) -> None:
        if self._signal(nid, signal.SIGSTOP):
            self.nodes[nid].paused = True

    def resume(self, nid: str) -> None:
        self._signal(nid, signal.SIGCONT)
        self.nodes[nid].paused = False

    def close(self) -> None:
        for nid in self.nodes:
            self._signal(nid, signal.SIGCONT)
            self.kill(nid)
        self.net.kill_processes()  # anything else started in the namespaces
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)

    def tail(self, nid: str, lines: int = 30) -> str:
        try:
            text = self.nodes[nid].log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    # ------------------------------------------------------------------ status (async)

    def client(self, urls: list[str] | None = None, **kw: Any) -> AsyncClient:
        """A client of this cluster (every node by default), with the admin token."""
        return AsyncClient(self.urls if urls is None else urls, token=self.token, **kw)

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(headers={"Authorization": f"Bearer {self.token}"})
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def status(
        self, nid: str, timeout: float = 2.0, digest: bool = False
    ) -> dict[str, Any] | None:
        node = self.nodes[nid]
        if not node.alive or node.paused:
            return None
        try:
            async with self.session().get(
                node.url + ("/cluster?digest=1" if digest else "/cluster"),
                timeout=aiohttp.ClientTimeout(total=timeout),
                headers={"Accept": "application/json"},
            ) as r:
                if r.status in (401, 403):
                    raise Refused(f"{nid} refused the harness's token: {await r.text()}")
                if r.status != 200:
                    return None
                body: dict[str, Any] = await r.json()
                return body
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None

    async def broker_figures(self, nid: str, timeout: float = 3.0) -> dict[str, float] | None:
        """This node's own view of the replicated state, from its local ``/metrics``: every
        ``raftq_topic_*`` / ``raftq_group_*`` sample (counters, pending, in flight...) but the
        oldest message's age."""
        node = self.nodes[nid]
        if not node.alive or node.paused:
            return None
        try:
            async with self.session().get(
                node.url + "/metrics", timeout=aiohttp.ClientTimeout(total=timeout)
            ) as r:
                if r.status != 200:
                    return None
                text = await r.text()
        except (aiohttp.ClientError, TimeoutError):
            return None
        out: dict[str, float] = {}
        for line in text.splitlines():
            # (the oldest message's age is by each node's own clock: not a replica's state)
            if line.startswith(("raftq_topic_", "raftq_group_")) and not line.startswith(
                "raftq_group_oldest_unsettled_age_seconds"
            ):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    async def digest(self, nid: str, timeout: float = 5.0) -> dict[str, Any] | None:
        """This replica's ``{"digest", "applied_index"}`` from ``GET /cluster?digest=1``."""
        st = await self.status(nid, timeout, digest=True)
        if st is None or "digest" not in st:
            return None
        return {"digest": st["digest"], "applied_index": st.get("applied_index")}

    async def statuses(self) -> dict[str, dict[str, Any] | None]:
        ids = list(self.nodes)
        res = await asyncio.gather(*(self.status(n) for n in ids))
        return dict(zip(ids, res, strict=True))

    async def leader(self) -> str | None:
        """The leader named by a majority of all members, if it is up and says it leads."""
        st = await self.statuses()
        votes: dict[str, int] = {}
        for s in st.values():
            if s and s.get("leader"):
                votes[s["leader"]] = votes.get(s["leader"], 0) + 1
        for lid, n in votes.items():
            s = st.get(lid)
            if n > len(self.nodes) // 2 and s and s.get("role") == "leader":
                return lid
        return None

    async def wait(self, what: str, fn: Any, timeout: float, every: float = 0.2) -> Any:
        deadline = time.monotonic() + timeout
        last: Any = None
        while True:
            try:
                value = await fn()
                if value:
                    return value
                last = value
            except (NodeExited, Refused):
                raise
            except Exception as e:
                last = e
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"timed out after {timeout} s waiting for {what} (last {last!r})"
                )
            await asyncio.sleep(every)

    async def wait_leader(self, timeout: float = 30.0) -> str:
        lid: str = await self.wait("a leader", self.leader, timeout)
        return lid

    async def wait_up(self, nid: str, timeout: float = 30.0) -> None:
        async def up() -> bool:
            node = self.nodes[nid]
            if not node.alive:
                raise NodeExited(f"{nid} exited:\n{self.tail(nid)}")
            return await self.status(nid, 1.0) is not None

        await self.wait(f"{nid} to answer /cluster", up, timeout)
