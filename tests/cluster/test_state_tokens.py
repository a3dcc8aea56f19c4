"""API tokens in the state machine: token_create / token_update / token_revoke, the token
queries, and tokens in snapshots (version 4 only when there is one). One behaviour per test."""

from __future__ import annotations

import hashlib
from typing import Any

import msgpack
import pytest
from state_harness import T0, Harness, legacy_snapshot  # type: ignore[import-not-found]

from raftq.cluster import errors as E
from raftq.cluster.state import Broker

HASH = hashlib.sha256(b"secret").digest()
GRANTS = [{"topics": "orders.*", "actions": ["publish", "consume"]}]


def create(h: Harness, tid: str = "tok1", name: str = "ci", **fields: Any) -> dict[str, Any]:
    res: dict[str, Any] = h("token_create", id=tid, name=name, hash=HASH, grants=GRANTS, **fields)
    return res


def test_token_create_answers_id_name_and_created_at_from_the_commands_now(h: Harness) -> None:
    assert create(h) == {"id": "tok1", "name": "ci", "created_at": T0}


def test_a_created_token_has_its_fields_and_defaults(h: Harness) -> None:
    create(h)
    assert h.b.tokens() == [
        {
            "id": "tok1",
            "name": "ci",
            "grants": [{"topics": "orders.*", "actions": ["consume", "publish"]}],
            "cluster": False,
            "expires_at": None,
            "disabled": False,
            "created_at": T0,
        }
    ]


def test_token_create_takes_cluster_and_expires_at(h: Harness) -> None:
    create(h, cluster=True, expires_at=T0 + 60_000)
    (view,) = h.b.tokens()
    assert (view["cluster"], view["expires_at"]) == (True, T0 + 60_000)


def test_an_expires_at_in_the_past_is_kept_and_left_to_the_node(h: Harness) -> None:
    create(h, expires_at=T0 - 1)
    h.advance(3600)
    h("tick")
    assert h.b.token("tok1") is not None  # the state machine expires nothing itself


def test_token_create_with_a_taken_id_is_token_exists_naming_the_id(h: Harness) -> None:
    create(h)
    before = h.b.snapshot()
    with pytest.raises(E.TokenExists) as ei:
        create(h, name="other")
    assert ei.value.details == {"field": "id", "id": "tok1"}
    assert h.b.snapshot() == before


def test_token_create_with_a_taken_name_is_token_exists_naming_the_name(h: Harness) -> None:
    create(h)
    before = h.b.snapshot()
    with pytest.raises(E.TokenExists) as ei:
        create(h, tid="tok2")
    assert ei.value.details == {"field": "name", "name": "ci"}
    assert h.b.snapshot() == before


@pytest.mark.parametrize("digest", [b"", HASH[:31], HASH + b"x", HASH.hex(), None, list(HASH)])
def test_token_create_with_a_hash_not_of_32_bytes_is_invalid_argument(
    h: Harness, digest: Any
) -> None:
    with pytest.raises(E.InvalidArgument) as ei:
        h("token_create", id="tok1", name="ci", hash=digest, grants=GRANTS)
    assert ei.value.field == "hash"  # type: ignore[attr-defined]
    assert h.b.tokens() == []


@pytest.mark.parametrize(
    ("grants", "field"),
    [
        ("*", "grants"),
        ([{"topics": "orders*", "actions": ["publish"]}], "grants[].topics"),
        ([{"topics": "*", "actions": ["read"]}], "grants[].actions"),
        ([{"topics": "*", "actions": []}], "grants[].actions"),
        ([{"topics": "*", "actions": ["admin"], "until": 5}], "grants[].until"),
    ],
)
def test_token_create_with_bad_grants_is_invalid_argument_naming_the_field(
    h: Harness, grants: Any, field: str
) -> None:
    with pytest.raises(E.InvalidArgument) as ei:
        h("token_create", id="tok1", name="ci", hash=HASH, grants=grants)
    assert ei.value.field == field  # type: ignore[attr-defined]
    assert h.b.tokens() == []


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"id": ""}, "id"),
        ({"id": "a.b"}, "id"),
        ({"id": "x" * 65}, "id"),
        ({"id": "tök"}, "id"),
        ({"id": 7}, "id"),
        ({"name": "bad name"}, "name"),
        ({"name": None}, "name"),
        ({"cluster": 1}, "cluster"),
        ({"cluster": None}, "cluster"),
        ({"expires_at": -1}, "expires_at"),
        ({"expires_at": 1.5}, "expires_at"),
        ({"expires_at": True}, "expires_at"),
        ({"expires_at": 2**53}, "expires_at"),
        ({"disabled": True}, "disabled"),  # not a field of token_create
        ({"secret": "s"}, "secret"),
    ],
)
def test_bad_token_create_is_invalid_argument_naming_the_field(
    h: Harness, fields: dict[str, Any], field: str
) -> None:
    cmd = {"id": "tok1", "name": "ci", "hash": HASH, "grants": GRANTS, **fields}
    with pytest.raises(E.InvalidArgument) as ei:
        h("token_create", **cmd)
    assert ei.value.field == field  # type: ignore[attr-defined]
    assert h.b.tokens() == []


