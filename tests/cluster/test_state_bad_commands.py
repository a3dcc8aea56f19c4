"""Whatever arrives in a command, ``apply`` answers or raises ``BrokerError``, and a rejected
command changes nothing (the tests keep ``now`` still, so that time cannot move either)."""

from __future__ import annotations

import copy
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftq.cluster.entry import apply_entry, encode_entry
from raftq.cluster.errors import BrokerError
from raftq.cluster.state import Broker

NOW = 1_700_000_000_000
OPS = [
    "create_topic",
    "update_topic",
    "delete_topic",
    "create_group",
    "update_group",
    "delete_group",
    "publish",
    "receive",
    "ack",
    "nack",
    "extend",
    "term",
    "release",
    "tick",
    "purge",
    "redrive",
    "token_create",
    "token_update",
    "token_revoke",
]
FIELDS = [
    "topic",
    "group",
    "groups",
    "config",
    "start",
    "if_not_exists",
    "messages",
    "consumer",
    "max",
    "visibility",
    "token",
    "receipts",
    "delay",
    "seconds",
    "reason",
    "topics",
    "id",
    "name",
    "hash",
    "grants",
    "cluster",
    "expires_at",
    "disabled",
]
CONFIG_KEYS = [
    "max_messages",
    "max_bytes",
    "max_message_bytes",
    "overflow",
    "max_age",
    "dedup_window",
    "visibility_timeout",
    "max_attempts",
    "backoff",
    "dead_letter_topic",
    "bogus",
]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["t", "default", "t.dlq", "g", "c1", "", ":", "t:default:1:1:00", "²"]),
    st.sampled_from(["tok1", "ci", "*", "t.*", "publish", "admin", b"h" * 32]),
    st.text(max_size=8),
    st.binary(max_size=70),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(["payload", "key", "headers", "delay", "group"]), inner),
        st.dictionaries(st.sampled_from(CONFIG_KEYS), inner, max_size=3),
        st.dictionaries(st.sampled_from(["topics", "actions", "x"]), inner, max_size=3),
        st.frozensets(st.integers(), max_size=2),
        st.sets(st.integers(), max_size=2),  # unhashable
    ),
    max_leaves=8,
)
commands = st.fixed_dictionaries(
    {"op": st.one_of(st.sampled_from(OPS), values)},
    optional={f: values for f in FIELDS},
)


def busy_broker() -> tuple[Broker, str]:
    """A broker with a topic, two groups, a backlog, deliveries in flight and a DLQ."""
    b = Broker()

    def do(op: str, **f: Any) -> dict[str, Any]:
        return b.apply({"op": op, "now": NOW, **f})

    do("create_topic", topic="t", groups=[{"group": "default"}, {"group": "g"}])
    do("publish", topic="t", messages=[{"payload": b"%d" % i, "key": f"k{i}"} for i in range(6)])
    d = do("receive", topic="t", group="default", consumer="c1", max=3, token=b"k" * 16)
    do("term", receipts=[d["deliveries"][0]["receipt"]])
    do("publish", topic="t", messages=[{"payload": b"late", "delay": 30}])
    grants = [{"topics": "t", "actions": ["consume", "publish"]}]
    do("token_create", id="tok1", name="ci", hash=b"h" * 32, grants=grants, expires_at=NOW + 9)
    return b, d["deliveries"][1]["receipt"]


_busy, RECEIPT = busy_broker()
BASE = _busy.snapshot()

# One valid command per op; the fuzzer breaks one or two fields of it (at any depth).
VALID: dict[str, dict[str, Any]] = {
    "create_topic": {
        "topic": "n",
        "config": {"max_messages": 5, "overflow": "drop_oldest", "max_age": 60},
        "groups": [{"group": "x", "config": {"max_attempts": 1, "backoff": [1]}}],
    },
    "update_topic": {"topic": "t", "config": {"max_messages": 100, "dedup_window": 1}},
    "delete_topic": {"topic": "t"},
    "create_group": {
        "topic": "t",
        "group": "x",
        "start": "earliest",
        "config": {"visibility_timeout": 3, "dead_letter_topic": "d"},
    },
    "update_group": {"topic": "t", "group": "g", "config": {"backoff": [1, 2]}},
    "delete_group": {"topic": "t", "group": "g"},
    "publish": {
        "topic": "t",
        "messages": [
            {"payload": b"x", "key": "k9", "headers": {"a": "b"}, "delay": 1},
            {"payload": b"y"},
        ],
    },
    "receive": {
        "topic": "t",
        "group": "default",
        "consumer": "c2",
        "max": 2,
        "visibility": 5,
        "token": b"x" * 16,
    },
    "ack": {"receipts": [RECEIPT]},
    "nack": {"receipts": [RECEIPT], "delay": 1},
    "extend": {"receipts": [RECEIPT], "seconds": 5},
    "term": {"receipts": [RECEIPT], "reason": "r"},
    "release": {"consumer": "c1", "topics": ["t", "x.*"]},
    "tick": {},
    "purge": {"topic": "t", "group": "g"},
    "redrive": {"topic": "t.dlq", "max": 1},
    "token_create": {
        "id": "tok2",
        "name": "deploy",
        "hash": b"d" * 32,
        "grants": [
            {"topics": "t.*", "actions": ["admin"]},
            {"topics": "*", "actions": ["consume"]},
        ],
        "cluster": True,
        "expires_at": NOW + 1000,
    },
    "token_update": {
        "id": "tok1",
        "name": "ci2",
        "grants": [{"topics": "*", "actions": ["publish"]}],
        "cluster": False,
        "expires_at": None,
        "disabled": True,
    },
    "token_revoke": {"id": "tok1"},
}
DELETE = object()


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = []
    if isinstance(obj, dict):
        items: Any = obj.items()
    elif isinstance(obj, list):
        items = enumerate(obj)
    else:
        return []
    for k, v in items:
        out.append((*prefix, k))
        out.extend(_paths(v, (*prefix, k)))
    return out


