"""Prometheus metrics, one ``CollectorRegistry`` per app (never the global one).

Broker figures are read from the replicated state at scrape time, so every node reports the
same cluster-wide numbers: cluster totals (``raftq_cluster_*``: topics, groups, retained
messages and bytes, pending, delayed, in flight, and every counter summed) always, and
per-topic and per-group series (``raftq_topic_*``, ``raftq_group_*``) for at most
``topics`` topics, those with the most unsettled messages (``--metrics-topics``: 100 by
default, 0 for none, ``all``): with ten thousand topics a full scrape is ~10 MB and takes
more than a second of the node's time under the apply lock. A topic that leaves the top ``topics``
loses its series (Prometheus marks them stale). These broker-wide series are alike on every
node: aggregate them over nodes with ``max``, never ``sum`` (README). Node figures (HTTP
latency, group-commit batch sizes, propose latency, the Raft binding's counters, process, GC
and platform) are this process's own and carry its Raft id in ``raftq_node_info{node}``.

Names follow Prometheus' rules (``promtool check metrics``): base units (seconds), counters
end in ``_total``, and one name for one thing: ``pending`` is what the API calls pending
(ready for delivery), ``unsettled`` is pending + delayed + in flight.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from raftq.cluster.state import Broker
from raftq.node.raftapi import Raft

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DEFAULT_TOPICS = 100  # per-topic series for this many topics by default (--metrics-topics)

_GROUP_COUNTERS = {
    "delivered": "deliveries",
    "redelivered": "redeliveries",
    "acked": "acks",
    "nacked": "nacks",
    "timed_out": "visibility timeouts",
    "released": "released deliveries",
    "dead_lettered": "dead-lettered messages",
    "dropped": "messages dropped before being settled",
}
_TOPIC_COUNTERS = {
    "published": "published messages",
    "duplicates": "publishes deduplicated by key",
    "dropped_overflow": "messages dropped by drop_oldest overflow",
    "expired": "messages expired by max_age",
    "purged": "messages purged",
}


_TOTALS = {  # raftq_cluster_<name>: (Broker.overview()["totals"] key, help)
    "topics": ("topics", "topics"),
    "groups": ("groups", "consumer groups"),
    "messages": ("messages", "retained messages, all topics"),
    "bytes": ("bytes", "retained payload bytes, all topics"),
    "pending": ("pending", "messages ready for delivery, summed over every group"),
    "delayed": ("delayed", "messages waiting for a delay, summed over every group"),
    "in_flight": ("in_flight", "deliveries awaiting ack, summed over every group"),
}


# The Raft binding's stats whose key does not name the thing well enough.
_RAFT_STAT_NAMES = {"syncs": "fsyncs", "sync_us": "fsync_us"}
_UNITS = (("_ms", 1e-3), ("_us", 1e-6))


def raft_stat_series(key: str) -> tuple[str, bool, float]:
    """The series for one of ``RaftNode.stats``: (name, is_counter, scale). Keys ending in
    ``_ms`` / ``_us`` become ``_seconds``; ``max_*`` and ``last_*`` are gauges, everything
    else a cumulative count (exported as ``<name>_total``)."""
    base, scale = _RAFT_STAT_NAMES.get(key, key), 1.0
    for suffix, factor in _UNITS:
        if base.endswith(suffix):
            base, scale = base.removesuffix(suffix) + "_seconds", factor
    return f"raftq_raft_{base}", not key.startswith(("max_", "last_")), scale


def top_topics(unsettled: dict[str, int], retained: dict[str, int], n: int | None) -> list[str]:
    """The ``n`` topics (all: None) with the most unsettled messages (pending, delayed or in
    flight), then the most retained messages, then by name: the same on every replica."""
    if n is None:
        return sorted(unsettled)
    return heapq.nsmallest(n, unsettled, key=lambda t: (-unsettled[t], -retained[t], t))


def _figures(b: Broker, n: int | None) -> tuple[dict[str, Any], list[dict[str, Any]], int]:
    overview = b.overview()
    top = top_topics(overview["unsettled"], overview["retained"], n)
    return overview, [b.topic_stats(name) for name in top], b.now


class BrokerCollector(Collector):
    def __init__(self, raft: Raft, topics: int | None = DEFAULT_TOPICS) -> None:
        self.raft = raft
        self.topics = topics  # per-topic series for this many topics (None: all)

    def collect(self) -> Iterator[Metric]:
        st = self.raft.status()
        for name, value, doc in (
            ("raftq_raft_term", st.term, "current Raft term"),
            ("raftq_raft_commit_index", st.commit_index, "Raft commit index"),
            ("raftq_raft_applied_index", st.applied_index, "last applied Raft index"),
            ("raftq_raft_is_leader", int(st.role == "leader"), "1 when this node leads"),
            ("raftq_raft_running", int(st.error is None), "0 once Raft stopped on a failure"),
        ):
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], value)
            yield g
        if st.error is not None:  # why (the process exits soon; /cluster says it too)
            g = GaugeMetricFamily(
                "raftq_raft_stopped", "1: Raft stopped on this failure", labels=["error"]
            )
            g.add_metric([st.error[:200]], 1)
            yield g
        # The binding's own counters (RaftNode.stats: fsyncs, time in fsync, longest tick,
        # snapshots), when it has them: where time goes under load.
        stats = getattr(self.raft, "stats", None)
        if isinstance(stats, dict):
            for key, value in sorted(stats.items()):
                if isinstance(value, int | float) and not isinstance(value, bool):
                    name, counter, scale = raft_stat_series(key)
                    doc = f"Raft binding: {key.replace('_', ' ')}"
                    family = CounterMetricFamily if counter else GaugeMetricFamily
                    m = family(name, doc)
                    m.add_metric([], value * scale)
                    yield m
        info = GaugeMetricFamily("raftq_node_info", "this node's Raft id", labels=["node"])
        info.add_metric([st.node_id], 1)
        yield info
        n = self.topics
        overview, topics, state_now = self.raft.read(lambda b: _figures(b, n))
        yield from _totals(overview)
        limit = self.raft.read(lambda b: b.settings.get("max_retained_bytes"))
        if limit is not None:  # (raftq_cluster_bytes is what counts against it)
            g = GaugeMetricFamily(
                "raftq_cluster_max_retained_bytes",
                "the cluster's max_retained_bytes: publishes past it are refused",
            )
            g.add_metric([], limit)
            yield g
        live, segments = self.raft.read(lambda b: b.store.retained_bytes())
        store = GaugeMetricFamily(
            "raftq_store_bytes",
            "this node's payload store: bytes of live records, and of its segment files",
            labels=["kind"],
        )
        store.add_metric(["live"], live)
        store.add_metric(["segments"], segments)
        yield store
        shown = GaugeMetricFamily(
            "raftq_metrics_topics_shown",
            "topics with per-topic series in this scrape (--metrics-topics)",
        )
        shown.add_metric([], len(topics))
        yield shown
        tc = {
            k: CounterMetricFamily(f"raftq_topic_{k}", doc, labels=["topic"])
            for k, doc in _TOPIC_COUNTERS.items()
        }
        gc = {
            k: CounterMetricFamily(f"raftq_group_{k}", doc, labels=["topic", "group"])
            for k, doc in _GROUP_COUNTERS.items()
        }
        t_msgs = GaugeMetricFamily("raftq_topic_messages", "retained messages", labels=["topic"])
        t_bytes = GaugeMetricFamily("raftq_topic_bytes", "retained payload bytes", labels=["topic"])
        pending = GaugeMetricFamily(
            "raftq_group_pending", "messages ready for delivery", labels=["topic", "group"]
        )
        delayed = GaugeMetricFamily(
            "raftq_group_delayed", "messages waiting for a delay", labels=["topic", "group"]
        )
        inflight = GaugeMetricFamily(
            "raftq_group_in_flight", "deliveries awaiting ack", labels=["topic", "group"]
        )
        oldest = GaugeMetricFamily(
            "raftq_group_oldest_unsettled_age_seconds",
            "age of the group's oldest unsettled message (pending, delayed or in flight;"
            " 0 when none), like SQS's ApproximateAgeOfOldestMessage",
            labels=["topic", "group"],
        )
        # The state's clock stands still while nothing is applied: age by this node's clock
        # from the message's publish time (the state's now minus its age there).
        wall_ms = time.time() * 1000
        for t in topics:
            name = t["topic"]
            for k in _TOPIC_COUNTERS:
                tc[k].add_metric([name], t.get(f"{k}_total", 0))
            t_msgs.add_metric([name], t["messages"])
            t_bytes.add_metric([name], t["bytes"])
            for g in t["groups"]:
                labels = [name, g["group"]]
                for k in _GROUP_COUNTERS:
                    gc[k].add_metric(labels, g.get(f"{k}_total", 0))
                pending.add_metric(labels, g["pending"])
                delayed.add_metric(labels, g["delayed"])
                inflight.add_metric(labels, g["in_flight"])
                age_ms = g["oldest_age_ms"]
                if age_ms is not None:
                    age_ms = max(age_ms, wall_ms - (state_now - age_ms))
                oldest.add_metric(labels, (age_ms or 0) / 1000)
        yield from tc.values()
        yield from gc.values()
        yield from (t_msgs, t_bytes, pending, delayed, inflight, oldest)


def _totals(overview: dict[str, Any]) -> Iterator[Metric]:
    """``raftq_cluster_*``: every topic and group together, whatever ``--metrics-topics``."""
    for name, (key, doc) in _TOTALS.items():
        g = GaugeMetricFamily(f"raftq_cluster_{name}", doc)
        g.add_metric([], overview["totals"][key])
        yield g
    for kind, counters, docs in (
        ("topic", overview["topic_counters"], _TOPIC_COUNTERS),
        ("group", overview["group_counters"], _GROUP_COUNTERS),
    ):
        for k, doc in docs.items():
            c = CounterMetricFamily(f"raftq_cluster_{kind}_{k}", f"{doc}, summed over every {kind}")
            c.add_metric([], counters.get(k, 0))
            yield c


class NodeMetrics:
    def __init__(self, raft: Raft, topics: int | None = DEFAULT_TOPICS) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(BrokerCollector(raft, topics))
        # The process-wide collectors prometheus_client puts in its default registry (CPU,
        # memory, open files; GC passes; Python version): shared objects, read at scrape.
        for collector in (PROCESS_COLLECTOR, GC_COLLECTOR, PLATFORM_COLLECTOR):
            self.registry.register(collector)
        self.requests = Counter(
            "raftq_http_requests",
            "HTTP requests answered",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "raftq_http_request_seconds",
            "HTTP request latency",
            ["route"],
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25),
        )
        self.batch_size = Histogram(
            "raftq_batch_commands",
            "commands per Raft entry (group commit)",
            registry=self.registry,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
        )
        self.propose_latency = Histogram(
            "raftq_propose_seconds",
            "time from propose to commit and apply",
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5),
        )
        self.stream_publishes = Counter(
            "raftq_stream_publishes",
            "publish frames answered on publish streams, by outcome (ok or the error code)",
            ["code"],
            registry=self.registry,
        )
        self.sqs_requests = Counter(
            "raftq_sqs_requests",
            "SQS API requests by action (unknown: not an SQS action) and outcome: ok, the SQS"
            " error type, or forwarded (answered by the leader, which counts it too)",
            ["action", "outcome"],
            registry=self.registry,
        )
        self.proxied = Counter(
            "raftq_proxied_requests", "requests forwarded to the leader", registry=self.registry
        )

    def gauge(self, name: str, doc: str, fn: Callable[[], float]) -> None:
        Gauge(name, doc, registry=self.registry).set_function(fn)

    def on_batch(self, n: int, seconds: float) -> None:
        self.batch_size.observe(n)
        self.propose_latency.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