@pytest.mark.parametrize("missing", ["id", "name", "hash", "grants"])
def test_token_create_without_a_required_field_is_invalid_argument(
    h: Harness, missing: str
) -> None:
    cmd = {"id": "tok1", "name": "ci", "hash": HASH, "grants": GRANTS}
    del cmd[missing]
    with pytest.raises(E.InvalidArgument) as ei:
        h("token_create", **cmd)
    assert ei.value.field == missing  # type: ignore[attr-defined]


@pytest.mark.parametrize("tid", ["a", "A-z_09", "x" * 64])
def test_valid_token_ids_are_accepted(h: Harness, tid: str) -> None:
    assert create(h, tid=tid)["id"] == tid


def test_a_token_keeps_no_alias_of_its_command(h: Harness) -> None:
    grants: list[dict[str, Any]] = [{"topics": "orders.*", "actions": ["publish"]}]
    h("token_create", id="tok1", name="ci", hash=HASH, grants=grants)
    grants[0]["actions"].append("admin")
    grants.append({"topics": "*", "actions": ["admin"]})
    assert h.b.tokens()[0]["grants"] == [{"topics": "orders.*", "actions": ["publish"]}]


def test_token_update_changes_only_the_given_fields_and_answers_the_public_view(
    h: Harness,
) -> None:
    create(h, expires_at=T0 + 5)
    h.advance(1)
    view = h("token_update", id="tok1", disabled=True, grants=[])
    assert view == {
        "id": "tok1",
        "name": "ci",
        "grants": [],
        "cluster": False,
        "expires_at": T0 + 5,
        "disabled": True,
        "created_at": T0,
    }
    assert h.b.tokens() == [view]


def test_token_update_can_enable_again_and_grant_cluster(h: Harness) -> None:
    create(h)
    h("token_update", id="tok1", disabled=True)
    view = h("token_update", id="tok1", disabled=False, cluster=True)
    assert (view["disabled"], view["cluster"]) == (False, True)


def test_token_update_with_expires_at_none_clears_the_expiry(h: Harness) -> None:
    create(h, expires_at=T0 + 5)
    assert h("token_update", id="tok1", expires_at=None)["expires_at"] is None


def test_token_update_renames_and_frees_the_old_name(h: Harness) -> None:
    create(h)
    assert h("token_update", id="tok1", name="deploy")["name"] == "deploy"
    assert create(h, tid="tok2", name="ci")["name"] == "ci"
    assert [t["name"] for t in h.b.tokens()] == ["ci", "deploy"]


def test_token_update_to_the_name_of_another_token_is_token_exists(h: Harness) -> None:
    create(h)
    create(h, tid="tok2", name="deploy")
    before = h.b.snapshot()
    with pytest.raises(E.TokenExists) as ei:
        h("token_update", id="tok2", name="ci", disabled=True)
    assert ei.value.details == {"field": "name", "name": "ci"}
    assert h.b.snapshot() == before


def test_token_update_to_its_own_name_is_allowed(h: Harness) -> None:
    create(h)
    assert h("token_update", id="tok1", name="ci")["name"] == "ci"


