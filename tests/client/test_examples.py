"""The scripts in examples/ run against an in-process node (real HTTP on 127.0.0.1, the
suite's admin token from RAFTQ_TOKEN): producer, worker, dead letters, the FastAPI app."""

from __future__ import annotations

import asyncio
import importlib.util
import signal
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from raftq.node.local import LocalRaft

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


async def run(script: str, *args: str, timeout: float = 30.0) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(EXAMPLES / script), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode == 0, (script, out, err)
    return out.decode()


async def until(pred: Callable[[], bool], timeout: float = 20.0) -> None:
    async def poll() -> None:
        while not pred():  # noqa: ASYNC110 - polling the node's state
            await asyncio.sleep(0.05)

    await asyncio.wait_for(poll(), timeout)


async def test_producer_worker_and_dead_letters(server: tuple[LocalRaft, str]) -> None:
    raft, url = server
    topic = "orders-" + uuid.uuid4().hex[:8]
    out = await run("producer.py", "--url", url, "--topic", topic, "--count", "30",
                    "--invalid", "2")  # fmt: skip
    assert f"published 32 orders to {topic} (seq 1..32)" in out

    worker = await asyncio.create_subprocess_exec(
        sys.executable, str(EXAMPLES / "worker.py"), "--url", url, "--topic", topic,
        "--concurrency", "4", "--max-attempts", "2", "--retry-delay", "0.05",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:

        def settled() -> bool:
            if topic + ".dlq" not in raft.read(lambda b: b.topics):
                return False
            dead: int = raft.read(lambda b: b.topic_stats(topic + ".dlq"))["messages"]
            g: dict[str, int] = raft.read(lambda b: b.group_stats(topic, "billing"))
            return dead == 2 and g["pending"] + g["in_flight"] + g["delayed"] == 0

        await until(settled)
        worker.send_signal(signal.SIGTERM)
        out_b, err_b = await asyncio.wait_for(worker.communicate(), 20)
    finally:
        if worker.returncode is None:
            worker.kill()
            await worker.wait()
    assert worker.returncode == 0, err_b
    lines = out_b.decode().splitlines()
    assert sum(line.startswith("billed order") for line in lines) == 30
    assert lines[-1] == "stopped"
    assert "is not billable" in err_b.decode()  # the handler's failures are logged

    listed = await run("dlq.py", "--url", url, "--topic", topic, "--redrive")
    assert f"2 dead letter(s) in {topic}.dlq" in listed
    assert '"amount": -1' in listed and "x-raftq-dlq" in listed
    assert f"redrove 2 to {topic}" in listed
    g = raft.read(lambda b: b.group_stats(topic, "billing"))
    assert g["pending"] == 2  # back for another try


async def test_dlq_script_says_when_there_are_none(server: tuple[LocalRaft, str]) -> None:
    _, url = server
    out = await run("dlq.py", "--url", url, "--topic", "t-" + uuid.uuid4().hex[:8])
    assert "no dead letters yet" in out


async def test_fastapi_app_publishes_an_order(
    server: tuple[LocalRaft, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    raft, url = server
    topic = "orders-" + uuid.uuid4().hex[:8]
    monkeypatch.setenv("RAFTQ_URL", url)
    monkeypatch.setenv("ORDERS_TOPIC", topic)
    spec = importlib.util.spec_from_file_location("fastapi_app", EXAMPLES / "fastapi_app.py")
    assert spec is not None and spec.loader is not None
    module: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    app = module.app
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            r = await http.post("/orders", json={"id": 7, "amount": 12})
            assert r.status_code == 201, r.text
            assert r.json() == {"seq": 1}
            bad = await http.post("/orders", json={"id": "x"})
            assert bad.status_code == 422
    assert raft.read(lambda b: b.topic_stats(topic))["messages"] == 1
