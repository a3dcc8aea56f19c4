"""The seam to pysyncobj: the one module that imports it or touches any of its internals.

Every private name of pysyncobj that raftq overrides, reads, writes or calls is declared in the
lists below, per pysyncobj class, and checked at import (``check_pysyncobj``: the installed
version is the pinned one and every declared name exists in it) and again on the objects once
built (``Raft.start``). A renamed private would otherwise fail silently: an override no longer
called (pre-vote or fast elections gone), a write that changes nothing, or a read raising inside
the tick. The rest of the package reaches pysyncobj only through ``Raft``, a small typed API,
and the constants at the end of this module.

Everything here runs under the node's tick lock (see ``_ticks``) unless it says otherwise.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import os
import pickle
import select
import struct
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from raftq.cluster.raft._tuning import (
    APPEND_BATCH_BYTES,
    APPEND_PERIOD,
    COMPACTION_SECONDS,
    CONNECTION_TIMEOUT,
    ELECTION_MAX,
    ELECTION_MIN,
    HANDSHAKE_TIMEOUT,
    LEADER_FALLBACK,
    MAX_CONNECTIONS,
    MAX_FRAME,
    PICKLE_PROTOCOL,
    PRE_AUTH_FRAME,
    RECONNECT,
    SEND_AHEAD,
    TICK,
    WARN_EVERY,
)
from raftq.cluster.raft._wire import RateLimited, _Sealer, _stored_zlib

# Must match the pin in pyproject.toml (tests/raft/test_seam.py checks that it does).
PINNED = "0.3.17"

Node = Any  # a pysyncobj TCPNode: ``id`` is its Raft address; raftq adds raftq_id, raftq_api

# ---------------------------------------------------------------------------- declared names
# Per pysyncobj class (or module): the names this module uses. A name may be in several lists.
_SYNCOBJ_MODULE = "pysyncobj.syncobj"
_SYNCOBJ = "pysyncobj.syncobj.SyncObj"
_TRANSPORT = "pysyncobj.transport.TCPTransport"
_CONNECTION = "pysyncobj.tcp_connection.TcpConnection"
_POLLER = "pysyncobj.poller.PollPoller"
_NOTIFIER = "pysyncobj.pipe_notifier.PipeNotifier"
_SERVER = "pysyncobj.tcp_server.TcpServer"
_SERIALIZER = "pysyncobj.serializer.Serializer"
_JOURNAL = "pysyncobj.journal.Journal"

# Public names imported below (checked first, so that a rename is reported like the others).
IMPORTED: dict[str, tuple[str, ...]] = {
    "pysyncobj": ("SyncObj", "SyncObjConf", "replicated"),
    "pysyncobj.config": ("FAIL_REASON", "SERIALIZER_STATE"),
    "pysyncobj.monotonic": ("monotonic",),
    "pysyncobj.node": ("TCPNode",),
    "pysyncobj.pipe_notifier": ("PipeNotifier",),
    "pysyncobj.poller": ("POLL_EVENT_TYPE", "PollPoller"),
    "pysyncobj.tcp_connection": ("CONNECTION_STATE",),
    "pysyncobj.transport": ("TCPTransport",),
}

# Methods replaced: by raftq's subclasses (_Binding, _Transport) or per instance.
OVERRIDDEN: dict[str, tuple[str, ...]] = {
    _SYNCOBJ: (
        "_SyncObj__generateRaftTimeout",  # fast election timeouts
        "_SyncObj__connectedToAnyone",  # the pre-vote gate
        "_checkCommandsToApply",  # raftq's proposals appended, completions delivered
    ),
    _TRANSPORT: (
        "_createServer",
        "send",  # (per instance)
        "_onNewIncomingConnection",  # the connection cap; each connection guarded at once
        "_onTick",  # unauthenticated connections timed out
        "_onDisconnected",  # a handshake the peer cut short is logged
        "_onOutgoingConnected",
        "_onOutgoingMessageReceived",
        "_onIncomingMessageReceived",  # a non-member presenting its address is noted
    ),
    _CONNECTION: (  # per instance (see _Transport.raftq_guard)
        "_TcpConnection__tryReadBuffer",  # one recv per event, frame sizes capped
        "disconnect",  # a message that failed to open is logged
    ),
    _SERVER: ("bind",),  # per instance: close the socket of a failed bind
}

READ: dict[str, tuple[str, ...]] = {
    _SYNCOBJ_MODULE: ("_RAFT_STATE", "_COMMAND_TYPE"),
    _SYNCOBJ: (
        "_SyncObj__raftState",
        "_SyncObj__raftCurrentTerm",
        "_SyncObj__raftCommitIndex",
        "_SyncObj__raftLastApplied",
        "_SyncObj__raftLeader",
        "_SyncObj__leaderCommitIndex",
        "_SyncObj__selfNode",
        "_SyncObj__otherNodes",
        "_SyncObj__connectedNodes",
        "_SyncObj__raftNextIndex",
        "_SyncObj__raftMatchIndex",
        "_SyncObj__lastResponseTime",
        "_SyncObj__raftElectionDeadline",
        "_SyncObj__newAppendEntriesTime",
        "_SyncObj__transferInProgress",
        "_SyncObj__transport",
        "_SyncObj__conf",
        "_methodToID",
        "_poller",
    ),
    _TRANSPORT: (
        "_connections",
        "_unknownConnections",
        "_nodeAddrToNode",
        "_server",
        "_onMessageReceivedCallback",
        "_onNodeConnectedCallback",
        "_onNodeDisconnectedCallback",
    ),
    # (sendRandKey, encryptor: no underscore, but internals all the same)
    _CONNECTION: (
        "_TcpConnection__socket",
        "_TcpConnection__writeBuffer",
        "_TcpConnection__readBuffer",
        "_TcpConnection__processConnection",
        "sendRandKey",
        "encryptor",
    ),
    _POLLER: ("_PollPoller__poll", "_PollPoller__descrToCallbacks"),
    _NOTIFIER: ("_PipeNotifier__pipeR", "_PipeNotifier__pipeW"),
    _SERVER: ("_TcpServer__socket",),
}

WRITTEN: dict[str, tuple[str, ...]] = {
    _SYNCOBJ: (
        "_SyncObj__sendAppendEntries",  # Raft._send_appends, in its place on the instance
        "_SyncObj__raftLog",
        "_SyncObj__serializer",
        "_SyncObj__encryptor",
        "_SyncObj__raftCurrentTerm",
        "_SyncObj__votedForNodeId",
        "_SyncObj__raftCommitIndex",
        "_SyncObj__needLoadDumpFile",
        "_SyncObj__raftElectionDeadline",
        "_SyncObj__otherNodes",
        "_SyncObj__newAppendEntriesTime",
    ),
    _CONNECTION: (
        "_TcpConnection__writeBuffer",
        "_TcpConnection__readBuffer",
        "_TcpConnection__lastReadTime",
        "encryptor",
    ),
    _POLLER: ("_PollPoller__poll",),
    _SERVER: ("_TcpServer__socket",),
}

CALLED: dict[str, tuple[str, ...]] = {
    _SYNCOBJ: (
        "_SyncObj__onMessageReceived",
        "_SyncObj__sendAppendEntries",
        "_SyncObj__connectedToAnyone",
        "_SyncObj__getCurrentLogIndex",
        "_SyncObj__getCurrentLogTerm",
        "_SyncObj__applyLogEntries",
        "_SyncObj__loadDumpFile",
        "_SyncObj__setCurrentTerm",  # (tests only: Raft.set_term)
        "_SyncObj__updateClusterConfiguration",  # (Raft.set_members: a forced new cluster)
        "_getFuncName",
        "_doDestroy",
    ),
    _TRANSPORT: ("_connToNode",),
    _CONNECTION: ("_TcpConnection__trySendBuffer",),
}

# Interfaces raftq's own objects implement in place of pysyncobj's: the names pysyncobj calls on
# them (journal.Journal, _snapshots._Snapshots, _wire._Sealer as conn.encryptor).
IMPLEMENTED: dict[str, tuple[str, ...]] = {
    _JOURNAL: (
        "add",
        "clear",
        "deleteEntriesFrom",
        "deleteEntriesTo",
        "__getitem__",
        "__len__",
        "_destroy",
        "setRaftCommitIndex",
        "getRaftCommitIndex",
        "setCurrentTerm",
        "getCurrentTerm",
        "getVotedForNodeId",
        "onOneSecondTimer",
    ),
    _SERIALIZER: (
        "checkSerializing",
        "serialize",
        "deserialize",
        "getTransmissionData",
        "setTransmissionData",
        "cancelTransmisstion",  # (sic)
    ),
    _CONNECTION: ("encrypt_at_time", "extract_timestamp", "decrypt"),
}

Declared = Mapping[str, Mapping[str, Sequence[str]]]  # kind -> owner -> names
DECLARED: Declared = {
    "imported": IMPORTED,
    "overridden": OVERRIDDEN,
    "read": READ,
    "written": WRITTEN,
    "called": CALLED,
    "implemented": IMPLEMENTED,
}

# ---------------------------------------------------------------------------- the checks


class PysyncobjMismatch(ImportError):
    """The installed pysyncobj is not the one this binding is written against."""


def _resolve(path: str) -> Any:
    """The module or class at ``path``, or None."""
    try:
        return importlib.import_module(path)
    except ImportError:
        pass
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None


def _codes(obj: Any) -> Iterator[types.CodeType]:
    """Every code object of a class's functions (properties and nested code included)."""
    stack: list[Any] = []
    for klass in getattr(obj, "__mro__", ()):
        for value in vars(klass).values():
            if isinstance(value, staticmethod | classmethod):
                value = value.__func__
            if isinstance(value, property):
                stack += [f for f in (value.fget, value.fset, value.fdel) if f is not None]
            elif isinstance(value, types.FunctionType):
                stack.append(value)
    codes = [f.__code__ for f in stack]
    while codes:
        code = codes.pop()
        yield code
        codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]


