"""Validation of command fields and of topic / group configuration.

Pure functions that either return a clean value or raise ``InvalidArgument`` / ``InvalidName``
naming the field. The state machine calls them before it mutates anything, so a bad command
changes nothing on any replica.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from raftq.cluster.errors import GroupExists, InvalidArgument, InvalidName

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
TOKEN_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")  # no ".": it ends the id in rq_<id>.<secret>
DEFAULT_GROUP = "default"  # a new topic's group unless its groups are given
MAX_TIMEOUT_S = 12 * 3600
MAX_DELAY_S = 14 * 24 * 3600
MAX_BACKOFF_STEPS = 32
MAX_KEY_LEN = 256
MAX_ORDERING_KEY_LEN = 128
MAX_LABELS = 64
MAX_LABEL_KEY_LEN = 128
MAX_LABEL_VALUE_LEN = 2048
MAX_HEADERS = 64
MAX_HEADER_LEN = 4096
MAX_RECEIVE = 1000
# Every integer the state keeps must fit msgpack (64 bits) and JSON clients (53 bits).
MAX_INT = 2**53 - 1

TOPIC_DEFAULTS: dict[str, Any] = {
    "max_messages": 10_000_000,
    "max_bytes": 1 << 30,
    "max_message_bytes": 1 << 20,
    "overflow": "reject",
    "max_age": None,
    "dedup_window": 120,
}
GROUP_DEFAULTS: dict[str, Any] = {
    "visibility_timeout": 30,
    "max_attempts": 5,
    "backoff": [],
}
# Fields kept in a config only when they differ from their default (so that a config that
# does not use them is stored, snapshotted and answered by an older node exactly as before);
# ``config_out`` adds the defaults back.
TOPIC_OPTIONAL: dict[str, Any] = {"labels": {}}
GROUP_OPTIONAL: dict[str, Any] = {"ordered": False}
TOPIC_FIELDS = frozenset([*TOPIC_DEFAULTS, *TOPIC_OPTIONAL])
# Cluster-wide settings (the ``cluster_settings`` command); null means "no limit". Only the
# ones set are stored, so a state without any snapshots as before (see snapshot.SNAPSHOT_VERSION).
CLUSTER_SETTINGS: dict[str, Any] = {"max_retained_bytes": None}
GROUP_FIELDS = frozenset([*GROUP_DEFAULTS, "dead_letter_topic", *GROUP_OPTIONAL])


def name(value: Any, field: str) -> str:
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise InvalidName(
            f"{field} must match [A-Za-z0-9][A-Za-z0-9._-]{{0,127}}, got {value!r}",
            field=field,
            name=value if isinstance(value, str) else repr(value),
        )
    return value


def token_id(value: Any, field: str = "id") -> str:
    if not isinstance(value, str) or not TOKEN_ID_RE.fullmatch(value):
        raise InvalidArgument(f"{field} must match [A-Za-z0-9_-]{{1,64}}", field=field)
    return value


def boolean(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{field} must be true or false", field=field)
    return value


def fixed_bytes(value: Any, field: str, size: int) -> bytes:
    if not isinstance(value, bytes) or len(value) != size:
        raise InvalidArgument(f"{field} must be exactly {size} bytes", field=field)
    return value


def integer(value: Any, field: str, lo: int, hi: int = MAX_INT) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{field} must be an integer", field=field)
    if value < lo or value > hi:
        raise InvalidArgument(f"{field} must be between {lo} and {hi}, got {value}", field=field)
    return value


def seconds_ms(value: Any, field: str, lo: float, hi: float) -> int:
    """A duration given in seconds (int or float), returned in whole milliseconds."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise InvalidArgument(f"{field} must be a number of seconds", field=field)
    if value < lo or value > hi:
        raise InvalidArgument(f"{field} must be between {lo} and {hi} seconds", field=field)
    return round(value * 1000)


def string(value: Any, field: str, max_len: int) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"{field} must be a string", field=field)
    if len(value) > max_len:
        raise InvalidArgument(f"{field} is longer than {max_len} characters", field=field)
    return value


def headers(value: Any, field: str = "headers") -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidArgument(f"{field} must be a map of string to string", field=field)
    if len(value) > MAX_HEADERS:
        raise InvalidArgument(f"{field} has more than {MAX_HEADERS} entries", field=field)
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise InvalidArgument(f"{field} must be a map of string to string", field=field)
        if len(k) > MAX_HEADER_LEN or len(v) > MAX_HEADER_LEN:
            raise InvalidArgument(f"{field} entry longer than {MAX_HEADER_LEN}", field=field)
    return value or None


def ordering_key(value: Any, field: str = "ordering_key") -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_ORDERING_KEY_LEN:
        raise InvalidArgument(
            f"{field} must be a string of 1 to {MAX_ORDERING_KEY_LEN} characters", field=field
        )
    return value


def labels(value: Any, field: str = "labels") -> dict[str, str]:
    """A topic's labels: a map of string to string, a copy."""
    if not isinstance(value, Mapping):
        raise InvalidArgument(f"{field} must be a map of string to string", field=field)
    if len(value) > MAX_LABELS:
        raise InvalidArgument(f"{field} has more than {MAX_LABELS} entries", field=field)
    for k, x in value.items():
        if not isinstance(k, str) or not 1 <= len(k) <= MAX_LABEL_KEY_LEN:
            raise InvalidArgument(
                f"{field}: a key must be a string of 1 to {MAX_LABEL_KEY_LEN} characters, "
                f"got {str(k)[:140]!r}",
                field=field,
            )
        if not isinstance(x, str) or len(x) > MAX_LABEL_VALUE_LEN:
            raise InvalidArgument(
                f"{field}[{k!r}] must be a string of at most {MAX_LABEL_VALUE_LEN} characters",
                field=field,
            )
    return dict(value)