def test_token_update_of_an_unknown_token_is_token_not_found(h: Harness) -> None:
    with pytest.raises(E.TokenNotFound) as ei:
        h("token_update", id="nope", disabled=True)
    assert ei.value.details == {"id": "nope"}


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"disabled": "yes"}, "disabled"),
        ({"cluster": 0}, "cluster"),
        ({"grants": [{"topics": "*"}]}, "grants[].actions"),
        ({"name": ""}, "name"),
        ({"expires_at": "soon"}, "expires_at"),
        ({"hash": HASH}, "hash"),  # a token's hash never changes: revoke and create
        ({"disable": True}, "disable"),
    ],
)
def test_bad_token_update_is_invalid_argument_and_changes_nothing(
    h: Harness, fields: dict[str, Any], field: str
) -> None:
    create(h)
    before = h.b.snapshot()
    with pytest.raises(E.InvalidArgument) as ei:
        h("token_update", **{"id": "tok1", "name": "renamed", **fields})  # (a good name first)
    assert ei.value.field == field  # type: ignore[attr-defined]
    assert h.b.snapshot() == before


def test_token_revoke_removes_the_token_and_frees_its_id_and_name(h: Harness) -> None:
    create(h)
    assert h("token_revoke", id="tok1") == {"id": "tok1", "revoked": True}
    assert h.b.token("tok1") is None
    assert h.b.tokens() == []
    assert create(h)["id"] == "tok1"


def test_token_revoke_of_an_unknown_token_is_token_not_found(h: Harness) -> None:
    create(h)
    before = h.b.snapshot()
    with pytest.raises(E.TokenNotFound) as ei:
        h("token_revoke", id="tok2")
    assert (ei.value.code, ei.value.details) == ("token_not_found", {"id": "tok2"})
    assert h.b.snapshot() == before


@pytest.mark.parametrize("tid", [None, "", "a.b", ["tok1"]])
def test_token_revoke_of_a_malformed_id_is_invalid_argument(h: Harness, tid: Any) -> None:
    with pytest.raises(E.InvalidArgument) as ei:
        h("token_revoke", id=tid)
    assert ei.value.field == "id"  # type: ignore[attr-defined]


def test_token_is_the_whole_record_with_the_hash(h: Harness) -> None:
    create(h, cluster=True)
    rec = h.b.token("tok1")
    assert rec is not None
    assert rec["hash"] == HASH
    assert {k: v for k, v in rec.items() if k != "hash"} == h.b.tokens()[0]


def test_no_answer_but_token_carries_the_hash(h: Harness) -> None:
    answers = [
        create(h),
        h("token_update", id="tok1", disabled=True),
        *h.b.tokens(),
        h("token_revoke", id="tok1"),
    ]
    assert all("hash" not in a and HASH not in a.values() for a in answers)


@pytest.mark.parametrize("tid", ["nope", "", None, 5, ["tok1"], {"tok1": 1}])
def test_token_of_an_unknown_or_malformed_id_is_none(h: Harness, tid: Any) -> None:
    create(h)
    assert h.b.token(tid) is None


def test_tokens_are_listed_by_name(h: Harness) -> None:
    create(h, tid="a", name="zeta")
    create(h, tid="b", name="alpha")
    create(h, tid="c", name="mid")
    assert [(t["id"], t["name"]) for t in h.b.tokens()] == [
        ("b", "alpha"),
        ("c", "mid"),
        ("a", "zeta"),
    ]


def test_token_answers_do_not_alias_the_state(h: Harness) -> None:
    create(h)
    view = h("token_update", id="tok1", cluster=True)
    rec = h.b.token("tok1")
    assert rec is not None
    before = h.b.snapshot()
    for answer in (view, rec, h.b.tokens()[0]):
        answer["grants"][0]["actions"].append("admin")
        answer["grants"].append({"topics": "*", "actions": ["admin"]})
        answer["disabled"] = True
    assert h.b.snapshot() == before


def test_token_errors_are_a_conflict_and_a_not_found() -> None:
    assert issubclass(E.TokenExists, E.Conflict) and E.TokenExists.code == "token_exists"
    assert issubclass(E.TokenNotFound, E.NotFound) and E.TokenNotFound.code == "token_not_found"


# ---------------------------------------------------------------- snapshots


