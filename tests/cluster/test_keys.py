"""A topic's idempotency keys (``keys.TopicKeys``): numbered keys in runs, others as digests."""

from __future__ import annotations

import random
from array import array
from typing import Any

import pytest
from state_harness import check_keys  # type: ignore[import-not-found]

from raftq.cluster import keys
from raftq.cluster.keys import LONG_RUN, MAX_RUNS, TopicKeys, _expand, _stretches, numbered, slot

AT = 1_700_000_000_000


def test_numbered_keys_are_the_canonical_decimal_ones() -> None:
    assert numbered("a1b2-9f-17") == ("a1b2-9f", 17)
    assert numbered("-1") == ("", 1)
    for key in ("k1", "x-", "x-0", "x-017", "x-+5", "x- 5", "x-1e3", "x-\u0663", "x-" + "9" * 19):
        assert numbered(key) is None, key
    assert numbered("x-" + "9" * 18) == ("x", 10**18 - 1)


def publish(
    k: TopicKeys, keys: list[str], seq: int, exp: int, fast: bool = True
) -> list[int | None]:
    """What ``Broker._op_publish`` does with one command's keys: the first ones a producer's
    next keys (``next_keys``, unless not ``fast``), each other one looked up, then add the new
    ones (a key twice in the command: the first wins)."""
    msgs = [{"payload": b"", "key": key} for key in keys]
    prefix, n0, known = k.next_keys(msgs) if fast and len(keys) > 1 else ("", 0, 0)
    first = seq
    batch: dict[Any, int] = {}
    out: list[int | None] = [None] * known
    seq += known
    for key in keys[known:]:
        tok, prior = k.lookup(key)
        if prior is None and known and tok[0] == prefix and 0 <= tok[1] - n0 < known:
            prior = first + tok[1] - n0
        if prior is None and tok in batch:
            prior = batch[tok]
        if prior is None:
            batch[tok] = seq
            seq += 1
        out.append(prior)
    if known:
        k.add_next(exp, prefix, n0, first, known)
    k.add(exp, batch)
    return out


def run_against_a_dict(
    seed: int, steps: int, restore_every: int, fast: bool = True
) -> tuple[TopicKeys, int]:
    """Returns the table and the most keys its runs held at once."""
    rnd = random.Random(seed)
    k = TopicKeys()
    model: dict[str, tuple[int, int]] = {}  # key -> (seq, expires_at)
    prefixes = [f"p{i:x}-{rnd.getrandbits(16):x}" for i in range(6)]
    counters = {p: 1 for p in prefixes}
    sent: list[str] = []
    seq, now, most = 1, AT, 0
    for step in range(steps):
        now += rnd.choice([0, 1, 5, 40, 200])
        nxt = k.next_expiry()
        if nxt is not None and nxt <= now:  # as the Broker: only when due
            k.expire(now)
        model = {key: v for key, v in model.items() if v[1] > now}
        keys: list[str] = []
        for _ in range(rnd.choice([1, 1, 2, 5, 30])):
            r = rnd.random()
            if r < 0.55:  # a producer's next keys
                p = rnd.choice(prefixes)
                keys.append(f"{p}-{counters[p]}")
                counters[p] += 1
            elif r < 0.7 and sent:  # a retry (a duplicate, or a key long expired)
                keys.append(rnd.choice(sent[-300:]))
            elif r < 0.8:  # a producer skipping ahead, or one that restarted its count
                p = rnd.choice(prefixes)
                counters[p] = max(1, counters[p] + rnd.randrange(-40, 40))
                keys.append(f"{p}-{counters[p]}")
                counters[p] += 1
            elif r < 0.9:  # a new client's one key
                keys.append(f"c{rnd.getrandbits(32):x}-1")
            else:
                keys.append(f"k{rnd.getrandbits(20)}")
        window = rnd.choice([100, 300, 300, 1000])
        got = publish(k, keys, seq, now + window, fast)
        want: list[int | None] = []
        for key in keys:
            if key in model:
                want.append(model[key][0])
            else:
                model[key] = (seq, now + window)
                want.append(None)
                seq += 1
        assert got == want, (step, keys)
        sent.extend(keys)
        assert len(k) == len(model), step
        check_keys(k, now)  # (runs' stretches maximal and in order, nruns counted)
        most = max(most, k.nruns)
        if restore_every and step % restore_every == restore_every - 1:
            before = k.dump()
            k = TopicKeys.restore(before)
            assert k.dump() == before and len(k) == len(model)
    return k, most


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_the_keys_agree_with_a_dict(seed: int, fast: bool) -> None:
    k, most = run_against_a_dict(seed, 1500, 0, fast)
    assert most > 20, "keys went to runs"
    assert len(k.digests), "and some to digests"


