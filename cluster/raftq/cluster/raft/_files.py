"""The node's files beyond the journal itself: the data directory's lock, the journal's head cut
to the snapshot at start, and the commit mark (applied at start, kept within a second after)."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time

from raftq.cluster.journal import Entry, Journal
from raftq.cluster.raft._seam import Raft
from raftq.cluster.raft._tuning import COMMIT_MARK_EVERY
from raftq.cluster.raft._types import RaftError
from raftq.cluster.storage import CommitMark

log = logging.getLogger("raftq.cluster.raft")  # one logger for the whole package


class CommitMarks:
    """The ``CommitMark`` (``commit.bin``; none without a data directory): a hint, without
    fsync, that lets a restarted node apply its journal before it hears from a leader."""

    def __init__(self, node_id: str) -> None:
        self._node_id = node_id
        self.mark: CommitMark | None = None
        self._marked_at = 0.0

    def apply(self, raft: Raft, journal: Journal) -> None:
        """At start, before the election clock runs: apply the journal up to the commit mark,
        if the journal still holds that entry with the same term."""
        mark = self.mark
        done = max(raft.commit_index, raft.last_applied)
        if mark is None or mark.index <= done:
            return  # (a mark older than the snapshot: nothing to replay)
        if journal.term_at(mark.index) != mark.term:
            log.warning(
                "raft %s: commit mark %d (term %d) not in the journal: ignored",
                self._node_id,
                mark.index,
                mark.term,
            )
            return
        t0 = time.monotonic()
        first = raft.last_applied
        raft.commit_index = mark.index
        raft.apply_committed()
        log.info(
            "raft %s: applied entries %d-%d (committed before the restart) in %.2f s",
            self._node_id,
            first + 1,
            mark.index,
            time.monotonic() - t0,
        )

    def keep(self, raft: Raft, journal: Journal, now: bool) -> None:
        """After each tick's journal sync: keep the mark within COMMIT_MARK_EVERY (``now``: at
        once, the node is stopping)."""
        mark = self.mark
        if mark is None:
            return
        idx = raft.commit_index
        t = time.monotonic()
        if idx <= mark.index or (not now and t - self._marked_at < COMMIT_MARK_EVERY):
            return
        term = journal.term_at(idx)
        if term is None:
            return
        self._marked_at = t
        try:
            mark.store(idx, term)
        except OSError as e:  # a hint only: the next write may succeed
            log.warning("raft %s: commit mark not written: %s", self._node_id, e)


def align_journal(journal: Journal, prev: Entry, last: Entry) -> None:
    """pysyncobj keeps the journal at startup only if it begins exactly with the snapshot's last
    two entries, and otherwise throws ALL of it away, entries after the snapshot included. A
    crash between writing a snapshot and compacting the journal leaves a longer head, and the
    node lost acknowledged entries (found by the power-loss test). Cut the head to the snapshot
    instead; keep everything after it."""
    pos = prev[1] - journal[0][1]
    if pos > 0 and pos + 1 < len(journal) and journal[pos] == prev and journal[pos + 1] == last:
        journal.deleteEntriesTo(pos)


# Every data-directory lock this process holds. A forked snapshot writer inherits them all (the
# flock is shared by every copy of the descriptor), so it closes its copies at once
# (``drop_inherited_locks``): otherwise a node of this process stopped while another node's
# writer runs could not be restarted on its directory until that writer ended.
_HELD: set[int] = set()


def drop_inherited_locks() -> None:
    """In a forked child: close this process's copies of the data-directory locks."""
    for fd in _HELD:
        with contextlib.suppress(OSError):
            os.close(fd)


def unlock_data_dir(fd: int) -> None:
    _HELD.discard(fd)
    os.close(fd)


def lock_data_dir(path: str) -> int:
    """Hold ``path/LOCK`` (flock) for as long as the node runs, or refuse to start."""
    fd = os.open(os.path.join(path, "LOCK"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise RaftError(
            f"data directory {path} is in use by another raftq node (its LOCK file is held);"
            " not starting"
        ) from None
    _HELD.add(fd)
    return fd
