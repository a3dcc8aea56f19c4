"""Topic patterns and grants (raftq.cluster.grants): what a pattern covers, what is refused."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftq.cluster import errors as E
from raftq.cluster import grants as G
from raftq.cluster.validate import NAME_RE

SETTINGS = settings(max_examples=300, deadline=None, derandomize=True, database=None)
names = st.from_regex(NAME_RE, fullmatch=True)
# short names drawn from few characters, so that prefixes and near misses are common
short = st.text(alphabet="ab.", min_size=1, max_size=6).map(lambda s: "a" + s)


@pytest.mark.parametrize("pattern", ["*", "orders", "a", "x" * 128, "a.b-c_d", "orders.*"])
def test_valid_patterns_are_returned_as_given(pattern: str) -> None:
    assert G.check_pattern(pattern, "topics") == pattern


@pytest.mark.parametrize(
    "pattern",
    ["", "**", "*.*", ".*", "orders*", "orders.**", "or*ders", "*.orders", "orders.*.x",
     "orders.a*", "ord.*.*", "-x.*", "a b.*", "x" * 129 + ".*", "é", "orders.+", 5, None, ["*"]],
)  # fmt: skip
def test_invalid_patterns_are_invalid_argument_naming_the_field(pattern: Any) -> None:
    with pytest.raises(E.InvalidArgument) as ei:
        G.check_pattern(pattern, "grants[].topics")
    assert ei.value.field == "grants[].topics"  # type: ignore[attr-defined]


def test_check_patterns_returns_a_copy_of_a_list_of_patterns() -> None:
    given_ = ["orders.*", "*", "audit"]
    out = G.check_patterns(given_, "topics")
    assert out == given_ and out is not given_
    assert G.check_patterns([], "topics") == []


@pytest.mark.parametrize(
    "value", [None, "orders.*", ("a",), ["a", "b*"], ["a"] * (G.MAX_PATTERNS + 1)]
)
def test_bad_pattern_lists_are_invalid_argument_naming_the_field(value: Any) -> None:
    with pytest.raises(E.InvalidArgument) as ei:
        G.check_patterns(value, "topics")
    assert ei.value.field == "topics"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("pattern", "topic", "expected"),
    [
        ("orders.*", "orders.a", True),
        ("orders.*", "orders.a.b", True),
        ("orders.*", "orders", False),
        ("orders.*", "ordersx.a", False),
        ("orders.*", "xorders.a", False),
        ("orders", "orders", True),
        ("orders", "orders.a", False),
        ("orders", "order", False),
        ("*", "anything.at-all", True),
    ],
)
def test_matches_examples(pattern: str, topic: str, expected: bool) -> None:
    assert G.matches(pattern, topic) is expected


@SETTINGS
@given(topic=names)
def test_star_matches_every_topic(topic: str) -> None:
    assert G.matches("*", topic)


@SETTINGS
@given(pattern=short, topic=short)
def test_an_exact_pattern_matches_only_its_own_name(pattern: str, topic: str) -> None:
    assert G.matches(pattern, topic) is (pattern == topic)


@SETTINGS
@given(prefix=short, topic=short)
def test_a_prefix_pattern_matches_exactly_the_names_below_it(prefix: str, topic: str) -> None:
    pattern = G.check_pattern(prefix + ".*", "topics")
    below = len(topic) > len(prefix) and topic[: len(prefix) + 1] == prefix + "."
    assert G.matches(pattern, topic) is below
    assert not G.matches(pattern, prefix)


@SETTINGS
@given(prefix=names, rest=names)
def test_a_prefix_pattern_matches_every_name_built_on_it(prefix: str, rest: str) -> None:
    pattern = G.check_pattern(prefix + ".*", "topics")
    assert G.matches(pattern, f"{prefix}.{rest}")
    assert not G.matches(pattern, prefix + rest)  # (no dot: a sibling, not below)


def test_check_grants_normalizes_actions_and_copies() -> None:
    given_ = [{"topics": "orders.*", "actions": ["publish", "admin", "publish"]}]
    out = G.check_grants(given_)
    assert out == [{"topics": "orders.*", "actions": ["admin", "publish"]}]
    out[0]["actions"].append("consume")
    assert given_[0]["actions"] == ["publish", "admin", "publish"]


def test_check_grants_accepts_an_empty_list_and_keeps_the_order_of_grants() -> None:
    assert G.check_grants([]) == []
    grants = [{"topics": "b", "actions": ["consume"]}, {"topics": "a", "actions": ["consume"]}]
    assert [g["topics"] for g in G.check_grants(grants)] == ["b", "a"]


@pytest.mark.parametrize(
    ("grants", "field"),
    [
        (None, "grants"),
        ({"topics": "*", "actions": ["admin"]}, "grants"),
        ([{"topics": "*", "actions": ["admin"]}] * (G.MAX_GRANTS + 1), "grants"),
        (["*"], "grants[]"),
        ([{"topics": "*", "actions": ["admin"], "expires": 1}], "grants[].expires"),
        ([{"actions": ["admin"]}], "grants[].topics"),
        ([{"topics": "a*", "actions": ["admin"]}], "grants[].topics"),
        ([{"topics": "*"}], "grants[].actions"),
        ([{"topics": "*", "actions": []}], "grants[].actions"),
        ([{"topics": "*", "actions": "admin"}], "grants[].actions"),
        ([{"topics": "*", "actions": ["read"]}], "grants[].actions"),
        ([{"topics": "*", "actions": ["Admin"]}], "grants[].actions"),
        ([{"topics": "*", "actions": [None]}], "grants[].actions"),
    ],
)
def test_bad_grants_are_invalid_argument_naming_the_field(grants: Any, field: str) -> None:
    with pytest.raises(E.InvalidArgument) as ei:
        G.check_grants(grants)
    assert ei.value.field == field  # type: ignore[attr-defined]


GRANTS = G.check_grants(
    [
        {"topics": "orders.*", "actions": ["publish", "consume"]},
        {"topics": "audit", "actions": ["consume"]},
        {"topics": "*", "actions": ["admin"]},
    ]
)


@pytest.mark.parametrize(
    ("action", "topic", "expected"),
    [
        ("publish", "orders.eu", True),
        ("consume", "orders.eu", True),
        ("publish", "orders", False),
        ("consume", "audit", True),
        ("publish", "audit", False),
        ("consume", "audit.x", False),
        ("admin", "anything", True),
    ],
)
def test_allows_needs_one_grant_with_both_the_action_and_the_topic(
    action: str, topic: str, expected: bool
) -> None:
    assert G.allows(GRANTS, action, topic) is expected


def test_allows_with_an_unknown_action_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="action"):
        G.allows(GRANTS, "read", "audit")


def test_nothing_is_allowed_without_grants() -> None:
    assert not any(G.allows([], a, "t") for a in G.ACTIONS)
    assert not G.any_right([], "t")


def test_any_right_is_some_action_on_the_topic() -> None:
    grants = G.check_grants([{"topics": "orders.*", "actions": ["consume"]}])
    assert G.any_right(grants, "orders.eu")
    assert not G.any_right(grants, "orders")
    assert not G.any_right(grants, "billing")


@SETTINGS
@given(
    grants=st.lists(
        st.fixed_dictionaries(
            {
                "topics": st.sampled_from(["*", "a", "a.*", "a.b", "a.b.*", "b"]),
                "actions": st.lists(st.sampled_from(G.ACTIONS), min_size=1, max_size=4),
            }
        ),
        max_size=4,
    ),
    topic=st.sampled_from(["a", "a.b", "a.b.c", "b", "ab", "c"]),
)
def test_any_right_is_allows_of_some_action(grants: list[dict[str, Any]], topic: str) -> None:
    checked = G.check_grants(grants)
    assert G.any_right(checked, topic) is any(G.allows(checked, a, topic) for a in G.ACTIONS)


def test_patterns_lists_the_patterns_of_one_action_sorted_and_unique() -> None:
    grants = G.check_grants(
        [
            {"topics": "orders.*", "actions": ["consume"]},
            {"topics": "audit", "actions": ["consume", "publish"]},
            {"topics": "orders.*", "actions": ["consume"]},
            {"topics": "*", "actions": ["admin"]},
        ]
    )
    assert G.patterns(grants, "consume") == ["audit", "orders.*"]
    assert G.patterns(grants, "publish") == ["audit"]
    with pytest.raises(ValueError, match="action"):
        G.patterns(grants, "read")
