"""A follower's forwards fail over as fast as it learns of a new leader (in-process nodes on
LocalRaft; the leader change is ``set_follower`` / ``set_leader``): a forward to a leader
that stopped leading ends at once, one that never reached it goes to the next leader, and a
write that may have reached it answers 504 outcome_unknown."""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from raftq.node.bench import SilentRelay
from raftq.node.local import LocalRaft
from raftq.node.ops import FORWARDER
from raftq.node.proxy import Forwarder
from tests.node.inprocess import Client, admin_client, app, serving, topic_of
from tests.support import ADMIN, free_ports

WAIT_S = 5.0  # bound of each wait below; a forward that is not cut short takes 35 s


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@contextlib.asynccontextmanager
async def hung_leader() -> AsyncIterator[tuple[str, asyncio.Queue[str]]]:
    """A "leader" that takes every request and never answers (frozen, or cut off after the
    request went out); yields its address and a queue of the paths it was sent."""
    seen: asyncio.Queue[str] = asyncio.Queue()
    forever = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        await request.read()
        seen.put_nowait(request.path)
        await forever.wait()
        raise AssertionError("unreachable")

    application = web.Application()
    application.router.add_route("*", "/{tail:.*}", hang)
    srv = TestServer(application, host="127.0.0.1")
    await srv.start_server()
    try:
        yield f"127.0.0.1:{srv.port}", seen
    finally:
        forever.set()
        await srv.close()


@contextlib.asynccontextmanager
async def follower_of(leader_api: str) -> AsyncIterator[tuple[LocalRaft, Client]]:
    raft = LocalRaft("n2")
    raft.set_follower("n1", leader_api)
    async with admin_client(app(raft, node_id="n2")) as client:
        yield raft, client


def count_sends(client: Client, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The leaders the follower's forwarder tries, in order (an entry once a try starts)."""
    fwd = client.app[FORWARDER]
    tried: list[str] = []
    send = Forwarder.send

    async def spy(self: Forwarder, request: web.Request, leader: Any, body: bytes) -> Any:
        tried.append(leader.api)
        return await send(self, request, leader, body)

    monkeypatch.setattr(fwd, "send", spy.__get__(fwd))
    return tried


async def until(what: str, cond: Any) -> None:
    try:
        async with asyncio.timeout(WAIT_S):
            while not cond():  # noqa: ASYNC110 - a condition of another task's making
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"timed out after {WAIT_S} s waiting for {what}") from None


async def test_a_forward_to_a_leader_that_stops_leading_ends_at_once() -> None:
    new = LocalRaft("n3")
    async with admin_client(app(new, node_id="n3")) as nc, hung_leader() as (old, seen):
        topic = await topic_of(nc)
        async with follower_of(old) as (follower, fc):
            publish = asyncio.ensure_future(
                fc.post(f"/topics/{topic}/messages", json={"payload": b64(b"p"), "key": "k1"})
            )
            read = asyncio.ensure_future(fc.get(f"/topics/{topic}"))
            async with asyncio.timeout(WAIT_S):
                sent = {await seen.get(), await seen.get()}
            assert sent == {f"/topics/{topic}/messages", f"/topics/{topic}"}
            follower.set_follower("n3", f"{nc.host}:{nc.port}")  # elected; n1 is gone
            async with asyncio.timeout(WAIT_S):
                r = await publish
                assert r.status == 504, await r.text()  # it may have been applied at n1
                assert (await r.json())["code"] == "outcome_unknown"
                r = await read  # a read is sent again, to the new leader
                assert r.status == 200, await r.text()
                assert r.headers["X-Raftq-Leader"] == f"http://{nc.host}:{nc.port}"
            # The client's retry with the same key goes through at once.
            r = await fc.post(f"/topics/{topic}/messages", json={"payload": b64(b"p"), "key": "k1"})
            assert r.status == 200 and (await r.json())["seq"] == 1


