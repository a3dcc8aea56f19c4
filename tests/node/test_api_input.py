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
from raftq.node.wsmask import FrameScanner
from tests.node.inprocess import Client, topic_of
from tests.support import ADMIN

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


# ---------------------------------------------------------------- issue 20, point 8


async def test_if_not_exists_on_an_existing_topic_or_group_still_checks_the_specs(
    node: tuple[LocalRaft, Client],
) -> None:
    raft, client = node
    topic = await topic_of(client)
    before = raft.read(lambda b: b.topic_stats(topic))
    bad_group = {"group": "g", "config": {"max_attempts": -1}}
    for path, body, field in (
        ("/topics", {"topic": topic, "if_not_exists": True, "groups": [bad_group]},
         "max_attempts"),
        ("/topics", {"topic": topic, "if_not_exists": True, "config": {"overflow": "x"}},
         "overflow"),
        (f"/topics/{topic}/groups",
         {"group": "default", "if_not_exists": True, "config": {"visibility_timeout": -1}},
         "visibility_timeout"),
    ):  # fmt: skip
        r = await client.post(path, json=body)
        assert (await error(r, 400, "invalid_argument"))["details"]["field"] == field
    r = await client.post("/topics", json={"topic": topic, "if_not_exists": True})
    assert r.status == 200 and (await r.json())["created"] is False  # a valid spec: as before
    assert raft.read(lambda b: b.topic_stats(topic)) == before  # (no group g)


async def test_header_names_must_not_be_empty_or_hold_control_characters(
    node: tuple[LocalRaft, Client],
) -> None:
    raft, client = node
    topic = await topic_of(client)
    for name in ("", "a\x00b", "line\nbreak", "tab\there", "del\x7f", "c1\x85"):
        body = {"payload": b64(b"x"), "headers": {name: "v"}}
        r = await client.post(f"/topics/{topic}/messages", json=body)
        err = await error(r, 400, "invalid_argument")
        assert "header name" in err["message"] and err["details"]["header"] == name, name
        r = await client.post(f"/topics/{topic}/publish", json={"messages": [body]})
        await error(r, 400, "invalid_argument")
    async with client.ws_connect("/publish/stream") as ws:
        frame = {"id": 1, "op": "publish", "topic": topic,
                 "messages": [{"payload": b"x", "headers": {"": "v"}}]}  # fmt: skip
        await ws.send_bytes(msgpack.packb(frame))
        got = msgpack.unpackb((await asyncio.wait_for(ws.receive(), 5)).data)
        assert (got["id"], got["code"]) == (1, "invalid_argument")
    assert raft.read(lambda b: b.topic_stats(topic)["messages"]) == 0
    ok = {"payload": b64(b"x"), "headers": {"Content-Type": "text/plain", "ünï": "v"}}
    assert (await client.post(f"/topics/{topic}/messages", json=ok)).status == 200


async def test_a_receipt_naming_an_unknown_topic_or_group_is_invalid_not_stale(
    node: tuple[LocalRaft, Client],
) -> None:
    _, client = node
    topic = await topic_of(client)
    receipts = ["no-such-topic:default:1:1:ab", f"{topic}:no-such-group:1:1:ab",
                f"{topic}:default:1:1:ab"]  # fmt: skip
    r = await client.post("/ack", json={"receipts": receipts})
    errors = (await r.json())["errors"]
    assert [e["code"] for e in errors] == ["receipt_invalid", "receipt_invalid", "receipt_stale"]
    assert "no-such-topic" in errors[0]["message"] and "no-such-group" in errors[1]["message"]


async def _handshake(client: Client, path: str) -> tuple[asyncio.StreamReader, Any]:
    """A WebSocket opened by hand (aiohttp's client masks every frame it sends)."""
    reader, writer = await asyncio.open_connection(client.host, client.port)
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: {client.host}\r\nUpgrade: websocket\r\n"
        "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        f"Sec-WebSocket-Version: 13\r\nAuthorization: {ADMIN['Authorization']}\r\n\r\n".encode()
    )
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 101"), head
    return reader, writer


async def _frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One server frame (servers never mask): (opcode, payload)."""
    first, second = await asyncio.wait_for(reader.readexactly(2), 5)
    n = second & 0x7F
    if n == 126:
        n = int.from_bytes(await reader.readexactly(2), "big")
    elif n == 127:
        n = int.from_bytes(await reader.readexactly(8), "big")
    return first & 0x0F, await asyncio.wait_for(reader.readexactly(n), 5)


def _masked(opcode: int, payload: bytes) -> bytes:
    key = b"\x01\x02\x03\x04"
    body = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
    return bytes([0x80 | opcode, 0x80 | len(payload)]) + key + body


async def test_an_unmasked_client_frame_closes_the_stream_with_1002(
    node: tuple[LocalRaft, Client],
) -> None:
    _, client = node
    topic = await topic_of(client)
    for path in ("/publish/stream?format=json", f"/topics/{topic}/groups/default/stream"):
        reader, writer = await _handshake(client, path)
        try:
            # A masked frame is read (and answered: it is not a publish)...
            writer.write(_masked(0x1, b'{"id": 1}'))
            if "publish" in path:
                opcode, data = await _frame(reader)
                assert opcode == 0x1 and json.loads(data)["id"] == 1
            # ... an unmasked one fails the connection: close, 1002 protocol error.
            writer.write(b"\x81\x09" + b'{"id": 2}')
            opcode, data = await _frame(reader)
            while opcode != 0x8:  # (a consumer stream may have sent something first)
                opcode, data = await _frame(reader)
            assert int.from_bytes(data[:2], "big") == 1002, data
            assert await asyncio.wait_for(reader.read(), 5) == b""  # and the server hangs up
        finally:
            writer.close()
            await writer.wait_closed()


def test_the_frame_scanner_finds_an_unmasked_frame_however_the_bytes_are_cut() -> None:
    def masked(n: int) -> bytes:
        if n < 126:
            return bytes([0x82, 0x80 | n]) + b"kkkk" + b"x" * n
        if n < 65536:
            return bytes([0x82, 0x80 | 126]) + n.to_bytes(2, "big") + b"kkkk" + b"x" * n
        return bytes([0x82, 0x80 | 127]) + n.to_bytes(8, "big") + b"kkkk" + b"x" * n

    good = masked(5) + masked(0) + masked(300) + masked(70000) + _masked(0x9, b"")
    stream = good + b"\x81\x02hi" + masked(5)
    for cut in (1, 2, 3, 7, 100, 4096, len(stream)):
        scanner = FrameScanner()
        chunks = [(at, stream[at : at + cut]) for at in range(0, len(stream), cut)]
        at, bad = next((at, b) for at, c in chunks if (b := scanner.scan(c)) is not None)
        # Found where it starts, or (its header cut after the first byte) at the next chunk.
        assert at + bad == len(good) or (bad == 0 and at == len(good) + 1), (cut, at, bad)
    scanner = FrameScanner()
    assert scanner.scan(good) is None and scanner.scan(b"\x81") is None
    assert scanner.scan(b"\x02hi") == 0
