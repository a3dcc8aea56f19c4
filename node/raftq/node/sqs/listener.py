"""The ``--sqs-listen`` listener: an aiohttp app over the same service, forwarder and
authenticator as the node's API (``build_sqs_app(api_app)``), answering the SQS protocols on
every path (SDKs post to ``/`` or to a queue's URL)."""

from __future__ import annotations

from aiohttp import web

from raftq.node.app import SERVICE
from raftq.node.ops import FORWARDER
from raftq.node.routes import AUTHN
from raftq.node.sqs.frontend import Frontend

MAX_BODY = 2 << 20  # a batch of 10 messages of up to 1 MiB in all, with its attributes


def build_sqs_app(api: web.Application) -> web.Application:
    svc = api[SERVICE]
    front = Frontend(svc, api[FORWARDER], api[AUTHN], listener=True)
    app = web.Application(client_max_size=MAX_BODY)

    async def handle(request: web.Request) -> web.StreamResponse:
        return await front.handle(request)

    app.router.add_route("*", "/{tail:.*}", handle)

    async def on_shutdown(app: web.Application) -> None:
        svc.drain()  # (long polls answer now)

    app.on_shutdown.append(on_shutdown)
    return app
