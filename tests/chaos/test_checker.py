"""The checker on hand-made histories: every anomaly class is detected, and every legitimate
duplicate is classified as such."""

from __future__ import annotations

from typing import Any

from raftq_chaos import checker
from raftq_chaos.history import History, read

SPEC = checker.Spec(topic="work", group="g", dlq_topic="work.dlq", max_attempts=3)
VIS = 2.0
T0 = 1_000_000


class H:
    """Builds histories tersely: server time ``now`` (ms) is set by the caller per receive."""

    def __init__(self) -> None:
        self.h = History()
        self.n = 0
        self.seqs = 0

    def publish(self, value: str, result: str = "ok", seq: int | None = None) -> None:
        """Successful publishes get seqs 0, 1, 2... unless ``seq`` says otherwise."""
        p = self.h.new_process()
        op = self.h.invoke(p, "publish", {"topic": "work", "value": value})
        if result == "ok":
            seq = self.seqs if seq is None else seq
            self.seqs = seq + 1
            self.h.ok(op, {"topic": "work", "value": value, "seq": seq})
        else:
            self.h.complete(op, result, error="boom")

    def receive(
        self,
        consumer: str,
        now: int,
        *items: tuple[str, int, int],
        topic: str = "work",
        headers: dict[str, str] | None = None,
        result: str = "ok",
    ) -> list[str]:
        """items: (value, seq, attempt); returns receipts."""
        p = self.h.new_process()
        v: dict[str, Any] = {"topic": topic, "group": "g", "consumer": consumer, "visibility": VIS}
        op = self.h.invoke(p, "receive", v)
        if result != "ok":
            self.h.complete(op, result, error="lost")
            return []
        ds = []
        for value, seq, attempt in items:
            self.n += 1
            ds.append(
                {
                    "value": value,
                    "seq": seq,
                    "attempt": attempt,
                    "receipt": f"{topic}:g:{seq}:{attempt}:{self.n}",
                    "deadline": now + int(VIS * 1000),
                    "headers": headers or {},
                }
            )
        self.h.ok(op, {**v, "deliveries": ds})
        return [str(d["receipt"]) for d in ds]

    def settle(self, f: str, receipt: str, result: str = "ok", **extra: Any) -> None:
        p = self.h.new_process()
        op = self.h.invoke(p, f, {"receipt": receipt, **extra})
        if result == "ok":
            self.h.ok(op)
        else:
            self.h.complete(op, result, error="x")

    def release(self, consumer: str) -> None:
        op = self.h.invoke(self.h.new_process(), "release", {"consumer": consumer})
        self.h.ok(op)

    def dlq(
        self, value: str, attempts: int, reason: str = "nack", dseq: int = 0, attempt: int = 1
    ) -> None:
        headers = {
            checker.DLQ_ATTEMPTS: str(attempts),
            checker.DLQ_REASON: reason,
            checker.DLQ_GROUP: "g",
        }
        r = self.receive(
            "drain", T0 + 10**6, (value, dseq, attempt), topic="work.dlq", headers=headers
        )
        self.settle("ack", r[0])

    def check(self) -> checker.Result:
        return checker.check(self.h.events, SPEC)


def kinds(res: checker.Result) -> list[str]:
    return [a.kind for a in res.anomalies]


def test_clean_history_is_valid() -> None:
    h = H()
    h.publish("a", seq=0)
    h.publish("b", seq=1)
    (ra, rb) = h.receive("c1", T0, ("a", 0, 1), ("b", 1, 1))
    h.settle("ack", ra)
    h.settle("ack", rb)
    res = h.check()
    assert res.valid, res.anomalies
    assert res.counts["publish-ok"] == 2 and res.counts["deliveries"] == 2


def test_acknowledged_publish_never_delivered_is_lost() -> None:
    h = H()
    h.publish("a", seq=0)
    h.publish("b", seq=1)
    (r,) = h.receive("c1", T0, ("a", 0, 1))
    h.settle("ack", r)
    res = h.check()
    assert kinds(res) == [checker.LOST]
    assert res.anomalies[0].value == "b"


