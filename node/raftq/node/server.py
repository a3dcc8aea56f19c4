"""One node process: Raft binding + HTTP API (HTTPS with ``--tls-cert``), and its orderly
shutdown.

On SIGTERM / SIGINT, within ``shutdown_timeout`` seconds: stop accepting connections; answer
waiting long polls at once (empty); let in-flight requests finish; release the deliveries of
consumers still held by open connections (streams); hand leadership to another member if this
node leads; flush and stop Raft; return exit code 0.

If Raft stops on a failure (its storage failed: a full disk), the node cannot replicate again in
this process: ``/healthz`` and ``/readyz`` answer 503 with the cause (so do ``/cluster`` and
``/metrics``) for ``failed_exit_delay`` seconds, then it shuts down as above and returns
``EXIT_RAFT_STOPPED`` (3), for a supervisor to restart it once the cause is gone.
"""

from __future__ import annotations

import asyncio
import logging
import re
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from raftq.node.app import NodeSettings, build_app
from raftq.node.auth import internal_token
from raftq.node.commands import host_port
from raftq.node.diskguard import DEFAULT_MIN_FREE, Reserve, parse_reserve
from raftq.node.httplimits import ApiProtocols, ApiSite, HttpLimits
from raftq.node.httpsite import HttpsSite
from raftq.node.malloc import trim_forever
from raftq.node.raftapi import ForceRefused, Raft
from raftq.node.sqs.credentials import node_key as sqs_node_key
from raftq.node.sqs.listener import build_sqs_app
from raftq.node.tlsutil import NodeTLS, TLSConfigError, TLSFiles, covers, describe

log = logging.getLogger("raftq.node")

# The shutdown's one budget (``shutdown_timeout``), spent in order: handlers finish (aiohttp may
# wait its grace twice: before and after cancelling them), the app drains (releases, group
# commit: ``DRAIN_S``), leadership moves (``TRANSFER_S``), Raft stops (``RAFT_STOP_S``, always).
DRAIN_S = 6.0  # NodeSettings.propose_timeout + 1
TRANSFER_S = 3.0
RAFT_STOP_S = 2.0
EXIT_USAGE = 2  # a start refused for its flags (as argparse's errors): --force-new-cluster
EXIT_RAFT_STOPPED = 3  # the process's exit code when Raft stopped on a failure


def handler_grace(total: float) -> float:
    return max(0.5, (total - DRAIN_S - TRANSFER_S - RAFT_STOP_S) / 2)


@dataclass(frozen=True)
class NodeOptions:
    node_id: str
    listen: str  # host:port of the HTTP API
    raft: str  # host:port of Raft
    advertise: str | None = None  # host:port others reach the API at (default: listen)
    sqs_listen: str | None = None  # host:port of the SQS-compatible API (raftq.node.sqs)
    peers: dict[str, tuple[str, str]] = field(default_factory=dict)  # id -> (raft, api)
    data_dir: str | None = None
    secret: str | None = field(default=None, repr=False)
    insecure: bool = False
    auth: bool = True
    admin_token: str | None = field(default=None, repr=False)
    auth_observe: bool = False
    metrics_topics: int | None = 100  # per-topic metric series for the top N (None: all)
    fsync: str = "always"
    raft_max_connections: int = 64  # unauthenticated inbound Raft connections at once
    raft_handshake_timeout: float = 5.0  # seconds for one to authenticate, or it is closed
    max_body: int = 8 << 20
    shutdown_timeout: float = 15.0
    failed_exit_delay: float = 5.0  # Raft stopped on a failure: say why this long, then exit 3
    max_inflight: int = 4
    batch_linger: float = 0.001
    max_queue: int = 2048  # commands waiting for group commit (4 full batches); beyond: 503
    # The API listener (raftq.node.httplimits): idle / header-read timeout, connection cap
    # (None: from ulimit -n).
    idle_timeout: float = 60.0
    max_connections: int | None = None
    # HTTPS (raftq.node.tlsutil): the API's certificate and key; client certificates required
    # and verified against tls_client_ca; other nodes verified against tls_ca (default: the
    # system's store). Certificate and key are reloaded on SIGHUP.
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    tls_ca: str | None = None
    min_free_disk: Reserve = field(default_factory=lambda: parse_reserve(DEFAULT_MIN_FREE))
    force_new_cluster: int | None = None  # recovery: this node alone, its journal committed
    # (this being its last log index)


