"""Handler tests of the node API against the in-process LocalRaft (fast, no processes)."""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from typing import Any

import aiohttp
import msgpack
import pytest
from aiohttp.test_utils import TestServer

from raftq.cluster.errors import ERRORS_BY_CODE
from raftq.cluster.state import Broker
from raftq.node.app import SERVICE, build_app
from raftq.node.errors import STATUS_BY_CODE
from raftq.node.local import LocalRaft
from raftq.node.raftapi import (
    EntryTooLarge,
    NotLeader,
    QueueFull,
    RaftError,
    ReadNotReady,
    UnknownOutcome,
)
from tests.node.inprocess import Client, admin_client, app
from tests.support import ADMIN


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def name() -> str:
    return "t-" + uuid.uuid4().hex[:10]


async def post(client: Client, path: str, body: Any, status: int = 200) -> Any:
    r = await client.post(path, json=body)
    data = await r.json()
    assert r.status == status, data
    return data


def stored(b: Broker) -> Any:
    """Everything stored, without the clock-dependent fields."""

    def strip(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k != "oldest_age_ms"}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x

    return strip([b.topic_stats(n) for n in b.list_topics()])


async def make_topic(client: Client, **kw: Any) -> str:
    topic = name()
    await post(client, "/topics", {"topic": topic, **kw}, 201)
    return topic


async def test_publish_receive_ack_round_trip(node: tuple[LocalRaft, Client]) -> None:
    _, client = node
    topic = await make_topic(client)
    res = await post(client, f"/topics/{topic}/messages", {"payload": b64(b"hello"), "key": "k1"})
    assert res == {"seq": 1, "duplicate": False}
    again = await post(client, f"/topics/{topic}/messages", {"payload": b64(b"hello"), "key": "k1"})
    assert again == {"seq": 1, "duplicate": True}
    got = await post(client, f"/topics/{topic}/groups/default/receive", {"max": 10})
    [d] = got["deliveries"]
    assert (d["topic"], d["group"], d["seq"], d["attempt"]) == (topic, "default", 1, 1)
    assert base64.b64decode(d["payload"]) == b"hello"
    acked = await post(client, "/ack", {"receipts": [d["receipt"]]})
    assert acked == {"acked": 1, "errors": []}
    stale = await post(client, "/ack", {"receipts": [d["receipt"]]})
    assert stale["acked"] == 0 and stale["errors"][0]["code"] == "receipt_stale"
    stats = await (await client.get(f"/topics/{topic}/groups/default")).json()
    assert stats["pending"] == 0 and stats["in_flight"] == 0 and stats["acked_total"] == 1


async def test_msgpack_bodies_carry_raw_bytes(node: tuple[LocalRaft, Client]) -> None:
    _, client = node
    topic = await make_topic(client)
    hdr = {"Content-Type": "application/msgpack", "Accept": "application/msgpack"}
    body = msgpack.packb({"messages": [{"payload": b"\x00\xff"}, {"payload": b"two"}]})
    r = await client.post(f"/topics/{topic}/publish", data=body, headers=hdr)
    assert r.status == 200 and r.content_type == "application/msgpack"
    assert msgpack.unpackb(await r.read())["messages"][1]["seq"] == 2
    r = await client.post(
        f"/topics/{topic}/groups/default/receive", data=msgpack.packb({"max": 5}), headers=hdr
    )
    got = msgpack.unpackb(await r.read())
    assert [d["payload"] for d in got["deliveries"]] == [b"\x00\xff", b"two"]


