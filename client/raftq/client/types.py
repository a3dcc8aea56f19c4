"""Typed answers of the client calls: ``TypedDict``s, so a result is still the plain dict the
server sent (``res["pending"]`` keeps working) and a type checker knows its keys.

Only the keys every server version sends are required; the others (``NotRequired``) appear
depending on the call or the server version. Counters come as ``<name>_total`` keys (e.g.
``acked_total``) and are not listed: read them with ``res.get(...)``. Nothing here is checked
at run time.
"""

from typing import Any, NotRequired, TypedDict

__all__ = [
    "ClusterInfo",
    "Created",
    "Deleted",
    "GroupConfigured",
    "GroupInfo",
    "Member",
    "Membership",
    "PeekedMessage",
    "Purged",
    "Redriven",
    "Released",
    "SettleError",
    "SettleResult",
    "TokenInfo",
    "TopicConfigured",
    "TopicInfo",
    "TopicsPage",
]


class Created(TypedDict):
    """``create_topic`` / ``create_group``: ``created`` is False when it existed
    (``if_not_exists``)."""

    topic: str
    created: bool
    group: NotRequired[str]


class Deleted(TypedDict):
    topic: str
    deleted: bool
    group: NotRequired[str]


class Purged(TypedDict):
    topic: str
    purged: int
    group: NotRequired[str]


class TopicConfigured(TypedDict):
    topic: str
    config: dict[str, Any]


class GroupConfigured(TypedDict):
    topic: str
    group: str
    config: dict[str, Any]


class GroupInfo(TypedDict):
    """A consumer group's state (``group``, and each of ``TopicInfo["groups"]``)."""

    group: str
    pending: int
    delayed: int
    in_flight: int
    config: NotRequired[dict[str, Any]]
    consumers: NotRequired[int]
    oldest_age_ms: NotRequired[int | None]


class TopicInfo(TypedDict):
    """``topic``: its config, sizes and groups."""

    topic: str
    messages: int
    bytes: int
    groups: list[GroupInfo]
    config: NotRequired[dict[str, Any]]
    created_at: NotRequired[int]
    first_seq: NotRequired[int | None]
    last_seq: NotRequired[int]
    oldest_age_ms: NotRequired[int | None]


class TopicsPage(TypedDict):
    topics: list[str]
    next: NotRequired[str | None]


class Member(TypedDict, total=False):
    raft: str
    api: str | None
    self: bool
    answers: bool
    observed_role: str  # (set by the CLI's status: what it saw, not what the node says)
    # role, term, commit_index, applied_index, rss_bytes, fsyncs, fsync_seconds, snapshots,
    # last_snapshot_seconds, last_snapshot_at: from the member's /healthz when it answers (the
    # web console's)
    figures: dict[str, Any]


class DiskInfo(TypedDict):
    """A node's data disk: publishes are refused (``StorageFull``) while ``ok`` is false."""

    free_bytes: int
    min_free_bytes: int
    ok: bool


class StorageInfo(TypedDict):
    """``cluster()["storage"]``: payload bytes retained vs the cluster's limit, this node's disk."""

    retained_bytes: int
    max_retained_bytes: int | None
    disk: NotRequired[DiskInfo]


class ClusterInfo(TypedDict):
    """``cluster``: this node's view (``leader_api`` is the leader's HTTP address)."""

    node: str
    role: str
    members: dict[str, Member]
    leader: NotRequired[str | None]
    leader_api: NotRequired[str | None]
    term: NotRequired[int]
    commit_index: NotRequired[int]
    applied_index: NotRequired[int]
    last_log_index: NotRequired[int]  # (choose the survivor to force by these: README)
    last_log_term: NotRequired[int]
    running: NotRequired[bool]
    error: NotRequired[str]
    storage: NotRequired[StorageInfo]
    digest: NotRequired[str]
    you: NotRequired[dict[str, Any]]  # the caller: name, cluster, all, grants


class Settings(TypedDict):
    max_retained_bytes: int | None


class ClusterSettings(TypedDict):
    """``cluster_settings``: the settings and the payload bytes retained over every topic."""

    settings: Settings
    retained_bytes: int


class Membership(TypedDict):
    members: list[str]
    added: NotRequired[str]
    removed: NotRequired[str]


class SettleError(TypedDict):
    receipt: str
    code: str
    message: str
    details: NotRequired[dict[str, Any]]


class SettleResult(TypedDict):
    """``ack`` / ``nack`` / ``extend`` / ``term`` by receipts: how many took, and why the
    others did not (the client raises for a batch of one)."""

    errors: list[SettleError]
    acked: NotRequired[int]
    nacked: NotRequired[int]
    extended: NotRequired[int]
    terminated: NotRequired[int]
    dead_lettered: NotRequired[int]
    deadline: NotRequired[int | None]


class Released(TypedDict):
    released: int
    consumer: NotRequired[str]
    dead_lettered: NotRequired[int]


class PeekedMessage(TypedDict):
    seq: int
    payload: bytes
    headers: NotRequired[dict[str, str]]
    published_at: NotRequired[int]
    ordering_key: NotRequired[str]


class Redriven(TypedDict):
    """``redrive`` of a dead-letter topic: how many went back to their topics."""

    redriven: int
    topic: NotRequired[str]
    skipped: NotRequired[int]


class TokenInfo(TypedDict):
    """A token (``token`` holds its secret in ``create_token``'s answer only)."""

    id: str
    name: str
    token: NotRequired[str]
    grants: NotRequired[list[dict[str, Any]]]
    cluster: NotRequired[bool]
    expires_at: NotRequired[int | None]
    disabled: NotRequired[bool]
    created_at: NotRequired[int]