def split_hostport(value: str, what: str) -> tuple[str, int]:
    """A ``--listen``-style address (``commands.host_port``; IPv6 with or without brackets)."""
    hp = host_port(value, bare_ipv6=True)
    if hp is None:
        raise ValueError(f"{what} must be host:port, got {value!r}")
    return hp


def parse_peers(spec: str) -> dict[str, tuple[str, str]]:
    """``n2=127.0.0.1:9002/127.0.0.1:8002,n3=...``: id = Raft address / HTTP address."""
    peers: dict[str, tuple[str, str]] = {}
    for item in filter(None, (p.strip() for p in spec.split(","))):
        node_id, eq, addrs = item.partition("=")
        raft, slash, api = addrs.partition("/")
        if not eq or not slash or not node_id:
            raise ValueError(f"peer must be id=raft_host:port/api_host:port, got {item!r}")
        split_hostport(raft, f"raft address of {node_id}")
        split_hostport(api, f"API address of {node_id}")
        if node_id in peers:
            raise ValueError(f"peer {node_id} given twice")
        peers[node_id] = (raft, api)
    return peers


_POD_NAME = re.compile(r"(.+)-(0|[1-9][0-9]{0,5})")


def statefulset_peers(
    node_id: str, raft: str, api: str, replicas: int
) -> dict[str, tuple[str, str]]:
    """The members of a StatefulSet of ``replicas`` pods, as ``parse_peers`` gives them: this
    node is pod ``<name>-<ordinal>`` and its addresses start with its own name
    (``raftq-1.raftq-headless:9000``); pod ``<name>-i`` has the same with its name. A pod
    beyond ``replicas`` (scaled up, not yet added) names itself and those before it."""
    pod = _POD_NAME.fullmatch(node_id)
    if pod is None:
        raise ValueError(
            f"--statefulset-replicas: the id {node_id!r} is not a StatefulSet pod's name"
            " (<name>-<ordinal>)"
        )
    base, ordinal = pod.group(1), int(pod.group(2))
    suffixes = []
    for what, addr in (("--raft", raft), ("--advertise", api)):
        host, port = split_hostport(addr, what)
        if host != node_id and not host.startswith(node_id + "."):
            raise ValueError(
                f"--statefulset-replicas: {what} {addr!r} must start with this pod's name"
                f" {node_id!r} (e.g. {node_id}.<headless service>:{port})"
            )
        suffixes.append(addr[len(node_id) :])
    return {
        f"{base}-{i}": (f"{base}-{i}{suffixes[0]}", f"{base}-{i}{suffixes[1]}")
        for i in range(max(replicas, ordinal + 1))
    }


def make_raft(opts: NodeOptions) -> Raft:
    from raftq.cluster.raft import RaftConfig, RaftNode

    cfg = RaftConfig(
        node_id=opts.node_id,
        raft_addr=opts.raft,
        api_addr=opts.advertise or opts.listen,
        peers=dict(opts.peers),
        data_dir=opts.data_dir,
        secret=opts.secret,
        insecure=opts.insecure,
        fsync=opts.fsync,
        force_new_cluster=opts.force_new_cluster,
        max_connections=opts.raft_max_connections,
        handshake_timeout=opts.raft_handshake_timeout,
    )
    node: Raft = RaftNode(cfg)
    return node


