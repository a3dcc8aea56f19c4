"""Who runs pysyncobj, and when: the tick thread, a leader's ticks on its event loop, and the one
epoll set (``_Wait``) both wait on, all under one lock; and the flush after every tick."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import select
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from raftq.cluster.raft._seam import LEADER, Notifier
from raftq.cluster.raft._tuning import CATCH_UP_ENTRIES, LOOP_WATCHDOG, TICK
from raftq.cluster.storage import StorageError

if TYPE_CHECKING:
    from raftq.cluster.raft._node import RaftNode

log = logging.getLogger("raftq.cluster.raft")  # one logger for the whole package


class Ticks:
    """pysyncobj code runs only under ``lock``. The tick thread holds it except while it waits
    for events; a leader's ticks run on its home loop (the event loop that started the node,
    LOOP_TICKS) while ``on_home`` is set, and the tick thread then only watches (and ticks if
    the loop has not for LOOP_WATCHDOG)."""

    def __init__(self, node: RaftNode, loop_ticks: bool, cool_bytes: int) -> None:
        self._node = node
        self._cool_bytes = cool_bytes
        self._raft = node._raft
        self._stats = node.stats
        self.lock = threading.Lock()  # pysyncobj's state; the tick thread's but in its waits
        self.ticking = False  # the tick thread holds the lock (its waits may release it)
        self.ident = 0  # the tick thread's id
        self.thread: threading.Thread | None = None
        self.closed = False  # pysyncobj destroyed (set under the lock)
        self.calls: deque[Callable[[], None]] = deque()  # for the next tick (any thread)
        self.wait: _Wait | None = None
        self.notifier: Notifier | None = None
        self.loop_ticks = loop_ticks
        self.home: asyncio.AbstractEventLoop | None = None
        self.home_ident = 0
        self.on_home = False  # (under the lock)
        # (loop, epoll fd) while that loop watches the wait (set and cleared on that loop only)
        self._attached: tuple[asyncio.AbstractEventLoop, int] | None = None
        self._home_timer: asyncio.TimerHandle | None = None
        self._home_ticked_at = 0.0
        self.unpark = threading.Event()

    # ------------------------------------------------------------------ set-up, wake-ups

    def install(self) -> None:
        """At start: our epoll set inside pysyncobj's poller, and the pipe that wakes it."""
        self.wait = _Wait(self)
        self._raft.install_poll(self.wait)
        self.notifier = self._raft.notifier()

    def start(self, name: str) -> None:
        if self.loop_ticks:
            with contextlib.suppress(RuntimeError):  # no running loop: the tick thread only
                self.home = asyncio.get_running_loop()
                self.home_ident = threading.get_ident()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def wake(self) -> None:
        """The next tick now (any thread)."""
        home = self.home
        if self.on_home and home is not None and threading.get_ident() == self.home_ident:
            home.call_soon(self.loop_tick)  # the ticking loop itself: no pipe needed
            return
        n = self.notifier
        if n is not None:
            with contextlib.suppress(OSError):  # pipe full: a wake-up is already pending
                n.notify()

    def close_notifier(self) -> None:
        n, self.notifier = self.notifier, None
        if n is not None:
            n.close()
        wait, attached = self.wait, self._attached
        if wait is None:
            return
        if attached is None:
            self.wait = None
            wait.close()
        elif threading.get_ident() == self.home_ident:
            self._detach_home(close=True)
        else:  # the loop still watches it: it lets go first
            try:
                attached[0].call_soon_threadsafe(self._detach_home, True)
            except RuntimeError:  # closed: nobody watches any more
                self.wait = None
                wait.close()

    # ------------------------------------------------------------------ the tick thread

    def _run(self) -> None:
        node, stats = self._node, self._stats
        last = time.monotonic()
        self.ident = threading.get_ident()
        # Held from one tick to the next: only the poll wait releases it, so an entry appended
        # by another thread is always synced (after_tick) before a tick counts it (found by
        # review: a single node committed such an entry unsynced when the lock was free between
        # ticks).
        with self.lock:
            self.ticking = True
            try:
                while not node._stopping and node._fatal is None:
                    if self.on_home:
                        self._watch_home()
                        last = time.monotonic()
                        continue
                    self.tick()
                    now = time.monotonic()
                    # Longest tick (poll wait included): heartbeats stop while it runs.
                    stats["max_tick_ms"] = max(stats["max_tick_ms"], int((now - last) * 1000))
                    last = now
                    if (
                        self.home is not None
                        and self._raft.state == LEADER
                        and not self._catching_up()
                    ):
                        self._go_home()
            finally:
                self.ticking = False
            if self.on_home:
                self._leave_home()  # (the loop lets go of the sockets before they close)
            self.closed = True
            try:
                if node._fatal is None:
                    self.after_tick()
            except Exception:
                log.exception("final flush failed")
            try:
                self._raft.destroy()
            except Exception:
                log.exception("closing raft failed")
            node._unlock_dir()
        node._fail_all()

    def tick(self, block: bool = True) -> float:
        """One pysyncobj tick and our flush after it; returns how long the next may wait."""
        node = self._node
        wait = TICK
        journal = node._journal
        try:
            if journal is not None and journal.dirty:
                # Appended since the last sync (a proposal from another thread while the loop
                # ticks): this tick may count the leader's own entries toward commit.
                node._sync(journal)
            if node._replication.quorum and node._proposals.pending:
                wait = node._replication.rescue()
            if node._peers.hello_due:
                node._peers.greet()
            if node._pre_vote.enabled:
                node._pre_vote.hold()
            self._raft.tick(wait if block else 0.0)
        except StorageError as e:
            node._fail(e)
            return wait
        except Exception as e:  # pysyncobj's state is unknown now: stop, as on a storage error
            node._crash("the raft tick", e)
            return wait
        try:
            self.after_tick()
        except StorageError as e:
            node._fail(e)
        except Exception as e:
            node._crash("the flush after a raft tick", e)
        return wait

    def drain(self) -> None:
        """In each tick (``Hooks.drain``): calls for the tick thread, read barriers started,
        proposals appended."""
        node = self._node
        calls = self.calls
        while calls:
            calls.popleft()()
        if node._reads.queue:
            node._reads.start()
        node._proposals.append_queued(sync=True)

    def after_tick(self) -> None:
        """The flush after each tick: appends sent, the journal synced (then the commit mark),
        the follower's held acks sent, read barriers and completions settled."""
        node = self._node
        journal = node._journal
        assert journal is not None
        replication = node._replication
        try:
            if replication.send_pending:
                replication.flush_send_pending()
        finally:
            if journal.dirty:
                node._sync(journal)
        node._marks.keep(self._raft, journal, self.closed)
        if journal.uncooled > self._cool_bytes:
            journal.cool(self._cool_bound())
            self._stats["journal_cooled_bytes"] = journal.cooled_bytes
        self._stats["journal_read_backs"] = journal.read_backs
        self._raft.bound_reads()
        if journal._broken is not None:  # (pysyncobj swallows a failed snapshot install)
            node._fail(journal._broken)
        if replication.acks:
            replication.flush_acks()
        if node._reads.waiting:
            node._reads.check()
        node._proposals.deliver_all()
        if not self.closed:
            node._changes.check()

    def _cool_bound(self) -> int:
        """The journal's entries before this index are needed by no one in the normal course:
        applied here and, on a leader, held by every connected member (one that reconnects, or
        a new leader's lagging follower, gets them read back)."""
        raft = self._raft
        bound = raft.last_applied
        if raft.state == LEADER:
            connected = raft.connected_nodes
            for n, matched in raft.match_index.items():
                if n in connected:
                    bound = min(bound, matched)
        return bound

    # ------------------------------------------------------------------ a leader's loop ticks

    def _go_home(self) -> None:
        """Tick thread, now leader: hand the ticks to the event loop (see LOOP_TICKS)."""
        home = self.home
        assert home is not None
        self.on_home = True
        self._home_ticked_at = time.monotonic()
        try:
            home.call_soon_threadsafe(self.loop_tick)
        except RuntimeError:  # the loop is closed: keep ticking here
            self.on_home = False
            self.home = None

    def _watch_home(self) -> None:
        """Tick thread while the loop ticks: wait, and tick for the loop if it has not for
        LOOP_WATCHDOG (it is busy elsewhere) so that heartbeats still go out."""
        node = self._node
        self.lock.release()
        try:
            # (Looks without the lock: taking it would make the loop's next tick wait.)
            while not self.unpark.wait(LOOP_WATCHDOG):
                home = self.home
                if (
                    not self.on_home
                    or node._stopping
                    or node._fatal is not None
                    or home is None
                    or not home.is_running()
                    or time.monotonic() - self._home_ticked_at >= LOOP_WATCHDOG
                ):
                    break
        finally:
            self.lock.acquire()
        self.unpark.clear()
        if not self.on_home or node._stopping or node._fatal is not None:
            return
        home = self.home
        if home is None or not home.is_running():
            self._leave_home()
            self.home = None  # that loop ended (the node outlived it): tick here from now on
            return
        if time.monotonic() - self._home_ticked_at >= LOOP_WATCHDOG:
            self._stats["watchdog_ticks"] += 1
            self.tick(block=False)
            if self._raft.state != LEADER or node._fatal is not None or self._catching_up():
                self._leave_home()

    def _catching_up(self) -> bool:
        """A connected follower lags by more than CATCH_UP_ENTRIES or needs the snapshot: its
        sends (8 MB batches, snapshot chunks) belong on the tick thread, not the API's loop."""
        raft, journal = self._raft, self._node._journal
        if journal is None:
            return False
        behind = max(journal[0][1], journal[-1][1] - CATCH_UP_ENTRIES)
        nxt, connected = raft.next_index, raft.connected_nodes
        if any(n in connected and nxt.get(n, 0) <= behind for n in raft.other_nodes):
            if self.on_home:
                self._stats["catch_up_handbacks"] += 1
            return True
        return False

    def _leave_home(self) -> None:
        """Under the lock: the tick thread ticks again; the loop stops watching."""
        self.on_home = False
        self.unpark.set()
        attached = self._attached
        if attached is None:
            return
        if threading.get_ident() == self.home_ident:
            self._detach_home()
        else:
            with contextlib.suppress(RuntimeError):  # closed: it watches nothing any more
                attached[0].call_soon_threadsafe(self._detach_home)

    def _detach_home(self, close: bool = False) -> None:
        """Loop thread: stop watching Raft's sockets (whoever decided to); ``close``: and
        close their epoll set (the node stopped)."""
        if self._home_timer is not None:
            self._home_timer.cancel()
            self._home_timer = None
        attached, self._attached = self._attached, None
        if attached is not None:
            with contextlib.suppress(Exception):
                attached[0].remove_reader(attached[1])
        wait = self.wait
        if close and wait is not None:
            self.wait = None
            wait.close()

    def loop_tick(self) -> None:
        """Event loop thread, leader: handle Raft's socket events and run a tick, as the tick
        thread would. Called when any Raft socket has an event, by a timer (heartbeats,
        elections, rescues) and once on taking over."""
        home = self.home
        if not self.on_home or home is None:
            self._detach_home()
            return
        if not self.lock.acquire(blocking=False):
            # The tick thread is ticking for a busy loop (LOOP_WATCHDOG): never block the loop
            # on it; stop watching the sockets (they would report the same events again and
            # again) and look again shortly.
            self._detach_home()
            self._home_timer = home.call_later(0.001, self._on_home_timer)
            return
        try:
            nxt = self._loop_tick_locked(home)
        finally:
            self.lock.release()
        if nxt is None:
            return
        timer = self._home_timer
        due = home.time() + nxt
        if timer is None or timer.when() > due + 0.001:
            if timer is not None:
                timer.cancel()
            self._home_timer = home.call_at(due, self._on_home_timer)

    def _loop_tick_locked(self, home: asyncio.AbstractEventLoop) -> float | None:
        """``loop_tick`` under the lock: how long until the next tick is due, or None once the
        tick thread takes over again."""
        node = self._node
        wait = self.wait
        if not self.on_home or wait is None:
            self._detach_home()
            return None
        if node._stopping or node._fatal is not None:
            self._leave_home()  # the tick thread ends the node (as it would have ticked)
            return None
        if self._attached is None:
            fd = wait.fileno()
            home.add_reader(fd, self.loop_tick)
            self._attached = (home, fd)
        stats = self._stats
        stats["max_tick_ms"] = max(
            stats["max_tick_ms"], int((time.monotonic() - self._home_ticked_at) * 1000)
        )
        stats["loop_ticks"] += 1
        try:
            self._raft.poll(0)  # acks first: this tick commits what they confirm
        except StorageError as e:  # (a vote for a newer term not stored: stop, as in a tick)
            node._fail(e)
        except Exception as e:  # as in a tick
            node._crash("the raft poll", e)
        nxt = TICK if node._fatal is not None else self.tick(block=False)
        wait.rearm()  # what is still unread wakes the loop again at once
        self._home_ticked_at = time.monotonic()
        if (
            node._stopping
            or node._fatal is not None
            or self._raft.state != LEADER
            or self._catching_up()
        ):
            self._leave_home()
            return None
        return nxt

    def _on_home_timer(self) -> None:
        self._home_timer = None
        self.loop_tick()


