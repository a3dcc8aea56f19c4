"""One node's runtime around its handlers: shutdown within its budget, streams on a node that
lost the leadership, a follower's proxy losing the leader's answer, and what the metrics count
(cases an independent review found)."""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from raftq.node.local import LocalRaft
from raftq.node.server import NodeOptions, serve
from raftq.node.stream import CLOSE_LEADER_CHANGED
from tests.node.inprocess import admin_client, app
from tests.support import ADMIN, ADMIN_TOKEN


async def test_shutdown_stays_within_its_budget_and_always_stops_raft(
    unused_tcp_port: int,
) -> None:
    raft = LocalRaft()
    raft.delay = 30.0  # a commit that never comes in time
    stop = asyncio.Event()
    opts = NodeOptions(node_id="n1", listen=f"127.0.0.1:{unused_tcp_port}", raft="unused:1",
                       shutdown_timeout=8.0, admin_token=ADMIN_TOKEN)  # fmt: skip
    server = asyncio.ensure_future(serve(opts, lambda o: raft, stop))
    url = f"http://127.0.0.1:{unused_tcp_port}"
    async with aiohttp.ClientSession(headers=ADMIN) as s:
        for _ in range(100):  # bounded: the server is up within a second or two
            try:
                async with s.get(url + "/healthz") as r:
                    if r.status == 200:
                        break
            except aiohttp.ClientError:
                await asyncio.sleep(0.05)
        pending = asyncio.ensure_future(s.post(url + "/topics", json={"topic": "t"}))
        await asyncio.sleep(0.2)
        t0 = time.monotonic()
        stop.set()
        code = await asyncio.wait_for(server, 20)
        elapsed = time.monotonic() - t0
        pending.cancel()
    assert raft.stopped  # before: the outer timeout cut the shutdown off before Raft stopped
    assert elapsed < 8.0 + 1.0, elapsed
    assert code == 1  # the stuck commit did not finish: said so in the exit code


async def test_an_idle_stream_on_a_node_that_lost_the_leadership_is_closed() -> None:
    raft = LocalRaft()
    async with admin_client(app(raft)) as client:
        r = await client.post("/topics", json={"topic": "t"})
        assert r.status == 201
        async with client.ws_connect("/topics/t/groups/default/stream") as ws:
            await asyncio.sleep(0.1)
            raft.set_follower("n2", "127.0.0.1:1")
            msg = await asyncio.wait_for(ws.receive(), 5)  # nothing published: idle
            assert msg.type.name in ("CLOSE", "CLOSED", "CLOSING")
            assert ws.close_code == CLOSE_LEADER_CHANGED


async def test_a_follower_that_loses_the_leaders_answer_releases_the_consumer_it_named() -> None:
    releases: list[str] = []

    async def receive(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json",
                                           "Content-Length": "1000"})  # fmt: skip
        await resp.prepare(request)
        await resp.write(b'{"consumer": "x", "deliveries": [')
        assert request.transport is not None
        request.transport.abort()  # the link to the follower drops mid-answer
        return resp

    async def release(request: web.Request) -> web.Response:
        releases.append(request.match_info["consumer"])
        return web.json_response({"released": 1})

    leader = web.Application()
    leader.router.add_post("/topics/{topic}/groups/{group}/receive", receive)
    leader.router.add_post("/consumers/{consumer}/release", release)
    async with TestClient(TestServer(leader)) as lc:
        follower = LocalRaft("n2")
        follower.set_follower("n1", f"{lc.host}:{lc.port}")
        async with admin_client(app(follower, node_id="n2")) as fc:
            r = await fc.post("/topics/t/groups/default/receive", json={})
            assert r.status == 504
            for _ in range(100):  # bounded wait for the spawned release
                if releases:
                    break
                await asyncio.sleep(0.02)
    assert len(releases) == 1 and releases[0].startswith("c-")


async def metric(client: Any, *parts: str) -> float:
    text = await (await client.get("/metrics")).text()
    lines = [ln for ln in text.splitlines() if all(p in ln for p in parts) and ln[0] != "#"]
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in lines)


async def test_metrics_count_redirects_as_such_and_methods_from_a_fixed_set() -> None:
    raft = LocalRaft()
    raft.set_follower("n2", "127.0.0.1:1")
    async with admin_client(app(raft)) as client:
        r = await client.get("/topics/t/groups/g/stream", allow_redirects=False,
                             headers={"Upgrade": "websocket", "Connection": "Upgrade",
                                      "Sec-WebSocket-Key": base64.b64encode(b"k" * 16).decode(),
                                      "Sec-WebSocket-Version": "13"})  # fmt: skip
        assert r.status == 307
        assert await metric(client, "raftq_http_requests_total", 'status="307"') == 1
        assert await metric(client, "raftq_http_requests_total", 'status="500"') == 0
        await client.request("PROPFIND", "/healthz")
        assert await metric(client, "raftq_http_requests_total", 'method="other"') == 1
        assert await metric(client, 'method="PROPFIND"') == 0


@pytest.fixture
def unused_tcp_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_node_whose_raft_stopped_turns_unhealthy_and_exits_3(
    unused_tcp_port: int,
) -> None:
    from raftq.cluster.storage import StorageError

    raft = LocalRaft()
    opts = NodeOptions(node_id="n1", listen=f"127.0.0.1:{unused_tcp_port}", raft="unused:1",
                       admin_token=ADMIN_TOKEN, failed_exit_delay=1.0)  # fmt: skip
    server = asyncio.ensure_future(serve(opts, lambda o: raft, asyncio.Event()))
    url = f"http://127.0.0.1:{unused_tcp_port}"
    async with aiohttp.ClientSession(headers=ADMIN) as s:
        for _ in range(100):  # bounded: the server is up within a second or two
            try:
                async with s.get(url + "/readyz") as r:
                    if r.status == 200:
                        break
            except aiohttp.ClientError:
                await asyncio.sleep(0.05)
        raft.fail(StorageError("journal.log: [Errno 28] No space left on device"))
        for path in ("/healthz", "/readyz"):
            async with s.get(url + path) as r:
                assert r.status == 503, path
                assert "No space left" in (await r.json())["raft_error"]
        async with s.get(url + "/cluster") as r:
            body = await r.json()
            assert (body["role"], body["running"]) == ("stopped", False)
            assert "No space left" in body["error"]
        async with s.get(url + "/metrics") as r:
            text = await r.text()
            assert "raftq_raft_running 0.0" in text and "raftq_raft_stopped{" in text
        code = await asyncio.wait_for(server, 20)  # no signal: it exits on its own
    assert code == 3 and raft.stopped
