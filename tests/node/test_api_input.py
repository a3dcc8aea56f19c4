"""Bad input at the HTTP and WebSocket edges: always a clear 4xx naming the problem, never a
500, a silent drop or a hang (cases an independent review found)."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
from typing import Any

import msgpack

from raftq.node.local import LocalRaft
from tests.node.inprocess import Client, topic_of

JSON = {"Content-Type": "application/json"}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def error(r: Any, status: int, code: str) -> dict[str, Any]:
    body = await r.json()
    assert (r.status, body["code"]) == (status, code), body
    return dict(body)


def raw_json(text: str) -> dict[str, Any]:
    return {"data": text.encode(), "headers": JSON}


async def test_a_lone_surrogate_is_refused_and_its_batch_mates_are_applied(
    node: tuple[LocalRaft, Client],
) -> None:
    raft, client = node
    topic = await topic_of(client)
    msgs = f"/topics/{topic}/messages"
    for body in (
        '{"payload": "aGk=", "key": "\\ud800"}',
        '{"payload": "aGk=", "headers": {"a": "\\udc80"}}',
        '{"payload": "aGk=", "headers": {"\\udc80": "a"}}',
    ):
        msg = await error(await client.post(msgs, **raw_json(body)), 400, "invalid_argument")
        assert "surrogate" in msg["message"]
    r = await client.post("/term", **raw_json('{"receipts": ["x"], "reason": "\\ud800"}'))
    await error(r, 400, "invalid_argument")
    # Sent together they share one Raft entry: the bad one must not fail the others.
    raft.delay = 0.05
    good = [client.post(msgs, json={"payload": b64(b"ok%d" % i)}) for i in range(3)]
    bad = client.post(msgs, **raw_json('{"payload": "aGk=", "key": "\\ud800"}'))
    answers = await asyncio.gather(*good, bad)
    assert [r.status for r in answers] == [200, 200, 200, 400]
    assert raft.read(lambda b: b.topic_stats(topic)["messages"]) == 3


async def test_a_body_that_does_not_decompress_is_a_400_not_a_500(
    node: tuple[LocalRaft, Client],
) -> None:
    _, client = node
    for enc, data in (("gzip", b"notgzip"), ("deflate", b"xx")):
        r = await client.post("/topics", data=data, headers={**JSON, "Content-Encoding": enc})
        assert "could not be read" in (await error(r, 400, "malformed_body"))["message"]
    ok = gzip.compress(json.dumps({"topic": "zipped"}).encode())
    r = await client.post("/topics", data=ok, headers={**JSON, "Content-Encoding": "gzip"})
    assert r.status == 201


async def test_membership_addresses_are_checked(node: tuple[LocalRaft, Client]) -> None:
    _, client = node
    for bad in ("h:²", "h:٣", "a b/c@d:1", "h:0", "h:65536", ":80", "[nope]:80", "-h:80"):
        r = await client.post("/cluster/members", json={"id": "n5", "raft": bad, "api": "h:1"})
        await error(r, 400, "invalid_argument")
    for good in ("node-5.raftq.svc:7001", "10.0.0.5:7001", "[::1]:7001", "proj_n4_1:7001"):
        r = await client.post("/cluster/members", json={"id": "n5", "raft": good, "api": good})
        await error(r, 409, "membership_refused")  # valid; LocalRaft has no membership


async def test_an_empty_idempotency_key_is_refused(node: tuple[LocalRaft, Client]) -> None:
    raft, client = node
    topic = await topic_of(client)
    r = await client.post(f"/topics/{topic}/messages", json={"payload": b64(b"a"), "key": ""})
    assert "key must not be empty" in (await error(r, 400, "invalid_argument"))["message"]
    # The msgpack fast path too.
    body = msgpack.packb({"messages": [{"payload": b"b", "key": ""}]}, use_bin_type=True)
    r = await client.post(
        f"/topics/{topic}/publish", data=body, headers={"Content-Type": "application/msgpack"}
    )
    await error(r, 400, "invalid_argument")
    assert raft.read(lambda b: b.topic_stats(topic)["messages"]) == 0


async def test_group_specs_in_create_topic_refuse_unknown_fields(
    node: tuple[LocalRaft, Client],
) -> None:
    _, client = node
    spec = {"group": "g", "visibility_timeout": 5}  # belongs under "config"
    r = await client.post("/topics", json={"topic": "t2", "groups": [spec]})
    assert (await error(r, 400, "unknown_field"))["details"]["fields"] == ["visibility_timeout"]
    r = await client.post("/topics", json={"topic": "t2", "groups": ["g"]})
    await error(r, 400, "invalid_argument")
    assert (await client.get("/topics/t2")).status == 404


async def test_method_not_allowed_names_the_allowed_ones_and_head_works(
    node: tuple[LocalRaft, Client],
) -> None:
    _, client = node
    r = await client.put("/topics")
    await error(r, 405, "method_not_allowed")
    assert set(r.headers["Allow"].split(",")) == {"GET", "HEAD", "POST"}
    r = await client.head("/healthz")
    assert r.status == 200


async def test_accept_q_values_count_and_a_refused_format_is_406_before_applying(
    node: tuple[LocalRaft, Client],
) -> None:
    raft, client = node
    topic = await topic_of(client)
    r = await client.get("/topics", headers={"Accept": "application/json, application/msgpack;q=0"})
    assert r.content_type == "application/json"
    r = await client.get("/topics", headers={"Accept": "application/msgpack;q=0, */*"})
    assert r.content_type == "application/json"
    r = await client.get("/topics", headers={"Accept": "application/vnd.msgpack"})
    assert r.content_type == "application/msgpack"
    r = await client.get("/topics", headers={"Accept": "application/*;q=0.5, application/msgpack"})
    assert r.content_type == "application/msgpack"
    r = await client.post(
        f"/topics/{topic}/messages",
        json={"payload": b64(b"x")},
        headers={"Accept": "text/html"},
    )
    await error(r, 406, "not_acceptable")
    assert raft.read(lambda b: b.topic_stats(topic)["messages"]) == 0  # refused, not applied
    # Reads are answered in JSON whatever Accept says (nothing to hide): probes, scrapers.
    for path in ("/metrics", "/healthz", "/topics"):
        assert (await client.get(path, headers={"Accept": "text/plain"})).status == 200, path


async def test_query_parameters_are_checked(node: tuple[LocalRaft, Client]) -> None:
    _, client = node
    topic = await topic_of(client)
    r = await client.get(f"/topics/{topic}?bogus=1")
    assert (await error(r, 400, "unknown_field"))["details"]["fields"] == ["bogus"]
    r = await client.post(f"/topics/{topic}/groups/default/receive?wait=5", json={})
    await error(r, 400, "unknown_field")
    for q in ("limit=1_0", "limit=%205%20", "limit=1&limit=5000", "from_seq=0x10"):
        await error(await client.get(f"/topics/{topic}/messages?{q}"), 400, "invalid_argument")
    assert (await client.get(f"/topics/{topic}/messages?limit=5&from_seq=1")).status == 200
    assert (await client.get("/cluster?digest=1")).status == 200
    # Probes and scrapers may add parameters of their own (cache busters, params:).
    for path in ("/healthz?_=1700000000", "/metrics?name[]=x", "/readyz?verbose"):
        assert (await client.get(path)).status in (200, 503), path
    stream = f"/topics/{topic}/groups/default/stream"
    await error(await client.get(stream), 426, "upgrade_required")
    for q in ("prefech=5", "batch=true", "batch=1&batch=0"):
        r = await client.get(f"{stream}?{q}", headers={"Upgrade": "websocket"})
        assert r.status == 400, q


async def test_stream_frames_of_the_wrong_shape_get_an_error_frame_and_the_stream_lives_on(
    node: tuple[LocalRaft, Client],
) -> None:
    _, client = node
    topic = await topic_of(client)
    await client.post(f"/topics/{topic}/messages", json={"payload": b64(b"ws")})
    path = f"/topics/{topic}/groups/default/stream?format=json&prefetch=1"
    async with client.ws_connect(path) as ws:
        d = (await asyncio.wait_for(ws.receive_json(), 5))["delivery"]

        async def answer(frame: str) -> dict[str, Any]:
            await ws.send_str(frame)
            return dict(await asyncio.wait_for(ws.receive_json(), 5))

        got = await answer(json.dumps({"id": 1, "op": [], "receipts": [d["receipt"]]}))
        assert (got["id"], got["code"]) == (1, "invalid_argument")
        got = await answer(json.dumps({"id": 2, "op": "ack", "receipts": [{"a": 1}]}))
        assert (got["id"], got["code"]) == (2, "invalid_argument")
        got = await answer('{"id": 3, "op": "ack", "receipts": ' + "[" * 5000 + "]" * 5000 + "}")
        assert got["code"] == "malformed_body"
        got = await answer('{"id": 4, "op": "ack", "receipts": ["\\ud800"]}')
        assert (got["id"], got["code"]) == (4, "invalid_argument")
        got = await answer("[1, 2]")  # not a map, no id: still told
        assert (got["id"], got["code"]) == (None, "malformed_body")
        # Still open, and prefetch credit was not lost on the bad frames: the ack works and
        # the next delivery (prefetch=1) comes.
        await client.post(f"/topics/{topic}/messages", json={"payload": b64(b"next")})
        got = await answer(json.dumps({"id": 5, "op": "ack", "receipts": [d["receipt"]]}))
        assert got == {"type": "result", "id": 5, "result": {"acked": 1, "errors": []}}
        nxt = await asyncio.wait_for(ws.receive_json(), 5)
        assert base64.b64decode(nxt["delivery"]["payload"]) == b"next"


async def test_a_follower_forwards_a_receive_with_a_bad_consumer_as_is(
    leader_and_follower: tuple[LocalRaft, Client, LocalRaft, Client],
) -> None:
    fc = leader_and_follower[3]
    topic = await topic_of(fc)
    bad: list[Any] = [[], 0, False, {}]
    for consumer in bad:
        r = await fc.post(f"/topics/{topic}/groups/default/receive", json={"consumer": consumer})
        await error(r, 400, "invalid_argument")