async def serve(
    opts: NodeOptions,
    raft_factory: Callable[[NodeOptions], Raft] = make_raft,
    stop: asyncio.Event | None = None,
) -> int:
    split_hostport(opts.listen, "--listen")  # a bad address fails before Raft starts
    tls: NodeTLS | None = None
    if opts.tls_cert or opts.tls_key:
        try:  # before Raft starts: a node that cannot serve does not join in
            tls = load_tls(opts)
        except TLSConfigError as e:
            log.error("node %s: TLS: %s", opts.node_id, e)
            return 1
    raft = raft_factory(opts)
    try:
        raft.start()
    except ForceRefused as e:
        log.error("node %s: %s", opts.node_id, e)
        return EXIT_USAGE
    except Exception as e:
        log.error("node %s: Raft did not start: %s", opts.node_id, e)
        return 1
    key = opts.secret or opts.admin_token  # the internal credential's (the same on every node)
    settings = NodeSettings(
        node_id=opts.node_id,
        max_body=opts.max_body,
        max_inflight=opts.max_inflight,
        batch_linger=opts.batch_linger,
        max_queue=opts.max_queue,
        body_timeout=opts.idle_timeout,
        auth=opts.auth,
        admin_token=opts.admin_token,
        internal_token=internal_token(key) if key else None,
        sqs_key=sqs_node_key(key) if key else None,
        auth_observe=opts.auth_observe,
        metrics_topics=opts.metrics_topics,
        scheme="https" if tls is not None else "http",
        peer_ssl=tls.peer if tls is not None else None,
        data_dir=opts.data_dir,
        min_free_disk=opts.min_free_disk,
    )
    if not opts.auth:
        log.warning(
            "node %s: ACCESS CONTROL IS OFF (--auth off): anyone who reaches %s may read,"
            " publish, delete and reconfigure everything",
            opts.node_id,
            opts.listen,
        )
    elif not opts.admin_token:
        log.warning(
            "node %s: access control is on and no admin token is set (RAFTQ_ADMIN_TOKEN):"
            " only tokens already in the cluster's state are accepted",
            opts.node_id,
        )
    app = build_app(raft, settings)
    limits = HttpLimits(idle_timeout=opts.idle_timeout, max_connections=opts.max_connections)
    runner = await _start_listener(app, opts, "--listen", tls, limits)
    if runner is None:
        await raft.stop()
        return 1
    log.info("node %s: API on %s, Raft on %s", opts.node_id, settings.url(opts.listen), opts.raft)
    runners = [runner]
    if opts.sqs_listen:
        sqs_runner = await _serve_sqs(opts, app, tls, limits)
        if sqs_runner is None:
            await runner.cleanup()
            await raft.stop()
            return 1
        runners.insert(0, sqs_runner)  # (stopped first: its requests use the API's service)
    advertised = split_hostport(opts.advertise or opts.listen, "--advertise")[0]
    if advertised in ("0.0.0.0", "::", "[::]", ""):
        log.warning(
            "node %s: advertises its API at %s, which clients and followers cannot reach; set"
            " --advertise (RAFTQ_ADVERTISE) to an address they can",
            opts.node_id,
            opts.advertise or opts.listen,
        )
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    failed: list[BaseException] = []

    def on_raft_stop(err: BaseException) -> None:
        if not failed:
            failed.append(err)
            log.critical(
                "node %s: Raft stopped (%s): unhealthy; exiting with code %d in %.0f s",
                opts.node_id,
                err,
                EXIT_RAFT_STOPPED,
                opts.failed_exit_delay,
            )
            loop.call_later(opts.failed_exit_delay, stop.set)

    raft.add_stop_listener(on_raft_stop)
    if (error := raft.status().error) is not None:  # stopped before the listener was in
        on_raft_stop(RuntimeError(error))
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if tls is not None:
        loop.add_signal_handler(signal.SIGHUP, reload_tls, opts.node_id, tls)
    trimmer = asyncio.create_task(trim_forever())  # (malloc.py: RSS follows what is held)
    await stop.wait()
    trimmer.cancel()
    log.info("node %s: shutting down", opts.node_id)
    code = 0 if await _shutdown(runners, raft, opts.shutdown_timeout) else 1
    if failed:
        code = EXIT_RAFT_STOPPED
        log.critical("node %s: exit code %d: Raft had stopped: %s", opts.node_id, code, failed[0])
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.remove_signal_handler(sig)
    log.info("node %s: stopped", opts.node_id)
    return code


