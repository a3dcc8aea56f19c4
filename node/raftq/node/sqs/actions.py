"""The SQS actions, each a few calls of the broker service (``BrokerService.call``,
``read_latest``, ``long_poll``) with commands built as the native API builds them
(``raftq.node.commands``), so the same rules hold whichever API a client speaks.

An action sees ``Ctx`` (the service, who calls, the region and the endpoint the client used)
and the request's JSON-shaped parameters, and returns the JSON-shaped result; ``ApiError``
codes map to SQS errors in ``sqs_error``. ``LeaderLost`` propagates: the caller forwards the
request to the leader (nothing was applied).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from raftq.cluster import validate
from raftq.cluster.errors import BrokerError
from raftq.node import commands
from raftq.node.auth import ADMIN, CONSUME, PUBLISH, TOPIC, Principal
from raftq.node.errors import ApiError
from raftq.node.service import BrokerService
from raftq.node.sqs import message as sqsmsg
from raftq.node.sqs import queues as q
from raftq.node.sqs.wire import SqsError, invalid, missing

MAX_BATCH = 10
MAX_BATCH_BYTES = q.MAX_MESSAGE_SIZE
MAX_RECEIVE = 10
MAX_WAIT_S = 20
_BATCH_ID = re.compile(r"[A-Za-z0-9_-]{1,80}")
SYSTEM_ATTRIBUTE_NAMES = frozenset(
    [
        "All", "SenderId", "SentTimestamp", "ApproximateReceiveCount",
        "ApproximateFirstReceiveTimestamp", "SequenceNumber", "MessageDeduplicationId",
        "MessageGroupId", "AWSTraceHeader", "DeadLetterQueueSourceArn",
    ]
)  # fmt: skip
MOVE_TASK_LABEL = q.ATTR_LABEL + "MoveTask"
NOT_A_QUEUE = "The specified queue does not exist."


@dataclass
class Ctx:
    svc: BrokerService
    who: Principal
    region: str
    endpoint: str  # scheme://host[:port], as the client addressed this node
    access_key: str
    consumer: str = ""  # a ReceiveMessage's consumer id (set by the caller, which holds it)


Action = Callable[[Ctx, dict[str, Any]], Awaitable[dict[str, Any]]]


def sqs_error(e: ApiError) -> SqsError:
    """A native error as SQS says it."""
    code = e.code
    if code in ("topic_not_found", "group_not_found"):
        return SqsError("QueueDoesNotExist", NOT_A_QUEUE)
    if code == "forbidden":
        return SqsError("AccessDeniedException", f"Access to the resource is denied: {e.message}")
    if code == "unauthenticated":
        return SqsError("InvalidClientTokenId", e.message)
    if code == "topic_exists":
        return SqsError("QueueNameExists", "A queue already exists with the same name")
    if code in ("receipt_invalid", "receipt_error"):
        return SqsError("ReceiptHandleIsInvalid", e.message)
    if code == "receipt_stale":
        return SqsError("MessageNotInflight", "Message does not exist or is not available for"
                        " visibility timeout change.")  # fmt: skip
    if code == "topic_full":
        return SqsError("OverLimit", e.message, retry_after=e.retry_after)
    if code in ("entry_too_large", "body_too_large", "message_too_large"):
        return SqsError("BatchRequestTooLong" if code == "entry_too_large"
                        else "InvalidParameterValueException", e.message)  # fmt: skip
    if code in ("no_leader", "overloaded", "shutting_down", "removed_from_cluster",
                "outcome_unknown"):  # fmt: skip
        return SqsError("ServiceUnavailable", e.message, retry_after=e.retry_after or 1)
    if e.status < 500:
        return SqsError("InvalidParameterValueException", e.message)
    return SqsError("InternalFailure", e.message)


# ---------------------------------------------------------------------- helpers


def _int(params: dict[str, Any], name: str, lo: int, hi: int, default: int | None) -> int | None:
    value = params.get(name)
    if value is None:
        return default
    text = str(value).strip()
    if isinstance(value, bool) or not re.fullmatch(r"-?[0-9]{1,12}", text):
        raise invalid(f"Value {value} for parameter {name} is invalid. Reason: not an integer.")
    n = int(text)
    if not lo <= n <= hi:
        raise invalid(
            f"Value {n} for parameter {name} is invalid. Reason: Must be between {lo} and {hi},"
            " if provided."
        )
    return n


def _name(raw: str) -> str:
    """A queue name that cannot be a raftq topic names no queue."""
    if not validate.NAME_RE.fullmatch(raw):
        raise SqsError("QueueDoesNotExist", NOT_A_QUEUE)
    return raw


def _queue(params: dict[str, Any]) -> str:
    return _name(q.name_from_url(params.get("QueueUrl")))


async def _stats(ctx: Ctx, name: str, latest: bool = True) -> dict[str, Any]:
    """The queue's topic stats: a linearizable read, or (``latest`` False: for the config a
    command is built from, the command itself being the linearization point) this leader's
    own state, without the read barrier's round trip."""
    if latest:
        stats: dict[str, Any] = await ctx.svc.read_latest(lambda b: b.topic_stats(name))
    else:
        stats = ctx.svc.read(lambda b: b.topic_stats(name))
    if not any(g["group"] == q.GROUP for g in stats["groups"]):
        raise SqsError("QueueDoesNotExist", NOT_A_QUEUE)
    return stats