@pytest.mark.parametrize("how", ["refused", "silent"])
async def test_a_forward_that_never_reached_the_leader_goes_to_the_next_one(
    how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused: a killed local process. Silent: a killed container's address, where a
    connection hangs (not refused) until the connect timeout."""
    with contextlib.ExitStack() as stack:
        if how == "silent":
            relay = SilentRelay(f"127.0.0.1:{free_ports(1)[0]}")
            stack.callback(relay.close)
            relay.silence()
            dead = relay.addr
        else:
            dead = f"127.0.0.1:{free_ports(1)[0]}"
        new = LocalRaft("n3")
        async with admin_client(app(new, node_id="n3")) as nc, follower_of(dead) as (f, fc):
            topic = await topic_of(nc)
            tried = count_sends(fc, monkeypatch)
            body = {"payload": b64(b"once"), "key": "k1"}
            publish = asyncio.ensure_future(fc.post(f"/topics/{topic}/messages", json=body))
            await until("the forward to the dead leader", lambda: tried)
            f.set_follower("n3", f"{nc.host}:{nc.port}")
            async with asyncio.timeout(WAIT_S):
                r = await publish
            assert r.status == 200, await r.text()
            assert await r.json() == {"seq": 1, "duplicate": False}
            assert tried[0] == dead and tried[-1] == f"{nc.host}:{nc.port}"
            assert new.read(lambda b: b.topic_stats(topic)["messages"]) == 1


async def test_a_follower_elected_while_its_forward_waits_serves_the_request_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with follower_of(f"127.0.0.1:{free_ports(1)[0]}") as (follower, fc):
        tried = count_sends(fc, monkeypatch)
        follower.set_leader()
        topic = await topic_of(fc)
        follower.set_follower("n1", f"127.0.0.1:{free_ports(1)[0]}")  # (a leader now gone)
        publish = asyncio.ensure_future(
            fc.post(f"/topics/{topic}/messages", json={"payload": b64(b"p")})
        )
        await until("the forward to the dead leader", lambda: tried)
        follower.set_leader()
        async with asyncio.timeout(WAIT_S):
            r = await publish
        assert r.status == 200, await r.text()
        assert "X-Raftq-Leader" not in r.headers  # served here
        assert follower.read(lambda b: b.topic_stats(topic)["messages"]) == 1


async def test_a_receive_cut_short_by_a_new_leader_releases_its_consumer_there() -> None:
    new = LocalRaft("n3")
    paths = serving(app(new, node_id="n3"), lambda r: r.path)
    async with paths as (url, seen_new), hung_leader() as (old, seen_old):
        topic = "t-receive"
        async with aiohttp.ClientSession(headers=ADMIN) as s:
            assert (await s.post(f"{url}/topics", json={"topic": topic})).status == 201
        async with follower_of(old) as (follower, fc):
            receive = asyncio.ensure_future(
                fc.post(f"/topics/{topic}/groups/default/receive", json={"wait": 20})
            )
            async with asyncio.timeout(WAIT_S):
                await seen_old.get()
            follower.set_follower("n3", url.removeprefix("http://"))
            async with asyncio.timeout(WAIT_S):
                r = await receive
            assert r.status == 504 and (await r.json())["code"] == "outcome_unknown"
            await until(
                "the consumer's release at the new leader",
                lambda: any(p.startswith("/consumers/c-") for p in seen_new),
            )


async def test_a_leader_that_stays_unreachable_is_answered_503_no_leader_in_bounded_time() -> None:
    dead = f"127.0.0.1:{free_ports(1)[0]}"
    raft = LocalRaft("n2")
    raft.set_follower("n1", dead)  # named the leader, never reachable, and no election
    async with admin_client(app(raft, node_id="n2", propose_timeout=0.5)) as fc:
        async with asyncio.timeout(WAIT_S):
            r = await fc.post("/topics/t/messages", json={"payload": b64(b"p")})
        assert r.status == 503 and r.headers["Retry-After"] == "1"
        err = await r.json()
        assert err["code"] == "no_leader"
        assert f"leader n1 at {dead} is unreachable" in err["message"]