@functools.cache
def code_names(obj: Any) -> frozenset[str]:
    """The attribute names a class's code uses: instance attributes included, which exist only
    once ``__init__`` ran (``self.__x = ...`` compiles to ``_Class__x``: mangling is done at
    compile time, so renamed privates show here)."""
    return frozenset(n for code in _codes(obj) for n in code.co_names)


def _found(kind: str, owner: Any, name: str) -> bool:
    if isinstance(owner, types.ModuleType) or kind == "imported":
        return hasattr(owner, name)
    if kind in ("overridden", "called"):  # methods, on the class
        return callable(getattr(owner, name, None))
    # attributes: on the class, or set by its code
    return hasattr(owner, name) or name in code_names(owner)


def missing_names(
    declared: Declared = DECLARED,
) -> list[str]:
    """Every declared name the installed pysyncobj lacks, as ``Owner.name (kind)``."""
    missing = []
    for kind, lists in declared.items():
        for path, names in lists.items():
            owner = _resolve(path)
            if owner is None:
                missing.append(f"{path} (owner of {', '.join(names)})")
                continue
            short = path.rpartition(".")[2]
            missing += [f"{short}.{n} ({kind})" for n in names if not _found(kind, owner, n)]
    return missing


def check_pysyncobj(
    installed: str | None = None,
    declared: Declared = DECLARED,
) -> None:
    """Raise one ``PysyncobjMismatch`` naming every problem: a version other than ``PINNED``,
    and each declared name missing from the installed pysyncobj."""
    if installed is None:
        try:
            installed = importlib.metadata.version("pysyncobj")
        except importlib.metadata.PackageNotFoundError:
            installed = "none"
    missing = missing_names(declared)
    if installed == PINNED and not missing:
        return
    problems = [] if installed == PINNED else [f"pysyncobj {installed} is installed"]
    if missing:
        problems.append(f"missing from it: {', '.join(missing)}")
    raise PysyncobjMismatch(
        f"raftq's Raft binding is written against pysyncobj {PINNED} (pinned in pyproject.toml)"
        f" and relies on its internals; {'; '.join(problems)}"
    )