def config_out(cfg: Mapping[str, Any], optional: Mapping[str, Any]) -> dict[str, Any]:
    """A stored config as answered: a copy, with the defaults of the optional fields."""
    out = dict(cfg)
    for k, default in optional.items():
        x = out.get(k, default)
        out[k] = dict(x) if isinstance(x, dict) else x
    if "backoff" in out:
        out["backoff"] = list(out["backoff"])
    return out


def _drop_defaults(out: dict[str, Any], optional: Mapping[str, Any]) -> None:
    for k, default in optional.items():
        if k in out and out[k] == default:
            del out[k]


def mapping(value: Any, field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidArgument(f"{field} must be a map", field=field)
    return value


def unknown(cfg: Mapping[str, Any], allowed: frozenset[str], field: str) -> None:
    """Refuse keys of ``cfg`` not in ``allowed``, naming the first (``field`` names ``cfg``)."""
    extra = sorted(str(k) for k in cfg if k not in allowed)
    if extra:
        raise InvalidArgument(f"unknown {field} field(s): {', '.join(extra)}", field=extra[0])


def cluster_settings(cfg: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``cfg`` over the current settings ``base``; only the ones set (not null) stay."""
    unknown(cfg, frozenset(CLUSTER_SETTINGS), "cluster settings")
    out = {**base, **cfg}
    if out.get("max_retained_bytes") is not None:
        integer(out["max_retained_bytes"], "max_retained_bytes", 0)
    return {k: out[k] for k in CLUSTER_SETTINGS if out.get(k) is not None}


def topic_config(cfg: Mapping[str, Any], base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Merge ``cfg`` over ``base`` (or the defaults) and validate the result."""
    unknown(cfg, TOPIC_FIELDS, "topic config")
    out = dict(base if base is not None else TOPIC_DEFAULTS)
    out.update(cfg)
    for f in ("max_messages", "max_bytes"):
        if out[f] is not None:
            integer(out[f], f, 1)
    integer(out["max_message_bytes"], "max_message_bytes", 1, 64 << 20)
    if out["max_bytes"] is not None and out["max_message_bytes"] > out["max_bytes"]:
        raise InvalidArgument(
            "max_message_bytes must not exceed max_bytes", field="max_message_bytes"
        )
    if out["overflow"] not in ("reject", "drop_oldest"):
        raise InvalidArgument("overflow must be 'reject' or 'drop_oldest'", field="overflow")
    if out["max_age"] is not None:
        seconds_ms(out["max_age"], "max_age", 0.001, 10 * 365 * 86400)
    seconds_ms(out["dedup_window"], "dedup_window", 0, 7 * 86400)
    if "labels" in out:
        out["labels"] = labels(out["labels"])
    _drop_defaults(out, TOPIC_OPTIONAL)
    return out


def default_dead_letter_topic(topic: str) -> str:
    """Where a new group of ``topic`` dead-letters unless its config says otherwise."""
    # Cut so that the longest valid topic name still has a valid dead-letter topic.
    dlq = f"{topic[:124]}.dlq"
    # (a 128-character name ending in .dlq would be its own dead-letter topic)
    return dlq if dlq != topic else f"{topic[:123]}-.dlq"


def group_config(
    topic: str, cfg: Mapping[str, Any], base: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    unknown(cfg, GROUP_FIELDS, "group config")
    out = dict(base if base is not None else GROUP_DEFAULTS)
    if base is None:
        out["dead_letter_topic"] = default_dead_letter_topic(topic)
    out.update(cfg)
    seconds_ms(out["visibility_timeout"], "visibility_timeout", 0.001, MAX_TIMEOUT_S)
    integer(out["max_attempts"], "max_attempts", 0, 1_000_000)
    backoff = out["backoff"]
    if not isinstance(backoff, list | tuple) or len(backoff) > MAX_BACKOFF_STEPS:
        raise InvalidArgument(
            f"backoff must be a list of at most {MAX_BACKOFF_STEPS} durations", field="backoff"
        )
    for step in backoff:
        seconds_ms(step, "backoff", 0, MAX_TIMEOUT_S)
    out["backoff"] = list(backoff)
    dlq = out["dead_letter_topic"]
    if dlq is not None:
        name(dlq, "dead_letter_topic")
        if dlq == topic:
            raise InvalidArgument(
                "dead_letter_topic must differ from the topic", field="dead_letter_topic"
            )
    if "ordered" in out:
        boolean(out["ordered"], "ordered")
    _drop_defaults(out, GROUP_OPTIONAL)
    return out


def topic_spec(
    topic: str, cmd: Mapping[str, Any]
) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]:
    """A create_topic command's config and groups (name, config), validated."""
    cfg = cmd.get("config")
    config = topic_config({} if cfg is None else mapping(cfg, "config"))
    groups_spec = cmd.get("groups")
    if groups_spec is None:
        groups_spec = [{"group": DEFAULT_GROUP}]
    if not isinstance(groups_spec, list):
        raise InvalidArgument("groups must be a list", field="groups")
    groups: list[tuple[str, dict[str, Any]]] = []
    for spec in groups_spec:
        spec = mapping(spec, "groups[]")
        gname = name(spec.get("group"), "group")
        if any(gname == n for n, _ in groups):
            raise GroupExists(f"group {gname!r} given twice", topic=topic, group=gname)
        gcfg = spec.get("config")
        groups.append((gname, group_config(topic, {} if gcfg is None else mapping(gcfg, "config"))))
    return config, groups