def test_delivery_never_settled_nor_redelivered_is_lost() -> None:
    h = H()
    h.publish("a", seq=0)
    h.receive("c1", T0, ("a", 0, 1))  # dropped; the drain never saw it again
    assert kinds(h.check()) == [checker.LOST]


def test_unknown_publish_that_appears_is_recovered_not_an_anomaly() -> None:
    h = H()
    h.publish("a", result="info")
    h.publish("b", result="info")  # never appeared: fine too
    (r,) = h.receive("c1", T0, ("a", 0, 1))
    h.settle("ack", r)
    res = h.check()
    assert res.valid
    assert res.recovered == ["a"]


def test_delivery_of_unpublished_or_failed_publish_is_unexpected() -> None:
    h = H()
    h.publish("a", result="fail")
    r1, r2 = h.receive("c1", T0, ("a", 0, 1), ("ghost", 1, 1))
    h.settle("ack", r1)
    h.settle("ack", r2)
    res = h.check()
    assert kinds(res) == [checker.UNEXPECTED, checker.UNEXPECTED]
    assert {a.value for a in res.anomalies} == {"a", "ghost"}


def test_redelivery_after_lease_expiry_is_legitimate() -> None:
    h = H()
    h.publish("a")
    h.receive("c1", T0, ("a", 0, 1))  # dropped
    (r,) = h.receive("c2", T0 + 2000, ("a", 0, 2))  # exactly at the deadline
    h.settle("ack", r)
    res = h.check()
    assert res.valid, res.anomalies
    assert res.legit_duplicates == {"expiry": 1}


def test_redelivery_inside_unexpired_lease_is_illegal() -> None:
    h = H()
    h.publish("a")
    h.receive("c1", T0, ("a", 0, 1))
    (r,) = h.receive("c2", T0 + 1999, ("a", 0, 2))
    h.settle("ack", r)
    res = h.check()
    assert kinds(res) == [checker.ILLEGAL_DUPLICATE]
    assert "1 ms inside an unexpired lease" in res.anomalies[0].detail


def test_acknowledged_extend_moves_the_lease_end() -> None:
    h = H()
    h.publish("a")
    (r1,) = h.receive("c1", T0, ("a", 0, 1))
    p = h.h.new_process()
    op = h.h.invoke(p, "extend", {"receipt": r1, "seconds": 10})
    h.h.ok(op, {"receipt": r1, "deadline": T0 + 10_000})
    (r2,) = h.receive("c2", T0 + 5000, ("a", 0, 2))
    h.settle("ack", r2)
    assert kinds(h.check()) == [checker.ILLEGAL_DUPLICATE]


def test_redelivery_after_nack_or_release_is_legitimate() -> None:
    h = H()
    h.publish("a")
    h.publish("b")
    h.publish("c")
    ra, rb, _rc = h.receive("c1", T0, ("a", 0, 1), ("b", 1, 1), ("c", 2, 1))
    h.settle("nack", ra)
    h.settle("nack", rb, result="info")  # may have happened
    h.release("c1")
    ra2, rb2, rc2 = h.receive("c2", T0 + 10, ("a", 0, 2), ("b", 1, 2), ("c", 2, 2))
    for r in (ra2, rb2, rc2):
        h.settle("ack", r)
    res = h.check()
    assert res.valid, res.anomalies
    assert res.legit_duplicates == {"nack": 2, "release": 1}


def test_receive_ending_badly_implies_a_release_of_that_consumer() -> None:
    h = H()
    h.publish("a")
    h.receive("c1", T0, ("a", 0, 1))
    h.receive("c1", T0 + 5, result="info")  # the node releases c1 when its poll breaks
    (r,) = h.receive("c2", T0 + 10, ("a", 0, 2))
    h.settle("ack", r)
    res = h.check()
    assert res.valid, res.anomalies
    assert res.legit_duplicates == {"release": 1}


def test_failed_nack_does_not_excuse_an_early_redelivery() -> None:
    h = H()
    h.publish("a")
    (r1,) = h.receive("c1", T0, ("a", 0, 1))
    h.settle("nack", r1, result="fail")
    (r2,) = h.receive("c2", T0 + 10, ("a", 0, 2))
    h.settle("ack", r2)
    assert kinds(h.check()) == [checker.ILLEGAL_DUPLICATE]