def test_a_snapshot_with_tokens_is_an_exact_round_trip(h: Harness) -> None:
    h.topic("t")
    h.publish("t", b"x")
    create(h, tid="b", name="one", cluster=True, expires_at=T0 + 9)
    create(h, tid="a", name="two")
    h("token_update", id="b", disabled=True)
    snap = h.b.snapshot()
    assert msgpack.unpackb(snap)[0] == 9
    other = Broker()
    other.restore(snap)
    assert other.snapshot() == snap
    assert other.digest() == h.b.digest()
    assert other.tokens() == h.b.tokens()
    assert other.token("b") == h.b.token("b")


def test_tokens_follow_the_topics_sorted_by_id(h: Harness) -> None:
    h.topic("t")
    before = msgpack.unpackb(h.b.snapshot())
    create(h, tid="b", name="one")
    create(h, tid="a", name="two", expires_at=5)
    version, now, applied, topics, tokens = msgpack.unpackb(h.b.snapshot())[:5]
    assert version == 9
    assert [now, topics] == [before[1], before[3]] and applied == before[2] + 2
    assert tokens == [
        ["a", "two", HASH, [["orders.*", ["consume", "publish"]]], False, 5, False, T0],
        ["b", "one", HASH, [["orders.*", ["consume", "publish"]]], False, None, False, T0],
    ]


def test_a_restored_broker_goes_on_handling_tokens_the_same(h: Harness) -> None:
    create(h)
    create(h, tid="tok2", name="deploy")
    other = Broker()
    other.restore(h.b.snapshot())
    cmds: list[dict[str, Any]] = [
        {"op": "token_update", "id": "tok2", "name": "ci"},  # the name index came back too
        {"op": "token_revoke", "id": "tok1"},
        {"op": "token_update", "id": "tok2", "name": "ci"},
        {"op": "token_create", "id": "tok1", "name": "deploy", "hash": HASH, "grants": []},
    ]
    results = [b.apply_batch(h.now, cmds) for b in (h.b, other)]
    assert results[0] == results[1]
    assert results[0][0]["error"]["code"] == "token_exists"
    assert other.snapshot() == h.b.snapshot()


def test_a_v3_snapshot_without_tokens_restores(h: Harness) -> None:
    h.topic("t")
    h.publish("t", b"x")
    other = Broker()
    other.restore(legacy_snapshot(h.b, 3))
    assert other.peek("t") == h.b.peek("t")


def test_revoking_the_last_token_leaves_none_in_the_snapshot(h: Harness) -> None:
    h.topic("t")
    create(h)
    h("token_revoke", id="tok1")
    assert msgpack.unpackb(h.b.snapshot())[4] == []
    other = Broker()
    other.restore(h.b.snapshot())
    assert other.snapshot() == h.b.snapshot()


def test_the_digest_covers_tokens(h: Harness) -> None:
    create(h)
    other = Broker()
    other.restore(h.b.snapshot())
    assert other.digest() == h.b.digest()
    h("token_update", id="tok1", disabled=True)
    other.apply({"op": "token_update", "id": "tok1", "disabled": False, "now": h.now})
    assert other.digest() != h.b.digest()


@pytest.mark.parametrize(
    "tokens",
    [
        [["a", "x", HASH, [], False, None, False, 0], ["b", "x", HASH, [], False, None, False, 0]],
        [["a", "x", HASH, [], False, None, False, 0], ["a", "y", HASH, [], False, None, False, 0]],
        [["a", "x", HASH, [], False, None, False]],
    ],
    ids=["name-twice", "id-twice", "short-record"],
)
def test_restore_of_a_v4_snapshot_with_bad_tokens_is_value_error(
    h: Harness, tokens: list[Any]
) -> None:
    create(h)
    before = h.b.snapshot()
    _, now, applied, topics, _ = msgpack.unpackb(legacy_snapshot(h.b, 4))
    with pytest.raises(ValueError, match="snapshot"):
        h.b.restore(msgpack.packb([4, now, applied, topics, tokens], use_bin_type=True))
    assert h.b.snapshot() == before


def test_a_version_3_snapshot_must_not_carry_tokens(h: Harness) -> None:
    create(h)
    _, now, applied, topics, tokens = msgpack.unpackb(legacy_snapshot(h.b, 4))
    with pytest.raises(ValueError, match="snapshot"):
        Broker().restore(msgpack.packb([3, now, applied, topics, tokens], use_bin_type=True))
