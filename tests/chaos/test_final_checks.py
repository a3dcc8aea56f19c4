"""The after-healing checks on fake clusters: each one fails when its property does not hold."""

from __future__ import annotations

from typing import Any

from raftq_chaos import runner


class _Fake:
    def __init__(self, statuses: Any, digests: Any = None, figures: Any = None) -> None:
        self.nodes = dict.fromkeys(statuses)
        self._st, self._dg, self._fg = statuses, digests or {}, figures or {}

    async def statuses(self) -> dict[str, dict[str, Any] | None]:
        return dict(self._st)

    async def digest(self, nid: str) -> dict[str, Any] | None:
        return self._dg.get(nid)

    async def broker_figures(self, nid: str) -> dict[str, float] | None:
        return self._fg.get(nid)


def FakeCluster(statuses: Any, digests: Any = None, figures: Any = None) -> Any:
    """Stands in for ``cluster.Cluster`` (typed Any: the checks only use these methods)."""
    return _Fake(statuses, digests, figures)


def st(role: str, leader: str | None) -> dict[str, Any]:
    return {"role": role, "leader": leader}


async def test_one_leader() -> None:
    good = FakeCluster({"n1": st("leader", "n1"), "n2": st("follower", "n1")})
    assert (await runner.check_one_leader(good, timeout=0.1))[0] is True
    two = FakeCluster({"n1": st("leader", "n1"), "n2": st("leader", "n2")})
    assert (await runner.check_one_leader(two, timeout=0.1))[0] is False
    split = FakeCluster({"n1": st("leader", "n1"), "n2": st("follower", None)})
    assert (await runner.check_one_leader(split, timeout=0.1))[0] is False
    down = FakeCluster({"n1": st("leader", "n1"), "n2": None})
    assert (await runner.check_one_leader(down, timeout=0.1))[0] is False


async def test_digests() -> None:
    sts = {"n1": st("leader", "n1"), "n2": st("follower", "n1")}
    same = FakeCluster(sts, {"n1": {"digest": "ab"}, "n2": {"digest": "ab"}})
    assert (await runner.check_digests(same, timeout=0.1))[0] is True
    differ = FakeCluster(sts, {"n1": {"digest": "ab"}, "n2": {"digest": "cd"}})
    assert (await runner.check_digests(differ, timeout=0.1))[0] is False
    missing = FakeCluster(sts, {"n1": {"digest": "ab"}})
    assert (await runner.check_digests(missing, timeout=0.1))[0] is False
    none = FakeCluster(sts)
    res = (await runner.check_digests(none, timeout=0.1))[0]
    assert res == "not exposed"


async def test_replicas_equal_and_empty() -> None:
    sts = {"n1": st("leader", "n1"), "n2": st("follower", "n1")}
    empty = {
        'raftq_topic_messages{topic="work"}': 0.0,
        'raftq_topic_published_total{topic="work"}': 9,
    }
    left = {**empty, 'raftq_group_in_flight{topic="work",group="g"}': 1.0}
    other = {**empty, 'raftq_topic_published_total{topic="work"}': 8}
    check = runner.check_replicas
    ok = FakeCluster(sts, figures={"n1": empty, "n2": dict(empty)})
    assert (await check(ok, timeout=0.1))[:2] == (True, True)
    inflight = FakeCluster(sts, figures={"n1": left, "n2": left})
    assert (await check(inflight, timeout=0.1))[:2] == (True, False)
    diverged = FakeCluster(sts, figures={"n1": empty, "n2": other})
    assert (await check(diverged, timeout=0.1))[:2] == (False, True)
    unreachable = FakeCluster(sts, figures={"n1": empty})
    assert (await check(unreachable, timeout=0.1))[:2] == (False, False)