async def test_json_users_publish_text_and_may_read_text_back(
    node: tuple[LocalRaft, Client],
) -> None:
    """curl users need no base64: ``text`` in, ``?payload_encoding=utf-8`` out (a payload that
    is not UTF-8 still comes as base64 ``payload``); the broker stores the same bytes."""
    _, client = node
    topic = await make_topic(client)
    await post(client, f"/topics/{topic}/messages", {"text": "héllo ✓", "key": "k1"})
    batch = {"messages": [{"text": ""}, {"payload": b64(b"\xff\xfe")}, {"text": "{}"}]}
    assert [m["seq"] for m in (await post(client, f"/topics/{topic}/publish", batch))[
        "messages"]] == [2, 3, 4]  # fmt: skip
    peeked = await client.get(f"/topics/{topic}/messages?payload_encoding=utf-8&from_seq=1")
    msgs = (await peeked.json())["messages"]
    assert [(m.get("text"), m.get("payload")) for m in msgs] == [
        ("héllo ✓", None), ("", None), (None, b64(b"\xff\xfe")), ("{}", None)]  # fmt: skip
    plain = (await (await client.get(f"/topics/{topic}/messages?from_seq=1")).json())["messages"]
    assert base64.b64decode(plain[0]["payload"]) == "héllo ✓".encode() and "text" not in plain[0]
    got = await post(
        client, f"/topics/{topic}/groups/default/receive?payload_encoding=utf-8", {"max": 10}
    )
    assert [d.get("text", d.get("payload")) for d in got["deliveries"]] == [
        "héllo ✓", "", b64(b"\xff\xfe"), "{}"]  # fmt: skip
    assert all(d["receipt"] for d in got["deliveries"])
    # msgpack readers may ask too; text publishes over msgpack alike
    hdr = {"Content-Type": "application/msgpack", "Accept": "application/msgpack"}
    r = await client.post(
        f"/topics/{topic}/messages", data=msgpack.packb({"text": "mp"}), headers=hdr
    )
    assert r.status == 200, await r.read()
    r = await client.get(f"/topics/{topic}/messages?from_seq=5&payload_encoding=utf-8",
                         headers=hdr)  # fmt: skip
    assert msgpack.unpackb(await r.read())["messages"][0]["text"] == "mp"


async def test_a_message_has_payload_or_text_not_both(node: tuple[LocalRaft, Client]) -> None:
    raft, client = node
    topic = await make_topic(client)
    before = raft.read(stored)
    for body, field in (
        ({"payload": b64(b"x"), "text": "x"}, "payload"),
        ({"key": "k"}, "payload"),
        ({"text": 5}, "text"),
        ({"text": None}, "payload"),
    ):
        r = await client.post(f"/topics/{topic}/messages", json=body)
        err = await r.json()
        assert r.status == 400 and err["code"] == "invalid_argument", err
        assert err["details"]["field"] == field, err
    r = await client.get(f"/topics/{topic}/messages?payload_encoding=latin-1")
    assert r.status == 400 and (await r.json())["details"]["field"] == "payload_encoding"
    assert raft.read(stored) == before


async def test_concurrent_requests_share_raft_entries(node: tuple[LocalRaft, Client]) -> None:
    raft, client = node
    topic = await make_topic(client)
    raft.entries.clear()
    results = await asyncio.gather(
        *(
            post(client, f"/topics/{topic}/messages", {"payload": b64(b"x%d" % i)})
            for i in range(60)
        )
    )
    assert sorted(r["seq"] for r in results) == list(range(1, 61))
    assert sum(raft.entries) == 60
    assert len(raft.entries) < 60  # group commit: fewer entries than requests


async def test_long_poll_wakes_on_publish(node: tuple[LocalRaft, Client]) -> None:
    _, client = node
    topic = await make_topic(client)
    t0 = time.monotonic()
    poll = asyncio.ensure_future(
        post(client, f"/topics/{topic}/groups/default/receive", {"wait": 10})
    )
    await asyncio.sleep(0.1)
    assert not poll.done()
    await post(client, f"/topics/{topic}/messages", {"payload": b64(b"late")})
    got = await asyncio.wait_for(poll, 5)
    assert len(got["deliveries"]) == 1
    assert time.monotonic() - t0 < 5


async def test_long_poll_times_out_empty(node: tuple[LocalRaft, Client]) -> None:
    _, client = node
    topic = await make_topic(client)
    t0 = time.monotonic()
    got = await post(client, f"/topics/{topic}/groups/default/receive", {"wait": 0.3})
    assert got["deliveries"] == []
    assert 0.29 <= time.monotonic() - t0 < 3


async def test_visibility_expiry_redelivers_with_next_attempt(
    node: tuple[LocalRaft, Client],
) -> None:
    _, client = node
    topic = await make_topic(client)
    await post(client, f"/topics/{topic}/messages", {"payload": b64(b"v")})
    recv = f"/topics/{topic}/groups/default/receive"
    first = await post(client, recv, {"visibility": 0.2})
    assert first["deliveries"][0]["attempt"] == 1
    # The leader's tick timer fires the deadline; the long poll wakes on that apply.
    second = await post(client, recv, {"wait": 5})
    assert second["deliveries"][0]["attempt"] == 2
    stale = await post(client, "/ack", {"receipts": [first["deliveries"][0]["receipt"]]})
    assert stale["errors"][0]["code"] == "receipt_stale"


