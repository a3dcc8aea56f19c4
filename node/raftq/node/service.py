"""The broker service of one node, under every transport: group commit, the tick timer, the
apply listener and long-poll waiters, consumers held by open connections and their release,
linearizable reads, readiness, and the ONE mapping from Raft outcomes to node errors.

It works over the narrow ``raftapi.Raft`` protocol and knows nothing of HTTP: transports
(``raftq.node.app`` and its route modules, ``stream``) turn requests into commands
(``commands``) and call ``call`` / ``read`` / ``read_latest``. Every state change is one
command through the ``Batcher``, answered after commit and apply. ``LeaderLost`` means "not
applied, and this node does not lead": the transport forwards or redirects to the leader.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from raftq.cluster.errors import BrokerError
from raftq.cluster.state import Broker
from raftq.node.batcher import Batcher
from raftq.node.commands import MAX_WAIT_S
from raftq.node.diskguard import DEFAULT_MIN_FREE, DiskGuard, Reserve, parse_reserve
from raftq.node.errors import ApiError
from raftq.node.metrics import DEFAULT_TOPICS as DEFAULT_METRICS_TOPICS
from raftq.node.metrics import NodeMetrics
from raftq.node.raftapi import (
    EntryTooLarge,
    NotLeader,
    QueueFull,
    Raft,
    RaftError,
    ReadNotReady,
)

log = logging.getLogger("raftq.node")

READ_RETRY_S = 0.02  # a read that reached a leader not ready yet (see read_latest)
FOLLOWER_TICKER_S = 0.05  # how soon a new leader's timer starts (due deadlines slip this much)
COMPACTION_CHECK_S = 1.0  # how often the leader looks for store segments worth compacting
# A command that cannot be encoded into an entry (a value msgpack refuses): refused before
# anything was appended, so a batch holding it may be split and retried without it.
UNENCODABLE = (TypeError, OverflowError, UnicodeEncodeError)


def splittable(e: BaseException) -> bool:
    """Whether a batch refused with ``e`` was refused as a whole before anything was
    appended (too large for one entry, or a value that cannot be encoded), so that the
    batcher may retry it in halves."""
    return isinstance(e, (EntryTooLarge, *UNENCODABLE))


@dataclass(frozen=True)
class NodeSettings:
    node_id: str = "n1"
    max_body: int = 8 << 20
    batch_max_ops: int = 512
    batch_max_bytes: int = 1 << 20
    batch_linger: float = 0.001
    max_inflight: int = 4
    max_queue: int = 2048  # commands waiting for group commit (4 full batches); beyond: 503
    propose_timeout: float = 5.0
    proxy_timeout: float = MAX_WAIT_S + 15.0
    retry_after: int = 1
    body_timeout: float | None = None  # seconds for a request body to arrive (None: no bound)
    # Access control (raftq.node.auth): on unless turned off; the bootstrap admin token and
    # the node's internal credential (derived from the cluster secret) are never logged.
    auth: bool = True
    admin_token: str | None = field(default=None, repr=False)
    internal_token: str | None = field(default=None, repr=False)
    auth_observe: bool = False  # /metrics and /openapi.json need a token too
    # What SQS secret access keys are derived from (raftq.node.sqs.credentials; from the
    # cluster secret): None, no SQS request can be verified.
    sqs_key: bytes | None = field(default=None, repr=False)
    # Per-topic and per-group metric series for at most this many topics, those with the
    # largest backlog (None: every topic); cluster totals are always there.
    metrics_topics: int | None = DEFAULT_METRICS_TOPICS
    # TLS (raftq.node.tlsutil): "https" when the API serves TLS; a cluster is all-TLS or
    # all-plain, so other nodes are reached with the same scheme, through ``peer_ssl()`` (the
    # current context: it changes when the certificate is reloaded).
    scheme: str = "http"
    peer_ssl: Callable[[], ssl.SSLContext] | None = field(default=None, repr=False, compare=False)
    # The free-disk reserve (raftq.node.diskguard) of the data directory (None: in memory).
    data_dir: str | None = None
    min_free_disk: Reserve = field(default_factory=lambda: parse_reserve(DEFAULT_MIN_FREE))

    def url(self, api: str) -> str:
        """A node's API URL from its advertised ``host:port``."""
        return f"{self.scheme}://{api}"


