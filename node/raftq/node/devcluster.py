"""``raftq cluster up``: N node processes on loopback for development.

Data, logs, the layout (``cluster.json``), a generated cluster secret (``secret``) and a
generated bootstrap admin token (``admin.token``; both mode 0600) live under ``--dir`` (default
``./.raftq``); running again reuses them, so the cluster resumes with its data and its token.
Access control is on, as in production: each node gets the admin token through its environment
(``RAFTQ_ADMIN_TOKEN``, never in argv, which ``ps`` shows), and the ``raftq`` CLI run from the
directory holding ``.raftq`` reads ``.raftq/admin.token`` by itself. Ctrl-C (or SIGTERM) stops
every node gracefully (SIGTERM, then SIGKILL after a bound). With ``--tls`` the nodes serve
HTTPS with a throwaway CA and certificate made (once) under ``<dir>/tls``; clients get the CA.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raftq.node.tlsutil import DevCA, make_dev_ca

STOP_TIMEOUT = 25.0
ADMIN_TOKEN_FILE = "admin.token"  # under --dir; the CLI's default is ./.raftq/admin.token
TLS_DIR = "tls"  # under --dir: the throwaway CA and node certificate of --tls
MIN_TOKEN = 16  # what a node accepts as --admin-token
SQS_PORT = 9324  # the first node's SQS endpoint (the port SQS emulators have made familiar)


class Refused(RuntimeError):
    """A node refused our credential (401/403): waiting longer cannot help."""


def _layout(
    base: Path, nodes: int, api_port: int, raft_port: int, sqs_port: int = SQS_PORT
) -> list[dict[str, str]]:
    path = base / "cluster.json"
    if path.exists():
        layout: list[dict[str, str]] = json.loads(path.read_text())["nodes"]
        for i, n in enumerate(layout):  # (a directory made before the SQS endpoint)
            n.setdefault("sqs", f"127.0.0.1:{sqs_port + i}")
        if len(layout) != nodes:
            raise SystemExit(
                f"{base} holds a {len(layout)}-node cluster; pass --nodes {len(layout)} "
                f"or use another --dir"
            )
        first = (layout[0]["api"], layout[0]["raft"])
        if first != (f"127.0.0.1:{api_port}", f"127.0.0.1:{raft_port}"):
            print(
                f"note: {base} keeps the ports it was created with (API from {first[0]},"
                f" Raft from {first[1]}); --api-port/--raft-port apply to a new --dir",
                file=sys.stderr,
            )
        return layout
    layout = [
        {
            "id": f"n{i + 1}",
            "api": f"127.0.0.1:{api_port + i}",
            "raft": f"127.0.0.1:{raft_port + i}",
            "sqs": f"127.0.0.1:{sqs_port + i}",
        }
        for i in range(nodes)
    ]
    path.write_text(json.dumps({"nodes": layout}, indent=2))
    return layout


def _busy(layout: list[dict[str, str]]) -> list[str]:
    """Addresses of the layout something already listens on (another cluster on this dir?)."""
    busy = []
    for n in layout:
        for addr in (n["api"], n["raft"], n["sqs"]):
            host, _, port = addr.rpartition(":")
            with socket.socket() as s:
                # (as the nodes bind: a port left in TIME_WAIT by the last run is free)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind((host, int(port)))
                except OSError:
                    busy.append(addr)
    return busy


def new_admin_token() -> str:
    """A fresh bootstrap admin token, as ``raftq token new`` prints one."""
    return f"rq_admin.{secrets.token_urlsafe(32)}"


def _kept(path: Path, make: Callable[[], str]) -> str:
    """The value kept in ``path``, made and written (mode 0600) on first use."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    value = make()
    with os.fdopen(fd, "w") as f:
        f.write(value + "\n")
    return value


def _secret(base: Path) -> str:
    return _kept(base / "secret", lambda: secrets.token_urlsafe(24))


def _admin_token(base: Path) -> str:
    path = base / ADMIN_TOKEN_FILE
    token = _kept(path, new_admin_token)
    if len(token) < MIN_TOKEN:
        raise SystemExit(
            f"{path} holds no usable admin token (16+ characters); delete it to get a new one"
        )
    return token


def node_command(
    me: dict[str, str],
    layout: list[dict[str, str]],
    data_dir: Path,
    fsync: str = "always",
    tls: DevCA | None = None,
) -> list[str]:
    peers = ",".join(f"{n['id']}={n['raft']}/{n['api']}" for n in layout if n["id"] != me["id"])
    cmd = [
        sys.executable, "-m", "raftq.node", "node",
        "--id", me["id"], "--listen", me["api"], "--raft", me["raft"],
        "--peers", peers, "--data-dir", str(data_dir), "--fsync", fsync,
    ]  # fmt: skip
    if me.get("sqs"):
        cmd += ["--sqs-listen", me["sqs"]]
    if tls is not None:  # (one certificate for every dev node: they all are 127.0.0.1)
        cmd += [
            "--tls-cert",
            str(tls.cert),
            "--tls-key",
            str(tls.key),
            "--tls-ca",
            str(tls.ca_cert),
        ]
    return cmd


