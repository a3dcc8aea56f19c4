"""Per-topic permissions of API tokens: topic patterns and the grants built from them.

A pattern is ``*`` (every topic), a topic name (exactly that topic), or ``<name>.*`` (every
topic whose name starts with ``<name>.``, but not ``<name>`` itself). Nothing else: no regexes,
no ``*`` anywhere else, so what a grant covers can be read off it. A grant is
``{"topics": pattern, "actions": [...]}``; the actions are independent of each other (``admin``
does not imply ``publish``) and what each allows is the node's business.

Pure functions, standard library only: the state machine validates grants with them, the node
checks requests with them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from raftq.cluster.errors import InvalidArgument
from raftq.cluster.validate import NAME_RE

ACTIONS = ("publish", "consume", "admin")
MAX_GRANTS = 64  # per token
MAX_PATTERNS = 64  # per list of patterns in a command (release's topics)
GRANT_FIELDS = frozenset(["topics", "actions"])


def check_pattern(value: Any, field: str) -> str:
    """``value`` if it is a topic pattern, else InvalidArgument naming ``field``."""
    if isinstance(value, str) and (
        value == "*"
        or NAME_RE.fullmatch(value)
        or (value.endswith(".*") and NAME_RE.fullmatch(value[:-2]))
    ):
        return value
    raise InvalidArgument(
        f"{field} must be '*', a topic name or '<topic name>.*', got {value!r}", field=field
    )


def check_patterns(value: Any, field: str) -> list[str]:
    """A list of at most MAX_PATTERNS patterns (a copy), else InvalidArgument naming ``field``."""
    if not isinstance(value, list) or len(value) > MAX_PATTERNS:
        raise InvalidArgument(
            f"{field} must be a list of at most {MAX_PATTERNS} topic patterns", field=field
        )
    return [check_pattern(p, field) for p in value]


def matches(pattern: str, topic: str) -> bool:
    """Does a (checked) pattern cover ``topic``?"""
    if pattern == "*":
        return True
    if pattern.endswith(".*"):
        return topic.startswith(pattern[:-1])
    return topic == pattern


def check_grants(value: Any) -> list[dict[str, Any]]:
    """A fresh, normalized copy of a grant list (actions sorted and unique), or
    InvalidArgument naming the field."""
    if not isinstance(value, list) or len(value) > MAX_GRANTS:
        raise InvalidArgument(f"grants must be a list of at most {MAX_GRANTS}", field="grants")
    out: list[dict[str, Any]] = []
    for g in value:
        if not isinstance(g, Mapping):
            raise InvalidArgument("grants[] must be a map", field="grants[]")
        extra = sorted(str(k) for k in g if k not in GRANT_FIELDS)
        if extra:
            raise InvalidArgument(
                f"unknown grant field(s): {', '.join(extra)}", field=f"grants[].{extra[0]}"
            )
        topics = check_pattern(g.get("topics"), "grants[].topics")
        actions = g.get("actions")
        if (
            not isinstance(actions, list)
            or not actions
            or not all(isinstance(a, str) and a in ACTIONS for a in actions)
        ):
            raise InvalidArgument(
                f"grants[].actions must be a non-empty list of {', '.join(ACTIONS)}",
                field="grants[].actions",
            )
        out.append({"topics": topics, "actions": sorted(dict.fromkeys(actions))})
    return out


def _action(action: str) -> str:
    if action not in ACTIONS:  # a caller's bug, not a request to refuse
        raise ValueError(f"unknown action {action!r}")
    return action


def allows(grants: Iterable[Mapping[str, Any]], action: str, topic: str) -> bool:
    """Does some grant allow ``action`` on ``topic``?"""
    _action(action)
    return any(action in g["actions"] and matches(g["topics"], topic) for g in grants)


def any_right(grants: Iterable[Mapping[str, Any]], topic: str) -> bool:
    """Does some grant allow any action on ``topic`` (may the token see that it exists)?"""
    return any(g["actions"] and matches(g["topics"], topic) for g in grants)


def patterns(grants: Iterable[Mapping[str, Any]], action: str) -> list[str]:
    """The patterns ``action`` is granted on, sorted and unique: e.g. the consume patterns
    to pass as release's ``topics``."""
    _action(action)
    return sorted({g["topics"] for g in grants if action in g["actions"]})
