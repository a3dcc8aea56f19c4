"""Every request builder in ``_requests`` and whether its request may be resent after an
unknown outcome: the table below is the decision, so changing one (or adding a builder) is a
deliberate edit here too."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from raftq.client import _core as core
from raftq.client import _requests as rq

MSG = {"payload": b"x", "key": "p-e-1"}

# builder: (example call, method, idempotent, settle)
TABLE: dict[str, tuple[Callable[[], core.Request], str, bool, bool]] = {
    "cluster": (lambda: rq.cluster(), "GET", True, False),
    "cluster_settings": (lambda: rq.cluster_settings(), "GET", True, False),
    # setting a value twice is setting it once
    "update_cluster_settings": (
        lambda: rq.update_cluster_settings({"max_retained_bytes": 5}),
        "PATCH",
        True,
        False,
    ),
    "add_member": (lambda: rq.add_member("n4", "h:9004", "h:8004"), "POST", False, False),
    "remove_member": (lambda: rq.remove_member("n4"), "DELETE", False, False),
    "create_topic": (lambda: rq.create_topic("t", None, None, False), "POST", False, False),
    "list_topics": (lambda: rq.list_topics("a", 5), "GET", True, False),
    "topic": (lambda: rq.topic("t"), "GET", True, False),
    "update_topic": (lambda: rq.update_topic("t", {"max_messages": 5}), "PATCH", True, False),
    "delete_topic": (lambda: rq.delete_topic("t"), "DELETE", True, False),
    "purge": (lambda: rq.purge("t"), "POST", True, False),
    "create_group": (
        lambda: rq.create_group("t", "g", None, "latest", False),
        "POST",
        False,
        False,
    ),
    "group": (lambda: rq.group("t", "g"), "GET", True, False),
    "update_group": (
        lambda: rq.update_group("t", "g", {"max_deliveries": 3}),
        "PATCH",
        True,
        False,
    ),
    "delete_group": (lambda: rq.delete_group("t", "g"), "DELETE", True, False),
    "publish": (lambda: rq.publish("t", MSG), "POST", True, False),
    "publish_batch": (lambda: rq.publish_batch("t", [MSG]), "POST", True, False),
    "receive": (lambda: rq.receive("t", "g", 1, 0.0, None, None), "POST", False, False),
    "settle": (lambda: rq.settle("ack", ["r1"]), "POST", True, True),
    "release": (lambda: rq.release("c1"), "POST", True, False),
    "peek": (lambda: rq.peek("t", None, 10), "GET", True, False),
    "redrive": (lambda: rq.redrive("t", 100), "POST", False, False),
    # a resent create could make a second token, and the first one's secret would be lost
    "create_token": (lambda: rq.create_token("ci", [], False, None), "POST", False, False),
    "list_tokens": (lambda: rq.list_tokens(), "GET", True, False),
    "sqs_credentials": (lambda: rq.sqs_credentials(), "GET", True, False),
    "token": (lambda: rq.token("abc"), "GET", True, False),
    "update_token": (lambda: rq.update_token("abc", {"disabled": True}), "PATCH", True, False),
    "revoke_token": (lambda: rq.revoke_token("abc"), "DELETE", True, False),
}


def builders() -> dict[str, Callable[..., Any]]:
    return {
        name: fn
        for name, fn in inspect.getmembers(rq, inspect.isfunction)
        if fn.__module__ == rq.__name__
    }


def test_every_builder_is_in_the_table() -> None:
    assert sorted(builders()) == sorted(TABLE)


def test_each_builder_says_whether_its_request_may_be_resent() -> None:
    got = {}
    for name, (make, *_) in TABLE.items():
        req = make()
        got[name] = (req.method, req.idempotent, req.settle)
    assert got == {name: tuple(row[1:]) for name, row in TABLE.items()}


def test_every_settle_op_is_idempotent() -> None:
    for op in ("ack", "nack", "extend", "term"):
        req = rq.settle(op, ["r1", "r2"])
        assert (req.path, req.idempotent, req.settle) == ("/" + op, True, True)


def test_a_request_that_does_not_say_is_not_resent() -> None:
    req = core.Request("POST", "/something/new")
    assert req.idempotent is False
    err = core.unavailable("http://h:1", ConnectionResetError(), sent=True)
    assert core.retry_delay(err, req, 0, 5.0) is None


def test_receive_holds_for_its_wait() -> None:
    assert rq.receive("t", "g", 1, 7.5, None, None).hold == 7.5


def test_the_first_topic_page_asks_nothing_and_the_next_ones_name_their_cursor() -> None:
    assert rq.list_topics().path == "/topics"  # (a node older than paging takes it too)
    assert rq.list_topics("orders.eu", 50).path == "/topics?limit=50&after=orders.eu"