async def _serve_sqs(
    opts: NodeOptions, api: web.Application, tls: NodeTLS | None, limits: HttpLimits
) -> web.AppRunner | None:
    """The ``--sqs-listen`` listener (HTTPS when the API is), over the API's service."""
    assert opts.sqs_listen is not None
    runner = await _start_listener(build_sqs_app(api), opts, "--sqs-listen", tls, limits)
    if runner is not None:
        scheme = "https" if tls is not None else "http"
        log.info("node %s: SQS API on %s://%s", opts.node_id, scheme, opts.sqs_listen)
    return runner


async def _start_listener(
    app: web.Application, opts: NodeOptions, flag: str, tls: NodeTLS | None, limits: HttpLimits
) -> web.AppRunner | None:
    """Serve ``app`` on the address of option ``flag`` (HTTPS with ``tls``) under the node's
    HTTP limits; None (and logged) when it cannot listen there."""
    listen = opts.listen if flag == "--listen" else opts.sqs_listen
    assert listen is not None
    host, port = split_hostport(listen, flag)
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        shutdown_timeout=handler_grace(opts.shutdown_timeout),
        access_log=None,
        **limits.handler_args(),
    )
    await runner.setup()
    assert runner.server is not None
    protocols = ApiProtocols(runner.server, limits, access_log=None)
    site: web.BaseSite
    if tls is None:
        site = ApiSite(runner, host, port, protocols)
    else:
        site = HttpsSite(
            runner, host, port, tls.server, require_client_cert=tls.require_client_cert,
            protocols=protocols,
        )  # fmt: skip
    try:
        await site.start()
    except OSError as e:
        log.error("node %s: cannot listen on %s: %s", opts.node_id, listen, e.strerror or e)
        await runner.cleanup()
        return None
    return runner


def load_tls(opts: NodeOptions) -> NodeTLS:
    """The node's TLS contexts from its options (``TLSConfigError``: not usable)."""
    if not opts.tls_cert or not opts.tls_key:
        raise TLSConfigError("--tls-cert and --tls-key go together")
    tls = NodeTLS(TLSFiles(opts.tls_cert, opts.tls_key, opts.tls_client_ca, opts.tls_ca))
    log.info("node %s: TLS certificate %s", opts.node_id, describe(tls.cert))
    advertised = split_hostport(opts.advertise or opts.listen, "--advertise")[0]
    if advertised not in ("0.0.0.0", "::", "") and not covers(tls.cert, advertised):
        log.warning(
            "node %s: the TLS certificate does not name %s, the address this node advertises:"
            " clients and other nodes that check host names will refuse it",
            opts.node_id,
            advertised,
        )
    return tls


def reload_tls(node_id: str, tls: NodeTLS) -> None:
    """SIGHUP: load the certificate and key again (new connections get them); a reload that
    fails keeps the ones in use."""
    try:
        cert = tls.reload()
    except TLSConfigError as e:
        log.error("node %s: TLS reload failed, still serving the old certificate: %s", node_id, e)
        return
    log.info("node %s: TLS certificate reloaded: %s", node_id, describe(cert))


async def _shutdown(runners: list[web.AppRunner], raft: Any, budget: float) -> bool:
    """Each step within what is left of one deadline; Raft is stopped whatever happened
    before. True if every step finished in time."""
    loop = asyncio.get_running_loop()
    end = loop.time() + budget
    clean = True
    try:
        try:  # stop accepting, drain handlers, release held consumers, drain group commit
            for runner in runners:
                await asyncio.wait_for(runner.cleanup(), max(0.1, end - RAFT_STOP_S - loop.time()))
        except TimeoutError:
            log.error("draining the API took longer than its share of %.0f s", budget)
            clean = False
        left = end - RAFT_STOP_S - loop.time()
        if raft.is_leader() and left > 0.2:
            try:
                moved = await raft.transfer_leadership(timeout=min(TRANSFER_S, left))
                log.info("leadership transfer %s", "done" if moved else "not confirmed")
            except Exception as e:
                log.warning("leadership transfer failed: %r", e)
    finally:
        try:
            await asyncio.wait_for(raft.stop(), max(1.0, end - loop.time()))
        except TimeoutError:
            log.error("Raft did not stop within the shutdown timeout (%.0f s)", budget)
            clean = False
    return clean