async def test_nack_with_delay_redelivers_after_the_delay(node: tuple[LocalRaft, Client]) -> None:
    _, client = node
    topic = await make_topic(client)
    await post(client, f"/topics/{topic}/messages", {"payload": b64(b"n")})
    recv = f"/topics/{topic}/groups/default/receive"
    [d] = (await post(client, recv, {}))["deliveries"]
    t0 = time.monotonic()
    res = await post(client, "/nack", {"receipts": [d["receipt"]], "delay": 0.3})
    assert res["nacked"] == 1
    assert (await post(client, recv, {}))["deliveries"] == []
    [d2] = (await post(client, recv, {"wait": 5}))["deliveries"]
    assert d2["attempt"] == 2 and time.monotonic() - t0 >= 0.29


async def test_max_attempts_dead_letters_then_redrive(node: tuple[LocalRaft, Client]) -> None:
    _, client = node
    topic = await make_topic(client, groups=[{"group": "g", "config": {"max_attempts": 2}}])
    await post(client, f"/topics/{topic}/messages", {"payload": b64(b"dl")})
    recv = f"/topics/{topic}/groups/g/receive"
    for attempt in (1, 2):
        [d] = (await post(client, recv, {}))["deliveries"]
        assert d["attempt"] == attempt
        await post(client, "/nack", {"receipts": [d["receipt"]]})
    peek = await (await client.get(f"/topics/{topic}.dlq/messages?limit=5")).json()
    [dead] = peek["messages"]
    assert base64.b64decode(dead["payload"]) == b"dl"
    assert dead["headers"]["x-raftq-dlq-attempts"] == "2"
    res = await post(client, f"/topics/{topic}.dlq/redrive", {})
    assert res["redriven"] == 1
    [d] = (await post(client, recv, {}))["deliveries"]
    assert d["attempt"] == 1 and d["headers"]["x-raftq-redrives"] == "1"


async def test_term_dead_letters_at_once(node: tuple[LocalRaft, Client]) -> None:
    _, client = node
    topic = await make_topic(client)
    await post(client, f"/topics/{topic}/messages", {"payload": b64(b"t")})
    [d] = (await post(client, f"/topics/{topic}/groups/default/receive", {}))["deliveries"]
    res = await post(client, "/term", {"receipts": [d["receipt"]], "reason": "poison"})
    assert res["terminated"] == 1
    peek = await (await client.get(f"/topics/{topic}.dlq/messages")).json()
    assert peek["messages"][0]["headers"]["x-raftq-dlq-reason"] == "term: poison"


async def test_extend_moves_the_deadline(node: tuple[LocalRaft, Client]) -> None:
    _, client = node
    topic = await make_topic(client)
    await post(client, f"/topics/{topic}/messages", {"payload": b64(b"e")})
    [d] = (await post(client, f"/topics/{topic}/groups/default/receive", {"visibility": 1}))[
        "deliveries"
    ]
    res = await post(client, "/extend", {"receipts": [d["receipt"]], "seconds": 60})
    assert res["extended"] == 1 and res["deadline"] > d["deadline"]


async def test_dropped_long_poll_connection_releases_its_deliveries(
    node: tuple[LocalRaft, Client],
) -> None:
    raft, client = node
    topic = await make_topic(client)
    await post(client, f"/topics/{topic}/messages", {"payload": b64(b"d")})
    recv = f"/topics/{topic}/groups/default/receive"
    raft.delay = 0.3  # the receive is in flight when the client goes away
    poll = asyncio.ensure_future(client.post(recv, json={"visibility": 600}))
    await asyncio.sleep(0.1)
    poll.cancel()
    with pytest.raises(asyncio.CancelledError):
        await poll
    raft.delay = 0
    # visibility is 10 minutes: only the release can bring it back this soon
    got = await post(client, recv, {"wait": 5})
    assert got["deliveries"][0]["attempt"] == 2
    stats = await (await client.get(f"/topics/{topic}/groups/default")).json()
    assert stats["released_total"] == 1