class Leader(NamedTuple):
    id: str | None
    api: str  # host:port of its HTTP API


class LeaderLost(Exception):
    """The request was refused because this node is not (or no longer) the leader: it was
    definitely not applied, so it may be sent to the leader."""


# What a Raft outcome means to the caller, by what was asked: a command ("write"), a read
# barrier ("read") or a membership change ("membership"). The one place that decides it.
WRITE, READ, MEMBERSHIP = "write", "read", "membership"


def outcome_error(e: BaseException, kind: str, retry_after: int) -> Exception:
    """The error to raise for a Raft failure ``e`` (``LeaderLost`` or an ``ApiError``)."""
    if isinstance(e, NotLeader):
        return LeaderLost()
    if isinstance(e, EntryTooLarge):
        return ApiError("entry_too_large", f"the request is too large to replicate: {e}")
    if isinstance(e, UNENCODABLE):
        return ApiError("invalid_argument", f"the request holds an unsupported value: {e}")
    if isinstance(e, QueueFull):
        why = (
            "a membership change is in progress; not applied"
            if kind == MEMBERSHIP
            else f"the leader is overloaded ({e}); not applied, retry later"
        )
        return ApiError("overloaded", why, retry_after=retry_after)
    if isinstance(e, ReadNotReady):
        return ApiError(
            "no_leader", "the new leader is not ready to serve reads yet; retry shortly",
            retry_after=retry_after,
        )  # fmt: skip
    if isinstance(e, TimeoutError) and kind == READ:  # (UnknownOutcome is one too)
        return ApiError(
            "no_leader", "could not confirm with a majority that this node still leads; retry",
            retry_after=retry_after,
        )  # fmt: skip
    if isinstance(e, TimeoutError):
        if kind == MEMBERSHIP:
            return ApiError(
                "outcome_unknown",
                "the membership change may or may not have been applied; see GET /cluster",
            )
        return ApiError(
            "outcome_unknown",
            "the command may or may not have been applied (timeout or leader change)",
        )
    if isinstance(e, RaftError) and kind == MEMBERSHIP:
        return ApiError("membership_refused", str(e))
    if isinstance(e, RaftError):  # this node's Raft stopped (a failed disk): not applied here
        return ApiError(
            "shutting_down",
            f"this node's Raft has stopped ({e}); see its log, and use another node",
            retry_after=retry_after,
        )
    raise TypeError(f"not a Raft outcome: {e!r}")


_OUTCOMES = (RaftError, TimeoutError, *UNENCODABLE)


