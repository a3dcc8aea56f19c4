"""raftq_chaos: a Jepsen-style chaos harness for raftq.

Modules: ``history`` (the JSONL operation log), ``checker`` (pure: history -> anomalies),
``netns`` (network namespaces, a bridge, link cuts), ``cluster`` (``raftq node`` processes
inside namespaces; replica digests from ``GET /cluster?digest=1``), ``workload``
(producers, consumers, a poison producer, the final drain), ``nemesis`` (faults on a schedule)
and ``runner`` (one scenario end to end; ``python -m raftq_chaos`` for long randomized runs).
Nothing here is imported by raftq itself.
"""