async def test_shutdown_answers_waiting_long_polls_at_once() -> None:
    raft = LocalRaft()
    server = TestServer(app(raft))
    await server.start_server()
    async with aiohttp.ClientSession(str(server.make_url("")), headers=ADMIN) as session:
        topic = name()
        r = await session.post("/topics", json={"topic": topic})
        assert r.status == 201
        poll = asyncio.ensure_future(
            session.post(f"/topics/{topic}/groups/default/receive", json={"wait": 15})
        )
        await asyncio.sleep(0.2)
        t0 = time.monotonic()
        await server.close()
        r = await asyncio.wait_for(poll, 5)
        assert r.status == 200 and (await r.json())["deliveries"] == []
        assert time.monotonic() - t0 < 5
        assert raft.read(lambda b: b.group_stats(topic, "default")["in_flight"]) == 0


# ---------------------------------------------------------------------- bad input


async def test_every_bad_input_class_gets_its_4xx(node: tuple[LocalRaft, Client]) -> None:
    raft, client = node
    topic = await make_topic(client, config={"max_message_bytes": 10, "max_messages": 1})
    before = raft.read(stored)
    pub = f"/topics/{topic}/messages"

    async def bad(method: str, path: str, status: int, code: str, **kw: Any) -> None:
        r = await client.request(method, path, **kw)
        body = await r.json()
        assert r.status == status, body
        assert body["code"] == code and body["message"] and isinstance(body["details"], dict)

    await bad(
        "POST",
        pub,
        400,
        "malformed_body",
        data=b"{nope",
        headers={"Content-Type": "application/json"},
    )
    await bad("POST", pub, 400, "malformed_body", data=b'{"payload": NaN}')
    await bad(
        "POST",
        pub,
        400,
        "malformed_body",
        data=b"\xc1",
        headers={"Content-Type": "application/msgpack"},
    )
    await bad("POST", pub, 400, "malformed_body", json=[1, 2])
    await bad("POST", pub, 400, "unknown_field", json={"payload": b64(b"x"), "colour": "red"})
    await bad("POST", pub, 400, "invalid_argument", json={"payload": "***"})
    await bad("POST", pub, 400, "invalid_argument", json={"payload": 5})
    await bad("POST", pub, 400, "invalid_argument", json={})
    await bad("POST", pub, 400, "invalid_argument", json={"payload": b64(b"x"), "delay": "soon"})
    await bad("POST", pub, 400, "invalid_argument", json={"payload": b64(b"x"), "delay": -1})
    await bad("POST", pub, 413, "message_too_large", json={"payload": b64(b"x" * 11)})
    await bad("POST", pub, 413, "body_too_large", data=b"x" * (65 * 1024))
    await bad(
        "POST", "/topics/bad name!/messages", 400, "invalid_name", json={"payload": b64(b"x")}
    )
    await bad("POST", "/topics", 400, "invalid_name", json={"topic": "-x"})
    await bad(
        "POST",
        "/topics",
        400,
        "invalid_argument",
        json={"topic": name(), "config": {"max_messages": "many"}},
    )
    await bad(
        "POST", "/topics", 400, "invalid_argument", json={"topic": name(), "config": {"zzz": 1}}
    )
    await bad("POST", "/topics/nope/messages", 404, "topic_not_found", json={"payload": b64(b"x")})
    await bad("POST", f"/topics/{topic}/groups/nope/receive", 404, "group_not_found", json={})
    await bad("POST", "/topics", 409, "topic_exists", json={"topic": topic})
    await bad(
        "POST",
        f"/topics/{topic}/groups/default/receive",
        400,
        "invalid_argument",
        json={"wait": 21},
    )
    await bad(
        "POST", f"/topics/{topic}/groups/default/receive", 400, "invalid_argument", json={"max": 0}
    )
    await bad("POST", "/ack", 400, "invalid_argument", json={"receipts": []})
    await bad("POST", "/ack", 400, "invalid_argument", json={"receipts": "r"})
    await bad("POST", "/extend", 400, "invalid_argument", json={"receipts": ["a:b:1:1:x"]})
    await bad("GET", f"/topics/{topic}/messages?limit=x", 400, "invalid_argument")
    await bad("GET", f"/topics/{topic}/messages?colour=1", 400, "unknown_field")
    await bad("GET", "/no/such/route", 404, "route_not_found")
    await bad("PUT", "/topics", 405, "method_not_allowed")
    assert raft.read(stored) == before  # nothing stored from a rejected request
    await post(client, pub, {"payload": b64(b"1")})
    await bad("POST", pub, 429, "topic_full", json={"payload": b64(b"2")})
    res = await post(client, "/ack", {"receipts": ["garbage", f"{topic}:default:1:1:beef"]})
    assert [e["code"] for e in res["errors"]] == ["receipt_invalid", "receipt_stale"]