@pytest.mark.parametrize("seed", range(4))
def test_the_keys_agree_with_a_dict_across_restores(seed: int) -> None:
    run_against_a_dict(100 + seed, 1500, 97)[0]


@pytest.mark.parametrize("seed", range(4))
def test_the_keys_agree_with_a_dict_when_runs_turn_dense_and_back(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(keys, "DENSE_FROM", 0)  # (a run with a few stretches turns dense)
    turned = {"dense": 0, "back": 0}  # (counted, as a mutation's witness)
    densify, drop = keys.Run._densify, keys.DenseRun.drop_front

    def count_densify(run: keys.Run) -> None:
        turned["dense"] += 1
        densify(run)

    def count_drop(run: keys.DenseRun) -> None:
        drop(run)
        turned["back"] += type(run) is keys.Run

    monkeypatch.setattr(keys.Run, "_densify", count_densify)
    monkeypatch.setattr(keys.DenseRun, "drop_front", count_drop)
    run_against_a_dict(200 + seed, 1500, 97 if seed % 2 else 0)
    assert turned["dense"], turned  # (and back: the test below)


def test_interleaved_one_key_publishes_make_a_dense_run_and_batches_stretch_again() -> None:
    k = TopicKeys()
    seq = 1
    for i in range(1, 2001):  # two producers, a key a publish, each publish its own expiry
        for p in ("a-1", "b-1"):
            assert publish(k, [f"{p}-{i}"], seq, AT + 2 * seq) == [None]
            seq += 1
    run = k.records["a-1"].runs[0]
    assert type(run) is keys.DenseRun and run.live() == 1999  # (key 1 alone: a digest)
    assert 16 <= k.nbytes() / len(k) < 20  # (an item a key: as before stretches)
    dumped = k.dump()
    assert TopicKeys.restore(dumped).dump() == dumped and isinstance(dumped[3][0][1][0][1], bytes)
    first = seq
    for i in range(2001, 3001, 100):  # then "a" alone, in batches of 100, one expiry each
        batch = [f"a-1-{j}" for j in range(i, i + 100)]
        assert publish(k, batch, seq, AT + 10_000 + i) == [None] * 100
        seq += 100
    # The one-key publishes expire: most of the dense run, dropped; the rest stretches.
    assert k.expire(AT + 10_000) == 4000
    run = k.records["a-1"].runs[0]
    assert type(run) is keys.Run and run.live() == 1000
    assert len(run.sidx) == 1 and len(run.evals) == 10
    assert k.lookup("a-1-2001")[1] == first and k.lookup("a-1-3000")[1] == seq - 1
    assert k.lookup("a-1-2000")[1] is None and k.lookup("a-1-3001")[1] is None


def test_a_producers_keys_are_runs_and_a_miss_there_is_an_answer() -> None:
    k = TopicKeys()
    assert publish(k, [f"p-{n}" for n in range(1, 101)], 1, AT + 10) == [None] * 100
    assert len(k.digests) == 0 and k.nruns == 100 and k.high is None
    rec = k.records["p"]
    assert len(rec.runs) == 1
    assert k.lookup("p-101") == (("p", 101), None)  # (no digest asked: a 2-tuple)
    assert k.lookup("p-50") == (("p", 50), 50)
    assert publish(k, ["p-101"], 101, AT + 20) == [None]  # one key: the record takes it
    assert len(rec.runs) == 1 and rec.runs[0].live() == 101
    assert k.expire(AT + 10) == 100 and len(k) == 1
    assert k.lookup("p-50")[1] is None and k.lookup("p-101")[1] == 101
    assert k.expire(AT + 20) == 1 and not k.records and len(k) == 0


def test_one_key_clients_cost_a_digest_not_a_record() -> None:
    k = TopicKeys()
    publish(k, [f"c{i}-1" for i in range(50)], 1, AT + 10)  # one command, 50 clients
    assert not k.records and len(k.digests) == 50
    assert k.lookup("c7-1")[1] == 8
    assert k.high is not None and max(k.high) == 1


def test_a_records_miss_asks_the_digests_up_to_its_slots_highest_digest_key() -> None:
    k = TopicKeys()
    publish(k, ["p-5"], 1, AT + 100)  # alone: a digest, and high[slot("p")] = 5
    assert k.high is not None and k.high[slot("p")] == 5
    publish(k, ["p-6", "p-7"], 2, AT + 50)  # a record
    assert k.lookup("p-5")[1] == 1  # found among the digests
    tok, seq = k.lookup("p-3")
    assert seq is None and len(tok) == 3  # asked them
    assert k.lookup("p-8") == (("p", 8), None)  # above 5: did not
    k.expire(AT + 50)
    assert "p" not in k.records  # (its runs gone: the record went with them)
    assert k.lookup("p-5")[1] == 1


def test_a_v8_table_asks_the_digests_until_its_keys_expired() -> None:
    k = TopicKeys()
    publish(k, ["q-1", "q-2"], 1, AT + 100)
    v8 = TopicKeys(k.digests)  # (as a v8 restore: digests only; here none of q's)
    publish(v8, ["x-1"], 3, AT + 200)
    assert v8.legacy_until == 0
    v8 = TopicKeys(v8.digests)
    assert v8.legacy_until == AT + 200 and v8.next_expiry() == AT + 200
    publish(v8, ["r-1", "r-2"], 4, AT + 300)
    assert len(v8.lookup("r-3")[0]) == 3  # asked the digests
    v8.expire(AT + 200)
    assert v8.legacy_until == 0 and v8.lookup("r-3") == (("r", 3), None)


def test_a_key_again_in_an_expired_front_goes_before_that_run() -> None:
    k = TopicKeys()
    publish(k, [f"p-{n}" for n in range(1, 21)], 1, AT + 10)
    publish(k, [f"p-{n}" for n in range(21, 41)], 21, AT + 20)
    assert len(k.records["p"].runs) == 1  # (one run: the second extended the first)
    k.expire(AT + 10)  # 1-20 gone
    assert publish(k, [f"p-{n}" for n in range(3, 11)], 41, AT + 30) == [None] * 8
    runs = k.records["p"].runs
    assert [(r.n0 + r.start, r.end()) for r in runs] == [(3, 11), (21, 41)]
    assert k.lookup("p-4")[1] == 42 and k.lookup("p-22")[1] == 22 and k.lookup("p-12")[1] is None


def test_sparse_numbers_are_digests_not_a_run_each() -> None:
    k = TopicKeys()
    ids = list(range(1, 2000, 7))
    for i in range(0, len(ids), 2):  # order-<id>, two a publish
        publish(k, [f"order-{n}" for n in ids[i : i + 2]], 1 + i, AT + 10)
    assert len(k.records["order"].runs) == 1 and k.nruns == 1  # (its first key only)
    assert len(k.digests) == len(ids) - 1
    assert k.lookup("order-8")[1] == 2 and k.lookup("order-9")[1] is None
    k.expire(AT + 10)
    assert len(k) == 0 and k.high is None  # (no numbered digest left: no bound)


def test_a_record_holds_at_most_max_runs_of_short_stretches() -> None:
    k = TopicKeys()
    for r in range(MAX_RUNS + 5):  # runs of 8 with gaps between them
        publish(k, [f"p-{100 * r + n}" for n in range(1, 9)], 1 + 8 * r, AT + 10)
    assert len(k.records["p"].runs) == MAX_RUNS
    assert len(k.digests) == 5 * 8 and k.lookup("p-6801")[1] == 1 + 8 * 68
    # A long stretch still gets a run: a client's batches, round robin over topics.
    publish(k, [f"p-{10_000 + n}" for n in range(LONG_RUN)], 1000, AT + 10)
    assert len(k.records["p"].runs) == MAX_RUNS + 1 and len(k.digests) == 5 * 8
    assert k.lookup(f"p-{10_000 + LONG_RUN - 1}")[1] == 1000 + LONG_RUN - 1


def test_a_clients_batches_round_robin_over_topics_are_runs() -> None:
    topics = [TopicKeys() for _ in range(10)]
    n = seq = 1
    for b in range(1000):  # batches of 100 keys, the client's one counter over 10 topics
        t = topics[b % 10]
        assert publish(t, [f"c-e-{n + j}" for j in range(100)], seq, AT + 1000) == [None] * 100
        n += 100
        seq += 100
    for t in topics:
        assert not len(t.digests) and t.nruns == 10_000 and len(t.records["c-e"].runs) == 100
        assert t.nbytes() / len(t) < 10
    assert topics[3].lookup("c-e-301")[1] == 301 and topics[3].lookup("c-e-401")[1] is None


def test_restore_refuses_malformed_records() -> None:
    good = TopicKeys()
    publish(good, [f"p-{n}" for n in range(1, 4)], 1, AT + 10)
    rows, high, legacy, recs = good.dump()
    eight = (1).to_bytes(8, "little")
    for bad in (
        [["p", []]],  # no keys
        [["p", [[1, eight, eight * 2]]]],  # seqs and expiries differ
        [["p", [[1, eight * 2, eight * 2], [2, eight, eight]]]],  # overlapping
        [["q", recs[0][1]], ["p", recs[0][1]]],  # prefixes out of order
        [["p", [[1, [-1, 3], [AT, 3]]]]],  # a seq below 0 (-1: "none yet" in a run)
        [["p", [[1, [7, 3], [-1, 3]]]]],  # an expiry below 0
        [["p", [[1, (-1).to_bytes(8, "little", signed=True), eight]]]],
        [["p", [[1, [1, 3], [AT, 2, AT - 1, 1]]]]],  # expiries going back
    ):
        with pytest.raises(ValueError):
            TopicKeys.restore([rows, high, legacy, bad])
    assert TopicKeys.restore([rows, high, legacy, recs]).lookup("p-2")[1] == 2


def test_a_run_whose_seqs_go_back_along_n_snapshots_as_the_arrays_did() -> None:
    """Seqs that go back along n (keys of one publish out of n order) defeat the bisection
    of ``_stretches``, which then wrote bytes: a snapshot still must (replicas of the
    version before stretch-coded runs write it so)."""
    k = TopicKeys()
    publish(k, [f"p-{n}" for n in range(1, 199)] + ["p-200", "p-199"], 1, AT + 10)
    (_, seqs, _) = k.dump()[3][0][1][0]
    assert isinstance(seqs, bytes)
    assert _expand(seqs, 1) == array("q", [*range(1, 199), 200, 199])
    check_keys(k, AT)


def test_runs_snapshot_as_stretches_when_few_else_bytes() -> None:
    rnd = random.Random(3)
    for _ in range(300):
        step = rnd.choice([0, 1])
        a = array("q")
        v = rnd.randrange(1, 1000)
        for _ in range(rnd.randrange(1, 8)):  # stretches, sometimes going back (any array)
            v += rnd.choice([1, 2, 50, -3]) if step else rnd.choice([0, 1, 7])
            k = rnd.choice([1, 5, 100, 400])
            a.extend(range(v, v + k) if step else [v] * k)
        lo = rnd.randrange(len(a))
        got = _stretches(a, lo, step)
        assert _expand(got, step) == a[lo:]
        if isinstance(got, list):
            assert len(got) <= 2 * max(1, (len(a) - lo) // 64)
    seqs = array("q", range(5, 1005))
    assert _stretches(seqs, 0, 1) == [5, 1000] and _stretches(seqs, 10, 1) == [15, 990]
    assert isinstance(_stretches(array("q", range(0, 2000, 2)), 0, 1), bytes)


def test_a_batch_of_next_keys_stops_at_what_may_be_held() -> None:
    """``next_keys`` answers for a batch only past the prefix's last run: a batch that starts
    in a gap between runs reaches held keys, and a batch whose numbers grow past MAX_DIGITS
    reaches keys that are not numbered ones (digests)."""
    k = TopicKeys()
    assert publish(k, [f"p-{n}" for n in range(1, 11)], 1, AT + 100) == [None] * 10
    assert publish(k, [f"p-{n}" for n in range(20, 31)], 11, AT + 100) == [None] * 11
    got = publish(k, [f"p-{n}" for n in range(15, 26)], 22, AT + 100)
    assert got == [None] * 5 + list(range(11, 17))
    top = 10**keys.MAX_DIGITS
    assert publish(k, [f"q-{top - 3}", f"q-{top - 2}"], 100, AT + 100) == [None, None]
    assert publish(k, [f"q-{top - 1}", f"q-{top}"], 102, AT + 100) == [None, None]
    assert publish(k, [f"q-{top}"], 104, AT + 100) == [103]
