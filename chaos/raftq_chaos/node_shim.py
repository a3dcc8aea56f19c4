"""``raftq node`` plus one read-only probe for the chaos checker.

``python -m raftq_chaos.node_shim node --id ...`` runs the real ``raftq node`` command with one
extra route, ``GET /chaos/digest``, answered by every node from its own replica:
``{"digest": Broker.digest(), "applied_index": ...}``. It changes nothing else and is only
needed while ``GET /cluster`` does not report a digest itself. If the node's internals it hooks
into (``server.build_app``, ``app.LOCAL_PATHS``) move, the node runs unpatched and the digest
check reports "not exposed".
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from aiohttp import web

PATH = "/chaos/digest"
log = logging.getLogger("raftq_chaos.node_shim")


def _patch() -> None:
    import raftq.node.app as app_mod
    import raftq.node.server as server_mod

    original = getattr(server_mod, "build_app")  # noqa: B009 - re-exported name, patched below

    def build_app(raft: Any, settings: Any = None) -> web.Application:
        app: web.Application = original(raft, settings)

        async def digest(request: web.Request) -> web.Response:
            value = raft.read(lambda b: b.digest())
            return web.json_response(
                {"digest": value, "applied_index": raft.status().applied_index}
            )

        app.router.add_get(PATH, digest)
        return app

    setattr(server_mod, "build_app", build_app)  # noqa: B010
    app_mod.LOCAL_PATHS = frozenset(app_mod.LOCAL_PATHS | {PATH})  # served locally, not proxied


def main() -> int:
    try:
        _patch()
    except (ImportError, AttributeError, TypeError) as e:
        print(f"raftq_chaos.node_shim: running unpatched ({e!r})", file=sys.stderr)
    from raftq.node.cli import main as raftq_main

    code: int = raftq_main()
    return code


if __name__ == "__main__":
    sys.exit(main())