def check_built(path: str, obj: Any) -> None:
    """Once pysyncobj built ``obj`` (an instance of the class at ``path``): every attribute this
    module uses on it exists."""
    names = {n for lists in DECLARED.values() for n in lists.get(path, ())}
    names -= set(IMPLEMENTED.get(path, ()))  # (called on raftq's objects, not on obj)
    missing = sorted(n for n in names if not hasattr(obj, n))
    if missing:
        raise PysyncobjMismatch(
            f"pysyncobj's {type(obj).__name__} object lacks {', '.join(missing)}: not the"
            f" pysyncobj {PINNED} raftq's Raft binding is written against"
        )


check_pysyncobj()

# ---------------------------------------------------------------------------- pysyncobj, checked

import pysyncobj.syncobj as _syncobj  # noqa: E402 - after the check, which names what is missing
from pysyncobj import SyncObj, SyncObjConf, replicated  # noqa: E402
from pysyncobj.config import FAIL_REASON, SERIALIZER_STATE  # noqa: E402
from pysyncobj.monotonic import monotonic  # noqa: E402
from pysyncobj.node import TCPNode  # noqa: E402
from pysyncobj.pipe_notifier import PipeNotifier  # noqa: E402
from pysyncobj.poller import POLL_EVENT_TYPE, PollPoller  # noqa: E402
from pysyncobj.tcp_connection import CONNECTION_STATE  # noqa: E402
from pysyncobj.transport import TCPTransport  # noqa: E402

__all__ = [
    "CANDIDATE",
    "FAIL_REASON",
    "FOLLOWER",
    "LEADER",
    "NO_OP",
    "PINNED",
    "REGULAR",
    "ROLES",
    "SERIALIZER_STATE",
    "Hooks",
    "Node",
    "Notifier",
    "PysyncobjMismatch",
    "Raft",
    "check_pysyncobj",
    "dials",
    "make_node",
    "monotonic",
]

LEADER: int = _syncobj._RAFT_STATE.LEADER
FOLLOWER: int = _syncobj._RAFT_STATE.FOLLOWER
CANDIDATE: int = _syncobj._RAFT_STATE.CANDIDATE
ROLES = {LEADER: "leader", FOLLOWER: "follower", CANDIDATE: "candidate"}
REGULAR = bytes([_syncobj._COMMAND_TYPE.REGULAR])  # a journal command's first byte
NO_OP = bytes([_syncobj._COMMAND_TYPE.NO_OP])  # (an entry pysyncobj applies as nothing)


def make_node(addr: str, node_id: str, api: str) -> Node:
    return TCPNode(addr, raftq_id=node_id, raftq_api=api)


# ---------------------------------------------------------------------------- subclasses, patches


@dataclass(frozen=True, slots=True)
class Hooks:
    """What raftq plugs into pysyncobj (``Raft.start``)."""

    apply: Callable[[int, bytes], None]  # a committed raftq entry (its index, its data)
    election_timeout: Callable[[], float]
    may_stand: Callable[[], bool]  # asked right before pysyncobj stands for election
    drain: Callable[[], None]  # in each tick, after pysyncobj's own command queue...
    deliver: Callable[[], None]  # ...and then this, before the tick's poll
    send: Callable[[Node, Any], bool]  # every message pysyncobj sends
    on_message: Callable[[Node, Any], None]  # every message received (see Raft.handle_message)
    on_connected: Callable[[Node], None]  # after pysyncobj's own handling
    on_disconnected: Callable[[Node], None]


class _Binding(SyncObj):  # type: ignore[misc]
    """The SyncObj subclass: one replicated method taking bytes, and the OVERRIDDEN methods."""

    def __init__(self, hooks: Hooks, self_node: Node, others: list[Node], conf: Any) -> None:
        self._raftq = hooks  # (before pysyncobj's constructor: it draws an election timeout)
        super().__init__(self_node, others, conf, transportClass=_Transport)

    @replicated  # type: ignore[untyped-decorator]
    def raftq_apply(self, data: bytes) -> None:
        self._raftq.apply(self._SyncObj__raftLastApplied + 1, data)

    def _SyncObj__generateRaftTimeout(self) -> float:  # pysyncobj calls it by this name
        return self._raftq.election_timeout()

    def _SyncObj__connectedToAnyone(self) -> bool:
        # pysyncobj asks this only right before it stands for election: the pre-vote gate
        return bool(super()._SyncObj__connectedToAnyone()) and self._raftq.may_stand()

    def _checkCommandsToApply(self) -> None:
        super()._checkCommandsToApply()  # membership changes (pysyncobj's own queue)
        hooks = self._raftq
        hooks.drain()
        hooks.deliver()  # before this tick's poll, which may wait a whole TICK


