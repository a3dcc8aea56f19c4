"""raftq.node: one broker process. An aiohttp HTTP API in front of a Raft-replicated ``Broker``.

See DESIGN.md in this folder. Modules: ``app`` (routes and handlers), ``batcher`` (group commit),
``codec`` (JSON / msgpack bodies), ``errors`` (the one code -> status table), ``local`` (an
in-process ``LocalRaft`` for tests and tools), ``metrics``, ``openapi``, ``server`` (process
lifecycle), ``devcluster`` (``raftq cluster up``) and ``cli``.
"""
