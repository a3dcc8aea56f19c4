"""``raftq cluster up``: N node processes on loopback for development.

Data, logs, the layout (``cluster.json``) and a generated secret (``secret``, mode 0600) live
under ``--dir`` (default ``./.raftq``); running again reuses them, so the cluster resumes with its
data. Ctrl-C (or SIGTERM) stops every node gracefully (SIGTERM, then SIGKILL after a bound).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

STOP_TIMEOUT = 25.0


def _layout(base: Path, nodes: int, api_port: int, raft_port: int) -> list[dict[str, str]]:
    path = base / "cluster.json"
    if path.exists():
        layout: list[dict[str, str]] = json.loads(path.read_text())["nodes"]
        if len(layout) != nodes:
            raise SystemExit(
                f"{base} holds a {len(layout)}-node cluster; pass --nodes {len(layout)} "
                f"or use another --dir"
            )
        first = (layout[0]["api"], layout[0]["raft"])
        if first != (f"127.0.0.1:{api_port}", f"127.0.0.1:{raft_port}"):
            print(
                f"note: {base} keeps the ports it was created with (API from {first[0]},"
                f" Raft from {first[1]}); --api-port/--raft-port apply to a new --dir",
                file=sys.stderr,
            )
        return layout
    layout = [
        {
            "id": f"n{i + 1}",
            "api": f"127.0.0.1:{api_port + i}",
            "raft": f"127.0.0.1:{raft_port + i}",
        }
        for i in range(nodes)
    ]
    path.write_text(json.dumps({"nodes": layout}, indent=2))
    return layout


def _busy(layout: list[dict[str, str]]) -> list[str]:
    """Addresses of the layout something already listens on (another cluster on this dir?)."""
    busy = []
    for n in layout:
        for addr in (n["api"], n["raft"]):
            host, _, port = addr.rpartition(":")
            with socket.socket() as s:
                # (as the nodes bind: a port left in TIME_WAIT by the last run is free)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind((host, int(port)))
                except OSError:
                    busy.append(addr)
    return busy


def _secret(base: Path) -> str:
    path = base / "secret"
    if path.exists():
        return path.read_text().strip()
    value = secrets.token_urlsafe(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value)
    return value


def node_command(
    me: dict[str, str], layout: list[dict[str, str]], data_dir: Path, fsync: str = "always"
) -> list[str]:
    peers = ",".join(f"{n['id']}={n['raft']}/{n['api']}" for n in layout if n["id"] != me["id"])
    return [
        sys.executable, "-m", "raftq.node", "node",
        "--id", me["id"], "--listen", me["api"], "--raft", me["raft"],
        "--peers", peers, "--data-dir", str(data_dir), "--fsync", fsync,
    ]  # fmt: skip


def get_json(url: str, timeout: float = 1.0) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        return json.loads(e.read() or b"{}")


def wait_for_leader(
    apis: list[str], timeout: float, failed: Callable[[], bool] = lambda: False
) -> str | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not failed():
        for api in apis:
            try:
                st = get_json(f"http://{api}/cluster", 0.5)
            except (OSError, ValueError):
                continue
            if st.get("role") == "leader":
                return str(st.get("node"))
        time.sleep(0.2)
    return None


def cluster_up(nodes: int, directory: str, api_port: int, raft_port: int, fsync: str) -> int:
    if not 1 <= nodes <= 9:
        raise SystemExit("--nodes must be between 1 and 9")
    base = Path(directory).resolve()
    base.mkdir(parents=True, exist_ok=True)
    layout = _layout(base, nodes, api_port, raft_port)
    busy = _busy(layout)
    if busy:
        # Else the wait below could find another cluster's leader there and report "up".
        print(
            f"cannot start: {', '.join(busy)} already in use (is this cluster already up?)",
            file=sys.stderr,
        )
        return 1
    env = dict(os.environ, RAFTQ_SECRET=_secret(base))
    procs: dict[str, subprocess.Popen[bytes]] = {}
    stopping = False

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        for n in layout:
            d = base / n["id"]
            d.mkdir(exist_ok=True)
            log = open(d / "node.log", "ab")  # noqa: SIM115 - handed to the child
            procs[n["id"]] = subprocess.Popen(
                node_command(n, layout, d, fsync),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches only us; we stop the nodes in order
            )
            log.close()
        apis = [n["api"] for n in layout]
        leader = wait_for_leader(
            apis, 30.0, lambda: stopping or any(p.poll() is not None for p in procs.values())
        )
        if leader is None and stopping:
            return 0
        if leader is None:
            for nid, p in procs.items():
                if p.poll() is not None:
                    tail = (base / nid / "node.log").read_text(errors="replace").splitlines()[-5:]
                    print(
                        f"node {nid} exited with {p.returncode}:",
                        *tail,
                        sep="\n  ",
                        file=sys.stderr,
                    )
            print(f"no leader; see the logs under {base}/n*/node.log", file=sys.stderr)
            return 1
        else:
            first = apis[0]
            print(f"raftq cluster of {nodes} is up; leader {leader}; data and logs in {base}")
            for n in layout:
                print(f"  {n['id']}  http://{n['api']}  (raft {n['raft']})")
            print("\nTry it (any node works; followers forward to the leader):")
            print(f'  curl -s -XPOST http://{first}/topics -d \'{{"topic":"orders"}}\'')
            print(
                f"  curl -s -XPOST http://{first}/topics/orders/messages "
                '-d \'{"payload":"aGVsbG8="}\''
            )
            print(
                f"  curl -s -XPOST http://{first}/topics/orders/groups/default/receive "
                "-d '{\"wait\":5}'"
            )
            print(f"  curl -s http://{first}/cluster\n\nCtrl-C stops the cluster.")
            sys.stdout.flush()
        while not stopping:
            for nid, p in procs.items():
                if p.poll() is not None and not getattr(p, "_reported", False):
                    print(f"node {nid} exited with {p.returncode}", file=sys.stderr)
                    p._reported = True  # type: ignore[attr-defined]
            if all(p.poll() is not None for p in procs.values()):
                print(f"every node exited; see the logs under {base}/n*/node.log", file=sys.stderr)
                return 1
            time.sleep(0.2)
    finally:
        code = stop_all(procs)
        print("cluster stopped")
    return code


def stop_all(procs: dict[str, subprocess.Popen[bytes]]) -> int:
    for p in procs.values():
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    code = 0
    for nid, p in procs.items():
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"node {nid} did not stop in time; killing it", file=sys.stderr)
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            code = 1
    return code
