"""SQS queues as raftq topics (pure): names, URLs and ARNs, and queue attributes <-> topic and
group configuration.

A queue is a topic with its ``default`` group. What SQS and raftq share maps onto config:
VisibilityTimeout = the group's ``visibility_timeout``; RedrivePolicy = ``max_attempts``
(maxReceiveCount; 0 without a policy: unlimited) and ``dead_letter_topic``;
MessageRetentionPeriod = ``max_age``; MaximumMessageSize = ``max_message_bytes``; a FIFO queue's
group is ``ordered``. What only SQS has (DelaySeconds, ReceiveMessageWaitTimeSeconds,
RedriveAllowPolicy, FifoQueue, ContentBasedDeduplication, Policy...) is kept in the topic's
``labels`` under ``aws:sqs:<Name>``; a queue's tags are its other labels (AWS reserves the
``aws:`` prefix for itself, so no tag can collide).
"""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Mapping
from typing import Any

from raftq.node.sqs.wire import SqsError, invalid

ACCOUNT = "000000000000"  # the one account a raftq cluster answers as
GROUP = "default"
ATTR_LABEL = "aws:sqs:"
FIFO_SUFFIX = ".fifo"
FIFO_DEDUP_WINDOW_S = 300
DEFAULT_RETENTION_S = 345_600
DEFAULT_MAX_SIZE = 262_144
MAX_MESSAGE_SIZE = 1_048_576
_QUEUE_NAME = re.compile(r"[A-Za-z0-9_-]{1,80}")

# Settable attributes: name -> (lo, hi) for integers, or None (checked by the code below).
INT_ATTRS = {
    "DelaySeconds": (0, 900),
    "MaximumMessageSize": (1024, MAX_MESSAGE_SIZE),
    "MessageRetentionPeriod": (60, 1_209_600),
    "ReceiveMessageWaitTimeSeconds": (0, 20),
    "VisibilityTimeout": (0, 43_200),
    "KmsDataKeyReusePeriodSeconds": (60, 86_400),
}
BOOL_ATTRS = ("ContentBasedDeduplication", "SqsManagedSseEnabled", "FifoQueue")
TEXT_ATTRS = (
    "Policy", "RedrivePolicy", "RedriveAllowPolicy", "KmsMasterKeyId", "DeduplicationScope",
    "FifoThroughputLimit",
)  # fmt: skip
SETTABLE = frozenset([*INT_ATTRS, *BOOL_ATTRS, *TEXT_ATTRS])
READ_ONLY = (
    "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed", "CreatedTimestamp", "LastModifiedTimestamp",
    "QueueArn",
)  # fmt: skip
ALL_ATTRS = frozenset([*SETTABLE, *READ_ONLY])
# Kept as labels (the rest is topic / group config).
LABEL_ATTRS = frozenset(SETTABLE - {"VisibilityTimeout", "MaximumMessageSize",
                                    "MessageRetentionPeriod", "RedrivePolicy"})  # fmt: skip


def url(endpoint: str, name: str) -> str:
    return f"{endpoint}/{ACCOUNT}/{name}"


def arn(region: str, name: str) -> str:
    return f"arn:aws:sqs:{region}:{ACCOUNT}:{name}"


def name_from_url(queue_url: Any) -> str:
    """The queue a QueueUrl names (its last path segment; the host is not checked: a client
    may reach the cluster through any node or name)."""
    if not isinstance(queue_url, str) or not queue_url:
        raise SqsError("MissingParameter", "The request must contain the parameter QueueUrl.")
    path = urllib.parse.urlparse(queue_url).path if "://" in queue_url else queue_url
    parts = [p for p in path.split("/") if p]
    if not parts:
        raise SqsError("InvalidAddress", f"The address {queue_url} is not valid for this endpoint.")
    return urllib.parse.unquote(parts[-1])


def name_from_arn(value: Any, field: str) -> str:
    parts = value.split(":") if isinstance(value, str) else []
    if len(parts) != 6 or parts[:3] != ["arn", "aws", "sqs"] or not parts[5]:
        raise invalid(f"Value {value} for parameter {field} is invalid. Reason: not an SQS ARN.")
    return parts[5]