class _Transport(TCPTransport):  # type: ignore[misc]
    """pysyncobj's TCP transport, whose server closes the socket of a failed bind attempt
    (pysyncobj retries the bind, from its constructor on, and left each failed socket open),
    with its port guarded: pysyncobj took any number of connections, kept a silent one forever
    and buffered whatever frame length it was told, before any authentication.

    * at most ``raftq_max_connections`` unauthenticated inbound connections at once: at that
      many, a new one closes the oldest (members' authenticated connections do not count);
    * an inbound connection not authenticated (the sealed handshake, then a member's address)
      within ``raftq_handshake_timeout`` of its accept is closed;
    * frames: at most PRE_AUTH_FRAME bytes until a connection is authenticated, MAX_FRAME after
      (``_read_once``); a longer one closes the connection once its length is read;
    * a message that fails to open (wrong secret, replayed, junk) and a handshake the peer cut
      short are logged (``RateLimited``) and counted in the node's stats, as are the above."""

    def __init__(self, *args: Any) -> None:
        # (before pysyncobj's constructor, which binds; Raft.start sets the real values)
        self.raftq_max_connections = MAX_CONNECTIONS
        self.raftq_handshake_timeout = HANDSHAKE_TIMEOUT
        self.raftq_stats: dict[str, int] = dict.fromkeys(GUARD_STATS, 0)
        self.raftq_view = memoryview(bytearray(PRE_AUTH_FRAME))  # reads land here
        self.raftq_log = RateLimited(WARN_EVERY)
        # Inbound connections open (authenticated or not), oldest first.
        self.raftq_inbound: dict[Any, None] = {}
        self.raftq_ticked = 0.0  # when _onTick last ran
        # Addresses that authenticated nodes presented as theirs, not members: when (refused)
        self.raftq_strangers: dict[str, float] = {}
        super().__init__(*args)

    def _createServer(self) -> None:
        super()._createServer()
        _close_socket_on_failed_bind(self._server)

    def _onNewIncomingConnection(self, conn: Any) -> None:
        # The cap counts connections not yet authenticated: a member's, once proven, never
        # makes room for strangers. At the cap the OLDEST unauthenticated one is closed, not
        # the new one: strangers that keep silent connections open cannot keep a member's
        # fresh connection from its chance to authenticate (it takes a round trip).
        pending = [c for c in self.raftq_inbound if c in self._unknownConnections]
        if len(pending) >= self.raftq_max_connections:
            oldest = pending[0]
            self.raftq_stats["connections_refused"] += 1
            self.raftq_log.warn(  # (before closing: whoever sees the close finds the line)
                "connections",
                "raft port: closed the oldest unauthenticated connection, from %s, for a new one"
                " from %s: %d unauthenticated inbound connections open, the limit",
                _peer(oldest),
                _peer(conn),
                len(pending),
            )
            oldest.disconnect()  # (-> _onDisconnected: forgotten)
            self._unknownConnections.discard(oldest)
        super()._onNewIncomingConnection(conn)
        conn.raftq_accepted = monotonic()
        self.raftq_inbound[conn] = None
        self.raftq_guard(conn)

    def _onTick(self) -> None:
        super()._onTick()
        now = monotonic()
        gap, self.raftq_ticked = now - self.raftq_ticked, now
        if gap > 1.0:  # this node was busy (a snapshot load): the poll after this reads first
            return
        cutoff = now - self.raftq_handshake_timeout
        for conn in list(self._connections.values()):
            # Ours, to a peer that accepted and never answered: pysyncobj's own timeout
            # runs only on events, and a connection waiting for an answer has none.
            if getattr(conn, "raftq_handshake", False) and conn.raftq_accepted < cutoff:
                conn.raftq_handshake = False
                self.raftq_stats["handshakes_timed_out"] += 1
                self.raftq_log.warn(
                    "handshake_timeout_out",
                    "raft connection to %s: no answer to the handshake within %.1f s; closed",
                    getattr(self._connToNode(conn), "id", "?"),
                    self.raftq_handshake_timeout,
                )
                conn.disconnect()  # (reconnected as usual)
        if self._unknownConnections:
            for conn in [
                c for c in self._unknownConnections if getattr(c, "raftq_accepted", 0) < cutoff
            ]:
                self.raftq_stats["handshakes_timed_out"] += 1
                self.raftq_log.warn(
                    "handshake_timeout",
                    "raft port: closed a connection from %s: not authenticated within %.1f s",
                    _peer(conn),
                    self.raftq_handshake_timeout,
                )
                conn.disconnect()  # (-> _onDisconnected: forgotten)
                self._unknownConnections.discard(conn)

    def _onOutgoingConnected(self, conn: Any) -> None:
        conn.raftq_handshake = bool(conn.encryptor)  # until the peer's sealed key arrives
        conn.raftq_accepted = monotonic()
        super()._onOutgoingConnected(conn)

    def _onOutgoingMessageReceived(self, conn: Any, message: Any) -> None:
        conn.raftq_handshake = False
        super()._onOutgoingMessageReceived(conn, message)

    def _onIncomingMessageReceived(self, conn: Any, message: Any) -> None:
        if (
            isinstance(message, str)
            and conn in self._unknownConnections
            and (conn.sendRandKey or not conn.encryptor)  # (the key exchange is done)
            and message != "readonly"
            and message not in self._nodeAddrToNode
        ):
            # A node with the cluster secret that takes us as a peer; pysyncobj refuses it
            # (not a member). The membership probe asks (``Raft.dialed_by``).
            if len(self.raftq_strangers) >= 256:
                self.raftq_strangers = {}
            self.raftq_strangers[message] = monotonic()
        super()._onIncomingMessageReceived(conn, message)

    def _onDisconnected(self, conn: Any) -> None:
        self.raftq_inbound.pop(conn, None)
        if getattr(conn, "raftq_handshake", False):
            # The peer closed before it answered: it could not open our first message (its
            # log says why), or does not take this node (not a member), or it is stopping.
            conn.raftq_handshake = False
            node = self._connToNode(conn)
            self.raftq_stats["handshakes_failed"] += 1
            self.raftq_log.warn(
                "handshake_failed",
                "raft connection to %s closed by the peer during the handshake: is the cluster"
                " secret the same on every node, and is this node a member?",
                getattr(node, "id", "?"),
            )
        super()._onDisconnected(conn)

    def raftq_guard(self, conn: Any) -> None:
        """Caps on its frames, a log line when a message fails to open (once per
        connection; for an inbound one at accept, before it is read)."""
        if not getattr(conn, "raftq_guarded", False):
            conn.raftq_guarded = True
            conn._TcpConnection__tryReadBuffer = functools.partial(_read_once, conn, self)
            conn.disconnect = functools.partial(_disconnect, conn, self, conn.disconnect)

    def raftq_pre_auth(self, conn: Any) -> bool:
        """Not yet authenticated: inbound until a member's address arrived (sealed, with the
        key we sent: a replayed handshake fails here), outbound until the peer's sealed key."""
        return conn in self._unknownConnections or bool(conn.encryptor and not conn.sendRandKey)


