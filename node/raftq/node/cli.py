"""The ``raftq`` command: ``raftq node`` (one broker process) and ``raftq cluster up`` (a local
dev cluster). Client subcommands are added by ``raftq.client.cli.register`` when installed.

Every ``raftq node`` option has an environment variable (``RAFTQ_ID``, ``RAFTQ_LISTEN``,
``RAFTQ_RAFT``, ``RAFTQ_PEERS``, ``RAFTQ_DATA_DIR``, ``RAFTQ_IN_MEMORY``, ``RAFTQ_SECRET``,
``RAFTQ_INSECURE``, ``RAFTQ_TLS_CERT``, ``RAFTQ_FSYNC``, ``RAFTQ_MAX_BODY``,
``RAFTQ_SHUTDOWN_TIMEOUT``...: the flag's name in capitals); a flag wins over the variable.
Peers are ``id=raft_host:port/api_host:port`` separated by commas. A node needs
``--data-dir`` unless it is told ``--in-memory`` (nothing survives a restart: tests and demos
only).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from raftq.node import logfmt


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"RAFTQ_{name}", default)


def _force_index(value: str) -> int:
    value = value.strip()
    if not value.isdigit():
        raise argparse.ArgumentTypeError(
            f"must be this node's last log index (a number; GET /cluster), not {value!r}"
        )
    return int(value)


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _metrics_topics(value: str) -> int | None:
    """``--metrics-topics``: a count, or None for ``all``."""
    value = value.strip().lower()
    if value == "all":
        return None
    if value.isascii() and value.isdigit() and len(value) <= 9:
        return int(value)
    raise argparse.ArgumentTypeError(f"must be a number >= 0 or all, not {value!r}")


def add_node_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("node", help="run one broker node", description=__doc__)
    p.add_argument("--id", default=_env("ID"), help="node id, e.g. n1 [RAFTQ_ID]")
    p.add_argument(
        "--listen",
        default=_env("LISTEN", "127.0.0.1:8001"),
        help="HTTP API host:port [RAFTQ_LISTEN] (default 127.0.0.1:8001)",
    )
    p.add_argument(
        "--raft",
        default=_env("RAFT", "127.0.0.1:9001"),
        help="Raft host:port [RAFTQ_RAFT] (default 127.0.0.1:9001)",
    )
    p.add_argument(
        "--advertise",
        default=_env("ADVERTISE"),
        help="host:port at which clients and peers reach this node's API, reported as the "
        "leader's address [RAFTQ_ADVERTISE] (default: --listen)",
    )
    p.add_argument(
        "--sqs-listen",
        default=_env("SQS_LISTEN"),
        help="also serve the SQS-compatible API (boto3, Celery, aws sqs) on this host:port, with"
        " TLS when the API has it [RAFTQ_SQS_LISTEN] (default: not served; the API's /sqs"
        " always is)",
    )
    p.add_argument(
        "--peers",
        default=_env("PEERS", ""),
        help="members: id=raft_host:port/api_host:port,... (this node's own entry, if any, "
        "is skipped) [RAFTQ_PEERS]",
    )
    p.add_argument(
        "--statefulset-replicas",
        type=int,
        default=_env("STATEFULSET_REPLICAS"),
        help="instead of --peers, in a Kubernetes StatefulSet: the members are pods <name>-0.."
        "<name>-(N-1), reached at --raft and --advertise with this pod's name replaced by "
        "theirs [RAFTQ_STATEFULSET_REPLICAS]",
    )
    p.add_argument("--data-dir", default=None, help="journal and snapshots [RAFTQ_DATA_DIR]")
    p.add_argument(
        "--in-memory",
        action="store_true",
        default=_truthy(_env("IN_MEMORY")),
        help="keep nothing on disk: a restart starts empty (tests, demos) [RAFTQ_IN_MEMORY]",
    )
    p.add_argument(
        "--secret",
        default=_env("SECRET"),
        help="shared cluster secret [RAFTQ_SECRET]; prefer the variable",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        default=_truthy(_env("INSECURE")),
        help="allow running without a secret (tests only) [RAFTQ_INSECURE]",
    )
    p.add_argument(
        "--auth",
        choices=["on", "off"],
        default=_env("AUTH", "on"),
        help="access control: every API call needs a token (off: anyone may do anything;"
        " development only) [RAFTQ_AUTH] (default on)",
    )
    p.add_argument(
        "--admin-token",
        default=_env("ADMIN_TOKEN"),
        help="bootstrap admin token (16+ characters; all rights); prefer the variable or"
        " --admin-token-file [RAFTQ_ADMIN_TOKEN]",
    )
    p.add_argument(
        "--admin-token-file",
        default=_env("ADMIN_TOKEN_FILE"),
        help="read the bootstrap admin token from this file [RAFTQ_ADMIN_TOKEN_FILE]",
    )
    p.add_argument(
        "--auth-observe",
        action="store_true",
        default=_truthy(_env("AUTH_OBSERVE")),
        help="/metrics and /openapi.json need a token too (default: open) [RAFTQ_AUTH_OBSERVE]",
    )
    p.add_argument(
        "--metrics-topics",
        type=_metrics_topics,
        metavar="N|all",
        default=_env("METRICS_TOPICS", "100"),
        help="per-topic and per-group series in /metrics for the N topics with the largest"
        " backlog, unsettled messages (0: none, all: every topic; cluster totals are always"
        " there)"
        " [RAFTQ_METRICS_TOPICS] (default 100)",
    )
    p.add_argument(
        "--tls-cert",
        default=_env("TLS_CERT"),
        help="serve the API over HTTPS only with this PEM certificate (chain), reloaded on"
        " SIGHUP; needs --tls-key [RAFTQ_TLS_CERT]",
    )
    p.add_argument(
        "--tls-key",
        default=_env("TLS_KEY"),
        help="the certificate's PEM private key, unencrypted [RAFTQ_TLS_KEY]",
    )
    p.add_argument(
        "--tls-client-ca",
        default=_env("TLS_CLIENT_CA"),
        help="require client certificates signed by this CA (PEM); this node then presents"
        " its own certificate to the others, so it must allow client use [RAFTQ_TLS_CLIENT_CA]",
    )
    p.add_argument(
        "--tls-ca",
        default=_env("TLS_CA"),
        help="the CA (PEM) this node verifies other nodes' certificates with"
        " [RAFTQ_TLS_CA] (default: the system's store)",
    )
    p.add_argument(
        "--fsync",
        choices=["always", "never"],
        default=_env("FSYNC", "always"),
        help="fsync the journal before acknowledging [RAFTQ_FSYNC]",
    )
    p.add_argument(
        "--force-new-cluster",
        metavar="LAST_LOG_INDEX",
        type=_force_index,
        default=_env("FORCE_NEW_CLUSTER") or None,
        help="recovery when a majority is lost for good: commit this node's journal and make it"
        " the only member, then add the others back (README: recovering a lost majority)."
        " The value must be this node's last_log_index (GET /cluster): once the log moves on,"
        " a start with the flag left set is refused (exit 2) [RAFTQ_FORCE_NEW_CLUSTER]",
    )
    p.add_argument(
        "--raft-max-connections",
        type=int,
        default=_env("RAFT_MAX_CONNECTIONS", "64"),
        help="unauthenticated inbound Raft connections at once; at that many, a new one closes"
        " the oldest [RAFTQ_RAFT_MAX_CONNECTIONS] (default 64)",
    )
    p.add_argument(
        "--raft-handshake-timeout",
        type=float,
        default=_env("RAFT_HANDSHAKE_TIMEOUT", "5"),
        help="seconds for an inbound Raft connection to prove the cluster secret, or it is"
        " closed [RAFTQ_RAFT_HANDSHAKE_TIMEOUT] (default 5)",
    )
    p.add_argument(
        "--max-body",
        type=int,
        default=_env("MAX_BODY", str(8 << 20)),  # (argparse converts, and reports errors)
        help="largest request body in bytes [RAFTQ_MAX_BODY] (default 8 MiB)",
    )
    p.add_argument(
        "--max-inflight",
        type=int,
        default=_env("MAX_INFLIGHT", "4"),
        help="Raft proposes in flight at once, pipelining [RAFTQ_MAX_INFLIGHT] (default 4)",
    )
    p.add_argument(
        "--batch-linger-ms",
        type=float,
        default=_env("BATCH_LINGER_MS", "1"),
        help="group-commit gathering time in ms [RAFTQ_BATCH_LINGER_MS] (default 1)",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=_env("MAX_QUEUE", "2048"),
        help="commands waiting for group commit at most; beyond, writes are answered 503"
        " overloaded with Retry-After [RAFTQ_MAX_QUEUE] (default 2048)",
    )
    p.add_argument(
        "--min-free-disk",
        default=_env("MIN_FREE_DISK", "1GiB"),  # (diskguard.DEFAULT_MIN_FREE)
        help="refuse publishes (507 storage_full) while the data directory's disk has less"
        " free: bytes (1GiB, 500MB, 0 for no reserve) or a percentage of the disk (5%%)"
        " [RAFTQ_MIN_FREE_DISK] (default 1GiB)",
    )
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=_env("IDLE_TIMEOUT", "60"),
        help="close an API connection idle, or whose request head (or body: 408) is"
        " unfinished, for this many seconds [RAFTQ_IDLE_TIMEOUT] (default 60)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=_env("MAX_CONNECTIONS"),
        help="open API connections at most; beyond, new ones get 503 overloaded and are"
        " closed [RAFTQ_MAX_CONNECTIONS] (default: 3/4 of ulimit -n, at most 10000)",
    )
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=_env("SHUTDOWN_TIMEOUT", "15"),
        help="bound on graceful shutdown, seconds [RAFTQ_SHUTDOWN_TIMEOUT] (default 15)",
    )
    p.add_argument(
        "--log-level",
        default=_env("LOG_LEVEL", "INFO"),
        help="DEBUG, INFO, WARNING or ERROR [RAFTQ_LOG_LEVEL] (default INFO)",
    )
    p.add_argument(
        "--log-format",
        default=_env("LOG_FORMAT", "text"),
        help="text, or json: one JSON object per line (time, level, logger, message,"
        " exception) [RAFTQ_LOG_FORMAT] (default text)",
    )
    p.set_defaults(func=_run_node, parser=p)


def _need_server_extra() -> None:
    """A client-only install (``pip install raftq``) runs no node: say what to install."""
    import importlib

    missing = []
    for module in ("pysyncobj", "cryptography", "prometheus_client"):
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(module)
    if missing:
        sys.exit(f"raftq: running a node needs {', '.join(missing)}: pip install 'raftq[server]'")


def _run_node(args: argparse.Namespace) -> int:
    _need_server_extra()
    from raftq.node.malloc import tuned_gc
    from raftq.node.server import (
        NodeOptions,
        parse_peers,
        serve,
        split_hostport,
        statefulset_peers,
    )

    parser: argparse.ArgumentParser = args.parser
    if not args.id:
        parser.error("--id (or RAFTQ_ID) is required")
    if not args.secret and not args.insecure:
        parser.error("--secret (or RAFTQ_SECRET) is required unless --insecure")
    if args.data_dir is None and not args.in_memory:
        args.data_dir = _env("DATA_DIR")  # (an explicit --in-memory wins over the variable)
    if not args.data_dir and not args.in_memory:
        parser.error(
            "--data-dir (or RAFTQ_DATA_DIR) is required; --in-memory keeps nothing on disk"
            " (a restart starts empty)"
        )
    if args.data_dir and args.in_memory:
        parser.error("--data-dir and --in-memory exclude each other")
    # (argparse checks choices for flags, not for defaults taken from the environment)
    if args.fsync not in ("always", "never"):
        parser.error(f"--fsync (or RAFTQ_FSYNC) must be always or never, not {args.fsync!r}")
    if args.auth not in ("on", "off"):
        parser.error(f"--auth (or RAFTQ_AUTH) must be on or off, not {args.auth!r}")
    admin_token = args.admin_token
    if args.admin_token_file:
        if admin_token:
            parser.error("--admin-token and --admin-token-file exclude each other")
        try:
            with open(args.admin_token_file) as f:
                admin_token = f.read().strip()
        except OSError as e:
            parser.error(f"--admin-token-file: {e.strerror or e}: {args.admin_token_file}")
    if admin_token is not None and len(admin_token) < 16:
        parser.error("the admin token must be at least 16 characters (use raftq token new)")
    if bool(args.tls_cert) != bool(args.tls_key):
        parser.error("--tls-cert and --tls-key (RAFTQ_TLS_CERT, RAFTQ_TLS_KEY) go together")
    if not args.tls_cert and (args.tls_client_ca or args.tls_ca):
        parser.error("--tls-client-ca and --tls-ca need --tls-cert and --tls-key (TLS is off)")
    if args.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        parser.error(f"--log-level (or RAFTQ_LOG_LEVEL): unknown level {args.log_level!r}")
    if args.log_format not in logfmt.FORMATS:
        parser.error(
            f"--log-format (or RAFTQ_LOG_FORMAT) must be text or json, not {args.log_format!r}"
        )
    from raftq.node.diskguard import parse_reserve

    try:
        min_free_disk = parse_reserve(args.min_free_disk)
    except ValueError as e:
        parser.error(f"--min-free-disk (or RAFTQ_MIN_FREE_DISK): {e}")
    for flag, value, lo in (
        ("--max-body", args.max_body, 1),
        ("--max-inflight", args.max_inflight, 1),
        ("--batch-linger-ms", args.batch_linger_ms, 0),
        ("--max-queue", args.max_queue, 1),
        ("--idle-timeout", args.idle_timeout, 0.1),
        ("--max-connections", 1 if args.max_connections is None else args.max_connections, 1),
        ("--shutdown-timeout", args.shutdown_timeout, 1),
        ("--raft-max-connections", args.raft_max_connections, 1),
        ("--raft-handshake-timeout", args.raft_handshake_timeout, 0.01),
    ):
        if not lo <= value < float("inf"):
            parser.error(f"{flag} must be at least {lo}, not {value}")
    try:
        split_hostport(args.listen, "--listen")
        split_hostport(args.raft, "--raft")
        if args.advertise:
            split_hostport(args.advertise, "--advertise")
        if args.sqs_listen:
            split_hostport(args.sqs_listen, "--sqs-listen")
        peers = parse_peers(args.peers or "")
        if args.statefulset_replicas is not None:
            replicas = int(args.statefulset_replicas)
            if peers:
                raise ValueError("--peers and --statefulset-replicas exclude each other")
            if not 1 <= replicas <= 1000:
                raise ValueError(f"--statefulset-replicas must be 1..1000, not {replicas}")
            peers = statefulset_peers(args.id, args.raft, args.advertise or args.listen, replicas)
    except ValueError as e:
        parser.error(str(e))
    # One peer list for every member (a StatefulSet template): this node's own entry is skipped.
    peers.pop(args.id, None)
    logfmt.setup(args.log_level, args.log_format)
    # Read once: not left for child processes to inherit (a forked snapshot writer still has a
    # copy of memory, and /proc/<pid>/environ keeps the original block: use files for secrets
    # where that matters).
    for name in ("RAFTQ_SECRET", "RAFTQ_ADMIN_TOKEN"):
        os.environ.pop(name, None)
    opts = NodeOptions(
        node_id=args.id,
        listen=args.listen,
        raft=args.raft,
        advertise=args.advertise,
        sqs_listen=args.sqs_listen or None,
        peers=peers,
        data_dir=args.data_dir,
        secret=args.secret,
        insecure=args.insecure,
        auth=args.auth == "on",
        admin_token=admin_token or None,
        auth_observe=args.auth_observe,
        metrics_topics=args.metrics_topics,
        fsync=args.fsync,
        raft_max_connections=args.raft_max_connections,
        raft_handshake_timeout=args.raft_handshake_timeout,
        max_body=args.max_body,
        shutdown_timeout=args.shutdown_timeout,
        max_inflight=max(1, args.max_inflight),
        batch_linger=max(0.0, args.batch_linger_ms / 1000),
        max_queue=args.max_queue,
        idle_timeout=args.idle_timeout,
        max_connections=args.max_connections,
        tls_cert=args.tls_cert or None,
        tls_key=args.tls_key or None,
        tls_client_ca=args.tls_client_ca or None,
        tls_ca=args.tls_ca or None,
        force_new_cluster=args.force_new_cluster,
        min_free_disk=min_free_disk,
    )
    with tuned_gc():
        return asyncio.run(serve(opts))


def add_cluster_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("cluster", help="local development cluster")
    csub = p.add_subparsers(dest="cluster_cmd", required=True)
    up = csub.add_parser("up", help="start N nodes on loopback (Ctrl-C stops them)")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--dir", default="./.raftq", help="data and logs (default ./.raftq)")
    up.add_argument("--api-port", type=int, default=8001, help="first HTTP port (default 8001)")
    up.add_argument("--raft-port", type=int, default=9001, help="first Raft port (default 9001)")
    up.add_argument(
        "--sqs-port", type=int, default=9324, help="first SQS endpoint port (default 9324)"
    )
    up.add_argument("--fsync", choices=["always", "never"], default="always")
    up.add_argument(
        "--tls",
        action="store_true",
        help="serve HTTPS, with a throwaway CA made under --dir/tls (give clients its ca.pem)",
    )
    up.set_defaults(func=_run_cluster_up)


def _run_cluster_up(args: argparse.Namespace) -> int:
    _need_server_extra()
    from raftq.node.devcluster import cluster_up

    logfmt.setup("INFO")
    return cluster_up(
        args.nodes, args.dir, args.api_port, args.raft_port, args.fsync, args.tls, args.sqs_port
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raftq", description="raftq message broker")
    sub = parser.add_subparsers(dest="command", required=True)
    add_node_parser(sub)
    add_cluster_parser(sub)
    try:
        from raftq.node.bench import add_bench_parser
    except ImportError:
        pass
    else:
        add_bench_parser(sub)
    try:
        from raftq.client.cli import register  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        pass
    else:
        register(sub, parser)  # (also the client options before the command, and --version)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    target = getattr(args, "extra_positionals", None)
    if extra and target and not any(x.startswith("-") for x in extra):
        getattr(args, target).extend(extra)  # positionals given after an option
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