def dev_ca(base: Path) -> DevCA:
    """The dev cluster's throwaway CA and node certificate under ``base/tls``, made on first
    use and kept (like the secret), so clients keep trusting the same CA across runs."""
    out = base / TLS_DIR
    kept = DevCA(out / "ca.pem", out / "ca.key", out / "node.pem", out / "node.key")
    if all(p.exists() for p in (kept.ca_cert, kept.cert, kept.key)):
        return kept
    return make_dev_ca(out)


def get_json(
    url: str, timeout: float = 1.0, token: str | None = None, ca: Path | None = None
) -> Any:
    """GET ``url`` as JSON, sending ``token`` as the bearer credential when given (and
    trusting the CA ``ca`` for https); an error status gives its error body."""
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    context = ssl.create_default_context(cafile=str(ca)) if ca is not None else None
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        with e:
            return json.loads(e.read() or b"{}")


def wait_for_leader(
    apis: list[str],
    timeout: float,
    failed: Callable[[], bool] = lambda: False,
    token: str | None = None,
    ca: Path | None = None,
) -> str | None:
    """The id of a node that says it leads, polling ``GET /cluster`` (which needs a token);
    None after ``timeout`` or once ``failed()``. Raises ``Refused`` if a node refuses
    ``token``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not failed():
        for api in apis:
            try:
                scheme = "http" if ca is None else "https"
                st = get_json(f"{scheme}://{api}/cluster", 0.5, token, ca)
            except (OSError, ValueError):
                continue
            if st.get("code") in ("unauthenticated", "forbidden"):
                raise Refused(f"{api}: {st['code']}: {st.get('message')}")
            if st.get("role") == "leader":
                return str(st.get("node"))
        time.sleep(0.2)
    return None


def cluster_up(
    nodes: int,
    directory: str,
    api_port: int,
    raft_port: int,
    fsync: str,
    tls: bool = False,
    sqs_port: int = SQS_PORT,
) -> int:
    if not 1 <= nodes <= 9:
        raise SystemExit("--nodes must be between 1 and 9")
    base = Path(directory).resolve()
    base.mkdir(parents=True, exist_ok=True)
    layout = _layout(base, nodes, api_port, raft_port, sqs_port)
    busy = _busy(layout)
    if busy:
        # Else the wait below could find another cluster's leader there and report "up".
        print(
            f"cannot start: {', '.join(busy)} already in use (is this cluster already up?)",
            file=sys.stderr,
        )
        return 1
    token = _admin_token(base)
    env = node_env(_secret(base), token)
    ca = dev_ca(base) if tls else None
    scheme = "https" if tls else "http"
    procs: dict[str, subprocess.Popen[bytes]] = {}
    stopping = False

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        for n in layout:
            d = base / n["id"]
            d.mkdir(exist_ok=True)
            log = open(d / "node.log", "ab")  # noqa: SIM115 - handed to the child
            procs[n["id"]] = subprocess.Popen(
                node_command(n, layout, d, fsync, ca),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches only us; we stop the nodes in order
            )
            log.close()
        apis = [n["api"] for n in layout]
        try:
            leader = wait_for_leader(
                apis,
                30.0,
                lambda: stopping or any(p.poll() is not None for p in procs.values()),
                token,
                None if ca is None else ca.ca_cert,
            )
        except Refused as e:
            print(f"a node refused the admin token of {base}: {e}", file=sys.stderr)
            return 1
        if leader is None and stopping:
            return 0
        if leader is None:
            for nid, p in procs.items():
                if p.poll() is not None:
                    tail = (base / nid / "node.log").read_text(errors="replace").splitlines()[-5:]
                    print(
                        f"node {nid} exited with {p.returncode}:",
                        *tail,
                        sep="\n  ",
                        file=sys.stderr,
                    )
            print(f"no leader; see the logs under {base}/n*/node.log", file=sys.stderr)
            return 1
        else:
            first = apis[0]
            print(f"raftq cluster of {nodes} is up; leader {leader}; data and logs in {base}")
            for n in layout:
                print(f"  {n['id']}  {scheme}://{n['api']}  (raft {n['raft']})")
            print(_token_note(base, token, off=env.get("RAFTQ_AUTH") == "off"))
            auth = '-H "Authorization: Bearer $RAFTQ_TOKEN"'
            if ca is not None:
                urls = ",".join(f"https://{n['api']}" for n in layout)
                print(
                    f"TLS is on, with a throwaway CA made for this cluster ({ca.ca_cert}): "
                    "give it to clients (ca=, --ca or RAFTQ_CA) with https:// URLs:\n"
                    f"  export RAFTQ_URL={urls} RAFTQ_CA={ca.ca_cert}"
                )
                auth += f" --cacert {ca.ca_cert}"
            print("\nTry it (any node works; followers forward to the leader):")
            print(f"  export RAFTQ_TOKEN=$(cat {base / ADMIN_TOKEN_FILE})")
            print(f'  curl -s {auth} -XPOST {scheme}://{first}/topics -d \'{{"topic":"orders"}}\'')
            print(
                f"  curl -s {auth} -XPOST {scheme}://{first}/topics/orders/messages "
                '-d \'{"payload":"aGVsbG8="}\''
            )
            print(
                f"  curl -s {auth} -XPOST {scheme}://{first}/topics/orders/groups/default/receive "
                "-d '{\"wait\":5}'"
            )
            print(f"  curl -s {auth} {scheme}://{first}/cluster")
            print(_sqs_note(layout, scheme, first, token, None if ca is None else ca.ca_cert))
            print("\nCtrl-C stops the cluster.")
            sys.stdout.flush()
        while not stopping:
            for nid, p in procs.items():
                if p.poll() is not None and not getattr(p, "_reported", False):
                    print(f"node {nid} exited with {p.returncode}", file=sys.stderr)
                    p._reported = True  # type: ignore[attr-defined]
            if all(p.poll() is not None for p in procs.values()):
                print(f"every node exited; see the logs under {base}/n*/node.log", file=sys.stderr)
                return 1
            time.sleep(0.2)
    finally:
        code = stop_all(procs)
        print("cluster stopped")
    return code


def node_env(secret: str, admin_token: str) -> dict[str, str]:
    """The environment of a node process: ours, with the cluster secret and the bootstrap
    admin token (never on the command line: ``ps`` shows argv to every user)."""
    env = dict(os.environ, RAFTQ_SECRET=secret, RAFTQ_ADMIN_TOKEN=admin_token)
    env.pop("RAFTQ_ADMIN_TOKEN_FILE", None)  # (the node refuses both at once)
    return env


def _token_note(base: Path, token: str, off: bool = False) -> str:
    """Where the admin token is and who finds it (the CLI looks in ./.raftq/admin.token)."""
    path = base / ADMIN_TOKEN_FILE
    state = "OFF (RAFTQ_AUTH=off in this environment)" if off else "on"
    lines = [
        f"\nAccess control is {state}. Admin token (all rights), kept in"
        f" {path} (mode 0600):\n  {token}"
    ]
    if Path(".raftq", ADMIN_TOKEN_FILE).resolve() == path:
        lines.append(
            "The raftq CLI (raftq status, topic, publish, consume...) run from this directory"
            " finds it by itself;"
        )
    else:
        lines.append(f"The raftq CLI finds it with --token-file {path} (or RAFTQ_TOKEN_FILE);")
    lines.append("clients (AsyncClient, Client, the CLI) take RAFTQ_TOKEN.")
    given = os.environ.get("RAFTQ_TOKEN")
    if given and given != token:
        lines.append(
            "note: RAFTQ_TOKEN is set in this shell to another token, and the CLI prefers it"
            " to the file: unset it, or set it to this one"
        )
    return "\n".join(lines)


def _sqs_note(
    layout: list[dict[str, str]], scheme: str, api: str, token: str, ca: Path | None
) -> str:
    """Where the SQS endpoint is and the admin token's SQS credentials (GET /sqs/credentials)."""
    try:
        creds = get_json(f"{scheme}://{api}/sqs/credentials", 5.0, token, ca)
    except (OSError, ValueError) as e:
        return f"\nSQS endpoint: could not read its credentials ({e})"
    if "secret_access_key" not in creds:
        return f"\nSQS endpoint: no credentials: {creds.get('message', creds)}"
    urls = "  ".join(f"{scheme}://{n['sqs']}" for n in layout if n.get("sqs"))
    first = f"{scheme}://{layout[0]['sqs']}"
    ca_opt = f" --ca-bundle {ca}" if ca is not None else ""
    return (
        f"\nSQS (boto3, Celery, aws sqs) on every node: {urls}\n"
        "The admin token's SQS credentials (raftq sqs credentials prints a token's own):\n"
        f"  export AWS_ACCESS_KEY_ID={creds['access_key_id']}"
        f" AWS_SECRET_ACCESS_KEY={creds['secret_access_key']}"
        f" AWS_DEFAULT_REGION={creds.get('region', 'us-east-1')}\n"
        f"  aws --endpoint-url {first}{ca_opt} sqs create-queue --queue-name jobs"
    )


def stop_all(procs: dict[str, subprocess.Popen[bytes]]) -> int:
    for p in procs.values():
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    code = 0
    for nid, p in procs.items():
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"node {nid} did not stop in time; killing it", file=sys.stderr)
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            code = 1
    return code