# The counters the guarded port adds to the node's stats.
GUARD_STATS = (
    "connections_refused",  # unauthenticated ones closed at the cap (the oldest, for a new one)
    "handshakes_timed_out",
    "handshakes_failed",
    "frames_refused",
    "messages_rejected",
)
_LENGTH = struct.Struct("i")  # pysyncobj's frame length (native, signed)


def _peer(conn: Any) -> str:
    try:
        host, port = conn._TcpConnection__socket.getpeername()[:2]
    except (OSError, AttributeError):
        return "?"
    return f"{host}:{port}"


def _own_overrides(cls: type, base: type) -> set[str]:
    return {n for n in vars(cls) if not n.startswith("__") and hasattr(base, n)}


# The subclasses override exactly what OVERRIDDEN declares for them (the rest are per instance).
if _own_overrides(_Binding, SyncObj) != set(OVERRIDDEN[_SYNCOBJ]) or not _own_overrides(
    _Transport, TCPTransport
) <= set(OVERRIDDEN[_TRANSPORT]):
    raise AssertionError("raft/_seam.py: an override is missing from OVERRIDDEN, or not made")


def _close_socket_on_failed_bind(server: Any) -> None:
    """pysyncobj's ``TcpServer.bind`` leaves the socket of a failed attempt open (e.g. the port
    still held by a process that just stopped; it retries later): close it."""
    bind = server.bind

    def bind_or_close() -> None:
        try:
            bind()
        except Exception:
            sock = server._TcpServer__socket
            if sock is not None:
                sock.close()
                server._TcpServer__socket = None
            raise

    server.bind = bind_or_close


def _read_once(conn: Any, transport: _Transport) -> None:
    """One recv into the transport's buffer, appended to the connection's read buffer
    (pysyncobj's ``__tryReadBuffer`` loops until the socket is drained, allocating its buffer
    size each time); then the length of the frame at the head of the buffer (the one pysyncobj
    parses next: it parsed every whole frame after the last read) is checked against the
    connection's cap. Before authentication, at most PRE_AUTH_FRAME bytes are read at once, so
    a refused frame costs that much memory."""
    sock = conn._TcpConnection__socket
    view, limit = transport.raftq_view, MAX_FRAME
    pre_auth = transport.raftq_pre_auth(conn)
    if pre_auth:
        view, limit = view[:PRE_AUTH_FRAME], PRE_AUTH_FRAME
    try:
        n = sock.recv_into(view)
    except (BlockingIOError, InterruptedError):
        n = -1
    except OSError:
        conn.disconnect()
        return
    if n == 0:  # closed by the peer
        conn.disconnect()
        return
    if n > 0:
        buf = conn._TcpConnection__readBuffer = conn._TcpConnection__readBuffer + view[:n]
        if len(buf) >= 4:
            (size,) = _LENGTH.unpack_from(buf)
            if not 0 <= size <= limit:
                transport.raftq_stats["frames_refused"] += 1
                transport.raftq_log.warn(
                    "frame before authentication" if pre_auth else "frame",  # (a member's
                    # refused frame is a different story: never hidden by strangers' ones)
                    "raft connection %s %s: refused a frame of %d bytes%s (the limit is %d);"
                    " closed",
                    "from" if conn in transport.raftq_inbound else "to",
                    _peer(conn),
                    size,
                    " before authentication" if pre_auth else "",
                    limit,
                )
                conn.disconnect()
                return
    conn._TcpConnection__lastReadTime = monotonic()


def _disconnect(conn: Any, transport: _Transport, disconnect: Callable[[], None]) -> None:
    """pysyncobj's ``disconnect``, which it also calls, without a word, when a message fails
    to open (bad seal or tag, an old timestamp, another connection's key: a replay): then the
    whole frame is still at the head of the read buffer (it parsed every whole frame after the
    last read otherwise). Say so, with the sealer's reason if it has one."""
    buf = conn._TcpConnection__readBuffer
    if conn.state != CONNECTION_STATE.DISCONNECTED and len(buf) >= 4:
        (size,) = _LENGTH.unpack_from(buf)
        if 0 <= size <= len(buf) - 4:
            sealer = conn.encryptor
            why = getattr(sealer, "rejected", None) or (
                "failed its checks (replayed, out of order or for another connection)"
            )
            if isinstance(sealer, _Sealer):
                sealer.rejected = None
            transport.raftq_stats["messages_rejected"] += 1
            transport.raftq_log.warn(
                why,  # (one of a few: rate-limited per reason)
                "raft connection %s %s: a message %s; closed",
                "from" if conn in transport.raftq_inbound else "to",
                _peer(conn),
                why,
            )
    disconnect()


class _Members(set):  # type: ignore[type-arg]
    """pysyncobj's set of the other members. While ``only`` is set (by
    ``Raft.send_append_entries_to``), ``members | readonly`` - how pysyncobj's send loop picks
    its targets - yields just those nodes; everything else, other threads included, still sees
    every member (swapping the set made /cluster and remove_member see a smaller cluster)."""

    __slots__ = ("only",)

    def __init__(self, nodes: Any = ()) -> None:
        super().__init__(nodes)
        self.only: set[Any] | None = None

    def __or__(self, other: Any) -> Any:
        if self.only is not None:
            return self.only | other
        return set.__or__(self, other)


# ---------------------------------------------------------------------------- the API


class Notifier:
    """pysyncobj's pipe notifier on the node's poller: ``notify`` (any thread) ends a tick's
    wait for events."""

    __slots__ = ("_pipe", "notify")

    def __init__(self, poller: Any) -> None:
        self._pipe = PipeNotifier(poller)
        check_built(_NOTIFIER, self._pipe)
        self.notify: Callable[[], None] = self._pipe.notify

    def close(self) -> None:
        p = self._pipe
        for fd in (p._PipeNotifier__pipeR, p._PipeNotifier__pipeW):
            with contextlib.suppress(OSError):
                os.close(fd)


