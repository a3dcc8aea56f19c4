"""The client's pure core: decoding, error mapping, leader choice and retry decisions."""

from __future__ import annotations

import json

import msgpack
import pytest

from raftq.client import _core as core
from raftq.client import errors


def test_error_body_maps_code_to_class_with_data_attributes() -> None:
    body = {"code": "topic_full", "message": "full", "details": {"topic": "t", "max_messages": 3}}
    with pytest.raises(errors.TopicFull) as info:
        core.decode(429, core.JSON, json.dumps(body).encode())
    assert info.value.topic == "t"  # type: ignore[attr-defined]
    assert info.value.max_messages == 3  # type: ignore[attr-defined]
    assert info.value.status == 429


def test_unknown_code_falls_back_to_the_status_class() -> None:
    body = {"code": "brand_new_code", "message": "x"}
    with pytest.raises(errors.NotFound):
        core.decode(404, core.JSON, json.dumps(body).encode())


def test_timeouts_are_also_builtin_timeout_errors() -> None:
    assert issubclass(errors.RaftqTimeout, TimeoutError)
    assert issubclass(errors.UnknownOutcome, errors.RaftqError)


def test_json_payloads_are_base64_both_ways() -> None:
    wire = core.prepare(
        core.Request("POST", "/x", {"messages": [{"payload": b"\x00hi"}]}), core.JSON
    )
    assert json.loads(wire.body or b"") == {"messages": [{"payload": "AGhp"}]}
    body = core.decode(200, core.JSON, b'{"deliveries": [{"payload": "AGhp"}]}')
    assert body["deliveries"][0]["payload"] == b"\x00hi"


def test_msgpack_keeps_raw_bytes() -> None:
    wire = core.prepare(core.Request("POST", "/x", {"payload": b"\xff"}), core.MSGPACK)
    assert msgpack.unpackb(wire.body or b"") == {"payload": b"\xff"}
    assert wire.headers["Content-Type"] == core.MSGPACK


def test_undecodable_body_is_a_protocol_error() -> None:
    with pytest.raises(errors.ProtocolError):
        core.decode(200, core.JSON, b"{nope")


def test_endpoints_prefer_the_learned_leader_and_forget_it_on_failure() -> None:
    ep = core.Endpoints(["127.0.0.1:1", "http://127.0.0.1:2/"])
    assert ep.seeds == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert {ep.pick(), ep.pick()} == set(ep.seeds)
    ep.learn("127.0.0.1:3")
    assert ep.pick() == "http://127.0.0.1:3"
    ep.failed("http://127.0.0.1:3")
    assert ep.pick() in ep.seeds


def test_leader_is_read_from_cluster_answers() -> None:
    assert core.leader_from_cluster({"leader": {"id": "n1", "api": "h:1"}}) == "h:1"
    assert core.leader_from_cluster({"leader_api": "h:2"}) == "h:2"
    assert core.leader_from_cluster({"leader": None}) is None


def test_unavailable_is_retried_until_the_deadline() -> None:
    req = core.Request("POST", "/x", idempotent=False)
    err = errors.Unavailable("down")
    assert core.retry_delay(err, req, 0, 5.0) is not None
    assert core.retry_delay(err, req, 10, 0.0) is None


def test_unknown_outcome_is_retried_only_when_idempotent() -> None:
    err = errors.UnknownOutcome("lost")
    assert core.retry_delay(err, core.Request("POST", "/x", idempotent=False), 0, 5) is None
    assert core.retry_delay(err, core.Request("POST", "/x", idempotent=True), 0, 5) is not None


def test_client_errors_are_never_retried() -> None:
    assert core.retry_delay(errors.TopicNotFound("x"), core.Request("GET", "/x"), 0, 5) is None


def test_every_message_gets_a_distinct_idempotency_key() -> None:
    p = core.Producer("p1")
    body = core.batch_body(p, [b"a", "b", {"payload": b"c", "key": "mine"}])
    k1, k2, k3 = [m["key"] for m in body["messages"]]
    assert k1.startswith("p1-") and k1.endswith("-1") and k2 == k1[:-1] + "2"
    assert k3 == "mine"
    assert body["messages"][1]["payload"] == b"b"


def test_a_restarted_producer_with_the_same_id_has_new_keys() -> None:
    # Same producer_id after a restart: its keys must not repeat the previous run's, or the
    # server drops its new messages as duplicates for the whole dedup window.
    first = {core.Producer("orders-svc").key() for _ in range(1)}
    again = {core.Producer("orders-svc").key() for _ in range(1)}
    assert first.isdisjoint(again)


def test_single_receipt_settle_raises_its_error() -> None:
    res = {"acked": 0, "errors": [{"receipt": "r", "code": "receipt_stale", "message": "gone"}]}
    with pytest.raises(errors.ReceiptStale):
        core.raise_receipt_errors(res, 1)
    core.raise_receipt_errors(res, 2)  # many: the caller reads the list


