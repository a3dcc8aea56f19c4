"""SQS messages as raftq messages (pure): bodies, message attributes as headers, MD5 digests,
MessageIds.

A String message attribute is the header of its name (so native consumers see it as one);
another type adds ``sqs-type:<name>`` = its DataType, a Binary value is kept base64. A native
publisher's headers come out as String attributes; the broker's own (``x-raftq-*``) never do.
The MessageId is derived from the message's topic and sequence number (a UUID), so it is the
same on every delivery, on every node and after failover; a dead letter keeps the id it had in
its source queue (the broker's dead-letter headers name the source).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import struct
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from raftq.cluster.state import DLQ_PREFIX as DLQ_PREFIX
from raftq.node.sqs.wire import SqsError, invalid, missing

TYPE_HEADER = "sqs-type:"
SYSTEM_HEADER = "sqs-sys:"
BROKER_HEADER = "x-raftq-"
MAX_ATTRIBUTES = 10
_ATTR_NAME = re.compile(r"[A-Za-z0-9_.-]{1,256}")
_DATA_TYPE = re.compile(r"(String|Number|Binary)(\.[^\s]{1,240})?")
# SQS's allowed characters: #x9 #xA #xD #x20-#xD7FF #xE000-#xFFFD #x10000-#x10FFFF.
_BAD_CHARS = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
SYSTEM_ATTRIBUTES_IN = frozenset(["AWSTraceHeader"])


def message_id(topic: str, seq: int, headers: Mapping[str, str] | None = None) -> str:
    if headers:
        src, src_seq = headers.get(DLQ_PREFIX + "topic"), headers.get(DLQ_PREFIX + "seq")
        if src and src_seq and src_seq.isdigit():
            topic, seq = src, int(src_seq)
    digest = hashlib.blake2b(f"{topic}\0{seq}".encode(), digest_size=16).digest()
    return str(uuid.UUID(bytes=digest, version=4))


def md5_body(body: str) -> str:
    return hashlib.md5(body.encode(), usedforsecurity=False).hexdigest()


def _value_bytes(value: Mapping[str, Any]) -> tuple[int, bytes]:
    if value["DataType"].startswith("Binary"):
        return 2, base64.b64decode(value["BinaryValue"])
    return 1, value["StringValue"].encode()


def md5_attributes(attrs: Mapping[str, Mapping[str, Any]]) -> str:
    """MD5OfMessageAttributes: AWS's encoding (by name: the name, the data type, a transport
    byte and the value, each length-prefixed, big-endian)."""
    h = hashlib.md5(usedforsecurity=False)
    for name in sorted(attrs):
        value = attrs[name]
        for part in (name.encode(), value["DataType"].encode()):
            h.update(struct.pack(">I", len(part)) + part)
        kind, data = _value_bytes(value)
        h.update(bytes([kind]) + struct.pack(">I", len(data)) + data)
    return h.hexdigest()


def check_body(body: Any) -> str:
    if body is None:
        raise missing("MessageBody")
    if not isinstance(body, str) or not body:
        raise invalid("The request must contain a non-empty MessageBody.")
    bad = _BAD_CHARS.search(body)
    if bad:
        raise SqsError(
            "InvalidMessageContents",
            f"Invalid binary character '#x{ord(bad.group()):X}' was found in the message body,"
            " the set of allowed characters is #x9 | #xA | #xD | #x20 to #xD7FF | #xE000 to"
            " #xFFFD | #x10000 to #x10FFFF",
        )
    return body


def check_attributes(attrs: Any, system: bool = False) -> dict[str, dict[str, Any]]:
    """Checked MessageAttributes (or MessageSystemAttributes): name -> {DataType, value}."""
    if attrs is None:
        return {}
    what = "MessageSystemAttribute" if system else "MessageAttribute"
    if not isinstance(attrs, dict):
        raise invalid(f"{what}s must be a map of name to value")
    if len(attrs) > MAX_ATTRIBUTES:
        raise invalid(
            f"Number of message attributes [{len(attrs)}] exceeds the allowed maximum"
            f" [{MAX_ATTRIBUTES}]."
        )
    out: dict[str, dict[str, Any]] = {}
    for name, value in attrs.items():
        if system and name not in SYSTEM_ATTRIBUTES_IN:
            raise invalid(f"Message system attribute name '{name}' is invalid.")
        if not _ATTR_NAME.fullmatch(name) or ".." in name or name[0] == "." or name[-1] == ".":
            raise invalid(f"Message ({what.lower()}) name '{name}' is invalid.")
        if name.lower().startswith(("aws.", "amazon.")) and not system:
            raise invalid(f"Message attribute name '{name}' uses a reserved prefix.")
        if not isinstance(value, dict):
            raise invalid(f"{what} {name} must be a structure")
        dtype = value.get("DataType")
        if not isinstance(dtype, str) or not _DATA_TYPE.fullmatch(dtype):
            raise invalid(
                f"The message attribute '{name}' must contain a valid DataType (String, Number"
                " or Binary, optionally with a .custom suffix)."
            )
        if dtype.startswith("Binary"):
            raw = value.get("BinaryValue")
            if isinstance(raw, bytes):
                raw = base64.b64encode(raw).decode()
            try:
                ok = isinstance(raw, str) and bool(base64.b64decode(raw, validate=True))
            except binascii.Error:
                ok = False
            if not ok:
                raise invalid(f"The message attribute '{name}' must contain a BinaryValue.")
            out[name] = {"DataType": dtype, "BinaryValue": raw}
        else:
            text = value.get("StringValue")
            if not isinstance(text, str) or not text:
                raise invalid(
                    f"The message attribute '{name}' must contain non-empty message attribute"
                    " value for message attribute type "
                    f"'{dtype.split('.')[0]}'."
                )
            check_body(text)
            out[name] = {"DataType": dtype, "StringValue": text}
    return out


def attributes_size(attrs: Mapping[str, Mapping[str, Any]]) -> int:
    """What attributes count toward MaximumMessageSize (name, type and value bytes)."""
    n = 0
    for name, value in attrs.items():
        n += len(name.encode()) + len(value["DataType"].encode()) + len(_value_bytes(value)[1])
    return n


def to_headers(
    attrs: Mapping[str, Mapping[str, Any]], system: Mapping[str, Mapping[str, Any]]
) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in attrs.items():
        dtype = value["DataType"]
        out[name] = value.get("StringValue") or value.get("BinaryValue") or ""
        if dtype != "String":
            out[TYPE_HEADER + name] = dtype
    for name, value in system.items():
        out[SYSTEM_HEADER + name] = value.get("StringValue") or ""
    return out


def from_headers(headers: Mapping[str, str]) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """(message attributes, system attributes kept as headers) of a stored message."""
    attrs: dict[str, dict[str, str]] = {}
    system: dict[str, str] = {}
    for k, v in headers.items():
        if k.startswith(BROKER_HEADER) or k.startswith(TYPE_HEADER):
            continue
        if k.startswith(SYSTEM_HEADER):
            system[k[len(SYSTEM_HEADER) :]] = v
            continue
        dtype = headers.get(TYPE_HEADER + k, "String")
        if dtype.startswith("Binary"):
            attrs[k] = {"DataType": dtype, "BinaryValue": v}
        else:
            attrs[k] = {"DataType": dtype, "StringValue": v}
    return attrs, system


def select(attrs: Mapping[str, Any], wanted: Iterable[str] | None) -> dict[str, Any]:
    """The attributes a receive asked for (MessageAttributeNames: names, ``All``, ``.*``,
    ``prefix.*``)."""
    if not wanted:
        return {}
    names = list(wanted)
    if "All" in names or ".*" in names:
        return dict(attrs)
    prefixes = tuple(n[:-1] for n in names if n.endswith(".*"))
    return {k: v for k, v in attrs.items() if k in names or (prefixes and k.startswith(prefixes))}
