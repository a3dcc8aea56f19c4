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
def compose(image: str) -> Iterator[list[str]]:
    project = f"raftqtest{uuid.uuid4().hex[:8]}"
    ports = [free_port() for _ in range(3)]
    env = dict(
        os.environ,
        RAFTQ_IMAGE=image,
        RAFTQ_SECRET=secrets.token_hex(16),
        RAFTQ_ADMIN_TOKEN=ADMIN_TOKEN,
        **{f"RAFTQ_PORT_N{i + 1}": str(p) for i, p in enumerate(ports)},
    )
    base = [*compose_cmd(), "-p", project, "-f", str(ROOT / "docker-compose.yml")]
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