async def test_raft_failures_map_to_definite_statuses(node: tuple[LocalRaft, Client]) -> None:
    raft, client = node
    topic = await make_topic(client)
    raft.fail_next(QueueFull("full"))
    r = await client.post(f"/topics/{topic}/messages", json={"payload": b64(b"x")})
    assert r.status == 503 and (await r.json())["code"] == "overloaded"
    assert r.headers["Retry-After"] == "1"
    raft.fail_next(UnknownOutcome("lost"))
    r = await client.post(f"/topics/{topic}/messages", json={"payload": b64(b"x")})
    assert r.status == 504 and (await r.json())["code"] == "outcome_unknown"
    raft.fail_next(EntryTooLarge("too big"))
    r = await client.post(f"/topics/{topic}/messages", json={"payload": b64(b"x")})
    assert r.status == 413 and (await r.json())["code"] == "entry_too_large"
    assert raft.read(lambda b: b.topic_stats(topic)["messages"]) == 0


async def test_without_a_leader_answers_503_with_retry_after(
    node: tuple[LocalRaft, Client],
) -> None:
    raft, client = node
    raft.set_follower(None, None)
    r = await client.get("/topics")
    assert r.status == 503 and r.headers["Retry-After"] == "1"
    assert (await r.json())["code"] == "no_leader"
    r = await client.get("/readyz")
    assert r.status == 503
    assert (await client.get("/healthz")).status == 200


async def test_follower_forwards_requests_to_the_leader(
    leader_and_follower: tuple[LocalRaft, Client, LocalRaft, Client],
) -> None:
    leader, lc, follower, fc = leader_and_follower
    topic = await make_topic(fc)
    r = await fc.post(f"/topics/{topic}/messages", json={"payload": b64(b"via")})
    assert r.status == 200 and r.headers["X-Raftq-Leader"] == f"http://{lc.host}:{lc.port}"
    assert leader.read(lambda b: b.topic_stats(topic)["messages"]) == 1
    assert topic not in follower.read(lambda b: b.list_topics())
    got = await post(fc, f"/topics/{topic}/groups/default/receive", {"wait": 1})
    assert got["deliveries"][0]["payload"] == b64(b"via")
    r = await fc.get(f"/topics/{topic}/groups/nope")
    assert r.status == 404 and (await r.json())["code"] == "group_not_found"


class DeposedRaft(LocalRaft):
    """Believes it leads until it proposes: then learns that ``new_api`` won an election."""

    new_api = ""

    async def propose(self, commands: list[dict[str, Any]], timeout: float = 5.0) -> Any:
        self.set_follower("n2", self.new_api)
        raise NotLeader("deposed", "n2", self.new_api)


async def test_leadership_lost_mid_request_is_forwarded_to_the_new_leader() -> None:
    new = LocalRaft("n2")
    async with admin_client(app(new)) as nc:
        old = DeposedRaft("n1")
        old.new_api = f"{nc.host}:{nc.port}"
        async with admin_client(app(old)) as oc:
            topic = await make_topic(nc)
            hdr = {"Content-Type": "application/msgpack", "Accept": "application/msgpack"}
            body = msgpack.packb({"payload": b"moved"})
            r = await oc.post(f"/topics/{topic}/messages", data=body, headers=hdr)
            assert r.status == 200
            assert msgpack.unpackb(await r.read()) == {"seq": 1, "duplicate": False}
            assert new.read(lambda b: b.peek(topic))[0]["payload"] == b"moved"


# ---------------------------------------------------------------------- contracts


def test_every_domain_error_code_has_an_http_status() -> None:
    missing = sorted(set(ERRORS_BY_CODE) - set(STATUS_BY_CODE))
    assert not missing
    # 4xx, but a full store: 507 Insufficient Storage (RFC 4918), the server's state, not the
    # request's fault
    assert STATUS_BY_CODE["storage_full"] == 507
    assert all(
        400 <= s < 500
        for c, s in STATUS_BY_CODE.items()
        if c in ERRORS_BY_CODE and c != "storage_full"
    )