class BrokerService:
    """One node's broker service (see the module docstring). Transports reach the leader's
    address through ``leader_elsewhere`` and give back deliveries held by another node
    through ``release_remote`` (set by the transport that can reach other nodes)."""

    def __init__(self, raft: Raft, settings: NodeSettings) -> None:
        self.raft = raft
        self.settings = settings
        self.metrics = NodeMetrics(raft, settings.metrics_topics)
        self.disk = DiskGuard(settings.data_dir, settings.min_free_disk)
        self.batcher = Batcher(
            raft.propose,
            max_ops=settings.batch_max_ops,
            max_bytes=settings.batch_max_bytes,
            linger=settings.batch_linger,
            max_inflight=settings.max_inflight,
            max_queue=settings.max_queue,
            timeout=settings.propose_timeout,
            on_batch=self.metrics.on_batch,
            splittable=splittable,
        )
        self.draining = asyncio.Event()
        # (leader's API address, consumer, topic patterns) -> give its deliveries back there
        self.release_remote: Callable[[str, str, list[str] | None], Awaitable[None]] | None = None
        self._caught_up = False  # readiness: applied the leader's commit index once since start
        # The ticker's wake-up on the next applied entries (leader only; see _ticker).
        self._apply_signal: asyncio.Future[None] | None = None
        # What the ticker sleeps until (ms: the next due time, at most 1 s ahead); None while
        # it is not asleep on one.
        self._ticker_until: float | None = None
        self._background: set[asyncio.Task[Any]] = set()
        # consumer id -> number of open connections holding it (long polls, streams)
        self.held_consumers: dict[str, int] = {}
        self.stream_consumers: set[str] = set()  # the streams' own (ids unique per stream)
        self._held_topics: dict[str, list[str] | None] = {}  # a held consumer's patterns
        # long polls waiting for something deliverable, per (topic, group)
        self._waiters: dict[tuple[str, str], set[asyncio.Future[None]]] = {}
        self.metrics.gauge(
            "raftq_long_polls_waiting",
            "receive requests waiting for a deliverable message",
            lambda: sum(len(w) for w in self._waiters.values()),
        )
        self.metrics.gauge(
            "raftq_consumers_held",
            "consumer ids held by open connections (long polls, streams)",
            lambda: len(self.held_consumers),
        )
        self.metrics.gauge(
            "raftq_ready", "1 when /readyz answers 200", lambda: self.readiness()["ready"]
        )
        if settings.data_dir is not None:
            self.metrics.gauge(
                "raftq_disk_free_bytes",
                "free bytes on this node's data disk (publishes stop below the reserve)",
                lambda: self._disk_figure("free_bytes"),
            )
            self.metrics.gauge(
                "raftq_disk_min_free_bytes",
                "this node's free-disk reserve (--min-free-disk)",
                lambda: self._disk_figure("min_free_bytes"),
            )

    def _disk_figure(self, key: str) -> float:
        st = self.disk.status()
        return float("nan") if st is None else float(st[key])

    # ------------------------------------------------------------------ leadership

    def leads(self) -> bool:
        return self.raft.is_leader()

    def leader_elsewhere(self) -> Leader:
        """The leader, when another node leads: the one rule every transport follows to reach
        it (forward, redirect); ``ApiError`` no_leader when none is known."""
        st = self.raft.status()
        if getattr(st, "removed", False):
            raise ApiError(
                "removed_from_cluster",
                f"node {st.node_id} was removed from the cluster: use another node",
            )
        if getattr(st, "error", None) is not None:  # stopped on a failure: not an election
            raise ApiError(
                "shutting_down",
                f"this node's Raft has stopped ({st.error}); see its log, and use another node",
                retry_after=self.settings.retry_after,
            )
        if not st.leader_api or st.leader_id == st.node_id:
            raise ApiError(
                "no_leader",
                "no leader is known right now; retry shortly",
                retry_after=self.settings.retry_after,
            )
        return Leader(st.leader_id, st.leader_api)

    # ------------------------------------------------------------------ commands and reads

    async def call(
        self, command: dict[str, Any], size: int = 0, bounded: bool = True
    ) -> dict[str, Any]:
        """Propose one command through group commit; return its result or raise ApiError
        (or LeaderLost: not applied, another node leads). ``bounded``: refused (503
        overloaded) when the group-commit queue is full; the node's own ticks and releases are
        not. A publish is refused first (507 storage_full, nothing proposed) while this node's
        data disk is below its free-disk reserve."""
        if command.get("op") == "publish":
            self.disk.check(self.settings.node_id)
        try:
            result = await self.batcher.submit(command, size, bounded)
        except _OUTCOMES as e:
            raise outcome_error(e, WRITE, self.settings.retry_after) from None
        err = result.get("error")
        if err is not None:
            raise ApiError.from_wire(err)
        return result

    def read(self, fn: Callable[[Broker], Any]) -> Any:
        """A read of this replica's state (not linearizable: see ``read_latest``)."""
        try:
            return self.raft.read(fn)
        except BrokerError as e:
            raise ApiError.from_wire(e.to_wire()) from None
        except RaftError as e:  # (a payload the store could not read stopped this node)
            raise outcome_error(e, READ, self.settings.retry_after) from None

    async def read_latest(self, fn: Callable[[Broker], Any]) -> Any:
        """``read`` that sees every write acknowledged before the request (linearizable): the
        leader first confirms, with a majority, that it still leads (``read_barrier``). A
        leader cut off from the others no longer answers from stale state."""
        deadline = time.monotonic() + self.settings.propose_timeout
        while True:
            try:
                await self.raft.read_barrier(max(0.0, deadline - time.monotonic()))
                break
            except ReadNotReady as e:  # just elected: its first entry commits within a heartbeat
                if time.monotonic() + READ_RETRY_S < deadline:
                    await asyncio.sleep(READ_RETRY_S)
                    continue
                raise outcome_error(e, READ, self.settings.retry_after) from None
            except _OUTCOMES as e:
                raise outcome_error(e, READ, self.settings.retry_after) from None
        return self.read(fn)

    async def membership(self, change: Awaitable[None]) -> None:
        """Await a membership change of the Raft binding, its failure mapped as the rest."""
        try:
            await change
        except _OUTCOMES as e:
            raise outcome_error(e, MEMBERSHIP, self.settings.retry_after) from None

    def spawn(self, coro: Awaitable[Any]) -> None:
        """Run background work (releases) that must outlive the request that started it."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ------------------------------------------------------------------ consumers

    @contextlib.contextmanager
    def hold_consumer(
        self, consumer: str, stream: bool = False, topics: list[str] | None = None
    ) -> Iterator[None]:
        """Mark a consumer id as owned by an open connection; at shutdown, whatever is still
        held is released (on ``topics`` patterns, if given: what the holder may consume), so
        its deliveries go back at once instead of timing out."""
        self.held_consumers[consumer] = self.held_consumers.get(consumer, 0) + 1
        self._held_topics[consumer] = topics
        if stream:
            self.stream_consumers.add(consumer)
        try:
            yield
        finally:
            n = self.held_consumers[consumer] - 1
            if n:
                self.held_consumers[consumer] = n
            else:
                del self.held_consumers[consumer]
                self._held_topics.pop(consumer, None)
            if stream:
                self.stream_consumers.discard(consumer)

    @contextlib.contextmanager
    def handing_out(self, consumer: str, topics: list[str] | None = None) -> Iterator[None]:
        """Hold ``consumer`` while its deliveries are handed to a client: if the client may
        not get them (it went away, or the receive's outcome is unknown), release them now
        (those on ``topics`` patterns, if given), so they are redelivered at once instead of
        after their visibility timeout."""
        with self.hold_consumer(consumer, topics=topics):
            try:
                yield
            except (asyncio.CancelledError, ConnectionError):
                self.spawn(self.release(consumer, topics))
                raise
            except ApiError as e:
                if e.code == "outcome_unknown":  # it may have handed out deliveries: undo
                    self.spawn(self.release(consumer, topics))
                raise

    async def release(self, consumer: str, topics: list[str] | None = None) -> None:
        """Give back a consumer's deliveries now (here, or at the leader if it moved); with
        ``topics``, only those on topics matching one of the patterns."""
        cmd: dict[str, Any] = {"op": "release", "consumer": consumer}
        if topics is not None:
            cmd["topics"] = topics
        try:
            await self.call(cmd, bounded=False)
        except LeaderLost:
            try:
                leader = self.leader_elsewhere()
            except ApiError:
                log.warning("release of consumer %s failed: no leader", consumer)
                return
            if self.release_remote is not None:
                await self.release_remote(leader.api, consumer, topics)
        except ApiError as e:
            log.warning("release of consumer %s failed: %s", consumer, e)

    def release_streams(self) -> None:
        """Give back what the open streams' consumers hold (shutdown, before cancelling the
        streams: a cancelled handler's own cleanup may itself be cut short). Not long polls'
        consumers: a release applied before their receive would leave what it delivers held."""
        for consumer in list(self.stream_consumers):
            self.spawn(self.release(consumer))

    # ------------------------------------------------------------------ long polls

    async def long_poll(
        self, cmd: dict[str, Any], wait: float, check: Callable[[], None] = lambda: None
    ) -> list[dict[str, Any]]:
        """Propose ``cmd`` (a receive); while it comes back empty, wait for applied entries
        that may have made the group deliverable, up to ``wait`` seconds. ``check()`` runs
        before each proposal (the caller's right to receive, which may be revoked meanwhile:
        it raises to stop)."""
        topic, group = cmd["topic"], cmd["group"]
        deadline = asyncio.get_running_loop().time() + wait
        while True:
            check()
            res = await self.call({**cmd, "token": secrets.token_bytes(16)})
            deliveries: list[dict[str, Any]] = res["deliveries"]
            if deliveries or self.draining.is_set():
                return deliveries
            if not await self.wait_deliverable(topic, group, deadline):
                return deliveries

    async def wait_deliverable(self, topic: str, group: str, deadline: float) -> bool:
        """Wait until the group may have something to deliver; False when time is up (loop
        time) or the node drains.

        Waiters register per (topic, group); after each applied entry one read checks every
        group somebody waits on and wakes only those waiters (``_check_waiters``)."""
        loop = asyncio.get_running_loop()
        key = (topic, group)
        while not self.draining.is_set():
            # Registered before the read: an entry applied after the read then wakes it.
            fut: asyncio.Future[None] = loop.create_future()
            self._waiters.setdefault(key, set()).add(fut)
            try:
                if self.raft.read(lambda b: b.may_deliver(topic, group)):
                    return True
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return False
                await asyncio.wait_for(fut, remaining)
            except TimeoutError:
                return False
            finally:
                waiting = self._waiters.get(key)
                if waiting is not None:
                    waiting.discard(fut)
                    if not waiting:
                        del self._waiters[key]
        return False

    def _check_waiters(self) -> None:
        if not self._waiters:
            return
        keys = list(self._waiters)
        ready = self.raft.read(lambda b: [k for k in keys if b.may_deliver(*k)])
        for key in ready:
            for fut in self._waiters.pop(key, ()):
                if not fut.done():
                    fut.set_result(None)

    def _wake_all_waiters(self) -> None:
        for futs in self._waiters.values():
            for fut in futs:
                if not fut.done():
                    fut.set_result(None)

    # ------------------------------------------------------------------ applied entries

    def _wants_apply(self) -> bool:
        """Asked on the Raft thread after entries were applied: wake the loop only if somebody
        waits (a follower's loop then sleeps through replication), and the leader's ticker
        only if something now falls due before it wakes anyway (a plain publish moves nothing
        earlier: its wake-up per entry cost ~35 us on the way to the response)."""
        if self._waiters:
            return True
        if self._apply_signal is None:
            return False
        until = self._ticker_until
        if until is None:
            return True
        due = self.raft.read(lambda b: b.next_due())
        return due is not None and due < until

    def _on_apply(self) -> None:
        """On the loop, after a Raft tick that applied entries (if ``_wants_apply``)."""
        signal, self._apply_signal = self._apply_signal, None
        if signal is not None and not signal.done():
            signal.set_result(None)
        if self._waiters:
            self._check_waiters()

    def _arm_apply_signal(self) -> asyncio.Future[None]:
        """Arm before reading the state the wait depends on (see ``add_apply_listener``)."""
        signal = self._apply_signal
        if signal is None or signal.done():
            signal = self._apply_signal = asyncio.get_running_loop().create_future()
        return signal

    async def _ticker(self) -> None:
        """Leader only: propose a ``tick`` when the earliest deadline / delay / retention is due.
        Re-armed after every tick that applied entries, so there is no fixed-rate scan; a
        follower looks every ``FOLLOWER_TICKER_S`` whether it leads now."""
        last_ticked: int | None = None
        compaction_checked = 0.0
        while True:
            try:
                self._ticker_until = None  # first: an apply from here on wakes us
                if not self.raft.is_leader():
                    self._apply_signal = None
                    await asyncio.sleep(FOLLOWER_TICKER_S)
                    continue
                signal = self._arm_apply_signal()
                if time.monotonic() - compaction_checked >= COMPACTION_CHECK_S:
                    # Mostly-dead store segments: one compaction per entry, like a tick.
                    compaction_checked = time.monotonic()
                    cmds = self.raft.read(lambda b: b.compaction_candidates())
                    if cmds:
                        await self.call(cmds[0], bounded=False)
                        continue
                due = self.raft.read(lambda b: b.next_due())
                now = time.time() * 1000
                if due is not None and due <= now:
                    if due == last_ticked:  # a tick did not move it: never spin on that
                        await asyncio.sleep(0.05)
                    last_ticked = due
                    await self.call({"op": "tick"}, bounded=False)
                    continue
                wait = 1.0 if due is None else min(1.0, (due - now) / 1000 + 0.001)
                self._ticker_until = now + 1000 if due is None else min(due, now + 1000)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await signal  # cancelled by the timeout: the next turn arms anew
            except asyncio.CancelledError:
                raise
            except Exception as e:  # never let the timer die; try again shortly
                log.debug("tick failed: %r", e)
                await asyncio.sleep(0.05)

    # ------------------------------------------------------------------ health

    def readiness(self) -> dict[str, Any]:
        """``ready``: a leader is known, this node applied what the leader had committed
        (once since start), it is not draining and it was not removed from the cluster; never
        once its Raft stopped on a failure (``raft_error``: it will not replicate again in this
        process)."""
        st = self.raft.status()
        if st.error is not None:
            return {
                "ready": False,
                "leader": None,
                "caught_up": False,
                "draining": self.draining.is_set(),
                "raft_error": st.error,
            }
        if not self._caught_up and st.leader_id:
            # Once since start: applied what the leader had committed (a restarted follower's
            # own commit index is capped at its log, so it cannot tell on its own). Not checked
            # again after that: a follower always trails a busy leader by an entry or two.
            target = st.commit_index if st.leader_commit is None else st.leader_commit
            self._caught_up = st.applied_index >= target
        draining = self.draining.is_set()
        removed = bool(getattr(st, "removed", False))
        out = {
            "ready": bool(st.leader_id) and self._caught_up and not draining and not removed,
            "leader": st.leader_id,
            "caught_up": self._caught_up,
            "draining": draining,
            "removed": removed,
        }
        disk = self.disk.status()
        if disk is not None:  # (low on disk: still ready, so consumers keep draining here)
            out["disk"] = disk
        return out

    # ------------------------------------------------------------------ lifecycle

    async def lifecycle(self, app: Any = None) -> AsyncIterator[None]:
        """Runs for as long as the node serves (an aiohttp ``cleanup_ctx``): group commit and
        the ticker; at the end, release what open connections still hold and drain."""
        self.raft.add_apply_listener(self._on_apply, self._wants_apply)
        self.batcher.start()
        ticker = asyncio.ensure_future(self._ticker())
        yield
        self.draining.set()
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
        for consumer in list(self.held_consumers):
            self.spawn(self.release(consumer, self._held_topics.get(consumer)))
        # Releases and group commit share one bound (server.DRAIN_S).
        drain_end = time.monotonic() + self.settings.propose_timeout + 1
        if self._background:
            await asyncio.wait(set(self._background), timeout=self.settings.propose_timeout + 1)
        await self.batcher.stop(max(0.0, drain_end - time.monotonic()))

    def drain(self) -> None:
        """Shutdown has begun (before in-flight requests finish): long polls answer now."""
        self.draining.set()
        self._wake_all_waiters()
