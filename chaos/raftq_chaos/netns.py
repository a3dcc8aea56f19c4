"""A private network for one chaos run: a bridge, and per node a network namespace joined to it
by a veth pair. Single links are cut with DROP rules inside the two namespaces involved.

Addresses are ``10.77.K.0/24`` (K picked per run, unused on this machine); the host side of the
bridge is ``.254``, node *i* is ``.i``. The namespaces have no default route, so no packet can
leave the machine. Names are ``rq<5 hex>`` + a suffix, unique per run and at most 15 characters.
The host's FORWARD chain may drop bridged traffic (docker sets policy DROP and br_netfilter
sends bridged frames through it), so one ACCEPT rule scoped to this bridge is inserted, tagged
with the run name, and removed at teardown. ``close()`` removes everything it made, is
idempotent, and is registered with ``atexit`` as a last resort.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import random
import secrets
import signal
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

SUBNET_PREFIX = "10.77"
# One small JSON file per live run (owner pid, what it made), so a run killed before its
# cleanup (SIGKILL, power cut) is swept by the next one.
REGISTRY = Path(tempfile.gettempdir()) / "raftq-chaos-nets"


class NetError(RuntimeError):
    pass


def sh(*args: str, check: bool = True, timeout: float = 10.0) -> str:
    res = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if check and res.returncode != 0:
        raise NetError(f"{' '.join(args)} failed ({res.returncode}): {res.stderr.strip()}")
    return res.stdout


def _free_octet(rng: random.Random) -> int:
    used = sh("ip", "-4", "addr", "show") + sh("ip", "-4", "route", "show")
    for _ in range(200):
        k = rng.randint(1, 250)
        if f"{SUBNET_PREFIX}.{k}." not in used:
            return k
    raise NetError(f"no free {SUBNET_PREFIX}.K.0/24 subnet")


class Net:
    def __init__(self, node_ids: Sequence[str], name: str | None = None) -> None:
        self.name = name or "rq" + secrets.token_hex(3)[:5]
        if len(self.name) > 9:
            raise ValueError("run name must be at most 9 characters (interface name limit)")
        self.node_ids = list(node_ids)
        self.bridge = self.name + "b"
        self.octet = _free_octet(random.Random())
        self.host_ip = f"{SUBNET_PREFIX}.{self.octet}.254"
        self.ns = {nid: f"{self.name}n{i + 1}" for i, nid in enumerate(self.node_ids)}
        self.ip = {nid: f"{SUBNET_PREFIX}.{self.octet}.{i + 1}" for i, nid in enumerate(node_ids)}
        self._veth = {nid: f"{self.name}h{i + 1}" for i, nid in enumerate(self.node_ids)}
        self._made_ns: list[str] = []
        self._made_links: list[str] = []
        self._forward_rule: list[str] | None = None
        self.cuts: set[frozenset[str]] = set()
        self._closed = False

    # ------------------------------------------------------------------ lifecycle

    def up(self) -> Net:
        sweep()
        self._register()
        atexit.register(self.close)
        try:
            self._up()
        except BaseException:
            self.close()
            raise
        return self

    def _register(self) -> None:
        """Record what this run is about to make, before making it."""
        REGISTRY.mkdir(exist_ok=True)
        rule = ["FORWARD", "-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT"]
        rule += ["-m", "comment", "--comment", f"raftq-chaos-{self.name}"]
        state = {
            "pid": os.getpid(),
            "ns": list(self.ns.values()),
            "links": [self.bridge, *self._veth.values()],
            "rule": rule,
        }
        (REGISTRY / f"{self.name}.json").write_text(json.dumps(state))

    def _up(self) -> None:
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        self._made_links.append(self.bridge)
        sh("ip", "addr", "add", f"{self.host_ip}/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        rule = ["FORWARD", "-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT"]
        rule += ["-m", "comment", "--comment", f"raftq-chaos-{self.name}"]
        sh("iptables", "-I", *rule)
        self._forward_rule = rule
        for i, nid in enumerate(self.node_ids):
            ns, host, peer = self.ns[nid], self._veth[nid], f"{self.name}p{i + 1}"
            sh("ip", "netns", "add", ns)
            self._made_ns.append(ns)
            sh("ip", "link", "add", host, "type", "veth", "peer", "name", peer)
            self._made_links.append(host)
            sh("ip", "link", "set", peer, "netns", ns)
            sh("ip", "link", "set", host, "master", self.bridge)
            sh("ip", "link", "set", host, "up")
            self.exec(nid, "ip", "link", "set", "lo", "up")
            self.exec(nid, "ip", "link", "set", peer, "name", "eth0")
            self.exec(nid, "ip", "addr", "add", f"{self.ip[nid]}/24", "dev", "eth0")
            self.exec(nid, "ip", "link", "set", "eth0", "up")

    def close(self) -> list[str]:
        """Remove every namespace, link and rule this run made; returns the errors (if any)."""
        if self._closed:
            return []
        errors: list[str] = []
        for ns in reversed(self._made_ns):
            try:
                sh("ip", "netns", "del", ns)
            except (NetError, subprocess.TimeoutExpired) as e:
                errors.append(str(e))
        for link in reversed(self._made_links):
            # a veth goes away with its namespace's peer, possibly a moment later (even while
            # this deletes it: then the kernel answers "No such device")
            try:
                sh("ip", "link", "del", link)
            except (NetError, subprocess.TimeoutExpired) as e:
                if not any(gone in str(e) for gone in ("Cannot find device", "No such device")):
                    errors.append(str(e))
        if self._forward_rule is not None:
            try:
                sh("iptables", "-D", *self._forward_rule)
            except (NetError, subprocess.TimeoutExpired) as e:
                errors.append(str(e))
            self._forward_rule = None
        self._made_ns.clear()
        self._made_links.clear()
        self._closed = True
        with contextlib.suppress(OSError):
            (REGISTRY / f"{self.name}.json").unlink()
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)
        return errors

    def kill_processes(self) -> None:
        """SIGKILL whatever still runs inside this run's namespaces."""
        for ns in self._made_ns:
            _kill_ns_processes(ns)

    def leftovers(self) -> list[str]:
        """Anything named after this run that still exists (for tests of the cleanup)."""
        found = [ns for ns in sh("ip", "netns", "list").split() if ns.startswith(self.name)]
        for line in sh("ip", "-o", "link", "show").splitlines():
            name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
            if name.startswith(self.name):
                found.append(name)
        if f"raftq-chaos-{self.name}" in sh("iptables", "-S", "FORWARD"):
            found.append("iptables FORWARD rule")
        return found

    # ------------------------------------------------------------------ inside a namespace

    def exec_argv(self, nid: str, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns[nid], *argv]

    def exec(self, nid: str, *argv: str, check: bool = True) -> str:
        return sh(*self.exec_argv(nid, *argv), check=check)

    # ------------------------------------------------------------------ faults

    def _rules(self, nid: str, peer: str, action: str) -> None:
        ip = self.ip[peer]
        self.exec(nid, "iptables", action, "INPUT", "-s", ip, "-j", "DROP")
        self.exec(nid, "iptables", action, "OUTPUT", "-d", ip, "-j", "DROP")

    def cut(self, a: str, b: str) -> None:
        """Drop every packet between nodes a and b (both ways, silently)."""
        link = frozenset((a, b))
        if a == b or link in self.cuts:
            return
        self._rules(a, b, "-A")
        self._rules(b, a, "-A")
        self.cuts.add(link)

    def mend(self, a: str, b: str) -> None:
        link = frozenset((a, b))
        if link not in self.cuts:
            return
        self._rules(a, b, "-D")
        self._rules(b, a, "-D")
        self.cuts.discard(link)

    def partition(self, groups: Iterable[Iterable[str]]) -> None:
        """Cut every link between nodes of different groups (nodes in no group: isolated)."""
        side: dict[str, object] = {nid: i for i, g in enumerate(groups) for nid in g}
        for a in self.node_ids:
            for b in self.node_ids:
                if a < b and side.get(a, ("alone", a)) != side.get(b, ("alone", b)):
                    self.cut(a, b)

    def heal(self) -> None:
        for nid in self.node_ids:
            self.exec(nid, "iptables", "-F", "INPUT")
            self.exec(nid, "iptables", "-F", "OUTPUT")
        self.cuts.clear()


def _kill_ns_processes(ns: str) -> None:
    for pid in sh("ip", "netns", "pids", ns, check=False).split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep() -> list[str]:
    """Remove what runs whose process is gone left behind; returns the run names swept."""
    swept: list[str] = []
    if not REGISTRY.is_dir():
        return swept
    for f in REGISTRY.glob("*.json"):
        try:
            state = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if _alive(int(state.get("pid", 0))):
            continue
        for ns in state.get("ns", []):
            _kill_ns_processes(ns)
            sh("ip", "netns", "del", ns, check=False)
        for link in state.get("links", []):
            sh("ip", "link", "del", link, check=False)
        if state.get("rule"):
            sh("iptables", "-D", *state["rule"], check=False)
        with contextlib.suppress(OSError):
            f.unlink()
        swept.append(f.stem)
    return swept
