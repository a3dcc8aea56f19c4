"""Run in the botocore 1.33 venv (tests/sqs/old_botocore.py), never imported by the suite.

Reads ``{"endpoint", "key", "secret", "region", "calls": [{"op", "params"}]}`` on stdin, makes
each call with a boto3 SQS client, and writes one outcome per call as JSON on stdout:
``{"ok": result, "protocol": ...}`` or ``{"error": {"code", "message", "status", "body"},
"protocol": ...}`` where ``body`` is the raw answer and ``protocol`` what the request was
("query": a form body with ``Action=``; "json": ``X-Amz-Target``).
"""

import base64
import datetime
import json
import sys
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError


def plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, bytes):
        return {"__bytes__": base64.b64encode(value).decode()}
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    return value


def main() -> None:
    spec = json.load(sys.stdin)
    client = boto3.client(
        "sqs",
        endpoint_url=spec["endpoint"],
        region_name=spec["region"],
        aws_access_key_id=spec["key"],
        aws_secret_access_key=spec["secret"],
        config=Config(retries={"max_attempts": 1}),
    )
    seen: dict[str, str] = {}

    def before_send(request: Any, **_: Any) -> None:
        body = request.body or b""
        if isinstance(body, str):
            body = body.encode()
        seen["protocol"] = (
            "json"
            if "X-Amz-Target" in request.headers
            else ("query" if b"Action=" in body else "other")
        )

    def after_call(http_response: Any, **_: Any) -> None:
        seen["body"] = http_response.content.decode("utf-8", "replace")

    client.meta.events.register("before-send.sqs", before_send)
    client.meta.events.register("after-call.sqs", after_call)
    out: list[dict[str, Any]] = []
    for call in spec["calls"]:
        seen.clear()
        params = call.get("params", {})
        for entry in params.get("Entries", []):  # binary values travel base64-encoded
            for attr in entry.get("MessageAttributes", {}).values():
                if "BinaryValue" in attr:
                    attr["BinaryValue"] = base64.b64decode(attr["BinaryValue"])
        try:
            result = getattr(client, call["op"])(**params)
            result.pop("ResponseMetadata", None)
            out.append({"ok": plain(result), "protocol": seen.get("protocol")})
        except ClientError as e:
            err = e.response.get("Error", {})
            out.append(
                {
                    "error": {
                        "code": err.get("Code"),
                        "message": err.get("Message"),
                        "status": e.response.get("ResponseMetadata", {}).get("HTTPStatusCode"),
                        "body": seen.get("body"),
                    },
                    "protocol": seen.get("protocol"),
                }
            )
        except Exception as e:  # e.g. an answer botocore could not parse
            out.append({"exception": repr(e), "protocol": seen.get("protocol")})
    json.dump(out, sys.stdout)


main()