class _Wait:
    """Stands in for the ``select.poll`` object inside pysyncobj's ``PollPoller``.

    An epoll set, so the event loop can watch all of Raft's sockets through one descriptor
    (``fileno``) while it runs the leader's ticks (see ``Ticks.loop_tick``). Registrations
    are one-shot, re-armed after their events were handled (``rearm``, or the next ``poll``):
    pysyncobj closes a socket before it unsubscribes it, and while a forked snapshot writer
    holds a copy the epoll set keeps that registration. Disarmed, it can never report again
    (armed, it would wake the loop forever, or under a reused fd number disconnect the new
    socket). Still level-triggered: unread data is reported again once re-armed.

    On the tick thread it releases the tick lock while blocked waiting, never while events are
    handled, so another thread holding the lock never runs alongside pysyncobj code."""

    def __init__(self, ticks: Ticks) -> None:
        self._ticks = ticks
        self._ep = select.epoll()
        self._masks: dict[int, int] = {}
        self._fired: set[int] = set()  # reported, not re-armed yet

    def fileno(self) -> int:
        return self._ep.fileno()

    def close(self) -> None:
        self._ep.close()

    def register(self, fd: int, mask: int) -> None:
        # poll and epoll share the event bits on Linux (IN 1, OUT 4, ERR 8, HUP 16).
        mask |= select.EPOLLONESHOT
        try:
            if fd in self._masks:
                self._ep.modify(fd, mask)
            else:
                self._ep.register(fd, mask)
        except FileNotFoundError:  # the fd number now names another file
            self._ep.register(fd, mask)
        except FileExistsError:
            self._ep.modify(fd, mask)
        self._masks[fd] = mask
        self._fired.discard(fd)

    def unregister(self, fd: int) -> None:
        self._fired.discard(fd)
        if self._masks.pop(fd, None) is None:
            raise KeyError(fd)  # as select.poll (pysyncobj expects it)
        with contextlib.suppress(OSError):  # already closed: gone, or disarmed for good
            self._ep.unregister(fd)

    def rearm(self) -> None:
        """Re-arm what was reported and is still registered (closed sockets are not)."""
        fired, self._fired = self._fired, set()
        for fd in fired:
            mask = self._masks.get(fd)
            if mask is not None:
                with contextlib.suppress(OSError):
                    self._ep.modify(fd, mask)

    def poll(self, timeout_ms: float | None = None) -> list[tuple[int, int]]:
        ticks = self._ticks
        self.rearm()
        timeout = -1.0 if timeout_ms is None or timeout_ms < 0 else timeout_ms / 1000
        if timeout == 0 or not ticks.ticking or threading.get_ident() != ticks.ident:
            events = self._ep.poll(timeout)  # no wait, the loop's ticks, pysyncobj's teardown
        else:
            ticks.lock.release()
            try:
                events = self._ep.poll(timeout)
            finally:
                ticks.lock.acquire()
        ready = []
        for fd, ev in events:
            if fd in self._masks:  # (else: a closed socket's last event, see above)
                self._fired.add(fd)
                ready.append((fd, ev))
        return ready
