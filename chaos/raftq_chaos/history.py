"""The operation history: one JSON object per line, Jepsen's convention.

Every client operation is written twice: an ``invoke`` when it starts and one completion: ``ok``
(it happened), ``fail`` (it definitely did not happen) or ``info`` (unknown: it may have happened,
now or later). A logical process runs one operation at a time; after an ``info`` its owner must
move to a new process id, since the old one may still have an operation in flight. Nemesis
actions are single ``info`` lines from the process ``"nemesis"``.

Line fields: ``index`` (order in the file is the real-time order of the events), ``time`` (wall
clock, ms), ``process``, ``type``, ``f`` (the operation), ``value`` and, on failures, ``error``.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

INVOKE, OK, FAIL, INFO = "invoke", "ok", "fail", "info"
TYPES = (INVOKE, OK, FAIL, INFO)


@dataclass
class Op:
    """An invoked operation waiting for its completion."""

    process: int | str
    f: str
    value: Any
    index: int


class History:
    """Appends events to a JSONL file (and keeps them in memory for the checker)."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self._file: IO[str] | None = (
            self.path.open("w", encoding="utf-8") if self.path is not None else None
        )
        self.events: list[dict[str, Any]] = []
        self._processes = itertools.count()

    def new_process(self) -> int:
        return next(self._processes)

    def _write(self, event: dict[str, Any]) -> dict[str, Any]:
        event = {"index": len(self.events), "time": round(time.time() * 1000, 3), **event}
        self.events.append(event)
        if self._file is not None:
            self._file.write(json.dumps(event, default=repr) + "\n")
            self._file.flush()
        return event

    def invoke(self, process: int | str, f: str, value: Any = None) -> Op:
        ev = self._write({"process": process, "type": INVOKE, "f": f, "value": value})
        return Op(process, f, value, ev["index"])

    def complete(self, op: Op, type_: str, value: Any = None, error: str | None = None) -> None:
        if type_ not in (OK, FAIL, INFO):
            raise ValueError(f"not a completion type: {type_!r}")
        ev: dict[str, Any] = {
            "process": op.process,
            "type": type_,
            "f": op.f,
            "value": op.value if value is None else value,
        }
        if error is not None:
            ev["error"] = error
        self._write(ev)

    def ok(self, op: Op, value: Any = None) -> None:
        self.complete(op, OK, value)

    def fail(self, op: Op, error: str, value: Any = None) -> None:
        self.complete(op, FAIL, value, error)

    def info(self, op: Op, error: str, value: Any = None) -> None:
        self.complete(op, INFO, value, error)

    def note(self, f: str, value: Any = None, process: str = "nemesis") -> None:
        """A one-line ``info`` event: nemesis actions, phase markers."""
        self._write({"process": process, "type": INFO, "f": f, "value": value})

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read(path: str | Path) -> list[dict[str, Any]]:
    with Path(path).open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def pairs(events: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any] | None]]:
    """(invoke, completion) per client operation, in invoke order; an operation never completed
    (the run was cut short) pairs with None and counts as ``info``."""
    pending: dict[Any, dict[str, Any]] = {}
    done: dict[int, dict[str, Any]] = {}
    invokes: list[dict[str, Any]] = []
    for ev in events:
        if ev["type"] == INVOKE:
            if ev["process"] in pending:
                raise ValueError(
                    f"process {ev['process']} invoked event {ev['index']} while "
                    f"{pending[ev['process']]['index']} is still open"
                )
            pending[ev["process"]] = ev
            invokes.append(ev)
        elif ev["process"] in pending:
            inv = pending.pop(ev["process"])
            if inv["f"] != ev["f"]:
                raise ValueError(f"event {ev['index']} completes {inv['f']} as {ev['f']}")
            done[inv["index"]] = ev
    for inv in invokes:
        yield inv, done.get(inv["index"])
