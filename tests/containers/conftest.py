"""Fixtures for container tests: the raftq image, and 3-node clusters of containers.

The image is built once per session by ``deploy/build-image.sh`` (offline: wheels from this
checkout, and a base image made with mmdebstrap when no registry answers). Tests talk to the
containers over their addresses on a private Docker network this fixture creates and removes.
Access control is on: the nodes get the suite's admin token (``tests.support.ADMIN_TOKEN``) in
their environment, and ``http_json`` and the clients (``RAFTQ_TOKEN``) send it. Without a Docker
daemon these tests are skipped; in CI the daemon is there and they run.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support import ADMIN_TOKEN

os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")  # its image cannot be pulled here

ROOT = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("RAFTQ_TEST_IMAGE", "raftq:test")


def docker_available() -> bool:
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="session")
def image() -> str:
    if not docker_available():
        pytest.skip("no Docker daemon")
    built = subprocess.run(
        ["bash", str(ROOT / "deploy" / "build-image.sh"), IMAGE],
        cwd=ROOT,
        timeout=600,
        capture_output=True,
        text=True,
    )
    output = built.stdout + built.stderr
    assert built.returncode == 0, output
    # Nothing a user would wonder about (the classic builder's deprecation banner, pip's...).
    assert "deprecat" not in output.lower(), output
    return IMAGE


def http_json(url: str, timeout: float = 2.0, token: str | None = ADMIN_TOKEN) -> tuple[int, Any]:
    """GET ``url`` with ``token`` as the bearer credential (None: none); (status, JSON)."""
    req = urllib.request.Request(url)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as e:
        with e:
            return e.code, None
    except (OSError, ValueError):  # unreachable (stopped, paused or cut off) or garbled
        return 0, None


def wait_for(pred: Any, timeout: float, what: str, interval: float = 0.2) -> Any:
    end = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < end:
        try:
            last = pred()
            if last:
                return last
        except OSError as e:
            last = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


@dataclass
class Node:
    name: str
    container: Any  # testcontainers DockerContainer

    @property
    def raw(self) -> Any:
        return self.container.get_wrapped_container()

    def ip(self, network: str) -> str:
        self.raw.reload()
        return str(self.raw.attrs["NetworkSettings"]["Networks"][network]["IPAddress"])


@dataclass
class ContainerCluster:
    network: Any  # testcontainers Network
    nodes: dict[str, Node] = field(default_factory=dict)
    volumes: list[str] = field(default_factory=list)
    ips: dict[str, str] = field(default_factory=dict)

    def url(self, name: str) -> str:
        return f"http://{self.ips[name]}:8000"

    def urls(self) -> list[str]:
        return [self.url(n) for n in sorted(self.nodes)]

    def ready(self, names: list[str] | None = None, timeout: float = 60.0) -> None:
        for n in names or sorted(self.nodes):
            wait_for(
                lambda n=n: http_json(self.url(n) + "/readyz", token=None)[0] == 200,
                timeout,
                f"{n} ready",
            )

    def leader(self, timeout: float = 30.0, exclude: str | None = None) -> str:
        def find() -> str | None:
            # The leader a majority of the nodes name (a deposed leader may still think it is).
            votes: dict[str, int] = {}
            for n in sorted(self.nodes):
                status, body = http_json(self.url(n) + "/cluster")
                if status == 200 and body.get("leader"):
                    votes[body["leader"]] = votes.get(body["leader"], 0) + 1
            for lid, count in votes.items():
                if count > len(self.nodes) // 2 and lid != exclude:
                    return lid
            return None

        return str(wait_for(find, timeout, "a leader"))


def _network() -> tuple[Any, str]:
    """A private network with a subnet of our own, so every node gets a fixed address that the
    nodes advertise and the test (on the host) can reach."""
    import docker.errors
    from docker.types import IPAMConfig, IPAMPool
    from testcontainers.core.network import Network

    for _ in range(20):
        subnet = f"10.213.{random.randrange(256)}"
        ipam = IPAMConfig(pool_configs=[IPAMPool(subnet=f"{subnet}.0/24", gateway=f"{subnet}.1")])
        try:
            net = Network(docker_network_kw={"ipam": ipam}).create()
        except docker.errors.APIError:  # the subnet is taken: pick another
            continue
        return net, subnet
    raise RuntimeError("no free 10.213.x.0/24 subnet for the test network")


def start_cluster(image: str, n: int = 3) -> ContainerCluster:
    from docker.types import EndpointConfig
    from testcontainers.core.container import DockerContainer

    run = uuid.uuid4().hex[:8]
    net, subnet = _network()
    cluster = ContainerCluster(net)
    secret = secrets.token_hex(16)
    names = [f"n{i}" for i in range(1, n + 1)]
    ips = {name: f"{subnet}.{10 + i}" for i, name in enumerate(names, start=1)}
    peers = ",".join(f"{p}={p}:9000/{ips[p]}:8000" for p in names)  # each skips its own entry
    for name in names:
        volume = f"raftq-test-{run}-{name}"
        cluster.volumes.append(volume)
        endpoint = EndpointConfig("1.41", aliases=[name], ipv4_address=ips[name])
        c = (
            DockerContainer(image)
            .with_name(f"raftq-test-{run}-{name}")
            .with_env("RAFTQ_ID", name)
            .with_env("RAFTQ_RAFT", f"{name}:9000")
            .with_env("RAFTQ_ADVERTISE", f"{ips[name]}:8000")
            .with_env("RAFTQ_PEERS", peers)
            .with_env("RAFTQ_SECRET", secret)
            .with_env("RAFTQ_ADMIN_TOKEN", ADMIN_TOKEN)
            .with_volume_mapping(volume, "/data", "rw")
            .with_kwargs(
                init=True,
                hostname=name,
                network=net.name,
                networking_config={net.name: endpoint},
            )
        )
        c.start()
        cluster.nodes[name] = Node(name, c)
        cluster.ips[name] = ips[name]
    return cluster


def stop_cluster(cluster: ContainerCluster) -> None:
    for node in cluster.nodes.values():
        with contextlib.suppress(Exception):  # already gone
            node.raw.remove(force=True)
    with contextlib.suppress(Exception):
        cluster.network.remove()
    for volume in cluster.volumes:
        subprocess.run(["docker", "volume", "rm", "-f", volume], capture_output=True, timeout=30)


@pytest.fixture
def cluster(image: str) -> Iterator[ContainerCluster]:
    c = start_cluster(image)
    try:
        c.ready()
        yield c
    finally:
        stop_cluster(c)
