"""The Raft port authenticates before it allocates: frame sizes capped before the handshake, a
silent connection closed after the handshake timeout, at the cap of unauthenticated connections
the oldest closed (a member still gets in), and a node with the wrong secret says so (real
processes)."""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import socket
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftq.cluster.raft._wire import _Sealer
from tests.node.cluster_fixture import Cluster, http, wait_for

pytestmark = pytest.mark.slow

HANDSHAKE_TIMEOUT = 3.0
MAX_CONNECTIONS = 4


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One node (it leads), with a short handshake timeout and a small connection cap."""
    c = Cluster(
        tmp_path_factory.mktemp("raftport"),
        1,
        extra_args=[
            "--raft-handshake-timeout", str(HANDSHAKE_TIMEOUT),
            "--raft-max-connections", str(MAX_CONNECTIONS),
        ],
    )  # fmt: skip
    try:
        yield c.start()
    finally:
        c.close()


def raft_addr(c: Cluster) -> tuple[str, int]:
    host, port = c.nodes["n1"].raft.rsplit(":", 1)
    return host, int(port)


def stat(c: Cluster, name: str) -> int:
    return stat_of(c, "n1", name)


def stat_of(c: Cluster, node_id: str, name: str) -> int:
    code, body = http("GET", c.url(node_id) + "/metrics")
    assert code == 200
    m = re.search(rf"^raftq_raft_{name}_total (\S+)$", body.decode(), re.M)
    assert m, name
    return int(float(m.group(1)))


def rss_kib(c: Cluster) -> int:
    proc = c.nodes["n1"].proc
    assert proc is not None
    status = Path(f"/proc/{proc.pid}/status").read_text()
    m = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
    assert m
    return int(m.group(1))


def closed_by_peer(s: socket.socket, timeout: float) -> bool:
    """True once the peer closed ``s`` (EOF or reset) within ``timeout`` (what it sent before
    is read and dropped); False if it stays open."""
    deadline = time.monotonic() + timeout
    try:
        while (left := deadline - time.monotonic()) > 0:
            s.settimeout(left)
            if s.recv(1 << 16) == b"":
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        pass
    return False


def test_a_huge_frame_before_authentication_is_refused_with_bounded_memory(
    single: Cluster,
) -> None:
    before = rss_kib(single)
    with socket.create_connection(raft_addr(single), timeout=10) as s:
        s.sendall(struct.pack("i", 2**31 - 1) + bytes(1024))  # "2 GiB follow"
        assert closed_by_peer(s, 10), "the node kept a connection announcing a 2 GiB frame"
    with socket.create_connection(raft_addr(single), timeout=10) as s:
        s.sendall(struct.pack("i", 2**31 - 1))
        sent, chunk = 0, bytes(1 << 16)
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            while sent < 64 << 20:
                s.sendall(chunk)
                sent += len(chunk)
        assert sent < 64 << 20, "the node took 64 MiB of a frame before authentication"
    assert stat(single, "frames_refused") >= 2
    growth = rss_kib(single) - before
    assert growth < 32 << 10, f"RSS grew by {growth} KiB"


def test_a_silent_connection_is_closed_after_the_handshake_timeout(single: Cluster) -> None:
    with socket.create_connection(raft_addr(single), timeout=10) as s:
        assert closed_by_peer(s, HANDSHAKE_TIMEOUT + 5), "a silent connection was kept"
    assert stat(single, "handshakes_timed_out") >= 1


def test_at_the_cap_a_new_connection_closes_the_oldest_unauthenticated_one(
    single: Cluster,
) -> None:
    closed = stat(single, "connections_refused")
    held = []
    try:
        for _ in range(MAX_CONNECTIONS):
            held.append(socket.create_connection(raft_addr(single), timeout=10))
            time.sleep(0.01)  # (accepted in this order: the first is the oldest)
        held.append(socket.create_connection(raft_addr(single), timeout=10))
        assert closed_by_peer(held[0], HANDSHAKE_TIMEOUT - 1), "the oldest was kept"
        assert stat(single, "connections_refused") == closed + 1
        assert not closed_by_peer(held[-1], 0.2), "the newest was closed"
    finally:
        for s in held:
            s.close()


def test_strangers_holding_silent_connections_do_not_keep_a_member_out(tmp_path: Path) -> None:
    """A flood of silent connections, re-opened as they are closed, on the port of the node a
    restarted member must dial (pysyncobj: the larger address dials): the member's connection
    still gets its turn to authenticate, and it rejoins."""
    c = Cluster(tmp_path, 2, extra_args=["--raft-max-connections", str(MAX_CONNECTIONS)])
    stop = threading.Event()
    held: list[socket.socket] = []

    def flood(addr: tuple[str, int]) -> None:
        while not stop.is_set():
            for s in list(held):
                try:
                    if s.recv(1) == b"":
                        held.remove(s)
                        s.close()
                except BlockingIOError:
                    pass
                except OSError:
                    held.remove(s)
                    s.close()
            while len(held) < MAX_CONNECTIONS + 2 and not stop.is_set():
                try:
                    s = socket.create_connection(addr, timeout=1)
                except OSError:
                    break
                s.setblocking(False)
                held.append(s)
            stop.wait(0.01)

    flooder: threading.Thread | None = None
    try:
        c.start()
        acceptor, member = sorted(c.nodes.values(), key=lambda n: n.raft)
        host, port = acceptor.raft.rsplit(":", 1)
        refused = stat_of(c, acceptor.id, "connections_refused")
        flooder = threading.Thread(target=flood, args=((host, int(port)),), daemon=True)
        flooder.start()
        wait_for(  # the flood holds the cap
            "the cap reached",
            lambda: stat_of(c, acceptor.id, "connections_refused") > refused + MAX_CONNECTIONS,
            10,
        )
        c.kill(member.id)
        c.start_node(member.id)
        # (Two members: the restarted one knows a leader only once it reached the other.)
        wait_for(
            "the restarted member knowing the leader while the flood goes on",
            lambda: c.status(member.id).get("leader"),
            20,
        )
        assert flooder.is_alive()
        assert stat_of(c, acceptor.id, "connections_refused") > refused + 2 * MAX_CONNECTIONS
    finally:
        stop.set()
        if flooder is not None:
            flooder.join(5)
        for s in held:
            s.close()
        c.close()


def sealed_frame(secret: str, message: object) -> bytes:
    """A frame as a member sends it (pysyncobj's framing, raftq's seal)."""
    data = _Sealer(secret).encrypt_at_time(zlib.compress(pickle.dumps(message)), 1)
    return struct.pack("i", len(data)) + data


def test_junk_and_replayed_frames_are_logged_and_closed(single: Cluster) -> None:
    rejected = stat(single, "messages_rejected")
    with socket.create_connection(raft_addr(single), timeout=10) as s:
        s.sendall(struct.pack("i", 64) + bytes(64))  # well framed, but junk
        assert closed_by_peer(s, 10)
    # A recorded first message, replayed where the second belongs: it opens (it is genuine)
    # but does not carry the key the node sent on this connection.
    frame = sealed_frame(single.secret, os.urandom(32))
    with socket.create_connection(raft_addr(single), timeout=10) as s:
        s.sendall(frame)
        s.recv(4)  # the node's answer begins: its key
        s.sendall(frame)
        assert closed_by_peer(s, 10)
    assert stat(single, "messages_rejected") == rejected + 2
    log = single.nodes["n1"].log.read_text()
    assert "a message has an unknown seal" in log
    assert "a message failed its checks (replayed" in log


def read_frame(s: socket.socket, secret: str) -> object:
    head = b""
    while len(head) < 4:
        head += s.recv(4 - len(head))
    (size,) = struct.unpack("i", head)
    data = b""
    while len(data) < size:
        data += s.recv(size - len(data))
    return pickle.loads(zlib.decompress(_Sealer(secret).decrypt(data)))


def test_after_authentication_frames_are_capped_at_the_largest_append(single: Cluster) -> None:
    # A peer knowing the secret completes the handshake (as a read-only node, which pysyncobj
    # lets in), then announces a frame over MAX_FRAME (16 MiB).
    secret, ours = single.secret, os.urandom(32)
    with socket.create_connection(raft_addr(single), timeout=10) as s:
        s.sendall(sealed_frame(secret, ours))
        reply = read_frame(s, secret)
        assert isinstance(reply, tuple)
        echoed, theirs = reply
        assert echoed == ours
        s.sendall(sealed_frame(secret, (theirs, "readonly")))
        s.sendall(struct.pack("i", (16 << 20) + 1))
        assert closed_by_peer(s, 10)
    lines = single.nodes["n1"].log.read_text().splitlines()
    refused = [line for line in lines if f"refused a frame of {(16 << 20) + 1} bytes" in line]
    assert refused and "before authentication" not in refused[-1], refused


def test_a_node_with_the_wrong_secret_and_its_peer_both_log_it(tmp_path: Path) -> None:
    c = Cluster(tmp_path, 2)
    try:
        c.start_node("n1")
        c.secret = "not-the-cluster-secret"
        c.start_node("n2")
        n1, n2 = c.nodes["n1"], c.nodes["n2"]
        acceptor, connector = (n1, n2) if n2.raft > n1.raft else (n2, n1)  # pysyncobj's rule

        def failures(node_id: str, name: str) -> int:
            _, body = http("GET", c.url(node_id) + "/metrics")
            m = re.search(rf"^raftq_raft_{name}_total (\S+)$", body.decode(), re.M)
            return int(float(m.group(1))) if m else 0

        # Reconnects every 0.3 s: several failures on both sides...
        wait_for("repeated rejections", lambda: failures(acceptor.id, "messages_rejected") >= 4, 20)
        wait_for(
            "repeated handshakes", lambda: failures(connector.id, "handshakes_failed") >= 4, 20
        )
        # ...each side says it, rate-limited (one line per kind per 10 s): fewer lines than
        # failures.
        rejected = acceptor.log.read_text().count("a message failed authentication")
        cut_short = connector.log.read_text().count("closed by the peer during the handshake")
        assert 1 <= rejected < failures(acceptor.id, "messages_rejected"), c.tail(acceptor.id)
        assert 1 <= cut_short < failures(connector.id, "handshakes_failed"), c.tail(connector.id)
    finally:
        c.close()
