"""Smoke test of the top-level docker-compose.yml with docker-compose v1 (what this box has)."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from raftq.client import Client
from tests.containers.conftest import ROOT, http_json, wait_for
from tests.support import ADMIN_TOKEN

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def compose_cmd() -> list[str]:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return ["docker", "compose"]


@pytest.fixture
def compose_project() -> list[str]:
    """The compose command for this test's own project."""
    return [*compose_cmd(), "-p", f"raftqtest{uuid.uuid4().hex[:8]}", "-f",
            str(ROOT / "docker-compose.yml")]  # fmt: skip


@pytest.fixture
def compose(image: str, compose_project: list[str]) -> Iterator[list[str]]:
    ports = [free_port() for _ in range(3)]
    sqs_ports = [free_port() for _ in range(3)]  # (not 9324-9326: a dev cluster may hold them)
    env = dict(
        os.environ,
        RAFTQ_IMAGE=image,
        RAFTQ_SECRET=secrets.token_hex(16),
        RAFTQ_ADMIN_TOKEN=ADMIN_TOKEN,
        **{f"RAFTQ_PORT_N{i + 1}": str(p) for i, p in enumerate(ports)},
        **{f"RAFTQ_SQS_PORT_N{i + 1}": str(p) for i, p in enumerate(sqs_ports)},
    )
    base = compose_project
    try:
        subprocess.run([*base, "up", "-d"], env=env, check=True, timeout=180, cwd=ROOT)
        yield [f"http://127.0.0.1:{p}" for p in ports]
    finally:
        subprocess.run(
            [*base, "down", "-v", "--timeout", "10"],
            env=env,
            timeout=180,
            cwd=ROOT,
            capture_output=True,
        )


def test_compose_cluster_publishes_and_consumes(compose: list[str]) -> None:
    for url in compose:
        wait_for(
            lambda url=url: http_json(url + "/readyz", token=None)[0] == 200, 90, f"{url} ready"
        )
    # Access control is on: no token, no answer; the compose file's admin token is accepted.
    assert http_json(compose[0] + "/cluster", token=None)[0] == 401
    topic = f"t-{uuid.uuid4().hex[:8]}"
    with Client(compose, token=ADMIN_TOKEN) as c:
        c.create_topic(topic)
        seqs = c.publish_batch(topic, [b"one", b"two", b"three"])
        got = []
        for m in c.consume(topic, max_messages=3, idle_timeout=10):
            m.ack()
            got.append(m)
    assert [m.payload for m in got] == [b"one", b"two", b"three"]
    assert [m.seq for m in got] == seqs


def test_a_node_whose_process_dies_is_restarted_on_a_read_only_root(
    compose: list[str], compose_project: list[str]
) -> None:
    """restart: unless-stopped brings back a node that dies (SIGKILL from inside: a crash, an
    OOM kill), and the node runs on a read-only root with no capabilities. (``docker kill`` is
    a manual stop to Docker: no policy restarts it, README.)"""
    wait_for(lambda: http_json(compose[2] + "/readyz", token=None)[0] == 200, 90, "n3 ready")
    project = compose_project[compose_project.index("-p") + 1]
    labels = [f"label=com.docker.compose.{k}" for k in (f"project={project}", "service=n3")]
    [cid] = subprocess.run(["docker", "ps", "-q", "--filter", labels[0], "--filter", labels[1]],
                           capture_output=True, text=True, check=True, timeout=60,
                           ).stdout.split()  # fmt: skip
    probe = subprocess.run(["docker", "exec", cid, "touch", "/x"], capture_output=True,
                           text=True, timeout=60)  # fmt: skip
    assert "Read-only file system" in probe.stderr, probe.stderr  # (EROFS comes before EACCES)
    kill = (  # the node's process (not the init, pid 1, whose argv holds "raftq node" too)
        "import os; [os.kill(int(p), 9) for p in os.listdir('/proc') if p.isdigit() and p != '1'"
        " and b'raftq\\x00node' in open(f'/proc/{p}/cmdline', 'rb').read()]"
    )
    # The init exits with the node, so the container may stop before this exec returns: Docker
    # then kills the exec too (137). Either way the restart below is what the test checks.
    done = subprocess.run(["docker", "exec", cid, "python3", "-c", kill], timeout=60)
    assert done.returncode in (0, 137), done.returncode

    def restarted() -> bool:
        out = subprocess.run(["docker", "inspect", "-f", "{{.RestartCount}}", cid],
                             capture_output=True, text=True, timeout=30).stdout  # fmt: skip
        return out.strip() not in ("", "0")

    wait_for(restarted, 30, "n3 restarted")
    wait_for(lambda: http_json(compose[2] + "/readyz", token=None)[0] == 200, 90, "n3 back")
