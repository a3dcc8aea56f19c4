"""The checker: a pure function from a history (see ``history``) to anomalies.

It knows one work topic and group, and that group's dead-letter topic. Messages are identified
by their payload (``value``), which the workload makes unique. Classes:

- **lost**: an ``ok`` publish never delivered and never dead-lettered, a message whose last
  delivery was never settled (no ack, no term, not dead-lettered) although the drain emptied the
  group, or a poison message (always nacked) that never reached the dead-letter topic;
- **unexpected**: a delivery of a value nobody published, or whose publish definitely failed, or
  whose stored seq differs from the one its ``ok`` publish returned;
- **duplicate**: a second delivery of a value. *Legitimate* after the previous delivery's lease
  expired, a nack, a release of its consumer (explicit, implied by a receive of that consumer
  ending badly: the node then releases it, or by a stream delivery: a stream's deliveries are
  released whenever its socket closes), or an unobserved delivery (a receive whose answer was
  lost). *Illegal* after an acknowledged ack or term, inside an unexpired lease without a nack or
  release, the same attempt twice, or the same value stored under two seqs (dedup failed);
- **dead-letter**: a dead letter without ``max_attempts`` deliveries or a term, a dead letter of
  an acknowledged-acked message, a value dead-lettered twice, or a delivery beyond max_attempts;
- **recovered** (not an anomaly): ``info`` publishes that turned out to have happened.

Server time is exact: the workload asks for a fixed ``visibility``, so a delivery's server clock
is ``deadline - visibility``; a redelivery is after expiry iff that is >= the previous deadline.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from raftq_chaos.history import FAIL, INFO, OK, pairs

DLQ_ATTEMPTS = "x-raftq-dlq-attempts"
DLQ_REASON = "x-raftq-dlq-reason"
DLQ_GROUP = "x-raftq-dlq-group"

LOST = "lost"
UNEXPECTED = "unexpected"
ILLEGAL_DUPLICATE = "illegal-duplicate"
DEAD_LETTER = "dead-letter"
ANOMALY_KINDS = (LOST, UNEXPECTED, ILLEGAL_DUPLICATE, DEAD_LETTER)


@dataclass(frozen=True)
class Spec:
    topic: str
    group: str
    dlq_topic: str
    max_attempts: int
    poison_prefix: str = "poison"


@dataclass
class Anomaly:
    kind: str
    value: str
    detail: str
    events: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "value": self.value,
            "detail": self.detail,
            "events": self.events,
        }


@dataclass
class Result:
    anomalies: list[Anomaly]
    counts: Counter[str]
    legit_duplicates: Counter[str]
    recovered: list[str]

    @property
    def valid(self) -> bool:
        return not self.anomalies

    def by_kind(self, kind: str) -> list[Anomaly]:
        return [a for a in self.anomalies if a.kind == kind]


@dataclass
class _Delivery:
    value: str
    seq: int
    attempt: int
    receipt: str
    deadline: int
    server_now: int
    consumer: str
    invoke: int  # index of the receive's invoke
    index: int  # index of the receive's ok
    headers: dict[str, str]


@dataclass
class _Pub:
    status: str
    invoke: int
    done: int | None
    seq: int | None


@dataclass
class _Settle:
    f: str
    type: str
    invoke: int
    index: int | None
    deadline: int | None = None


def _status(done: dict[str, Any] | None) -> str:
    return INFO if done is None else str(done["type"])


def check(events: list[dict[str, Any]], spec: Spec) -> Result:
    counts: Counter[str] = Counter()
    published: dict[str, _Pub] = {}
    deliveries: dict[str, list[_Delivery]] = defaultdict(list)
    dead: dict[str, list[_Delivery]] = defaultdict(list)
    settles: dict[str, list[_Settle]] = defaultdict(list)  # by receipt
    releases: dict[str, list[int]] = defaultdict(list)  # consumer -> invoke indices
    anomalies: list[Anomaly] = []

    for inv, done in pairs(events):
        f, value, status = inv["f"], inv.get("value") or {}, _status(done)
        if f == "publish":
            if value.get("topic") != spec.topic:
                continue
            # one message, or a batch: "values" in, "seqs" out
            values = value["values"] if "values" in value else [value["value"]]
            seqs: list[int | None] = [None] * len(values)
            if status == OK:
                assert done is not None
                out = done["value"]
                seqs = out["seqs"] if "values" in value else [out.get("seq")]
            done_at = None if done is None else done["index"]
            for v, seq in zip(values, seqs, strict=True):
                counts[f"publish-{status}"] += 1
                published[v] = _Pub(status, inv["index"], done_at, seq)
        elif f == "receive":
            consumer = str(value.get("consumer"))
            if status != OK:
                releases[consumer].append(inv["index"])
                continue
            assert done is not None
            if value.get("stream"):
                # the node releases a stream's deliveries when its socket closes, unseen here
                releases[consumer].append(inv["index"])
            topic = value.get("topic")
            if topic not in (spec.topic, spec.dlq_topic) or (
                topic == spec.topic and value.get("group") != spec.group
            ):
                continue
            vis_ms = round(float(value["visibility"]) * 1000)
            for d in done["value"]["deliveries"]:
                dl = _Delivery(
                    value=str(d["value"]),
                    seq=int(d["seq"]),
                    attempt=int(d["attempt"]),
                    receipt=str(d["receipt"]),
                    deadline=int(d["deadline"]),
                    server_now=int(d["deadline"]) - vis_ms,
                    consumer=consumer,
                    invoke=inv["index"],
                    index=done["index"],
                    headers=dict(d.get("headers") or {}),
                )
                if topic == spec.topic:
                    deliveries[dl.value].append(dl)
                    counts["deliveries"] += 1
                else:
                    dead[dl.value].append(dl)
                    counts["dead-letter-deliveries"] += 1
        elif f in ("ack", "nack", "term", "extend"):
            counts[f"{f}-{status}"] += 1
            deadline = None
            if f == "extend" and status == OK:
                assert done is not None
                deadline = int(done["value"]["deadline"])
            idx = None if done is None else done["index"]
            settles[str(value["receipt"])].append(_Settle(f, status, inv["index"], idx, deadline))
        elif f == "release":
            counts[f"release-{status}"] += 1
            if status != FAIL:
                releases[str(value["consumer"])].append(inv["index"])

    legit: Counter[str] = Counter()
    recovered: list[str] = []

    # unexpected + recovered
    for value in sorted(set(deliveries) | set(dead)):
        seen = deliveries.get(value, []) + dead.get(value, [])
        evs = [d.index for d in seen]
        pub = published.get(value)
        if pub is None:
            anomalies.append(Anomaly(UNEXPECTED, value, "delivered but never published", evs))
            continue
        if pub.status == FAIL:
            anomalies.append(
                Anomaly(
                    UNEXPECTED, value, "delivered although its publish failed", [pub.invoke, *evs]
                )
            )
        elif pub.status == INFO:
            recovered.append(value)
        elif pub.status == OK and pub.seq is not None and deliveries.get(value):
            wrong = [d for d in deliveries[value] if d.seq != pub.seq]
            if wrong:
                anomalies.append(
                    Anomaly(
                        UNEXPECTED,
                        value,
                        f"publish returned seq {pub.seq}, delivered as seq {wrong[0].seq}",
                        [pub.done or 0, wrong[0].index],
                    )
                )

    acked_ok: set[str] = set()
    for value, ds in deliveries.items():
        for d in ds:
            if any(s.f == "ack" and s.type == OK for s in settles.get(d.receipt, [])):
                acked_ok.add(value)
        ds.sort(key=lambda d: (d.attempt, d.index))
        stored = sorted({d.seq for d in ds})
        if len(stored) > 1:
            anomalies.append(
                Anomaly(
                    ILLEGAL_DUPLICATE,
                    value,
                    f"stored twice, as seqs {stored} (idempotent publish failed)",
                    [d.index for d in ds],
                )
            )
            continue
        for prev, cur in itertools.pairwise(ds):
            reason, illegal = _classify(prev, cur, settles, releases)
            if illegal:
                anomalies.append(Anomaly(ILLEGAL_DUPLICATE, value, reason, [prev.index, cur.index]))
            else:
                legit[reason] += 1
        counts["duplicates"] += len(ds) - 1
        over = [d for d in ds if spec.max_attempts and d.attempt > spec.max_attempts]
        if over:
            anomalies.append(
                Anomaly(
                    DEAD_LETTER,
                    value,
                    f"delivered as attempt {over[0].attempt} > max_attempts {spec.max_attempts}",
                    [over[0].index],
                )
            )

    # dead letters
    for value, ds in dead.items():
        # a dead letter is itself a message of the dead-letter group: same duplicate rules
        ds.sort(key=lambda d: (d.seq, d.attempt, d.index))
        for prev, cur in itertools.pairwise(ds):
            if prev.seq != cur.seq:
                continue
            reason, illegal = _classify(prev, cur, settles, releases)
            if illegal:
                anomalies.append(
                    Anomaly(
                        ILLEGAL_DUPLICATE, value, "dead letter " + reason, [prev.index, cur.index]
                    )
                )
            else:
                legit[reason] += 1
        entries = {d.seq: d for d in ds}  # redelivered dead letters are one entry
        mine = [d for d in entries.values() if d.headers.get(DLQ_GROUP, spec.group) == spec.group]
        if len(mine) > 1:
            anomalies.append(
                Anomaly(
                    DEAD_LETTER,
                    value,
                    f"dead-lettered {len(mine)} times (dead-letter seqs {sorted(entries)})",
                    [d.index for d in mine],
                )
            )
        for d in mine:
            reason = d.headers.get(DLQ_REASON, "")
            attempts = int(d.headers.get(DLQ_ATTEMPTS, "0") or 0)
            termed = any(
                s.f == "term" and s.type != FAIL
                for x in deliveries.get(value, [])
                for s in settles.get(x.receipt, [])
            )
            if reason.startswith("term"):
                if not termed:
                    anomalies.append(
                        Anomaly(
                            DEAD_LETTER, value, "dead-lettered by a term nobody sent", [d.index]
                        )
                    )
            elif attempts != spec.max_attempts:
                anomalies.append(
                    Anomaly(
                        DEAD_LETTER,
                        value,
                        f"dead-lettered ({reason}) after {attempts} attempts, "
                        f"max_attempts is {spec.max_attempts}",
                        [d.index],
                    )
                )
            if value in acked_ok:
                anomalies.append(
                    Anomaly(
                        DEAD_LETTER, value, "dead-lettered after an acknowledged ack", [d.index]
                    )
                )
        counts["dead-lettered"] += len(mine)

    # lost
    for value, pub in sorted(published.items()):
        if pub.status != OK:
            continue
        done_at = pub.done or 0
        ds = deliveries.get(value, [])
        in_dlq = value in dead
        if not ds and not in_dlq:
            anomalies.append(
                Anomaly(LOST, value, "acknowledged publish never delivered", [done_at])
            )
        elif value.startswith(spec.poison_prefix) and not in_dlq:
            anomalies.append(
                Anomaly(
                    LOST,
                    value,
                    "poison message (always nacked) never reached the dead-letter topic",
                    [done_at, *[d.index for d in ds]],
                )
            )
        elif ds and not in_dlq:
            last = ds[-1]
            ss = settles.get(last.receipt, [])
            if not any(s.f in ("ack", "term") and s.type != FAIL for s in ss):
                anomalies.append(
                    Anomaly(
                        LOST,
                        value,
                        f"last delivery (attempt {last.attempt}) never settled, yet never "
                        "redelivered nor dead-lettered",
                        [done_at, last.index],
                    )
                )

    counts["recovered"] = len(recovered)
    counts["legit-duplicates"] = sum(legit.values())
    for a in anomalies:
        counts[a.kind] += 1
    anomalies.sort(key=lambda a: (ANOMALY_KINDS.index(a.kind), a.value))
    return Result(anomalies, counts, legit, recovered)


def _classify(
    prev: _Delivery,
    cur: _Delivery,
    settles: dict[str, list[_Settle]],
    releases: dict[str, list[int]],
) -> tuple[str, bool]:
    """Why ``cur`` may follow ``prev``: (reason, illegal)."""
    ss = settles.get(prev.receipt, [])
    if cur.attempt == prev.attempt:
        return f"attempt {cur.attempt} delivered twice", True
    if any(s.f == "ack" and s.type == OK for s in ss):
        return f"redelivered (attempt {cur.attempt}) after an acknowledged ack", True
    if any(s.f == "term" and s.type == OK for s in ss):
        return f"redelivered (attempt {cur.attempt}) after an acknowledged term", True
    if any(s.f == "nack" and s.type != FAIL and s.invoke < cur.index for s in ss):
        return "nack", False
    if any(prev.invoke <= r < cur.index for r in releases.get(prev.consumer, [])):
        return "release", False
    if cur.attempt > prev.attempt + 1:
        return "unobserved delivery", False
    deadline = max(
        [prev.deadline] + [s.deadline for s in ss if s.f == "extend" and s.deadline is not None]
    )
    if cur.server_now >= deadline:
        return "expiry", False
    return (
        f"redelivered (attempt {cur.attempt}) {deadline - cur.server_now} ms inside an "
        "unexpired lease without nack or release",
        True,
    )