class Raft:
    """pysyncobj's ``SyncObj`` as raftq uses it. Made idle; ``start`` builds the SyncObj (which
    binds the Raft port) and plugs raftq's ``Hooks`` into it.

    The per-message methods are bound methods of pysyncobj's objects, stored here at start
    (``tick``, ``poll``, ``send_append_entries``, ``handle_message``), and properties only read
    one attribute, so the hot paths pay one call at most for going through the seam."""

    def __init__(self) -> None:
        self.started = False
        self._b: Any = None
        self._transport: Any = None
        self._stats: dict[str, int] = {}
        self._fix_sends = True
        self._last_log_seen = (0, 0)  # (see _last_log)
        self.func_id = 0  # raftq_apply's id in journal commands
        self.tick: Callable[[float], None] = _unstarted
        self.poll: Callable[[float], None] = _unstarted
        self.send_append_entries: Callable[[], None] = _unstarted
        self.handle_message: Callable[[Node, Any], None] = _unstarted  # pysyncobj's own

    def start(
        self,
        self_node: Node,
        others: list[Node],
        hooks: Hooks,
        *,
        bind_addr: str,
        socket_buffer: int,
        compaction_entries: int,
        fix_sends: bool,
        stats: dict[str, int],
        max_connections: int = MAX_CONNECTIONS,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
    ) -> None:
        conf = SyncObjConf(
            autoTick=False,  # raftq's own tick loop: sync, flush held acks, deliver completions
            autoTickPeriod=TICK,
            password=None,  # pysyncobj's Fernet is replaced by _Sealer (install_sealer)
            bindAddress=bind_addr,  # never 0.0.0.0 (pysyncobj's default for a host)
            bindRetryTime=0.1,
            maxBindRetries=10,
            appendEntriesPeriod=APPEND_PERIOD,
            raftMinTimeout=ELECTION_MIN,
            raftMaxTimeout=ELECTION_MAX,
            leaderFallbackTimeout=LEADER_FALLBACK,
            connectionTimeout=CONNECTION_TIMEOUT,
            connectionRetryTime=RECONNECT,
            sendBufferSize=socket_buffer,
            recvBufferSize=socket_buffer,
            appendEntriesBatchSizeBytes=APPEND_BATCH_BYTES,
            logCompactionBatchSize=1 << 20,
            logCompactionMinEntries=compaction_entries,
            logCompactionMinTime=COMPACTION_SECONDS,
            commandsQueueSize=1000,  # pysyncobj's queue: membership changes only
            commandsWaitLeader=False,  # a proposal without a leader fails at once (NotLeader)
            dynamicMembershipChange=True,
        )
        b = _Binding(hooks, self_node, others, conf)
        try:
            transport = b._SyncObj__transport
            check_built(_SYNCOBJ, b)
            check_built(_TRANSPORT, transport)
            check_built(_POLLER, b._poller)
            if not isinstance(b._poller, PollPoller):
                raise PysyncobjMismatch(f"unexpected pysyncobj poller {type(b._poller).__name__}")
            if transport._server is not None:
                check_built(_SERVER, transport._server)
            for conn in transport._connections.values():  # made in __init__, not yet connected
                check_built(_CONNECTION, conn)
        except BaseException:
            b._doDestroy()
            raise
        self._b, self._transport = b, transport
        self._stats, self._fix_sends = stats, fix_sends
        for key in GUARD_STATS:
            stats.setdefault(key, 0)
        transport.raftq_stats = stats
        transport.raftq_max_connections = max_connections
        transport.raftq_handshake_timeout = handshake_timeout
        transport.raftq_view = memoryview(bytearray(socket_buffer))  # (see bound_reads)
        self.func_id = b._methodToID[b._getFuncName("raftq_apply")]
        self.tick = b.doTick
        self.poll = b._poller.poll
        b._SyncObj__sendAppendEntries = self._send_appends(b._SyncObj__sendAppendEntries)
        self.send_append_entries = b._SyncObj__sendAppendEntries
        self.handle_message = b._SyncObj__onMessageReceived
        transport.send = hooks.send
        transport.setOnMessageReceivedCallback(hooks.on_message)
        connected, disconnected = (
            transport._onNodeConnectedCallback,
            transport._onNodeDisconnectedCallback,
        )

        def on_connected(node: Node) -> None:
            connected(node)
            hooks.on_connected(node)

        def on_disconnected(node: Node) -> None:
            disconnected(node)
            hooks.on_disconnected(node)

        transport.setOnNodeConnectedCallback(on_connected)
        transport.setOnNodeDisconnectedCallback(on_disconnected)
        # Membership changes go through RaftNode's checks only: pysyncobj's admin messages that
        # would add or remove a member are answered FAIL (unregistered, one would crash the tick).
        for command in ("add", "remove"):
            transport.setOnUtilityMessageCallback(command, _denied)
        self.started = True

    # ------------------------------------------------------------------ set-up

    def install_storage(self, journal: Any, serializer: Any) -> None:
        """raftq's journal and serializer in place of the ones pysyncobj built (before any tick),
        and the state pysyncobj's constructor read from its own journal, read from ours."""
        b = self._b
        if len(journal) == 0:
            journal.add(NO_OP, 1, 0)  # pysyncobj's initial entry
            journal.sync()
        b._SyncObj__raftLog = journal
        b._SyncObj__raftCurrentTerm = max(journal.getCurrentTerm(), journal[-1][2])
        b._SyncObj__votedForNodeId = journal.getVotedForNodeId()
        b._SyncObj__raftCommitIndex = 1
        b._SyncObj__needLoadDumpFile = False
        b._SyncObj__serializer = serializer

    def install_sealer(self, sealer: _Sealer) -> None:
        self._b._SyncObj__encryptor = sealer  # read by the transport for every new connection
        for conn in self._transport._connections.values():  # made in __init__
            conn.encryptor = sealer

    def install_poll(self, wait: Any) -> None:
        """Swap the ``select.poll`` object inside pysyncobj's poller for ``wait`` (a ``_Wait``).
        Only the server socket may be subscribed yet (pysyncobj binds in its constructor), for
        reads."""
        poller = self._b._poller
        inner = poller._PollPoller__poll
        for fd in poller._PollPoller__descrToCallbacks:
            with contextlib.suppress(KeyError, OSError):
                inner.unregister(fd)
                os.fstat(fd)
                wait.register(fd, select.POLLIN | select.POLLERR)
        poller._PollPoller__poll = wait

    def notifier(self) -> Notifier:
        return Notifier(self._b._poller)

    def load_snapshot(self) -> None:
        """pysyncobj loads the serializer's snapshot (``deserialize``), keeping the journal."""
        self._b._SyncObj__loadDumpFile(clearJournal=False)

    def apply_committed(self) -> None:
        """pysyncobj applies the entries up to the commit index."""
        self._b._SyncObj__applyLogEntries()

    def destroy(self) -> None:
        self._b._doDestroy()

    # ------------------------------------------------------------------ state

    @property
    def state(self) -> int:  # LEADER, FOLLOWER or CANDIDATE
        s: int = self._b._SyncObj__raftState
        return s

    @property
    def term(self) -> int:
        t: int = self._b._SyncObj__raftCurrentTerm
        return t

    @property
    def commit_index(self) -> int:
        i: int = self._b._SyncObj__raftCommitIndex
        return i

    @commit_index.setter
    def commit_index(self, index: int) -> None:
        self._b._SyncObj__raftCommitIndex = index

    @property
    def last_applied(self) -> int:
        i: int = self._b._SyncObj__raftLastApplied
        return i

    @property
    def leader_commit(self) -> int | None:
        """The commit index the leader last sent (ours on the leader)."""
        i: int | None = self._b._SyncObj__leaderCommitIndex
        return i

    @property
    def leader(self) -> Node | None:
        return self._b._SyncObj__raftLeader

    @property
    def self_node(self) -> Node | None:
        return self._b._SyncObj__selfNode

    @property
    def other_nodes(self) -> set[Node]:
        """pysyncobj's own set (do not change it; ``members`` is a copy for other threads)."""
        s: set[Node] = self._b._SyncObj__otherNodes
        return s

    @property
    def members(self) -> set[Node]:
        """The other members, a copy (any thread)."""
        s: set[Node] = self._b.otherNodes
        return s

    @property
    def connected_nodes(self) -> set[Node]:
        s: set[Node] = self._b._SyncObj__connectedNodes
        return s

    @property
    def next_index(self) -> dict[Node, int]:
        d: dict[Node, int] = self._b._SyncObj__raftNextIndex
        return d

    @property
    def match_index(self) -> dict[Node, int]:
        d: dict[Node, int] = self._b._SyncObj__raftMatchIndex
        return d

    @property
    def last_response_time(self) -> dict[Node, float]:
        d: dict[Node, float] = self._b._SyncObj__lastResponseTime
        return d

    @property
    def election_deadline(self) -> float:
        t: float = self._b._SyncObj__raftElectionDeadline
        return t

    @election_deadline.setter
    def election_deadline(self, when: float) -> None:
        self._b._SyncObj__raftElectionDeadline = when

    @property
    def transfer_in_progress(self) -> bool:
        return bool(self._b._SyncObj__transferInProgress)

    def _last_log(self) -> tuple[int, int]:
        """The last log entry's (index, term). ``status()`` reads it from other threads, and a
        snapshot install on the Raft thread empties the journal for a moment before it appends
        the snapshot's entry: a reader that lands in that moment gets the last pair read."""
        b = self._b
        with contextlib.suppress(IndexError):
            self._last_log_seen = (
                b._SyncObj__getCurrentLogIndex(),
                b._SyncObj__getCurrentLogTerm(),
            )
        return self._last_log_seen

    @property
    def last_log_index(self) -> int:
        return self._last_log()[0]

    @property
    def last_log_term(self) -> int:
        return self._last_log()[1]

    @property
    def conf(self) -> Any:
        """pysyncobj's SyncObjConf (its fields are pysyncobj's documented options)."""
        return self._b._SyncObj__conf

    def set_compaction_entries(self, n: int) -> None:
        self._b._SyncObj__conf.logCompactionMinEntries = n

    def is_connected(self, node: Node) -> bool:
        return bool(self._b.isNodeConnected(node))

    def dialed_by(self, addr: str) -> float | None:
        """When a node that is not a member last connected to us with the cluster secret,
        presenting Raft address ``addr`` as its own (pysyncobj refused it), on pysyncobj's clock."""
        return self._transport.raftq_strangers.get(addr) if self._transport else None

    def connected_to_anyone(self) -> bool:
        """pysyncobj's own condition for standing for election (without the pre-vote gate)."""
        return bool(SyncObj._SyncObj__connectedToAnyone(self._b))

    def set_term(self, term: int) -> None:
        """As on a vote request of a newer term, without the vote (tests)."""
        self._b._SyncObj__setCurrentTerm(term, None)

    @property
    def on_receive(self) -> Callable[[Node, Any], None]:
        """The transport's receive callback (``Hooks.on_message``; tests wrap it)."""
        f: Callable[[Node, Any], None] = self._transport._onMessageReceivedCallback
        return f

    @on_receive.setter
    def on_receive(self, f: Callable[[Node, Any], None]) -> None:
        self._transport.setOnMessageReceivedCallback(f)

    # ------------------------------------------------------------------ requests (public API)

    def force_compaction(self) -> None:
        self._b.forceLogCompaction()

    def transfer_leadership(self, callback: Callable[[Any, Any], None]) -> None:
        self._b.transferLeadership(callback=callback)

    def set_members(self, others: list[Node]) -> None:
        """Make ``others`` the other members, as a snapshot's membership is loaded (at start
        only: no log entry says so)."""
        self._b._SyncObj__updateClusterConfiguration(others)

    def add_node(self, node: Node, callback: Callable[[Any, Any], None]) -> None:
        self._b.addNodeToCluster(node, callback=callback)

    def remove_node(self, node: Node, callback: Callable[[Any, Any], None]) -> None:
        self._b.removeNodeFromCluster(node, callback=callback)

    # ------------------------------------------------------------------ sends and receives

    def _members(self) -> _Members:
        b = self._b
        others = b._SyncObj__otherNodes
        if not isinstance(others, _Members):  # pysyncobj replaces it on a snapshot install
            others = b._SyncObj__otherNodes = _Members(others)
        return others

    def _send_appends(self, send: Callable[[], None]) -> Callable[[], None]:
        """pysyncobj's append send (``send``), installed in its place (its own calls too),
        passing over the followers whose connection holds more than SEND_AHEAD unsent: it
        sends a lagging follower 8 MB batches or 1 MiB snapshot parts for up to APPEND_PERIOD
        a call, however much is still queued for it (a new member catching up queued 100+ MB
        on the leader). What is queued reaches it, so it hears from its leader; the queue is
        pushed on (a connection whose peer stopped reading times out there, as a send's
        would)."""
        connections = self._transport._connections

        def send_appends() -> None:
            full = self.backed_up()
            if not full:
                send()
                return
            for n in full:
                connections[n]._TcpConnection__trySendBuffer()
            others = self._members()
            only = others.only
            others.only = (set(others) if only is None else only) - full
            try:
                send()
            finally:
                others.only = only

        return send_appends

    def backed_up(self) -> set[Node]:
        """The followers whose connection holds more than SEND_AHEAD unsent: appends pass
        over them (``_send_appends``) until it drains."""
        return {
            n for n, c in self._transport._connections.items() if c.getSendBufferSize() > SEND_AHEAD
        }

    def send_append_entries_to(self, nodes: set[Node]) -> None:
        """pysyncobj's append send to just ``nodes``; the others' next heartbeat is not moved."""
        b = self._b
        others = self._members()
        heartbeat = b._SyncObj__newAppendEntriesTime
        others.only = nodes
        try:
            b._SyncObj__sendAppendEntries()
        finally:
            others.only = None
            b._SyncObj__newAppendEntriesTime = heartbeat

    def send_now(self, node: Node, message: Any) -> bool:
        """Frame and write ``message`` to ``node``'s connection now: pysyncobj's framing, with
        pickle protocol 4, a stored zlib stream and ``_Sealer`` parts gathered by one
        ``sendmsg`` (no joined copy). Here whole rather than behind per-field accessors: it runs
        for every message and works on TcpConnection's internals throughout."""
        conn = self._transport._connections.get(node)
        if conn is None or conn.state != CONNECTION_STATE.CONNECTED:
            return False
        if conn.sendRandKey:
            message = (conn.sendRandKey, message)
        data = _stored_zlib(pickle.dumps(message, PICKLE_PROTOCOL))
        parts: tuple[bytes, ...] = (data,)
        if isinstance(conn.encryptor, _Sealer):
            parts = conn.encryptor.seal_parts(data, int(monotonic()))
        elif conn.encryptor:
            parts = (conn.encryptor.encrypt_at_time(data, int(monotonic())),)
        size = sum(len(p) for p in parts)
        parts = (struct.pack("i", size), *parts)
        if conn._TcpConnection__writeBuffer:  # queued behind earlier bytes
            conn._TcpConnection__writeBuffer += b"".join(parts)
            conn._TcpConnection__trySendBuffer()
        else:  # straight to the socket, the parts gathered by the kernel (no joined copy)
            try:
                sent = conn._TcpConnection__socket.sendmsg(parts)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                conn.disconnect()
                return False
            if sent < size + 4:
                conn._TcpConnection__writeBuffer = b"".join(parts)[sent:]
        if conn.state != CONNECTION_STATE.CONNECTED:
            return False
        if self._fix_sends and conn.getSendBufferSize() > 0:
            # pysyncobj re-arms write interest only inside a write event, so a send that did not
            # fit the socket buffer would sit until the next send (up to a heartbeat later).
            self._stats["rearmed_sends"] += 1
            ev = POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.WRITE | POLL_EVENT_TYPE.ERROR
            self._b._poller.subscribe(conn.fileno(), conn._TcpConnection__processConnection, ev)
        return True

    def bound_reads(self) -> None:
        """pysyncobj reads a socket until it would block and only then parses, growing its
        buffer with ``+=`` and cutting every message off the front with a copy: both are
        quadratic in a burst. A 100 MB snapshot sent to a restarted follower froze it for
        10 s per attempt (the leader timed out and started over, forever). One recv per poll
        event bounds the buffer; the poller is level-triggered, so the rest comes next.
        That recv fills one preallocated buffer of the socket buffer's size: pysyncobj's
        ``recv(4 MiB)`` allocates 4 MiB per call (~24 us for a 12 KB message; 3 us now), and
        a smaller recv size makes a large append take many poll rounds. Each connection is
        guarded too (``_Transport.raftq_guard``: frame caps, rejected messages logged)."""
        transport = self._transport
        for conn in transport._connections.values():  # (inbound ones: guarded at accept)
            transport.raftq_guard(conn)


def dials(self_addr: str, addr: str) -> bool:
    """Whether a node at ``self_addr`` opens the connection to its peer at ``addr`` (pysyncobj:
    the larger address dials; the other one only accepts)."""
    return self_addr > addr


def _denied(args: Any, callback: Callable[[Any, Any], None]) -> None:
    callback(None, FAIL_REASON.REQUEST_DENIED)


def _unstarted(*args: Any) -> Any:
    raise RuntimeError("raft not started")