def test_redelivery_after_acknowledged_ack_is_illegal_even_after_expiry() -> None:
    h = H()
    h.publish("a")
    (r1,) = h.receive("c1", T0, ("a", 0, 1))
    h.settle("ack", r1)
    (r2,) = h.receive("c2", T0 + 60_000, ("a", 0, 2))
    h.settle("ack", r2)
    res = h.check()
    assert kinds(res) == [checker.ILLEGAL_DUPLICATE]
    assert "acknowledged ack" in res.anomalies[0].detail


def test_ack_with_unknown_outcome_then_redelivery_after_expiry_is_legitimate() -> None:
    h = H()
    h.publish("a")
    (r1,) = h.receive("c1", T0, ("a", 0, 1))
    h.settle("ack", r1, result="info")
    (r2,) = h.receive("c2", T0 + 2500, ("a", 0, 2))
    h.settle("ack", r2)
    assert h.check().valid


def test_same_attempt_twice_and_two_seqs_are_illegal() -> None:
    h = H()
    h.publish("a", seq=0)
    h.publish("b", seq=1)
    ra, rb = h.receive("c1", T0, ("a", 0, 1), ("b", 1, 1))
    ra2, rb2 = h.receive("c2", T0 + 3000, ("a", 0, 1), ("b", 7, 1))
    for r in (ra, rb, ra2, rb2):
        h.settle("ack", r)
    res = h.check()
    details = sorted(a.detail for a in res.by_kind(checker.ILLEGAL_DUPLICATE))
    assert len(details) == 2
    assert "attempt 1 delivered twice" in details[0]
    assert "stored twice" in details[1]


def test_skipped_attempt_is_an_unobserved_delivery() -> None:
    h = H()
    h.publish("a")
    h.receive("c1", T0, ("a", 0, 1))
    (r,) = h.receive("c2", T0 + 100, ("a", 0, 3))  # attempt 2 went to a lost receive
    h.settle("ack", r)
    res = h.check()
    assert res.valid, res.anomalies
    assert res.legit_duplicates == {"unobserved delivery": 1}


def test_poison_message_dead_lettered_after_max_attempts_is_valid() -> None:
    h = H()
    h.publish("poison-1")
    now = T0
    for attempt in (1, 2, 3):
        (r,) = h.receive(f"c{attempt}", now, ("poison-1", 0, attempt))
        h.settle("nack", r)
        now += 10
    h.dlq("poison-1", attempts=3)
    res = h.check()
    assert res.valid, res.anomalies
    assert res.counts["dead-lettered"] == 1


def test_poison_message_missing_from_dead_letters_is_lost() -> None:
    h = H()
    h.publish("poison-1")
    (r,) = h.receive("c1", T0, ("poison-1", 0, 1))
    h.settle("nack", r)
    res = h.check()
    assert kinds(res) == [checker.LOST]
    assert "poison" in res.anomalies[0].detail


def test_dead_letter_invariants() -> None:
    h = H()
    for v in ("early", "acked", "twice", "termed", "phantom-term"):
        h.publish(v)
    # dead-lettered after 2 attempts while max_attempts is 3
    (r,) = h.receive("c1", T0, ("early", 0, 1))
    h.settle("nack", r)
    h.dlq("early", attempts=2, dseq=0)
    # acked, then dead-lettered anyway
    (r,) = h.receive("c1", T0, ("acked", 1, 1))
    h.settle("ack", r)
    h.dlq("acked", attempts=3, dseq=1)
    # dead-lettered twice
    (r,) = h.receive("c1", T0, ("twice", 2, 1))
    h.settle("term", r)
    h.dlq("twice", attempts=1, reason="term: x", dseq=2)
    h.dlq("twice", attempts=1, reason="term: x", dseq=3)
    # a term is a legitimate early dead letter
    (r,) = h.receive("c1", T0, ("termed", 3, 1))
    h.settle("term", r)
    h.dlq("termed", attempts=1, reason="term: bad", dseq=4)
    # a term reason without any term sent
    (r,) = h.receive("c1", T0, ("phantom-term", 4, 1))
    h.settle("nack", r)
    h.dlq("phantom-term", attempts=1, reason="term: ?", dseq=5)
    res = h.check()
    got = sorted((a.value, a.detail.split(" ")[0]) for a in res.by_kind(checker.DEAD_LETTER))
    assert got == [
        ("acked", "dead-lettered"),
        ("early", "dead-lettered"),
        ("phantom-term", "dead-lettered"),
        ("twice", "dead-lettered"),
    ]
    assert all(a.kind == checker.DEAD_LETTER for a in res.anomalies)