def check_new_name(name: Any, fifo: bool) -> str:
    """CreateQueue's QueueName: SQS's rules, and raftq's (a letter or digit first)."""
    if not isinstance(name, str) or not name:
        raise SqsError("MissingParameter", "The request must contain the parameter QueueName.")
    base = name[: -len(FIFO_SUFFIX)] if name.endswith(FIFO_SUFFIX) else name
    if not _QUEUE_NAME.fullmatch(base) or len(name) > 80:
        raise invalid(
            "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length"
        )
    if not name[0].isalnum():
        raise invalid(f"queue name {name!r}: raftq queue names start with a letter or digit")
    if name.endswith(FIFO_SUFFIX) != fifo:
        raise invalid(
            "The name of a FIFO queue can only include alphanumeric characters, hyphens, or"
            " underscores, must end with .fifo suffix and be 1 to 80 in length"
            if fifo
            else "FifoQueue must be true for a queue whose name ends in .fifo"
        )
    return name


def _int(name: str, value: Any) -> int:
    lo, hi = INT_ATTRS[name]
    text = str(value).strip()
    if not re.fullmatch(r"-?[0-9]{1,12}", text) or not lo <= int(text) <= hi:
        raise SqsError(
            "InvalidAttributeValue",
            f"Invalid value for the parameter {name}. Reason: must be an integer from {lo} to"
            f" {hi}.",
        )
    return int(text)


def _bool(name: str, value: Any) -> bool:
    text = str(value).strip().lower()
    if text not in ("true", "false"):
        raise SqsError("InvalidAttributeValue", f"Invalid value for the parameter {name}.")
    return text == "true"


def redrive_policy(value: str) -> tuple[str, int] | None:
    """A RedrivePolicy's (dead-letter queue name, maxReceiveCount); None for "" (none)."""
    if value.strip() in ("", "{}"):
        return None
    try:
        obj = json.loads(value)
    except ValueError:
        raise SqsError(
            "InvalidAttributeValue", "Invalid value for the parameter RedrivePolicy: not JSON"
        ) from None
    if not isinstance(obj, dict) or "deadLetterTargetArn" not in obj:
        raise SqsError(
            "InvalidAttributeValue",
            "Value for parameter RedrivePolicy is invalid. Reason: Redrive policy does not"
            " contain mandatory attribute: deadLetterTargetArn.",
        )
    count = obj.get("maxReceiveCount")
    text = str(count)
    if count is None or not text.isdigit() or not 1 <= int(text) <= 1000:
        raise SqsError(
            "InvalidAttributeValue",
            "Value for parameter RedrivePolicy is invalid. Reason: Invalid value for"
            " maxReceiveCount: must be an integer from 1 to 1000.",
        )
    return name_from_arn(obj["deadLetterTargetArn"], "RedrivePolicy"), int(text)


def parse_attributes(attrs: Any, creating: bool) -> dict[str, Any]:
    """Checked queue attributes (names and values); values normalized to their kind."""
    if attrs is None:
        return {}
    if not isinstance(attrs, dict):
        raise invalid("Attributes must be a map of attribute name to value")
    out: dict[str, Any] = {}
    for k, v in attrs.items():
        if k not in SETTABLE:
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {k}.")
        if k == "FifoQueue" and not creating:
            raise SqsError("InvalidAttributeName", "FifoQueue can be set only by CreateQueue.")
        if not isinstance(v, str | int):
            raise SqsError("InvalidAttributeValue", f"Invalid value for the parameter {k}.")
        if k in INT_ATTRS:
            out[k] = _int(k, v)
        elif k in BOOL_ATTRS:
            out[k] = _bool(k, v)
        else:
            out[k] = str(v)
            if k == "RedrivePolicy":
                redrive_policy(out[k])  # (checked now; resolved by the caller)
    return out