async def test_openapi_and_metrics_are_served(node: tuple[LocalRaft, Client]) -> None:
    _, client = node
    topic = await make_topic(client)
    await post(client, f"/topics/{topic}/messages", {"payload": b64(b"m")})
    doc = await (await client.get("/openapi.json")).json()
    assert doc["openapi"].startswith("3.")
    text = await (await client.get("/metrics")).text()
    assert f'raftq_topic_published_total{{topic="{topic}"}} 1.0' in text
    assert f'raftq_group_pending{{group="default",topic="{topic}"}} 1.0' in text
    assert "raftq_batch_commands_bucket" in text and "raftq_raft_term 1.0" in text
    assert "raftq_long_polls_waiting 0.0" in text and "raftq_consumers_held 0.0" in text


async def test_cluster_endpoint_describes_the_node(node: tuple[LocalRaft, Client]) -> None:
    _, client = node
    st = await (await client.get("/cluster")).json()
    assert st["node"] == "n1" and st["role"] == "leader" and st["leader"] == "n1"
    assert st["members"]["n1"]["answers"] is True
    assert (await client.get("/readyz")).status == 200


async def test_metrics_carry_the_raft_bindings_own_counters() -> None:
    raft = LocalRaft()
    raft.stats = {  # type: ignore[attr-defined]
        "syncs": 7,
        "sync_us": 1_500_000,
        "max_tick_ms": 250,
        "flag": True,
        "name": "x",
    }
    application = build_app(raft)
    text = application[SERVICE].metrics.render().decode()
    assert "# TYPE raftq_raft_fsyncs_total counter\nraftq_raft_fsyncs_total 7.0" in text
    assert "raftq_raft_fsync_seconds_total 1.5" in text
    assert "# TYPE raftq_raft_max_tick_seconds gauge\nraftq_raft_max_tick_seconds 0.25" in text
    assert "raftq_raft_flag" not in text and "raftq_raft_name" not in text


def test_each_app_has_its_own_metrics_registry() -> None:
    a, b = build_app(LocalRaft()), build_app(LocalRaft())
    assert a[SERVICE].metrics.registry is not b[SERVICE].metrics.registry


async def test_stream_route_delivers_and_settles_over_websocket(
    node: tuple[LocalRaft, Client],
) -> None:
    _, client = node
    topic = await make_topic(client)
    await post(client, f"/topics/{topic}/messages", {"payload": b64(b"ws")})
    async with client.ws_connect(f"/topics/{topic}/groups/default/stream?format=json") as ws:
        frame = await asyncio.wait_for(ws.receive_json(), 5)
        assert frame["type"] == "delivery"
        d = frame["delivery"]
        assert base64.b64decode(d["payload"]) == b"ws"
        await ws.send_json({"id": 1, "op": "ack", "receipts": [d["receipt"]]})
        res = await asyncio.wait_for(ws.receive_json(), 5)
        assert res == {"type": "result", "id": 1, "result": {"acked": 1, "errors": []}}


async def test_stream_batch_mode_sends_one_frame_per_receive_and_tops_up_in_bulk(
    node: tuple[LocalRaft, Client],
) -> None:
    _, client = node
    topic = await make_topic(client)
    for i in range(12):
        await post(client, f"/topics/{topic}/messages", {"payload": b64(b"m%d" % i)})
    path = f"/topics/{topic}/groups/default/stream?format=json&batch=1&prefetch=8"
    async with client.ws_connect(path) as ws:
        frame = await asyncio.wait_for(ws.receive_json(), 5)
        assert frame["type"] == "deliveries"
        first = frame["deliveries"]
        assert [base64.b64decode(d["payload"]) for d in first] == [b"m%d" % i for i in range(8)]
        # One ack frees less than a quarter of prefetch: nothing more comes until two are free.
        await ws.send_json({"id": None, "op": "ack", "receipts": [first[0]["receipt"]]})
        await ws.send_json({"id": 1, "op": "ack", "receipts": [first[1]["receipt"]]})
        frames = [await asyncio.wait_for(ws.receive_json(), 5) for _ in range(2)]
        frames.sort(key=lambda f: f["type"])
        assert frames[0]["type"] == "deliveries" and frames[1]["type"] == "result"
        assert [base64.b64decode(d["payload"]) for d in frames[0]["deliveries"]] == [
            b"m8",
            b"m9",
        ]