def test_a_node_that_failed_is_passed_over_for_a_while() -> None:
    now = [0.0]
    ep = core.Endpoints(["h:1", "h:2", "h:3"], cooldown=2.0, clock=lambda: now[0])
    ep.failed("http://h:1")
    assert {ep.pick() for _ in range(6)} == {"http://h:2", "http://h:3"}
    now[0] = 2.5
    assert "http://h:1" in {ep.pick() for _ in range(6)}


def test_when_every_node_failed_they_are_still_tried() -> None:
    ep = core.Endpoints(["h:1", "h:2"], clock=lambda: 0.0)
    ep.failed("http://h:1")
    ep.failed("http://h:2")
    assert ep.pick() in ep.seeds


def test_a_leader_hint_we_could_not_reach_is_ignored_during_the_cooldown() -> None:
    now = [0.0]
    ep = core.Endpoints(["h:1"], clock=lambda: now[0])
    ep.learn("inside-docker:8000")
    ep.failed(ep.pick())
    ep.learn("inside-docker:8000")
    assert ep.pick() == "http://h:1"
    now[0] = 3.0
    ep.learn("inside-docker:8000")
    assert ep.pick() == "http://inside-docker:8000"


def test_no_leader_from_a_live_node_is_polled_often() -> None:
    req = core.Request("POST", "/x", idempotent=True)
    no_leader = errors.error_from_body(503, {"code": "no_leader", "message": "election"})
    assert isinstance(no_leader, errors.Unavailable) and no_leader.server_code == "no_leader"
    assert core.retry_delay(no_leader, req, 10, 5.0) == pytest.approx(core.NO_LEADER_CAP, rel=0.5)
    down = errors.error_from_body(503, {"code": "overloaded", "message": "busy"})
    delay = core.retry_delay(down, req, 10, 5.0)
    assert delay is not None and delay >= core.BACKOFF_CAP / 2


def test_a_server_url_with_a_bad_port_is_a_usage_error_at_once() -> None:
    for bad in ("127.0.0.1:abc", "http://h:99999", "http://:80", "ftp://h:1"):
        with pytest.raises(ValueError, match="not a server URL"):
            core.normalize_url(bad)
    assert core.normalize_url("h:8001") == "http://h:8001"


def test_a_server_error_is_definite_and_not_retried() -> None:
    err = errors.error_from_body(500, {"code": "internal", "message": "see the log"})
    assert isinstance(err, errors.ServerError) and not isinstance(err, errors.Unavailable)
    assert core.retry_delay(err, core.Request("GET", "/x"), 0, 5) is None


def test_the_topic_list_is_followed_only_while_its_cursor_moves_forward() -> None:
    assert core.next_topics_page({"topics": ["a", "b"], "next": "b"}, None) == "b"
    assert core.next_topics_page({"topics": ["c"], "next": None}, "b") is None
    assert core.next_topics_page({"topics": ["a"]}, None) is None  # (an older node: one page)
    assert core.next_topics_page({"topics": [], "next": "a"}, "b") is None  # (no progress)
    assert core.next_topics_page({"topics": [], "next": 7}, None) is None


def test_retry_after_is_read_as_seconds_or_a_date_and_capped() -> None:
    now = 1_000_000_000.0
    assert core.parse_retry_after("5", lambda: now) == 5.0
    assert core.parse_retry_after(" 0 ", lambda: now) == 0.0
    assert core.parse_retry_after("86400", lambda: now) == core.RETRY_AFTER_CAP
    date = "Sun, 09 Sep 2001 01:46:50 GMT"  # now + 10 s
    assert core.parse_retry_after(date, lambda: now) == pytest.approx(10.0)
    assert core.parse_retry_after(date, lambda: now + 60) == 0.0  # (in the past)
    for junk in (None, "", "-1", "1.5", "soon", "Sun, 09 Sep 2001 01:46:50"):
        assert core.parse_retry_after(junk, lambda: now) is None


def test_no_leaders_retry_after_does_not_slow_the_election_polling() -> None:
    err = errors.error_from_body(503, {"code": "no_leader", "message": "m", "details": {}})
    err.retry_after = 1.0
    delay = core.retry_delay(err, core.Request("GET", "/x"), 10, 5.0)
    assert delay is not None and delay <= core.NO_LEADER_CAP


def test_endpoints_tell_of_a_new_leader_once() -> None:
    calls: list[tuple[str | None, str]] = []
    ep = core.Endpoints(["http://a:1"], on_leader_change=lambda old, new: calls.append((old, new)))
    ep.learn("http://a:1")
    ep.learn("http://a:1")
    ep.no_leader("http://a:1")  # unsure for a while, then the same leader: no change
    ep.learn("a:1")
    ep.learn("http://b:2")
    assert calls == [(None, "http://a:1"), ("http://a:1", "http://b:2")]
