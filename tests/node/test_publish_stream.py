"""``GET /publish/stream``: publishes over one WebSocket, each answered after commit and apply
exactly as ``POST /topics/{topic}/publish``; bad frames get an error frame naming the problem."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import aiohttp
import msgpack
import pytest
from aiohttp.test_utils import TestServer

from raftq.node import stream
from raftq.node.local import LocalRaft
from raftq.node.stream import CLOSE_GOING_AWAY, CLOSE_LEADER_CHANGED, STREAM_GRACE_S
from tests.node.inprocess import Client, admin_client, app, topic_of
from tests.support import ADMIN

PATH = "/publish/stream"


@pytest.fixture
async def with_topic(node: tuple[LocalRaft, Client]) -> tuple[LocalRaft, Client, str]:
    """The in-process node, its client, and a fresh topic on it."""
    raft, client = node
    return raft, client, await topic_of(client)


def stored(raft: LocalRaft, topic: str) -> list[bytes]:
    return [m["payload"] for m in raft.read(lambda b: b.peek(topic, None, 100))]


async def answer(ws: aiohttp.ClientWebSocketResponse, frame: Any) -> dict[str, Any]:
    if isinstance(frame, str):
        await ws.send_str(frame)
    else:
        await ws.send_bytes(frame if isinstance(frame, bytes) else msgpack.packb(frame))
    msg = await asyncio.wait_for(ws.receive(), 5)
    assert msg.type == aiohttp.WSMsgType.BINARY, msg
    return dict(msgpack.unpackb(msg.data))


async def test_publishes_are_answered_after_apply_and_deduplicated_by_key(
    with_topic: tuple[LocalRaft, Client, str],
) -> None:
    raft, client, topic = with_topic
    async with client.ws_connect(PATH) as ws:
        got = await answer(ws, {"id": 1, "op": "publish", "topic": topic, "messages": [
            {"payload": b"a", "key": "k1"}, {"payload": b"b", "headers": {"h": "v"}}]})  # fmt: skip
        sent = [{"seq": 1, "duplicate": False}, {"seq": 2, "duplicate": False}]
        assert got == {"type": "result", "id": 1, "result": {"messages": sent}}
        assert stored(raft, topic) == [b"a", b"b"]  # applied before the answer
        # A retry with the same key is stored once; ids may be strings, echoed as given.
        again = await answer(
            ws,
            {
                "id": "x",
                "op": "publish",
                "topic": topic,
                "messages": [{"payload": b"a", "key": "k1"}],
            },
        )
        assert again["id"] == "x"
        assert again["result"]["messages"] == [{"seq": 1, "duplicate": True}]
        assert stored(raft, topic) == [b"a", b"b"]


async def test_concurrent_frames_share_group_commit_and_each_gets_its_own_answer(
    with_topic: tuple[LocalRaft, Client, str],
) -> None:
    raft, client, topic = with_topic
    async with client.ws_connect(PATH) as ws:
        for i in range(50):
            frame = {"id": i, "op": "publish", "topic": topic, "messages": [{"payload": b"%d" % i}]}
            await ws.send_bytes(msgpack.packb(frame))
        answers = {}
        for _ in range(50):
            got = msgpack.unpackb((await asyncio.wait_for(ws.receive(), 5)).data)
            answers[got["id"]] = got["result"]["messages"][0]["seq"]
        metrics = (await (await client.get("/metrics")).read()).decode()
    assert 'raftq_stream_publishes_total{code="ok"} 50.0' in metrics
    assert "raftq_streams_open 1.0" in metrics
    assert sorted(answers) == list(range(50))
    assert sorted(answers.values()) == list(range(1, 51))
    assert sorted(stored(raft, topic)) == sorted(b"%d" % i for i in range(50))


def pub(**over: Any) -> dict[str, Any]:
    """A good publish frame to topic "T" (the test's topic), with fields changed or removed."""
    frame = {"id": 1, "op": "publish", "topic": "T", "messages": [{"payload": b"x"}]}
    frame.update(over)
    return {k: v for k, v in frame.items() if v is not DROP}


DROP = object()


@pytest.mark.parametrize(
    ("frame", "fid", "code"),
    [
        (b"\xc1", None, "malformed_body"),  # not msgpack
        ([1, 2], None, "malformed_body"),  # not a map
        (pub(id=DROP), None, "invalid_argument"),  # its answer could not name it
        (pub(id=1.5), None, "invalid_argument"),
        (pub(op=DROP), 1, "invalid_argument"),
        (pub(op="ack"), 1, "invalid_argument"),
        (pub(x=1), 1, "unknown_field"),
        (pub(topic="../x"), 1, "invalid_name"),
        (pub(topic=DROP), 1, "invalid_name"),
        (pub(topic="nope"), 1, "topic_not_found"),
        (pub(messages=[]), 1, "invalid_argument"),
        (pub(messages={"payload": b"x"}), 1, "invalid_argument"),
        (pub(messages=[{"payload": 5}]), 1, "invalid_argument"),
        (pub(messages=[{"payload": b"x", "key": ""}]), 1, "invalid_argument"),
        # (a string that is not UTF-8: the frame cannot be decoded, so its id is unknown)
        (pub(messages=[{"payload": "\ud800"}]), None, "malformed_body"),
    ],
)
async def test_a_bad_frame_gets_an_error_frame_naming_the_problem_and_the_stream_lives_on(
    with_topic: tuple[LocalRaft, Client, str], frame: Any, fid: Any, code: str
) -> None:
    raft, client, topic = with_topic
    if isinstance(frame, dict) and frame.get("topic") == "T":
        frame["topic"] = topic
    async with client.ws_connect(PATH) as ws:
        raw = (
            frame
            if isinstance(frame, bytes)
            else msgpack.packb(frame, unicode_errors="surrogatepass")
        )
        got = await answer(ws, raw)
        assert (got["type"], got["id"], got["code"]) == ("error", fid, code), got
        ok = await answer(
            ws, {"id": 99, "op": "publish", "topic": topic, "messages": [{"payload": b"ok"}]}
        )
        assert ok["result"]["messages"] == [{"seq": 1, "duplicate": False}]
    assert stored(raft, topic) == [b"ok"]


async def test_a_frame_over_the_body_limit_closes_the_stream_with_1009(
    with_topic: tuple[LocalRaft, Client, str],
) -> None:
    raft, client, topic = with_topic
    async with client.ws_connect(PATH) as ws:
        frame = {"id": 1, "op": "publish", "topic": topic, "messages": [{"payload": b"x" * 70_000}]}
        await ws.send_bytes(msgpack.packb(frame))
        msg = await asyncio.wait_for(ws.receive(), 5)
        assert (msg.type, msg.data) == (aiohttp.WSMsgType.CLOSE, 1009)  # "message too big"
    assert stored(raft, topic) == []


async def test_json_frames_carry_base64_payloads(with_topic: tuple[LocalRaft, Client, str]) -> None:
    raft, client, topic = with_topic
    async with client.ws_connect(PATH + "?format=json") as ws:
        payload = base64.b64encode(b"\x00\xff").decode()
        frame = {"id": 1, "op": "publish", "topic": topic, "messages": [{"payload": payload}]}
        await ws.send_str(json.dumps(frame))
        got = await asyncio.wait_for(ws.receive_json(), 5)
        assert got["result"]["messages"] == [{"seq": 1, "duplicate": False}]
        await ws.send_str(json.dumps({**frame, "id": 2, "messages": [{"payload": "%%"}]}))
        got = await asyncio.wait_for(ws.receive_json(), 5)
        assert (got["id"], got["code"]) == (2, "invalid_argument")
    assert stored(raft, topic) == [b"\x00\xff"]


async def test_text_frames_on_a_msgpack_socket_are_read_as_json_with_base64_payloads(
    with_topic: tuple[LocalRaft, Client, str],
) -> None:
    raft, client, topic = with_topic
    async with client.ws_connect(PATH) as ws:  # (format msgpack: its answers are binary)
        frame = {"id": 1, "op": "publish", "topic": topic, "messages": [{"payload": "AP8="}]}
        got = await answer(ws, json.dumps(frame))
        assert got["result"]["messages"] == [{"seq": 1, "duplicate": False}]
        # An id no answer could carry (beyond 64 bits) is refused, and nothing fails after.
        got = await answer(ws, json.dumps({**frame, "id": 2**70}))
        assert (got["id"], got["code"]) == (None, "invalid_argument")
    assert stored(raft, topic) == [b"\x00\xff"]  # decoded, not stored as the base64 text


async def test_the_upgrade_and_the_query_are_checked_and_a_follower_redirects(
    leader_and_follower: tuple[LocalRaft, Client, LocalRaft, Client],
) -> None:
    _, lc, _, fc = leader_and_follower
    r = await lc.get(PATH)
    assert (r.status, (await r.json())["code"]) == (426, "upgrade_required")
    for q in ("format=xml", "prefetch=5", "format=json&format=json"):
        r = await lc.get(f"{PATH}?{q}", headers={"Upgrade": "websocket", "Connection": "upgrade"})
        assert r.status == 400, q
    ws_headers = {"Upgrade": "websocket", "Connection": "upgrade", "Sec-WebSocket-Version": "13",
                  "Sec-WebSocket-Key": base64.b64encode(b"k" * 16).decode()}  # fmt: skip
    r = await fc.get(PATH + "?format=json", headers=ws_headers, allow_redirects=False)
    assert r.status == 307
    assert r.headers["Location"] == f"http://{lc.host}:{lc.port}{PATH}?format=json"


async def test_a_node_that_loses_the_leadership_closes_its_publish_streams() -> None:
    raft = LocalRaft()
    async with admin_client(app(raft)) as client, client.ws_connect(PATH) as ws:
        await asyncio.sleep(0.1)
        raft.set_follower("n2", "127.0.0.1:1")
        msg = await asyncio.wait_for(ws.receive(), 5)
        assert msg.type.name in ("CLOSE", "CLOSED", "CLOSING")
        assert ws.close_code == CLOSE_LEADER_CHANGED


async def test_shutdown_answers_the_publishes_in_flight_then_closes() -> None:
    raft = LocalRaft()
    server = TestServer(app(raft))
    await server.start_server()
    async with aiohttp.ClientSession(str(server.make_url("")), headers=ADMIN) as session:
        assert (await session.post("/topics", json={"topic": "t"})).status == 201
        ws = await session.ws_connect(PATH)
        # The commit takes longer than the consumer streams' grace: the close comes while it
        # is in flight, and the answer still comes first.
        raft.delay = STREAM_GRACE_S + 0.5
        frame = {"id": 1, "op": "publish", "topic": "t", "messages": [{"payload": b"p"}]}
        await ws.send_bytes(msgpack.packb(frame))
        await asyncio.sleep(0.05)
        closing = asyncio.ensure_future(server.close())
        got = msgpack.unpackb((await asyncio.wait_for(ws.receive(), 5)).data)
        assert got["result"]["messages"] == [{"seq": 1, "duplicate": False}]
        msg = await asyncio.wait_for(ws.receive(), 5)
        assert msg.type.name in ("CLOSE", "CLOSED", "CLOSING")
        assert ws.close_code == CLOSE_GOING_AWAY
        await asyncio.wait_for(closing, 10)
    assert stored(raft, "t") == [b"p"]


async def test_a_stream_whose_answers_cannot_be_sent_is_closed(
    with_topic: tuple[LocalRaft, Client, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An answer that cannot go out (the client reads nothing for SEND_TIMEOUT, or is gone)
    ends the stream instead of leaving it to take more frames."""
    raft, client, topic = with_topic
    send = stream._Socket.send

    async def failing(self: Any, obj: dict[str, Any]) -> None:
        if obj.get("type") == "result":
            raise ConnectionResetError("the client reads nothing; stream cut off")
        await send(self, obj)

    monkeypatch.setattr(stream._Socket, "send", failing)
    async with client.ws_connect(PATH) as ws:
        frame = {"id": 1, "op": "publish", "topic": topic, "messages": [{"payload": b"p"}]}
        await ws.send_bytes(msgpack.packb(frame))
        msg = await asyncio.wait_for(ws.receive(), 5)
        assert (msg.type, msg.data) == (aiohttp.WSMsgType.CLOSE, 1008)
    assert stored(raft, topic) == [b"p"]  # applied: the client finds out by its key
