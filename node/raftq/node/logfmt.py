"""The node's log format (``--log-format``): ``text`` (one line per record) or ``json`` (one
JSON object per line, for log shippers: ``time`` in UTC RFC 3339 with milliseconds, ``level``,
``logger``, ``message``, and ``exception`` with the traceback when there is one)."""

from __future__ import annotations

import json
import logging
import sys
import time

FORMATS = ("text", "json")
TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        t = time.gmtime(record.created)
        out = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", t) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False)


def setup(level: str, fmt: str = "text") -> None:
    """The root logger's one handler, on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT))
    logging.basicConfig(level=level.upper(), handlers=[handler])