async def test_many_long_polls_one_message_exactly_one_gets_it(
    node: tuple[LocalRaft, Client],
) -> None:
    _, client = node
    topic, other = await make_topic(client), await make_topic(client)
    recv = f"/topics/{topic}/groups/default/receive"
    polls = [asyncio.ensure_future(post(client, recv, {"wait": 1.5})) for _ in range(20)]
    idle = asyncio.ensure_future(
        post(client, f"/topics/{other}/groups/default/receive", {"wait": 1})
    )
    await asyncio.sleep(0.2)
    await post(client, f"/topics/{topic}/messages", {"payload": b64(b"one")})
    results = await asyncio.wait_for(asyncio.gather(*polls), 10)
    assert sum(len(r["deliveries"]) for r in results) == 1
    assert (await idle)["deliveries"] == []


async def test_shutdown_ends_open_streams_and_releases_their_deliveries() -> None:
    raft = LocalRaft()
    server = TestServer(app(raft))
    await server.start_server()
    async with aiohttp.ClientSession(str(server.make_url("")), headers=ADMIN) as session:
        topic = name()
        await session.post("/topics", json={"topic": topic})
        await session.post(f"/topics/{topic}/messages", json={"payload": b64(b"s")})
        ws = await session.ws_connect(
            f"/topics/{topic}/groups/default/stream?format=json&prefetch=1"
        )
        assert (await asyncio.wait_for(ws.receive_json(), 5))["type"] == "delivery"

        async def read_until_closed() -> None:
            async for _ in ws:
                pass

        reader = asyncio.ensure_future(read_until_closed())
        t0 = time.monotonic()
        await server.close()
        assert time.monotonic() - t0 < 5
        await asyncio.wait_for(reader, 5)
        assert ws.close_code == 1001  # "going away": the client reconnects elsewhere
    assert raft.read(lambda b: b.group_stats(topic, "default")["in_flight"]) == 0


