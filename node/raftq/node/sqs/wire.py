"""The two SQS wire protocols, both ways (pure: no aiohttp, no I/O).

*AWS JSON 1.0* (current SDKs): ``POST /`` with ``X-Amz-Target: AmazonSQS.<Action>`` and a JSON
body; the answer is JSON; an error is ``{"__type": "com.amazonaws.sqs#<Type>", "message"}``
plus, when the request says ``x-amzn-query-mode: true`` (SDKs built with
``awsQueryCompatible``), the header ``x-amzn-query-error: <legacy code>;<Sender|Receiver>``
from which those SDKs take the error code older clients saw.

*Query* (older botocore, kombu's async client): a form (``Action=...``, in the body or the
URL), parameters flattened as the 2012-11-05 model names them (``Attribute.1.Name``,
``SendMessageBatchRequestEntry.2.MessageAttribute.1.Value.StringValue``); the answer is XML,
``<{Action}Response><{Action}Result>...``; an error is an ``ErrorResponse``.

Both decode into one JSON-shaped ``params`` dict (the JSON protocol's member names), which is
all ``actions`` sees; results are JSON-shaped dicts encoded back by the caller's protocol.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from xml.sax.saxutils import escape

JSON_CONTENT_TYPE = "application/x-amz-json-1.0"
XML_NS = "http://queue.amazonaws.com/doc/2012-11-05/"
TARGET_PREFIX = "AmazonSQS."

# Error type (the JSON protocol's name) -> (HTTP status, the query protocol's code). Codes
# SQS has no type for (signature problems) keep their own name on both sides.
ERRORS: dict[str, tuple[int, str]] = {
    "QueueDoesNotExist": (400, "AWS.SimpleQueueService.NonExistentQueue"),
    "QueueNameExists": (400, "QueueAlreadyExists"),
    "QueueDeletedRecently": (400, "AWS.SimpleQueueService.QueueDeletedRecently"),
    "ReceiptHandleIsInvalid": (400, "ReceiptHandleIsInvalid"),
    "MessageNotInflight": (400, "AWS.SimpleQueueService.MessageNotInflight"),
    "TooManyEntriesInBatchRequest": (400, "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"),
    "EmptyBatchRequest": (400, "AWS.SimpleQueueService.EmptyBatchRequest"),
    "BatchEntryIdsNotDistinct": (400, "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"),
    "BatchRequestTooLong": (400, "AWS.SimpleQueueService.BatchRequestTooLong"),
    "InvalidBatchEntryId": (400, "AWS.SimpleQueueService.InvalidBatchEntryId"),
    "PurgeQueueInProgress": (400, "AWS.SimpleQueueService.PurgeQueueInProgress"),
    "UnsupportedOperation": (400, "AWS.SimpleQueueService.UnsupportedOperation"),
    "InvalidAttributeName": (400, "InvalidAttributeName"),
    "InvalidAttributeValue": (400, "InvalidAttributeValue"),
    "InvalidMessageContents": (400, "InvalidMessageContents"),
    "InvalidParameterValueException": (400, "InvalidParameterValue"),
    "MissingParameter": (400, "MissingParameter"),
    "InvalidAddress": (404, "InvalidAddress"),
    "InvalidAction": (400, "InvalidAction"),
    "OverLimit": (403, "OverLimit"),
    "ResourceNotFoundException": (404, "ResourceNotFoundException"),
    "AccessDeniedException": (403, "AccessDenied"),
    "InvalidSecurity": (403, "AWS.SimpleQueueService.InvalidSecurity"),
    "MalformedQueryString": (400, "MalformedQueryString"),
    "RequestThrottled": (403, "RequestThrottled"),
    # signatures (raftq.node.sqs.sigv4)
    "MissingAuthenticationToken": (403, "MissingAuthenticationToken"),
    "IncompleteSignature": (400, "IncompleteSignature"),
    "InvalidClientTokenId": (403, "InvalidClientTokenId"),
    "SignatureDoesNotMatch": (403, "SignatureDoesNotMatch"),
    "RequestExpired": (400, "RequestExpired"),
    "AuthorizationQueryParametersError": (400, "AuthorizationQueryParametersError"),
    # the node's own state
    "ServiceUnavailable": (503, "ServiceUnavailable"),
    "InternalFailure": (500, "InternalFailure"),
}


class SqsError(Exception):
    """An error answered in SQS's shape; ``type`` is a key of ``ERRORS``."""

    def __init__(self, type_: str, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        if type_ not in ERRORS:
            raise ValueError(f"unknown SQS error type {type_!r}")
        self.type = type_
        self.message = message
        self.retry_after = retry_after

    @property
    def status(self) -> int:
        return ERRORS[self.type][0]

    @property
    def query_code(self) -> str:
        return ERRORS[self.type][1]

    @property
    def fault(self) -> str:
        return "Sender" if self.status < 500 else "Receiver"


def invalid(message: str) -> SqsError:
    return SqsError("InvalidParameterValueException", message)


def missing(name: str) -> SqsError:
    return SqsError("MissingParameter", f"The request must contain the parameter {name}.")


@dataclass
class Call:
    """One decoded SQS request."""

    action: str
    params: dict[str, Any]
    protocol: str  # "json" or "query"
    query_compat: bool = False  # JSON request asking for x-amzn-query-error
    extra: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------- JSON


def decode_json(target: str | None, body: bytes, query_mode: bool) -> Call:
    if not target or not target.startswith(TARGET_PREFIX):
        raise SqsError("InvalidAction", f"X-Amz-Target must be {TARGET_PREFIX}<Action>")
    action = target[len(TARGET_PREFIX) :]
    try:
        params = json.loads(body or b"{}")
    except (ValueError, UnicodeDecodeError):
        raise SqsError("InvalidParameterValueException", "the body is not JSON") from None
    if not isinstance(params, dict):
        raise SqsError("InvalidParameterValueException", "the body must be a JSON object")
    return Call(action, params, "json", query_mode)


# ---------------------------------------------------------------------- query (form) in

# Flattened names of the query protocol -> the JSON member and its kind: a map of
# (key name, value name) pairs, a list, or a list of entries (structures).
_MAPS = {
    "Attribute": ("Attributes", "Name", "Value"),
    "MessageAttribute": ("MessageAttributes", "Name", "Value"),
    "MessageSystemAttribute": ("MessageSystemAttributes", "Name", "Value"),
    "Tag": ("Tags", "Key", "Value"),
}
_LISTS = {
    "AttributeName": "AttributeNames",
    "MessageAttributeName": "MessageAttributeNames",
    "MessageSystemAttributeName": "MessageSystemAttributeNames",
    "TagKey": "TagKeys",
    "StringListValue": "StringListValues",
    "BinaryListValue": "BinaryListValues",
    "AWSAccountId": "AWSAccountIds",
    "ActionName": "Actions",
}
_ENTRIES = (
    "SendMessageBatchRequestEntry",
    "DeleteMessageBatchRequestEntry",
    "ChangeMessageVisibilityBatchRequestEntry",
)
_SCALARS_IN_QUERY = frozenset(["Action", "Version"])
MAX_QUERY_INDEX = 100  # a flattened index beyond this is refused (SQS's lists are short)
_XML_ESCAPES = {"\r": "&#xD;"}  # (a parser would read a bare CR as a line feed)


def _tree(pairs: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """``a.1.b=x`` pairs as nested dicts ({"a": {"1": {"b": "x"}}})."""
    root: dict[str, Any] = {}
    for key, value in pairs:
        node = root
        parts = key.split(".")
        for p in parts[:-1]:
            nxt = node.setdefault(p, {})
            if not isinstance(nxt, dict):
                raise SqsError("MalformedQueryString", f"parameter {key!r} conflicts with another")
            node = nxt
        last = parts[-1]
        if last in node:
            raise SqsError("MalformedQueryString", f"parameter {key!r} is given more than once")
        node[last] = value
    return root


def _indexed(node: Any, name: str) -> list[Any]:
    """A flattened list's members in index order (``name.1``, ``name.2``...)."""
    if not isinstance(node, dict):
        raise SqsError("MalformedQueryString", f"{name} must be given as {name}.<n>...")
    out = []
    for k in node:
        if not (k.isascii() and k.isdigit()) or not 1 <= int(k) <= MAX_QUERY_INDEX:
            raise SqsError("MalformedQueryString", f"{name}.{k}: the index must be 1 to 100")
    for k in sorted(node, key=int):
        out.append(node[k])
    return out


def _convert(tree: Mapping[str, Any], action: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if k in _MAPS:
            name, kname, vname = _MAPS[k]
            if k == "Tag" and action == "CreateQueue":
                name = "tags"  # (the JSON model's lower-case member)
            m: dict[str, Any] = {}
            for item in _indexed(v, k):
                if not isinstance(item, dict) or not isinstance(item.get(kname), str):
                    raise SqsError("MalformedQueryString", f"{k}.<n> needs {kname} and {vname}")
                val = item.get(vname)
                m[item[kname]] = _convert(val, action) if isinstance(val, dict) else val
            out[name] = m
        elif k in _LISTS:
            out[_LISTS[k]] = [x for x in _indexed(v, k) if isinstance(x, str)]
        elif k in _ENTRIES:
            out["Entries"] = [
                _convert(e, action) if isinstance(e, dict) else e for e in _indexed(v, k)
            ]
        elif isinstance(v, dict):
            raise SqsError("MalformedQueryString", f"unknown parameter {k}.{next(iter(v))}")
        elif k not in _SCALARS_IN_QUERY:
            out[k] = v
    return out


def decode_query(pairs: Sequence[tuple[str, str]]) -> Call:
    """A query-protocol request's parameters (the form and URL query, signature parameters
    removed) as a ``Call``. Numbers stay strings: ``actions`` reads both."""
    pairs = [(k, v) for k, v in pairs if not k.startswith("X-Amz-")]
    action = next((v for k, v in pairs if k == "Action"), None)
    if not action:
        raise SqsError("InvalidAction", "the request names no Action")
    return Call(action, _convert(_tree(pairs), action), "query")


# ---------------------------------------------------------------------- answers

# A JSON result member that the XML answer spells otherwise: a list whose members repeat
# under one name, or a map whose entries repeat as (key, value) elements.
_XML_LIST_MEMBER = {
    "QueueUrls": "QueueUrl",
    "queueUrls": "QueueUrl",
    "Messages": "Message",
    "Failed": "BatchResultErrorEntry",
    "Results": "ListMessageMoveTasksResultEntry",
    "StringListValues": "StringListValue",
    "BinaryListValues": "BinaryListValue",
}
_XML_MAP = {
    "Attributes": ("Attribute", "Name", "Value"),
    "MessageAttributes": ("MessageAttribute", "Name", "Value"),
    "Tags": ("Tag", "Key", "Value"),
}


def _xml(name: str, value: Any, out: list[str]) -> None:
    if value is None:
        return
    if isinstance(value, dict):
        out.append(f"<{name}>")
        _xml_members(value, out)
        out.append(f"</{name}>")
    elif isinstance(value, bool):
        out.append(f"<{name}>{'true' if value else 'false'}</{name}>")
    elif isinstance(value, bytes):
        out.append(f"<{name}>{base64.b64encode(value).decode()}</{name}>")
    else:
        out.append(f"<{name}>{escape(str(value), _XML_ESCAPES)}</{name}>")


def _xml_members(obj: Mapping[str, Any], out: list[str], successful: str = "") -> None:
    for k, v in obj.items():
        if k in _XML_MAP and isinstance(v, dict):
            elem, kname, vname = _XML_MAP[k]
            for mk, mv in v.items():
                out.append(f"<{elem}>")
                _xml(kname, mk, out)
                _xml(vname, mv, out)
                out.append(f"</{elem}>")
        elif isinstance(v, list):
            member = successful if k == "Successful" else _XML_LIST_MEMBER.get(k, k)
            for item in v:
                _xml(member, item, out)
        else:
            _xml(k, v, out)


# Actions whose XML answer has no ``<{Action}Result>`` (every other one has it, maybe empty).
NO_RESULT = frozenset(
    ["ChangeMessageVisibility", "DeleteMessage", "DeleteQueue", "PurgeQueue",
     "SetQueueAttributes", "TagQueue", "UntagQueue", "AddPermission", "RemovePermission"]
)  # fmt: skip


def encode_result(call: Call, result: Mapping[str, Any], request_id: str) -> tuple[bytes, str]:
    """A successful answer in the call's protocol: (body, content type)."""
    if call.protocol == "json":
        return json.dumps(result, separators=(",", ":")).encode(), JSON_CONTENT_TYPE
    a = call.action
    out = [f'<?xml version="1.0"?><{a}Response xmlns="{XML_NS}">']
    if a not in NO_RESULT:
        out.append(f"<{a}Result>")
        _xml_members(result, out, successful=f"{a}ResultEntry")
        out.append(f"</{a}Result>")
    out.append(f"<ResponseMetadata><RequestId>{request_id}</RequestId></ResponseMetadata>")
    out.append(f"</{a}Response>")
    return "".join(out).encode(), "text/xml"


def encode_error(
    protocol: str, query_compat: bool, err: SqsError, request_id: str
) -> tuple[int, bytes, str, dict[str, str]]:
    """An error in the request's protocol: (status, body, content type, headers)."""
    headers = {"x-amzn-RequestId": request_id}
    if err.retry_after:
        headers["Retry-After"] = str(int(err.retry_after))
    if protocol == "json":
        if query_compat:
            headers["x-amzn-query-error"] = f"{err.query_code};{err.fault}"
        body = {"__type": f"com.amazonaws.sqs#{err.type}", "message": err.message}
        return err.status, json.dumps(body).encode(), JSON_CONTENT_TYPE, headers
    xml = (
        f'<?xml version="1.0"?><ErrorResponse xmlns="{XML_NS}"><Error>'
        f"<Type>{err.fault}</Type><Code>{escape(err.query_code)}</Code>"
        f"<Message>{escape(err.message)}</Message><Detail/></Error>"
        f"<RequestId>{request_id}</RequestId></ErrorResponse>"
    )
    return err.status, xml.encode(), "text/xml", headers
