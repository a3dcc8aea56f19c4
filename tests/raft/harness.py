"""Multi-process Raft clusters for tests and benchmarks: one ``node_runner.py`` per node.

Every process runs in its own process group and ``RaftCluster.close()`` kills every group it
started. Waits are bounded and poll conditions, never fixed sleeps.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, TypeVar

from tests.support import free_ports as free_ports
from tests.support import wait_for as wait_for

T = TypeVar("T")
RUNNER = Path(__file__).with_name("node_runner.py")
REPO = RUNNER.parents[2]


class RaftProc:
    def __init__(self, node_id: str, raft: str, api: str, data: Path, shadow: Path | None) -> None:
        self.id, self.raft, self.api = node_id, raft, api
        self.data, self.shadow = data, shadow
        self.proc: subprocess.Popen[bytes] | None = None
        self._ids = itertools.count(1)
        self._cond = threading.Condition()
        self._answers: dict[int, dict[str, Any]] = {}
        self._ready: dict[str, Any] | None = None

    def start(
        self, peers: dict[str, tuple[str, str]], extra: list[str], timeout: float = 20.0
    ) -> None:
        self.data.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            str(RUNNER),
            *("--id", self.id, "--raft", self.raft, "--api", self.api),
            *("--peers", json.dumps(peers), "--data", str(self.data)),
            *extra,
        ]
        if self.shadow is not None:
            cmd += ["--shadow", str(self.shadow)]
        self._reap()
        self._ready = None
        self._answers = {}
        with open(self.data.parent / f"{self.id}.log", "ab") as err:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                cwd=REPO,
                start_new_session=True,
            )
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()
        with self._cond:
            ok = self._cond.wait_for(lambda: self._ready is not None, timeout)
        if not ok or self._ready is None or "fatal" in self._ready:
            raise RuntimeError(f"{self.id} did not start: {self._ready}")

    def start_expect_failure(self, peers: dict[str, tuple[str, str]], timeout: float = 20.0) -> str:
        try:
            self.start(peers, [], timeout)
        except RuntimeError:
            assert self._ready is not None and "fatal" in self._ready, self._ready
            return str(self._ready["fatal"])
        raise AssertionError(f"{self.id} started although it should have refused")

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                msg = json.loads(line)
                with self._cond:
                    if self.proc is not proc:
                        return
                    if "id" in msg:
                        self._answers[msg["id"]] = msg
                    else:
                        self._ready = msg
                    self._cond.notify_all()
        except (ValueError, OSError):
            pass  # pipe closed by kill()
        with self._cond:
            if self.proc is proc and self._ready is None:
                self._ready = {"fatal": "process exited"}
            self._cond.notify_all()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def send(self, op: str, **kw: Any) -> int:
        assert self.proc is not None and self.proc.stdin is not None
        rid = next(self._ids)
        self.proc.stdin.write((json.dumps({"id": rid, "op": op, **kw}) + "\n").encode())
        self.proc.stdin.flush()
        return rid

    def answer(self, rid: int, timeout: float = 15.0) -> dict[str, Any]:
        with self._cond:
            ok = self._cond.wait_for(lambda: rid in self._answers or not self.alive, timeout)
            if not ok or rid not in self._answers:
                raise AssertionError(f"{self.id}: no answer to request {rid} (alive={self.alive})")
            return self._answers.pop(rid)

    def call(self, op: str, timeout: float = 15.0, **kw: Any) -> dict[str, Any]:
        return self.answer(self.send(op, **kw), timeout)

    def ok(self, op: str, timeout: float = 15.0, **kw: Any) -> Any:
        r = self.call(op, timeout, **kw)
        assert "ok" in r, f"{self.id} {op}: {r}"
        return r["ok"]

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self._reap()

    def _reap(self) -> None:
        if self.proc is None:
            return
        self.proc.wait(10)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()

    def stop(self) -> None:
        if self.alive:
            with contextlib.suppress(AssertionError):
                self.call("stop", timeout=15)
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
            self.kill()


class RaftCluster:
    def __init__(
        self, root: Path, n: int = 3, *, shadow: bool = False, extra: list[str] | None = None
    ) -> None:
        ports = free_ports(2 * n)
        self.extra = extra or []
        self.nodes: dict[str, RaftProc] = {}
        for i in range(n):
            nid = f"n{i + 1}"
            self.nodes[nid] = RaftProc(
                nid,
                f"127.0.0.1:{ports[2 * i]}",
                f"127.0.0.1:{ports[2 * i + 1]}",
                root / nid,
                root / f"{nid}.shadow" if shadow else None,
            )

    def peers(self, nid: str) -> dict[str, tuple[str, str]]:
        return {k: (p.raft, p.api) for k, p in self.nodes.items() if k != nid}

    def start(self, nid: str) -> RaftProc:
        p = self.nodes[nid]
        p.start(self.peers(nid), self.extra)
        return p

    def start_all(self) -> RaftCluster:
        for nid in self.nodes:
            self.start(nid)
        return self

    def leader(self, timeout: float = 20.0) -> RaftProc:
        def find() -> RaftProc | None:
            for p in self.nodes.values():
                if p.alive and p.ok("status", 5)["role"] == "leader":
                    return p
            return None

        return wait_for("a leader", find, timeout, 0.1)

    def propose(self, commands: list[dict[str, Any]], timeout: float = 20.0) -> list[Any]:
        """Propose on the current leader, retrying NotLeader until ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            leader = self.leader(max(1.0, deadline - time.monotonic()))
            r = leader.call("propose", commands=commands, timeout=5.0)
            if "ok" in r:
                return list(r["ok"])
            if r["error"] != "NotLeader" or time.monotonic() > deadline:
                raise AssertionError(f"propose failed: {r}")
            time.sleep(0.05)

    def kill_all(self) -> None:
        procs = [p.proc for p in self.nodes.values() if p.alive and p.proc is not None]
        for proc in procs:  # as close to "at once" as signals get
            os.killpg(proc.pid, signal.SIGKILL)
        for p in self.nodes.values():
            p.kill()

    def close(self) -> None:
        for p in self.nodes.values():
            p.kill()


def wait_payloads(p: RaftProc, topic: str, expected: list[str], timeout: float = 20.0) -> None:
    def done() -> bool:
        return bool(p.ok("payloads", topic=topic) == expected)

    wait_for(f"{p.id} to apply {len(expected)} messages of {topic}", done, timeout)


def publish(topic: str, payload: str) -> dict[str, Any]:
    return {"op": "publish", "topic": topic, "messages": [{"payload": payload}]}