async def test_readyz_waits_until_the_leaders_commit_index_is_applied_once(
    node: tuple[LocalRaft, Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restarted follower's own commit index is capped at its log: /readyz compares what it
    applied with the commit index the leader sent, and latches once caught up."""
    import dataclasses

    raft, client = node
    raft.set_follower("n9", "127.0.0.1:1")
    status = raft.status
    applied = [3]

    def behind() -> Any:
        st = status()
        return dataclasses.replace(st, commit_index=3, applied_index=applied[0], leader_commit=50)

    monkeypatch.setattr(raft, "status", behind)
    r = await client.get("/readyz")
    assert r.status == 503 and (await r.json())["caught_up"] is False
    applied[0] = 50
    assert (await client.get("/readyz")).status == 200
    applied[0] = 48  # trailing a busy leader by a little afterwards: still ready
    assert (await client.get("/readyz")).status == 200


async def test_applies_wake_the_ticker_only_when_something_falls_due_sooner(
    node: tuple[LocalRaft, Client],
) -> None:
    raft, client = node
    api = client.app[SERVICE]
    topic = await make_topic(client)
    loop = asyncio.get_running_loop()

    async def publish(**extra: Any) -> None:
        msg = {"payload": b"x", **extra}
        await raft.propose([{"op": "publish", "topic": topic, "messages": [msg]}])

    def asleep_for_1s() -> None:  # (a listener call disarms the ticker's signal)
        api._apply_signal, api._ticker_until = loop.create_future(), time.time() * 1000 + 1000

    await publish()
    asleep_for_1s()
    assert not api._wants_apply()  # a plain publish moved nothing earlier
    await publish(delay=0.2)
    asleep_for_1s()
    assert api._wants_apply()  # its delay ends before the ticker would wake
    api._ticker_until = raft.read(lambda b: b.next_due())
    assert not api._wants_apply()  # already asleep until exactly then
    api._ticker_until = None
    assert api._wants_apply()  # between two sleeps: always
    api._apply_signal = None
    assert not api._wants_apply()  # nobody waits at all (a follower)


async def test_reads_first_confirm_that_this_node_still_leads(
    node: tuple[LocalRaft, Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    raft, client = node
    topic = await make_topic(client)
    outcomes: list[BaseException | None] = [ReadNotReady("new leader"), None, TimeoutError()]

    async def barrier(timeout: float = 5.0) -> None:
        out = outcomes.pop(0)
        if out is not None:
            raise out

    monkeypatch.setattr(raft, "read_barrier", barrier)
    r = await client.get(f"/topics/{topic}")  # a new leader, ready at the second try
    assert r.status == 200, await r.text()
    r = await client.get(f"/topics/{topic}/groups/default")
    assert r.status == 503 and (await r.json())["code"] == "no_leader"
    assert outcomes == []
    for path in ("/topics", f"/topics/{topic}/groups", f"/topics/{topic}/messages"):
        outcomes.append(NotLeader("deposed"))  # no leader known to forward to: 503
        r = await client.get(path)
        assert r.status == 503 and (await r.json())["code"] == "no_leader", path
    assert outcomes == []


async def test_a_node_whose_raft_stopped_answers_503_not_500(
    node: tuple[LocalRaft, Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    raft, client = node
    topic = await make_topic(client)
    raft.fail_next(RaftError("raft node stopped: fdatasync failed"))
    r = await client.post(f"/topics/{topic}/messages", json={"payload": b64(b"x")})
    assert r.status == 503 and (await r.json())["code"] == "shutting_down"

    async def stopped(timeout: float = 5.0) -> None:
        raise RaftError("raft node stopped: fdatasync failed")

    monkeypatch.setattr(raft, "read_barrier", stopped)
    r = await client.get(f"/topics/{topic}")
    assert r.status == 503 and (await r.json())["code"] == "shutting_down"


async def test_ordering_keys_ordered_groups_and_labels_over_http(
    node: tuple[LocalRaft, Client],
) -> None:
    """SQS FIFO support on the native API: ``ordering_key`` in (JSON and msgpack) and out,
    ``ordered`` on a group, ``labels`` on a topic; bad ones are a 400 naming the field."""
    _, client = node
    topic = await make_topic(
        client,
        config={"labels": {"team": "a"}},
        groups=[{"group": "fifo", "config": {"ordered": True}}],
    )
    stats = await (await client.get(f"/topics/{topic}")).json()
    assert stats["config"]["labels"] == {"team": "a"}
    assert stats["groups"][0]["config"]["ordered"] is True
    await post(client, f"/topics/{topic}/messages", {"text": "1", "ordering_key": "k"})
    hdr = {"Content-Type": "application/msgpack", "Accept": "application/msgpack"}
    body = msgpack.packb({"messages": [{"payload": b"2", "ordering_key": "k"}, {"payload": b"3"}]})
    r = await client.post(f"/topics/{topic}/publish", data=body, headers=hdr)
    assert r.status == 200, await r.read()
    got = await post(client, f"/topics/{topic}/groups/fifo/receive", {"max": 1})
    [d] = got["deliveries"]
    assert d["ordering_key"] == "k" and d["first_received_at"] > 0
    got = await post(client, f"/topics/{topic}/groups/fifo/receive", {"max": 10})
    assert [x["seq"] for x in got["deliveries"]] == [3]  # 2 waits for 1 (same key)
    assert "ordering_key" not in got["deliveries"][0]
    peeked = (await (await client.get(f"/topics/{topic}/messages?from_seq=1")).json())["messages"]
    assert [m.get("ordering_key") for m in peeked] == ["k", "k", None]
    cfg = await client.patch(f"/topics/{topic}", json={"config": {"labels": {"b": "c"}}})
    assert (await cfg.json())["config"]["labels"] == {"b": "c"}, cfg.status
    for path, bad, field in [
        (f"/topics/{topic}/messages", {"text": "x", "ordering_key": ""}, "ordering_key"),
        (f"/topics/{topic}/messages", {"text": "x", "ordering_key": 5}, "ordering_key"),
        ("/topics", {"topic": name(), "config": {"labels": {"k": 1}}}, "labels"),
        (
            "/topics",
            {"topic": name(), "groups": [{"group": "g", "config": {"ordered": 1}}]},
            "ordered",
        ),
    ]:
        err = await post(client, path, bad, 400)
        assert err["details"]["field"].endswith(field), err
