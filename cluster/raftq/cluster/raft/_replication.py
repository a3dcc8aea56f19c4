"""Replication as raftq changes it: every message pysyncobj sends passes ``send``; new entries go
at once to a quorum (rescued to everyone when slow); followers' acks wait for the journal sync;
the leader's next index never rewinds on a stale ack; a re-sent append never truncates."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from raftq.cluster.raft._proposals import _LOGGED
from raftq.cluster.raft._seam import LEADER, Node, monotonic
from raftq.cluster.raft._tuning import RESCUE_AFTER, RESCUE_MAX, TICK

if TYPE_CHECKING:
    from raftq.cluster.raft._node import RaftNode

log = logging.getLogger("raftq.cluster.raft")  # one logger for the whole package


class Replication:
    """Sends, acks and the quorum; under the tick lock (``send`` is pysyncobj's transport send)."""

    def __init__(self, node: RaftNode, fix_stale_acks: bool, quorum_sends: bool) -> None:
        self._node = node
        self._raft = node._raft
        self._stats = node.stats
        self.send_now = node._raft.send_now  # (tests wrap it)
        self.fix_acks = fix_stale_acks
        self.quorum_sends = quorum_sends
        self.quorum: list[Node] = []  # followers sent new entries at once (see send_new)
        self.race: tuple[int, int, list[Node]] | None = None  # (index, term, first acks)
        self.commit_s = 0.0  # moving average: our entries' append -> apply (quorum sends)
        self.quorum_sending = False  # send_new is sending to the quorum (tags the appends)
        self.send_pending = False  # appended off the tick thread, to be sent by it
        self.acks: list[tuple[Node, Any]] = []  # a follower's, held until the journal sync
        self.ack_next: dict[Node, int] = {}  # the verified next index for a duplicate append

    # ------------------------------------------------------------------ sends

    def send(self, node: Node, message: Any) -> bool:
        """Every message pysyncobj (and raftq) sends."""
        if (
            self.quorum_sends
            and isinstance(message, dict)
            and message.get("type") == "append_entries"
        ):
            # Tells a follower whether it is in the quorum: its fast election timeout depends
            # on it (pysyncobj ignores the key; without it a follower takes the full range).
            message["quorum"] = self.quorum_sending
        if isinstance(message, dict) and message.get("type") == "next_node_idx":
            nxt = self.ack_next.pop(node, None)
            if nxt is not None and message.get("success"):
                message = {**message, "next_node_idx": nxt}
            # A follower's ack waits for the end of the tick: the journal is synced first.
            self.acks.append((node, message))
            return True
        return self.send_now(node, message)

    def flush_acks(self) -> None:
        """After the tick's journal sync: the acks it held back."""
        acks, self.acks = self.acks, []
        # A node that failed (a snapshot it could not install, a journal it could not
        # write) acks nothing: the ack would claim entries it does not hold.
        if self._node._fatal is None:
            for node, msg in acks:
                self.send_now(node, msg)

    def flush_send_pending(self) -> None:
        """Entries appended by another thread that ``send_new`` could not send."""
        self.send_pending = False
        raft = self._raft
        if raft.state == LEADER:
            raft.send_append_entries()

    def send_new(self, first_new: int) -> bool:
        """Send entries from ``first_new`` on to followers that have everything before them
        (no catch-up: that may be large and is the tick thread's job). With quorum sends, only
        to as many as a majority needs, kept from one entry to the next; the heartbeat carries
        them to the rest. A follower whose connection is backed up is not ready: the send
        would pass over it (``Raft.backed_up``; pysyncobj moves its next index when it queues,
        so it may look current) and the commit would wait for a rescue. False when too few
        such followers are connected: the caller sends to everyone instead."""
        raft = self._raft
        others = raft.other_nodes
        nxt = raft.next_index
        connected = raft.connected_nodes
        full = raft.backed_up()
        ready = [
            n for n in others if n in connected and n not in full and nxt.get(n, 0) >= first_new
        ]
        if not self.quorum_sends or len(others) < 2:
            if len(ready) < len([n for n in others if n not in full]):
                return False  # (a backed-up one is passed over by the send anyway)
            raft.send_append_entries()
            return True
        need = (len(others) + 1) // 2
        chosen = [n for n in self.quorum if n in ready]
        if len(chosen) < need:
            chosen += sorted((n for n in ready if n not in chosen), key=lambda n: n.id)
            chosen = chosen[:need]
            if len(chosen) < need:
                self.quorum = []
                return False
        self.quorum = chosen
        self.quorum_sending = True
        try:
            raft.send_append_entries_to(set(chosen))
        finally:
            self.quorum_sending = False
        return True

    def rescue(self) -> float:
        """Tick thread, quorum sends on: if our oldest uncommitted entry has waited
        RESCUE_AFTER, send everything to every follower now and let the first to acknowledge
        it form the quorum (a quorum follower may be stalled: a snapshot, a slow disk).
        Returns how long the coming poll may wait."""
        raft, proposals = self._raft, self._node._proposals
        with proposals.lock:  # a timed-out proposal leaves the table from another thread
            first = next(iter(proposals.pending.values()), None)
        if first is None or first.state != _LOGGED or raft.state != LEADER:
            return TICK
        after = max(RESCUE_AFTER, min(3 * self.commit_s, RESCUE_MAX))
        left = first.logged_at + after - time.monotonic()
        if left > 0:
            return min(TICK, left)
        others = raft.other_nodes
        match = raft.match_index
        if sum(match.get(n, 0) >= first.index for n in others) >= (len(others) + 1) // 2:
            return TICK  # acknowledged: this tick commits it
        term = raft.term
        race = self.race
        if race is None or race[0] < first.index or race[1] != term:
            journal = self._node._journal
            assert journal is not None
            self.race = (journal[-1][1], term, [])
            self._stats["rescues"] += 1
            raft.send_append_entries()
        return TICK

    # ------------------------------------------------------------------ receives

    def on_ack(self, node: Node, message: dict[str, Any]) -> None:
        """pysyncobj sets next_index to whatever an ack says, so an ack for an older append
        rewinds it below entries already in flight: they are sent again and the follower
        truncates and rewrites entries it had (and may have applied). Only move forward on
        success; on a rejection trust the follower (acks arrive in order) but never below its
        match index unless it says it lost entries."""
        raft = self._raft
        match = raft.match_index
        nxt_tbl = raft.next_index
        nxt = int(message["next_node_idx"])
        if node in match:
            if message.get("success"):
                if nxt - 1 > match[node]:
                    match[node] = nxt - 1
                    race = self.race
                    if race is not None and nxt - 1 >= race[0] and node not in race[2]:
                        race[2].append(node)
                        if len(race[2]) >= (len(raft.other_nodes) + 1) // 2:
                            self.quorum, self.race = race[2], None
                if nxt > nxt_tbl.get(node, 0):
                    nxt_tbl[node] = nxt
                elif nxt < nxt_tbl.get(node, 0):
                    self._stats["stale_acks_ignored"] += 1  # pysyncobj would rewind here
            elif message.get("reset"):
                if nxt - 1 < match[node]:
                    log.warning(
                        "follower %s reports log end %d below its match index %d",
                        node,
                        nxt - 1,
                        match[node],
                    )
                    match[node] = nxt - 1
                nxt_tbl[node] = nxt
        raft.last_response_time[node] = monotonic()

    def skip_known_entries(self, node: Node, m: dict[str, Any]) -> None:
        """pysyncobj truncates a follower's log after ``prevLogIdx`` on every append, even when
        the entries sent are the ones it already has (a re-send): acknowledged, possibly
        committed entries vanish until the leader notices. Raft truncates only at a conflict:
        drop the entries we already hold, and if nothing new remains, answer for exactly the
        entries this message verified without letting pysyncobj touch the log."""
        j = self._node._journal
        assert j is not None
        last_idx, last_term = j[-1][1], j[-1][2]
        prev = m["prevLogIdx"]
        if prev >= last_idx or prev < j[0][1] or j.term_at(prev) != m["prevLogTerm"]:
            return  # nothing of ours after prev, or pysyncobj rejects: no truncation either way
        entries = m.get("entries") or []
        known = 0
        for e in entries:
            if e[1] > last_idx or j.term_at(e[1]) != e[2]:
                break
            known += 1
        verified = prev + known
        self._stats["duplicate_appends"] += 1  # a re-send: pysyncobj would truncate here
        if known == len(entries):
            m["prevLogIdx"], m["prevLogTerm"], m["entries"] = last_idx, last_term, []
            m["commit_index"] = min(m["commit_index"], verified)  # our tail is unverified
            self.ack_next[node] = verified + 1
        elif known:
            m["prevLogIdx"], m["prevLogTerm"] = verified, j.term_at(verified)
            m["entries"] = entries[known:]