def test_delivery_beyond_max_attempts_is_a_dead_letter_anomaly() -> None:
    h = H()
    h.publish("a")
    now = T0
    for attempt in (1, 2, 3, 4):
        (r,) = h.receive("c", now, ("a", 0, attempt))
        if attempt < 4:
            h.settle("nack", r)
        else:
            h.settle("ack", r)
        now += 10
    assert kinds(h.check()) == [checker.DEAD_LETTER]


def test_history_round_trips_through_jsonl(tmp_path: Any) -> None:
    hist = History(tmp_path / "h.jsonl")
    op = hist.invoke(0, "publish", {"topic": "work", "value": "a"})
    hist.info(op, "timeout")
    hist.note("kill", {"node": "n1"})
    hist.close()
    events = read(tmp_path / "h.jsonl")
    assert [e["type"] for e in events] == ["invoke", "info", "info"]
    res = checker.check(events, SPEC)
    assert res.valid and res.counts["publish-info"] == 1


def test_batch_publish_values_are_checked_one_by_one() -> None:
    h = H()
    p = h.h.new_process()
    op = h.h.invoke(p, "publish", {"topic": "work", "values": ["a", "b", "c"]})
    h.h.ok(op, {"topic": "work", "values": ["a", "b", "c"], "seqs": [0, 1, 2]})
    ra, rb = h.receive("c1", T0, ("a", 0, 1), ("b", 5, 1))
    h.settle("ack", ra)
    h.settle("ack", rb)
    res = h.check()
    assert res.counts["publish-ok"] == 3
    got = sorted((a.kind, a.value) for a in res.anomalies)
    assert got == [(checker.LOST, "c"), (checker.UNEXPECTED, "b")]


def test_dead_letter_redelivered_after_acknowledged_ack_is_illegal() -> None:
    h = H()
    h.publish("poison-1")
    now = T0
    for attempt in (1, 2, 3):
        (r,) = h.receive(f"c{attempt}", now, ("poison-1", 0, attempt))
        h.settle("nack", r)
        now += 10
    h.dlq("poison-1", attempts=3, dseq=0)  # received from the dead-letter group and acked
    h.dlq("poison-1", attempts=3, dseq=0, attempt=2)  # ... and delivered again
    res = h.check()
    assert kinds(res) == [checker.ILLEGAL_DUPLICATE]
    assert res.anomalies[0].detail.startswith("dead letter redelivered")


def test_stream_deliveries_may_be_released_at_any_time_but_not_after_an_ack() -> None:
    h = H()
    h.publish("a")
    h.publish("b")
    stream = {"topic": "work", "group": "g", "consumer": "s1", "visibility": VIS, "stream": True}
    receipts = []
    for value, seq in (("a", 0), ("b", 1)):
        op = h.h.invoke(h.h.new_process(), "receive", stream)
        r = f"work:g:{seq}:1:s"
        d = {"value": value, "seq": seq, "attempt": 1, "receipt": r, "deadline": T0 + 2000}
        h.h.ok(op, {**stream, "deliveries": [d]})
        receipts.append(r)
    h.settle("ack", receipts[1])
    ra, rb = h.receive("c2", T0 + 10, ("a", 0, 2), ("b", 1, 2))  # inside both leases
    h.settle("ack", ra)
    h.settle("ack", rb)
    res = h.check()
    assert [(a.kind, a.value) for a in res.anomalies] == [(checker.ILLEGAL_DUPLICATE, "b")]
    assert res.legit_duplicates == {"release": 1}