def to_config(
    attrs: Mapping[str, Any], labels: Mapping[str, str], fifo: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Topic config and group config changes for checked attributes (``parse_attributes``),
    the labels given being the topic's current ones (tags included)."""
    topic: dict[str, Any] = {}
    group: dict[str, Any] = {}
    new_labels = dict(labels)
    for k, v in attrs.items():
        if k == "VisibilityTimeout":
            group["visibility_timeout"] = v or 0.001  # (0: visible again at once)
        elif k == "MaximumMessageSize":
            topic["max_message_bytes"] = v
        elif k == "MessageRetentionPeriod":
            topic["max_age"] = v
        elif k == "RedrivePolicy":
            policy = redrive_policy(v)
            group["dead_letter_topic"] = policy[0] if policy else None
            group["max_attempts"] = policy[1] if policy else 0
        elif k in BOOL_ATTRS:
            new_labels[ATTR_LABEL + k] = "true" if v else "false"
        else:
            new_labels[ATTR_LABEL + k] = str(v)
    if fifo:
        group["ordered"] = True
    if new_labels != dict(labels):
        topic["labels"] = new_labels
    return topic, group


def new_queue_config(attrs: Mapping[str, Any], tags: Mapping[str, str], fifo: bool) -> Any:
    """The create_topic command's config and group config of a new queue."""
    base_topic: dict[str, Any] = {
        "max_age": DEFAULT_RETENTION_S,
        "max_message_bytes": DEFAULT_MAX_SIZE,
    }
    if fifo:
        base_topic["dedup_window"] = FIFO_DEDUP_WINDOW_S
    base_group: dict[str, Any] = {"max_attempts": 0, "dead_letter_topic": None}
    topic, group = to_config(attrs, {}, fifo)
    if tags:
        topic["labels"] = {**topic.get("labels", {}), **tags}
    return {**base_topic, **topic}, {**base_group, **group}


def is_fifo(labels: Mapping[str, str], name: str) -> bool:
    return labels.get(ATTR_LABEL + "FifoQueue") == "true" or name.endswith(FIFO_SUFFIX)


def label_attr(labels: Mapping[str, str], name: str, default: str) -> str:
    return labels.get(ATTR_LABEL + name, default)


def tags_of(labels: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if not k.startswith("aws:")}


def attributes(stats: Mapping[str, Any], region: str, names: set[str] | None) -> dict[str, str]:
    """A queue's attributes from its topic stats (``names`` None: all of them)."""
    name = stats["topic"]
    cfg = stats["config"]
    labels: dict[str, str] = cfg.get("labels") or {}
    group = next((g for g in stats["groups"] if g["group"] == GROUP), None)
    if group is None:
        raise SqsError("QueueDoesNotExist", "The specified queue does not exist.")
    gcfg = group["config"]
    created = str(stats["created_at"] // 1000)
    out: dict[str, str] = {
        "ApproximateNumberOfMessages": str(group["pending"]),
        "ApproximateNumberOfMessagesNotVisible": str(group["in_flight"]),
        "ApproximateNumberOfMessagesDelayed": str(group["delayed"]),
        "CreatedTimestamp": created,
        "LastModifiedTimestamp": label_attr(labels, "LastModifiedTimestamp", created),
        "QueueArn": arn(region, name),
        "VisibilityTimeout": str(int(gcfg["visibility_timeout"])),
        "MaximumMessageSize": str(cfg["max_message_bytes"]),
        "MessageRetentionPeriod": str(
            int(cfg["max_age"]) if cfg.get("max_age") is not None else 1_209_600
        ),
        "DelaySeconds": label_attr(labels, "DelaySeconds", "0"),
        "ReceiveMessageWaitTimeSeconds": label_attr(labels, "ReceiveMessageWaitTimeSeconds", "0"),
        "SqsManagedSseEnabled": label_attr(labels, "SqsManagedSseEnabled", "false"),
    }
    if gcfg.get("dead_letter_topic") and gcfg.get("max_attempts"):
        out["RedrivePolicy"] = json.dumps(
            {
                "deadLetterTargetArn": arn(region, gcfg["dead_letter_topic"]),
                "maxReceiveCount": gcfg["max_attempts"],
            },
            separators=(",", ":"),
        )
    for k in ("RedriveAllowPolicy", "Policy", "KmsMasterKeyId", "KmsDataKeyReusePeriodSeconds"):
        if ATTR_LABEL + k in labels:
            out[k] = labels[ATTR_LABEL + k]
    if is_fifo(labels, name):
        out["FifoQueue"] = "true"
        out["ContentBasedDeduplication"] = label_attr(labels, "ContentBasedDeduplication", "false")
        out["DeduplicationScope"] = label_attr(labels, "DeduplicationScope", "queue")
        out["FifoThroughputLimit"] = label_attr(labels, "FifoThroughputLimit", "perQueue")
    if names is None:
        return out
    return {k: v for k, v in out.items() if k in names}


def attribute_names(given: Any) -> set[str] | None:
    """AttributeNames of GetQueueAttributes: None for All; unknown names refused."""
    if given is None:
        return set()
    if not isinstance(given, list) or not all(isinstance(x, str) for x in given):
        raise invalid("AttributeNames must be a list of attribute names")
    if "All" in given:
        return None
    for x in given:
        if x not in ALL_ATTRS:
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {x}.")
    return set(given)