@st.composite
def broken_commands(draw: st.DrawFn) -> dict[str, Any]:
    op = draw(st.sampled_from(sorted(VALID)))
    cmd: dict[str, Any] = copy.deepcopy({"op": op, **VALID[op]})
    for _ in range(draw(st.integers(1, 2))):
        paths = _paths(cmd) + [(f,) for f in FIELDS if f not in cmd]
        path = draw(st.sampled_from(paths))
        value = draw(st.one_of(st.just(DELETE), values))
        parent = cmd
        for k in path[:-1]:
            parent = parent[k]
        if value is DELETE:
            if isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                del parent[path[-1]]
        else:
            parent[path[-1]] = value
    return cmd


def _bad(op: str, **change: Any) -> dict[str, Any]:
    return {"op": op, **VALID[op], **change}


# Token commands that must be refused, each with good fields beside the bad one.
BAD_TOKEN_COMMANDS = [
    _bad("token_create", id="tok1"),
    _bad("token_create", name="ci"),
    _bad("token_create", hash=b"d" * 31),
    _bad("token_create", grants=[{"topics": "*", "actions": ["admin"]}, {"topics": "*"}]),
    _bad("token_create", cluster="yes"),
    _bad("token_create", secret="s"),
    _bad("token_update", disabled=None),
    _bad("token_update", grants=[{"topics": "t**", "actions": ["admin"]}]),
    _bad("token_update", hash=b"d" * 32),
    _bad("token_update", id="tok2"),
    _bad("token_revoke", id="tok2"),
    _bad("token_revoke", id="bad.id"),
]


def fresh() -> Broker:
    b = Broker()
    b.restore(BASE)
    return b


@settings(
    max_examples=800,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(cmd=st.one_of(commands, broken_commands(), broken_commands()))
def test_any_command_is_answered_or_rejected_with_broker_error_without_change(
    cmd: dict[str, Any],
) -> None:
    b = fresh()
    try:
        result = b.apply({**cmd, "now": NOW})
    except BrokerError as e:
        assert isinstance(e.code, str) and e.code
        assert b.snapshot() == BASE
        return
    assert isinstance(result, dict)
    # whatever was accepted can still be snapshotted and restored exactly
    snap = b.snapshot()
    copy = Broker()
    copy.restore(snap)
    assert copy.snapshot() == snap


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(cmds=st.lists(st.one_of(commands, values), min_size=1, max_size=4))
def test_a_batch_of_anything_yields_results_never_internal_errors(cmds: list[Any]) -> None:
    b = fresh()
    results = b.apply_batch(NOW, cmds)
    assert len(results) == len(cmds)
    for r in results:
        assert isinstance(r, dict)
        if "error" in r:
            assert r["error"]["code"] != "internal", r


@pytest.mark.parametrize("command", BAD_TOKEN_COMMANDS)
def test_a_rejected_token_command_changes_nothing(command: dict[str, Any]) -> None:
    b = fresh()
    with pytest.raises(BrokerError):
        b.apply({**command, "now": NOW})
    assert b.snapshot() == BASE


@pytest.mark.parametrize("command", [None, 5, "publish", [("op", "tick")], b"x", {1, 2}])
def test_a_command_that_is_not_a_map_is_invalid_argument(command: Any) -> None:
    b = fresh()
    with pytest.raises(BrokerError) as ei:
        b.apply(command)
    assert ei.value.code == "invalid_argument"
    assert b.snapshot() == BASE


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",
        encode_entry(NOW, [])[:-1],
        b"\x93\x02\x00\x90",
        b"\x92\x01\x00",
        b"\x01",
        encode_entry(-5, [{"op": "tick"}]),
        msgpack.packb([1, 2**64 - 1, [{"op": "tick"}]]),
        msgpack.packb([1, True, [{"op": "tick"}]]),
    ],
)
def test_a_malformed_entry_changes_nothing_and_yields_no_results(data: bytes) -> None:
    b = fresh()
    assert apply_entry(b, data) == []
    assert b.snapshot() == BASE


def test_an_entry_round_trips_through_encode_and_apply() -> None:
    b = fresh()
    data = encode_entry(NOW + 1, [{"op": "tick"}, {"op": "nope"}])
    results = apply_entry(b, data)
    assert results[0] == {"now": NOW + 1}
    assert results[1]["error"]["code"] == "invalid_argument"