def _labels(stats: dict[str, Any]) -> dict[str, str]:
    return dict(stats["config"].get("labels") or {})


async def _dlq_exists(ctx: Ctx, dlq: str) -> None:
    try:
        await _stats(ctx, dlq)
    except (SqsError, ApiError) as e:
        if isinstance(e, ApiError) and e.code != "topic_not_found":
            raise
        raise invalid(
            "Value for parameter RedrivePolicy is invalid. Reason: Dead letter target does not"
            " exist."
        ) from None


# ---------------------------------------------------------------------- queues


async def create_queue(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    attrs = q.parse_attributes(p.get("Attributes"), creating=True)
    tags = p.get("tags") or p.get("Tags") or {}
    if not isinstance(tags, dict) or not all(isinstance(v, str) for v in tags.values()):
        raise invalid("tags must be a map of string to string")
    name = q.check_new_name(p.get("QueueName"), bool(attrs.get("FifoQueue")))
    fifo = name.endswith(q.FIFO_SUFFIX)
    if not fifo and ("ContentBasedDeduplication" in attrs or "DeduplicationScope" in attrs):
        raise SqsError("InvalidAttributeName", "Unknown Attribute ContentBasedDeduplication.")
    ctx.who.require(TOPIC, name)  # (an existing queue: any right on it)
    try:
        stats = await _stats(ctx, name)
    except (SqsError, ApiError) as e:
        if isinstance(e, ApiError) and e.code != "topic_not_found":
            raise
        stats = None
    if stats is not None:
        current = q.attributes(stats, ctx.region, None)
        for k, v in attrs.items():
            text = ("true" if v else "false") if isinstance(v, bool) else str(v)
            if k in current and current[k] != text and k != "RedrivePolicy":
                raise SqsError(
                    "QueueNameExists",
                    f"A queue already exists with the same name and a different value for"
                    f" attribute {k}",
                )
        return {"QueueUrl": q.url(ctx.endpoint, name)}
    ctx.who.require(ADMIN, name)
    if fifo:
        attrs["FifoQueue"] = True
    policy = q.redrive_policy(attrs["RedrivePolicy"]) if "RedrivePolicy" in attrs else None
    if policy is not None:
        ctx.who.require(ADMIN, policy[0])
        await _dlq_exists(ctx, policy[0])
    tcfg, gcfg = q.new_queue_config(attrs, tags, fifo)
    body = {
        "topic": name,
        "config": tcfg,
        "groups": [{"group": q.GROUP, "config": gcfg}],
        "if_not_exists": True,
    }
    await ctx.svc.call(commands.create_topic(body))
    return {"QueueUrl": q.url(ctx.endpoint, name)}


async def get_queue_url(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    raw = p.get("QueueName")
    if not isinstance(raw, str) or not raw:
        raise missing("QueueName")
    name = _name(raw)
    ctx.who.require(TOPIC, name)
    await _stats(ctx, name)
    return {"QueueUrl": q.url(ctx.endpoint, name)}


async def list_queues(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    prefix = p.get("QueueNamePrefix") or ""
    if not isinstance(prefix, str):
        raise invalid("QueueNamePrefix must be a string")
    limit = _int(p, "MaxResults", 1, 1000, None)
    after = ""
    token = p.get("NextToken")
    if token:
        try:
            after = base64.urlsafe_b64decode(str(token).encode()).decode()
        except (ValueError, UnicodeDecodeError):
            raise invalid("Invalid NextToken value.") from None
    names = sorted(await ctx.svc.read_latest(lambda b: b.list_topics()))
    page: list[str] = []
    more = False
    for name in names:
        if name <= after or not name.startswith(prefix) or not ctx.who.may(TOPIC, name):
            continue
        if len(page) == (limit or 1000):
            more = True
            break
        page.append(name)
    out: dict[str, Any] = {"QueueUrls": [q.url(ctx.endpoint, n) for n in page]}
    if more and limit is not None:
        out["NextToken"] = base64.urlsafe_b64encode(page[-1].encode()).decode()
    return out


async def delete_queue(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    name = _queue(p)
    ctx.who.require(ADMIN, name)
    await ctx.svc.call({"op": "delete_topic", "topic": name})
    return {}


async def purge_queue(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    name = _queue(p)
    ctx.who.require(ADMIN, name)
    await ctx.svc.call({"op": "purge", "topic": name})
    return {}


async def get_queue_attributes(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    name = _queue(p)
    ctx.who.require(TOPIC, name)
    names = q.attribute_names(p.get("AttributeNames"))
    stats = await _stats(ctx, name)
    attrs = q.attributes(stats, ctx.region, names)
    return {"Attributes": attrs} if attrs else {}


async def set_queue_attributes(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    name = _queue(p)
    ctx.who.require(ADMIN, name)
    if p.get("Attributes") is None:
        raise missing("Attributes")
    attrs = q.parse_attributes(p.get("Attributes"), creating=False)
    stats = await _stats(ctx, name)
    labels = _labels(stats)
    fifo = q.is_fifo(labels, name)
    if not fifo and "ContentBasedDeduplication" in attrs:
        raise SqsError("InvalidAttributeName", "Unknown Attribute ContentBasedDeduplication.")
    if "RedrivePolicy" in attrs:
        policy = q.redrive_policy(attrs["RedrivePolicy"])
        if policy is not None:
            if policy[0] == name:
                raise invalid("Value for parameter RedrivePolicy is invalid. Reason: a queue"
                              " cannot be its own dead-letter queue.")  # fmt: skip
            ctx.who.require(ADMIN, policy[0])
            await _dlq_exists(ctx, policy[0])
    # (the leader's clock, stamped into the command: LastModifiedTimestamp)
    attrs["LastModifiedTimestamp"] = int(time.time())
    tcfg, gcfg = q.to_config(attrs, labels, fifo=False)
    if gcfg:
        await ctx.svc.call(commands.update_group(name, q.GROUP, {"config": gcfg}))
    if tcfg:
        await ctx.svc.call(commands.update_topic(name, {"config": tcfg}))
    return {}


async def _set_labels(ctx: Ctx, name: str, change: Callable[[dict[str, str]], None]) -> None:
    stats = await _stats(ctx, name)
    labels = _labels(stats)
    new = dict(labels)
    change(new)
    if new != labels:
        await ctx.svc.call(commands.update_topic(name, {"config": {"labels": new}}))


async def tag_queue(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    name = _queue(p)
    ctx.who.require(ADMIN, name)
    tags = p.get("Tags")
    if not isinstance(tags, dict) or not tags:
        raise missing("Tags")
    for k, v in tags.items():
        if not isinstance(v, str) or not 1 <= len(k) <= 128 or len(v) > 256:
            raise invalid(f"Tag {k[:140]!r}: a key is 1-128 characters, a value at most 256")
        if k.startswith("aws:"):
            raise invalid(f"Tag {k!r}: the aws: prefix is reserved")
    await _set_labels(ctx, name, lambda labels: labels.update(tags))
    return {}


async def untag_queue(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    name = _queue(p)
    ctx.who.require(ADMIN, name)
    keys = p.get("TagKeys")
    if not isinstance(keys, list) or not keys:
        raise missing("TagKeys")

    def drop(labels: dict[str, str]) -> None:
        for k in keys:
            if isinstance(k, str) and not k.startswith("aws:"):
                labels.pop(k, None)

    await _set_labels(ctx, name, drop)
    return {}


async def list_queue_tags(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    name = _queue(p)
    ctx.who.require(TOPIC, name)
    tags = q.tags_of(_labels(await _stats(ctx, name)))
    return {"Tags": tags} if tags else {}


def _sources(b: Any, dlq: str) -> list[str]:
    """The queues whose RedrivePolicy names ``dlq`` (a read of every topic: rare calls)."""
    out = []
    for t in sorted(b.list_topics()):
        try:
            g = b.group_stats(t, q.GROUP)
        except BrokerError:  # (no default group: not a queue)
            continue
        if g["config"].get("dead_letter_topic") == dlq and g["config"].get("max_attempts"):
            out.append(t)
    return out


async def list_dead_letter_source_queues(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    name = _queue(p)
    ctx.who.require(TOPIC, name)
    await _stats(ctx, name)
    limit = _int(p, "MaxResults", 1, 1000, None)

    names = [n for n in await ctx.svc.read_latest(lambda b: _sources(b, name))
             if ctx.who.may(TOPIC, n)]  # fmt: skip
    after = ""
    if p.get("NextToken"):
        try:
            after = base64.urlsafe_b64decode(str(p["NextToken"]).encode()).decode()
        except (ValueError, UnicodeDecodeError):
            raise invalid("Invalid NextToken value.") from None
    names = [n for n in names if n > after]
    out: dict[str, Any] = {}
    if limit is not None and len(names) > limit:
        names = names[:limit]
        out["NextToken"] = base64.urlsafe_b64encode(names[-1].encode()).decode()
    out["queueUrls"] = [q.url(ctx.endpoint, n) for n in names]
    return out


# ---------------------------------------------------------------------- redrive


async def start_message_move_task(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    """Moves the dead letters of SourceArn back to the queues they came from, now (one
    ``redrive`` command per 100,000); the finished task is recorded on the dead-letter queue
    (a label) for ListMessageMoveTasks. Another DestinationArn is not supported."""
    if not p.get("SourceArn"):
        raise missing("SourceArn")
    dlq = q.name_from_arn(p["SourceArn"], "SourceArn")
    ctx.who.require(ADMIN, dlq)
    stats = await _stats(ctx, dlq)
    if p.get("DestinationArn"):
        dest = q.name_from_arn(p["DestinationArn"], "DestinationArn")
        if await ctx.svc.read_latest(lambda b: _sources(b, dlq)) != [dest]:
            raise SqsError(
                "UnsupportedOperation",
                "raftq moves dead letters back to the queues they came from only: omit"
                " DestinationArn, or name the one queue that dead-letters here",
            )
    _int(p, "MaxNumberOfMessagesPerSecond", 1, 500, None)
    to_move = next(g["pending"] for g in stats["groups"] if g["group"] == q.GROUP)
    started = int(time.time() * 1000)
    handle = base64.urlsafe_b64encode(
        hashlib.blake2b(f"{dlq}\0{started}".encode(), digest_size=12).digest()
    ).decode()
    moved = 0
    while True:
        res = await ctx.svc.call({"op": "redrive", "topic": dlq, "max": 100_000})
        moved += res["redriven"]
        if res["redriven"] < 100_000:
            break
    task = {
        "TaskHandle": handle,
        "Status": "COMPLETED",
        "SourceArn": q.arn(ctx.region, dlq),
        "ApproximateNumberOfMessagesMoved": moved,
        "ApproximateNumberOfMessagesToMove": to_move,
        "StartedTimestamp": started,
    }
    if p.get("DestinationArn"):
        task["DestinationArn"] = p["DestinationArn"]
    text = json.dumps(task, separators=(",", ":"))
    await _set_labels(ctx, dlq, lambda labels: labels.__setitem__(MOVE_TASK_LABEL, text))
    return {"TaskHandle": handle}


async def list_message_move_tasks(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    if not p.get("SourceArn"):
        raise missing("SourceArn")
    dlq = q.name_from_arn(p["SourceArn"], "SourceArn")
    ctx.who.require(TOPIC, dlq)
    _int(p, "MaxResults", 1, 10, None)
    labels = _labels(await _stats(ctx, dlq))
    text = labels.get(MOVE_TASK_LABEL)
    return {"Results": [json.loads(text)] if text else []}


async def cancel_message_move_task(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    raise SqsError(
        "ResourceNotFoundException",
        "raftq runs a message move task to its end when it starts: none is running",
    )


async def unsupported(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    raise SqsError(
        "UnsupportedOperation",
        "raftq grants rights with its tokens (raftq token ...), not with queue policies",
    )


# ---------------------------------------------------------------------- messages


async def _queue_for(ctx: Ctx, p: dict[str, Any], action: str) -> tuple[str, dict[str, Any]]:
    """The queue a message action names, the caller's right on it checked, and its stats."""
    name = _queue(p)
    ctx.who.require(action, name)
    return name, await _stats(ctx, name, latest=False)


def _message(
    entry: dict[str, Any], labels: dict[str, str], name: str, max_size: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One SendMessage(Batch) entry as a raftq message, and the answer's MD5s."""
    body = sqsmsg.check_body(entry.get("MessageBody"))
    attrs = sqsmsg.check_attributes(entry.get("MessageAttributes"))
    system = sqsmsg.check_attributes(entry.get("MessageSystemAttributes"), system=True)
    size = len(body.encode()) + sqsmsg.attributes_size(attrs)
    if size > max_size:
        raise invalid(
            f"One or more parameters are invalid. Reason: Message must be shorter than"
            f" {max_size} bytes."
        )
    fifo = q.is_fifo(labels, name)
    delay = _int(entry, "DelaySeconds", 0, 900, None)
    if fifo and delay is not None:
        raise invalid(
            "Value for parameter DelaySeconds is invalid. Reason: The request include parameter"
            " that is not valid for this queue type."
        )
    if delay is None:
        delay = int(q.label_attr(labels, "DelaySeconds", "0"))
    msg: dict[str, Any] = {"text": body}
    headers = sqsmsg.to_headers(attrs, system)
    group_id = entry.get("MessageGroupId")
    dedup_id = entry.get("MessageDeduplicationId")
    if fifo:
        if not isinstance(group_id, str) or not group_id:
            raise missing("MessageGroupId")
        if not re.fullmatch(r"[!-~]{1,128}", group_id):
            raise invalid("MessageGroupId can only include alphanumeric and punctuation"
                          " characters. 1 to 128 in length.")  # fmt: skip
        if dedup_id is None:
            if q.label_attr(labels, "ContentBasedDeduplication", "false") != "true":
                raise invalid(
                    "The queue should either have ContentBasedDeduplication enabled or"
                    " MessageDeduplicationId provided explicitly"
                )
            dedup_id = hashlib.sha256(body.encode()).hexdigest()
        if not isinstance(dedup_id, str) or not re.fullmatch(r"[!-~]{1,128}", dedup_id):
            raise invalid("MessageDeduplicationId can only include alphanumeric and punctuation"
                          " characters. 1 to 128 in length.")  # fmt: skip
        msg["key"] = dedup_id
        msg["ordering_key"] = group_id
        headers[sqsmsg.SYSTEM_HEADER + "MessageDeduplicationId"] = dedup_id
    elif dedup_id is not None:
        raise invalid(
            "Value for parameter MessageDeduplicationId is invalid. Reason: The"
            " request includes a parameter that is not valid for this queue type."
        )
    if headers:
        msg["headers"] = headers
    if delay:
        msg["delay"] = delay
    answer = {"MD5OfMessageBody": sqsmsg.md5_body(body)}
    if attrs:
        answer["MD5OfMessageAttributes"] = sqsmsg.md5_attributes(attrs)
    return msg, answer


def _published(
    name: str, fifo: bool, res: dict[str, Any], answer: dict[str, Any]
) -> dict[str, Any]:
    seq = res["seq"]
    out = {"MessageId": sqsmsg.message_id(name, seq), **answer}
    if fifo:
        out["SequenceNumber"] = f"{seq:020d}"
    return out


async def _publish(ctx: Ctx, name: str, msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    cmd, size = commands.publish(name, msgs, False)
    res = await ctx.svc.call(cmd, size)
    messages: list[dict[str, Any]] = res["messages"]
    return messages


async def send_message(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    name, stats = await _queue_for(ctx, p, PUBLISH)
    labels = _labels(stats)
    msg, answer = _message(p, labels, name, stats["config"]["max_message_bytes"])
    res = await _publish(ctx, name, [msg])
    return _published(name, q.is_fifo(labels, name), res[0], answer)


def _entries(p: dict[str, Any]) -> list[dict[str, Any]]:
    entries = p.get("Entries")
    if entries is None:
        raise missing("Entries")
    if not isinstance(entries, list) or not entries:
        raise SqsError("EmptyBatchRequest", "There should be at least one entry in the request.")
    if len(entries) > MAX_BATCH:
        raise SqsError(
            "TooManyEntriesInBatchRequest",
            f"Maximum number of entries per request are {MAX_BATCH}. You have sent {len(entries)}.",
        )
    seen: set[str] = set()
    for e in entries:
        eid = e.get("Id") if isinstance(e, dict) else None
        if not isinstance(eid, str) or not _BATCH_ID.fullmatch(eid):
            raise SqsError(
                "InvalidBatchEntryId",
                "A batch entry id can only contain alphanumeric characters, hyphens and"
                " underscores. It can be at most 80 letters long.",
            )
        if eid in seen:
            raise SqsError("BatchEntryIdsNotDistinct", f"Id {eid} repeated.")
        seen.add(eid)
    return entries


def _failed(eid: str, err: SqsError) -> dict[str, Any]:
    return {"Id": eid, "SenderFault": err.status < 500, "Code": err.query_code,
            "Message": err.message}  # fmt: skip


def _entry_size(entry: dict[str, Any]) -> int:
    """What an entry counts toward the batch's size, as SQS counts it: its body and its
    message attributes (bad attributes count nothing here: that entry fails on its own)."""
    size = len(str(entry.get("MessageBody") or "").encode())
    try:
        return size + sqsmsg.attributes_size(
            sqsmsg.check_attributes(entry.get("MessageAttributes"))
        )
    except SqsError:
        return size


async def send_message_batch(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    entries = _entries(p)
    name, stats = await _queue_for(ctx, p, PUBLISH)
    total = sum(_entry_size(e) for e in entries)
    if total > MAX_BATCH_BYTES:
        raise SqsError(
            "BatchRequestTooLong",
            f"Batch requests cannot be longer than {MAX_BATCH_BYTES} bytes. You have sent"
            f" {total} bytes.",
        )
    labels = _labels(stats)
    fifo = q.is_fifo(labels, name)
    good: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    failed: list[dict[str, Any]] = []
    for e in entries:
        try:
            msg, answer = _message(e, labels, name, stats["config"]["max_message_bytes"])
        except SqsError as err:
            failed.append(_failed(e["Id"], err))
            continue
        good.append((e["Id"], msg, answer))
    ok: list[dict[str, Any]] = []
    if good:
        try:
            res = await _publish(ctx, name, [m for _, m, _ in good])
        except ApiError as e:
            if e.code in ("topic_not_found", "group_not_found", "forbidden") or e.status >= 500:
                raise
            whole = sqs_error(e)
            failed.extend(_failed(eid, whole) for eid, _, _ in good)
        else:
            for (eid, _, answer), r in zip(good, res, strict=True):
                ok.append({"Id": eid, **_published(name, fifo, r, answer)})
    return {"Successful": ok, "Failed": failed}


def _system_names(p: dict[str, Any]) -> set[str]:
    names: set[str] = set()
    for key in ("AttributeNames", "MessageSystemAttributeNames"):
        given = p.get(key)
        if given is None:
            continue
        if not isinstance(given, list):
            raise invalid(f"{key} must be a list")
        for n in given:
            if n not in SYSTEM_ATTRIBUTE_NAMES and n not in q.ALL_ATTRS:
                raise SqsError("InvalidAttributeName", f"Unknown Attribute {n}.")
            names.add(n)
    return names


def _delivered(
    ctx: Ctx, name: str, d: dict[str, Any], system: set[str], wanted: Any, fifo: bool
) -> dict[str, Any]:
    headers: dict[str, str] = d.get("headers") or {}
    body = d["payload"].decode("utf-8", "replace")
    attrs, sys_attrs = sqsmsg.from_headers(headers)
    out: dict[str, Any] = {
        "MessageId": sqsmsg.message_id(name, d["seq"], headers),
        "ReceiptHandle": d["receipt"],
        "MD5OfBody": sqsmsg.md5_body(body),
        "Body": body,
    }
    every = "All" in system
    first = d.get("first_received_at")
    if first is None:  # (without it: the first delivery's time is this one's, or unknown)
        first = int(time.time() * 1000) if d["attempt"] == 1 else d["published_at"]
    values = {
        "SenderId": ctx.access_key or q.ACCOUNT,
        "SentTimestamp": str(d["published_at"]),
        "ApproximateReceiveCount": str(d["attempt"]),
        "ApproximateFirstReceiveTimestamp": str(first),
    }
    if "AWSTraceHeader" in sys_attrs:
        values["AWSTraceHeader"] = sys_attrs["AWSTraceHeader"]
    if fifo:
        values["SequenceNumber"] = f"{d['seq']:020d}"
        if d.get("ordering_key"):
            values["MessageGroupId"] = d["ordering_key"]
        if "MessageDeduplicationId" in sys_attrs:
            values["MessageDeduplicationId"] = sys_attrs["MessageDeduplicationId"]
    src = headers.get(sqsmsg.DLQ_PREFIX + "topic")
    if src:
        values["DeadLetterQueueSourceArn"] = q.arn(ctx.region, src)
    chosen = {k: v for k, v in values.items() if every or k in system}
    if chosen:
        out["Attributes"] = chosen
    picked = sqsmsg.select(attrs, wanted)
    if picked:
        out["MessageAttributes"] = picked
        out["MD5OfMessageAttributes"] = sqsmsg.md5_attributes(picked)
    return out


async def receive_message(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    name, stats = await _queue_for(ctx, p, CONSUME)
    labels = _labels(stats)
    n = _int(p, "MaxNumberOfMessages", 1, MAX_RECEIVE, 1)
    default_wait = int(q.label_attr(labels, "ReceiveMessageWaitTimeSeconds", "0"))
    wait = _int(p, "WaitTimeSeconds", 0, MAX_WAIT_S, default_wait)
    vis = _int(p, "VisibilityTimeout", 0, 43_200, None)
    system = _system_names(p)
    wanted = p.get("MessageAttributeNames")
    if wanted is not None and not isinstance(wanted, list):
        raise invalid("MessageAttributeNames must be a list")
    cmd: dict[str, Any] = {
        "op": "receive",
        "topic": name,
        "group": q.GROUP,
        "consumer": ctx.consumer or commands.fresh_consumer(),
        "max": n,
    }
    if vis is not None:
        cmd["visibility"] = vis or 0.001  # (0: visible again at once)
    who = ctx.who

    def may_receive() -> None:
        who.require(CONSUME, name)

    deliveries = await ctx.svc.long_poll(cmd, float(wait or 0), may_receive)
    fifo = q.is_fifo(labels, name)
    msgs = [_delivered(ctx, name, d, system, wanted, fifo) for d in deliveries]
    return {"Messages": msgs} if msgs else {}


def _receipt(name: str, handle: Any) -> str:
    if not isinstance(handle, str) or not handle:
        raise missing("ReceiptHandle")
    if not handle.startswith(f"{name}:{q.GROUP}:"):
        raise SqsError("ReceiptHandleIsInvalid", f'The input receipt handle "{handle[:300]}" is'
                       " not a valid receipt handle.")  # fmt: skip
    return handle


def _settle_errors(res: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["receipt"]: e for e in res.get("errors") or []}


def _entry_error(err: dict[str, Any], deleting: bool) -> SqsError | None:
    """A settle's per-receipt error as SQS reports it; None: not an error to SQS (deleting a
    message with an old receipt handle succeeds and changes nothing, as SQS documents)."""
    code = err.get("code")
    if code == "receipt_stale":
        if deleting:
            return None
        return SqsError("MessageNotInflight", "Message does not exist or is not available for"
                        " visibility timeout change.")  # fmt: skip
    return SqsError("ReceiptHandleIsInvalid", f"The input receipt handle is invalid: "
                    f"{err.get('message', '')}")  # fmt: skip


async def delete_message(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    name = _queue(p)
    ctx.who.require(CONSUME, name)
    receipt = _receipt(name, p.get("ReceiptHandle"))
    res = await ctx.svc.call(commands.settle("ack", {"receipts": [receipt]}))
    for err in _settle_errors(res).values():
        e = _entry_error(err, deleting=True)
        if e is not None:
            raise e
    return {}


async def delete_message_batch(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    entries = _entries(p)
    name = _queue(p)
    ctx.who.require(CONSUME, name)
    ok: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    todo: list[tuple[str, str]] = []
    for e in entries:
        try:
            todo.append((e["Id"], _receipt(name, e.get("ReceiptHandle"))))
        except SqsError as err:
            failed.append(_failed(e["Id"], err))
    if todo:
        res = await ctx.svc.call(commands.settle("ack", {"receipts": [r for _, r in todo]}))
        errors = _settle_errors(res)
        for eid, r in todo:
            problem = _entry_error(errors[r], deleting=True) if r in errors else None
            if problem is None:
                ok.append({"Id": eid})
            else:
                failed.append(_failed(eid, problem))
    return {"Successful": ok, "Failed": failed}


async def _change_visibility(
    ctx: Ctx, items: list[tuple[str, str, int]]
) -> dict[str, SqsError | None]:
    """(id, receipt, seconds) -> error or None. 0 makes the message visible again now (a
    failed attempt, as SQS counts it); more moves its deadline to now + seconds."""
    out: dict[str, SqsError | None] = {}
    now = [(i, r) for i, r, s in items if s == 0]
    later: dict[int, list[tuple[str, str]]] = {}
    for i, r, s in items:
        if s:
            later.setdefault(s, []).append((i, r))
    batches: list[tuple[dict[str, Any], list[tuple[str, str]]]] = []
    if now:
        batches.append(({"receipts": [r for _, r in now], "delay": 0}, now))
    for secs, group in sorted(later.items()):
        batches.append(({"receipts": [r for _, r in group], "seconds": secs}, group))
    for body, group in batches:
        op = "nack" if "delay" in body else "extend"
        res = await ctx.svc.call(commands.settle(op, body))
        errors = _settle_errors(res)
        for i, r in group:
            out[i] = _entry_error(errors[r], deleting=False) if r in errors else None
    return out


async def change_message_visibility(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    name = _queue(p)
    ctx.who.require(CONSUME, name)
    receipt = _receipt(name, p.get("ReceiptHandle"))
    if p.get("VisibilityTimeout") is None:
        raise missing("VisibilityTimeout")
    secs = _int(p, "VisibilityTimeout", 0, 43_200, None)
    assert secs is not None
    err = (await _change_visibility(ctx, [("1", receipt, secs)]))["1"]
    if err is not None:
        raise err
    return {}


async def change_message_visibility_batch(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    entries = _entries(p)
    name = _queue(p)
    ctx.who.require(CONSUME, name)
    failed: list[dict[str, Any]] = []
    items: list[tuple[str, str, int]] = []
    for e in entries:
        try:
            receipt = _receipt(name, e.get("ReceiptHandle"))
            secs = _int(e, "VisibilityTimeout", 0, 43_200, None)
            if secs is None:
                raise missing("VisibilityTimeout")
        except SqsError as err:
            failed.append(_failed(e["Id"], err))
            continue
        items.append((e["Id"], receipt, secs))
    ok: list[dict[str, Any]] = []
    if items:
        for eid, problem in (await _change_visibility(ctx, items)).items():
            if problem is None:
                ok.append({"Id": eid})
            else:
                failed.append(_failed(eid, problem))
    return {"Successful": ok, "Failed": failed}


ACTIONS: dict[str, Action] = {
    "CreateQueue": create_queue,
    "GetQueueUrl": get_queue_url,
    "ListQueues": list_queues,
    "DeleteQueue": delete_queue,
    "PurgeQueue": purge_queue,
    "GetQueueAttributes": get_queue_attributes,
    "SetQueueAttributes": set_queue_attributes,
    "TagQueue": tag_queue,
    "UntagQueue": untag_queue,
    "ListQueueTags": list_queue_tags,
    "ListDeadLetterSourceQueues": list_dead_letter_source_queues,
    "StartMessageMoveTask": start_message_move_task,
    "ListMessageMoveTasks": list_message_move_tasks,
    "CancelMessageMoveTask": cancel_message_move_task,
    "AddPermission": unsupported,
    "RemovePermission": unsupported,
    "SendMessage": send_message,
    "SendMessageBatch": send_message_batch,
    "ReceiveMessage": receive_message,
    "DeleteMessage": delete_message,
    "DeleteMessageBatch": delete_message_batch,
    "ChangeMessageVisibility": change_message_visibility,
    "ChangeMessageVisibilityBatch": change_message_visibility_batch,
}
