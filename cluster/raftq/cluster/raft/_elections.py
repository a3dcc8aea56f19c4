"""When a node stands for election: fast timeouts once its leader's connection drops, and a
pre-vote won before it raises its term."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any

from raftq.cluster.raft._peers import Peers
from raftq.cluster.raft._seam import LEADER, Node, Raft, monotonic
from raftq.cluster.raft._tuning import (
    ELECTION_MAX,
    ELECTION_MIN,
    FAST_ELECTION_MAX,
    FAST_ELECTION_MIN,
    FAST_ELECTION_SPLIT,
    FAST_ELECTION_WINDOW,
    HELLO_GRACE,
    LEADER_FRESH,
    PRE_VOTE_WAIT,
    PRE_VOTE_WARN_EVERY,
    QUORUM_RECENT,
)
from raftq.cluster.raft._wire import _PRE_VOTE, _PRE_VOTE_REPLY

log = logging.getLogger("raftq.cluster.raft")  # one logger for the whole package


class Elections:
    """Election timeouts: the normal range, or a fast one after the connection to the leader
    dropped (see FAST_ELECTION_SPLIT). Under the tick lock; times on pysyncobj's clock."""

    def __init__(self, raft: Raft, stats: dict[str, int]) -> None:
        self._raft = raft
        self._stats = stats
        self.leader_lost = False  # the connection to the leader dropped; none heard from since
        self.leader_lost_until = 0.0
        # New entries last received as a quorum member / only in heartbeats (time.monotonic)
        self.quorum_at = self.lagging_at = -QUORUM_RECENT
        self._append_at: tuple[int, float] | None = None  # (term, when) of the last append

    def election_timeout(self) -> float:
        if self.leader_lost and (
            self._raft.state == LEADER or monotonic() > self.leader_lost_until
        ):
            self.leader_lost = False  # won, or the loss is old: a one-way link to a live
            # leader must not depose it every 0.15-0.5 s
        if self.leader_lost:
            lo, hi = FAST_ELECTION_MIN, FAST_ELECTION_MAX
            recent = time.monotonic() - QUORUM_RECENT
            if self.quorum_at > recent:
                hi = FAST_ELECTION_SPLIT
            elif self.lagging_at > recent:
                lo = FAST_ELECTION_SPLIT
            return random.uniform(lo, hi)
        return random.uniform(ELECTION_MIN, ELECTION_MAX)

    def restart_timer(self) -> None:
        """A new election timeout from now (as pysyncobj starts one)."""
        self._raft.election_deadline = monotonic() + self.election_timeout()

    def disconnected(self, node: Node) -> None:
        """A follower whose connection to the leader drops stands for election soon instead of
        waiting out the election timeout (kill -9 of the leader closes its sockets at once).
        If the leader is alive and only this link broke, the election may move leadership
        here: a short disruption, which the timeout would cause a little later anyway."""
        raft = self._raft
        if node == raft.leader and raft.state != LEADER:
            self.leader_lost = True
            self.leader_lost_until = monotonic() + FAST_ELECTION_WINDOW
            self._stats["fast_elections"] += 1
            deadline = monotonic() + self.election_timeout()
            raft.election_deadline = min(raft.election_deadline, deadline)

    def heard_append(self, message: dict[str, Any], current: bool) -> None:
        """An append from a leader (``current``: of our term or newer)."""
        if current:
            now, term = time.monotonic(), message.get("term", -1)
            last = self._append_at
            if last is not None and last[0] == term:  # the same leader: the gap a silent
                gap = int((now - last[1]) * 1000)  # death must exceed to be noticed
                self._stats["max_append_gap_ms"] = max(self._stats["max_append_gap_ms"], gap)
            self._append_at = (term, now)
        quorum = message.get("quorum")
        if quorum:
            self.quorum_at = time.monotonic()
        elif quorum is not None and message.get("entries"):
            self.lagging_at = time.monotonic()
        if current:
            self.leader_lost = False  # a leader again: normal timeouts from here


class PreVote:
    """Pre-vote rounds (Raft thesis 9.6): before pysyncobj stands (term + 1), ask the others
    whether they would vote for us. Under the tick lock; times on pysyncobj's clock."""

    def __init__(
        self,
        raft: Raft,
        elections: Elections,
        peers: Peers,
        send: Callable[[Node, Any], bool],
        stats: dict[str, int],
        node_id: str,
        enabled: bool,
    ) -> None:
        self._raft = raft
        self._elections = elections
        self._peers = peers
        self._send = send
        self._stats = stats
        self._node_id = node_id
        self.enabled = enabled
        self.heard_leader_at = -LEADER_FRESH
        self.round: tuple[int, float, set[str]] | None = None  # (term, until, peers granting)
        self.won: tuple[int, float] | None = None  # pysyncobj may stand for (term, until)
        self.ahead_term = -1  # our term while a leader of an older one is heard (see may_stand)
        self._warned = -PRE_VOTE_WARN_EVERY

    def may_stand(self) -> bool:
        """May pysyncobj stand for election now (term + 1)? With pre-vote only once it was won
        (PRE_VOTE_WAIT ago at most), when the leader asked us to (a transfer), or when a leader
        of an older term is alive: our term is ahead of it, which pysyncobj never tells it, so
        only a higher term in a vote request brings the terms together (one election)."""
        raft = self._raft
        if not self.enabled or raft.transfer_in_progress:
            return True
        term = raft.term
        if self.ahead_term == term:
            return True
        won = self.won
        return won is not None and won[0] == term + 1 and monotonic() < won[1]

    def hold(self) -> None:
        """Before each tick. pysyncobj stands for election (term + 1) in the tick where its
        deadline has passed, if ``may_stand``. Until then, ask the others whether they would
        vote for us: a majority of yes within PRE_VOTE_WAIT lets it stand at once; otherwise a
        new election timeout starts. Our term does not change meanwhile."""
        raft = self._raft
        if raft.state == LEADER or raft.self_node is None:
            return
        now = monotonic()
        if raft.election_deadline > now or self.may_stand():
            return
        if not raft.connected_to_anyone():
            return  # pysyncobj does not stand either
        term = raft.term + 1
        r = self.round
        if r is not None and r[0] == term:
            if now < r[1]:
                return
            self.round = None
            self._lost_round(term, r)
            raft.election_deadline = now + self._elections.election_timeout()
            return
        others = raft.other_nodes
        connected = raft.connected_nodes
        peers = self._peers
        unsure = [
            peers.connected_at.get(n.id, 0.0) + HELLO_GRACE
            for n in others
            if n in connected and n.id not in peers.pre_voters
        ]
        if unsure and max(unsure) > now:
            raft.election_deadline = max(unsure)  # let them say hello first
            return
        self.round = (term, now + PRE_VOTE_WAIT, set())
        self._stats["pre_votes"] += 1
        ask = {
            "type": _PRE_VOTE,
            "term": term,
            "last_log_index": raft.last_log_index,
            "last_log_term": raft.last_log_term,
        }
        for n in others:
            if n in connected:
                self._send(n, ask)
        self._count_round()

    def _lost_round(self, term: int, r: tuple[int, float, set[str]]) -> None:
        stats = self._stats
        stats["pre_votes_lost"] += 1
        now = time.monotonic()
        if now - self._warned >= PRE_VOTE_WARN_EVERY:
            self._warned = now
            log.warning(
                "raft %s: no leader heard, and a pre-vote for term %d got %d of %d yes (more"
                " are needed); cut off from the others? (%d lost so far)",
                self._node_id,
                term,
                1 + len(r[2]),
                1 + len(self._raft.other_nodes),
                stats["pre_votes_lost"],
            )

    def _count_round(self) -> None:
        r = self.round
        if r is None:
            return
        raft = self._raft
        others = raft.other_nodes
        connected = raft.connected_nodes
        pre_voters = self._peers.pre_voters
        votes = 1
        for n in others:
            if n.id in r[2]:
                votes += 1
            elif n in connected and n.id not in pre_voters:
                votes += 1  # an older version: knows no pre-vote and votes as it always did
        if 2 * votes > len(others) + 1:
            now = monotonic()
            self.won = (r[0], now + PRE_VOTE_WAIT)
            self.round = None
            self._stats["pre_votes_won"] += 1
            raft.election_deadline = now  # stand in the next tick

    def on_message(self, node: Node, kind: str, m: dict[str, Any]) -> None:
        self._peers.pre_voters.add(node.id)
        if kind == _PRE_VOTE:
            granted = self._would_vote(m)
            if not granted:
                self._stats["pre_votes_refused"] += 1
            self._send(node, {"type": _PRE_VOTE_REPLY, "term": m.get("term"), "granted": granted})
        elif kind == _PRE_VOTE_REPLY:
            r = self.round
            if (
                r is not None
                and m.get("granted") is True
                and m.get("term") == r[0]
                and monotonic() < r[1]
            ):
                r[2].add(node.id)
                self._count_round()

    def _would_vote(self, m: dict[str, Any]) -> bool:
        """Would we vote for this candidate in the term it names? As pysyncobj decides a vote
        (a newer term, a log at least as up to date), and only if we know of no live leader:
        not leading ourselves, nor a follower that heard one within LEADER_FRESH and still has
        its connection."""
        raft = self._raft
        term, idx, last_term = m.get("term"), m.get("last_log_index"), m.get("last_log_term")
        if not (type(term) is int and type(idx) is int and type(last_term) is int):
            return False
        if raft.state == LEADER or term <= raft.term:
            return False
        if (
            raft.leader is not None
            and not self._elections.leader_lost
            and monotonic() - self.heard_leader_at < LEADER_FRESH
        ):
            return False
        ours = (raft.last_log_term, raft.last_log_index)
        return (last_term, idx) >= ours

    def heard_append(self, message: dict[str, Any], term: int) -> None:
        """An append from a leader; ``term`` is ours."""
        if message.get("term", -1) >= term:
            self.heard_leader_at = monotonic()
            self.round = self.won = None  # a leader: no election
            self.ahead_term = -1
        elif self.enabled and self.ahead_term != term:
            self.ahead_term = term
            log.warning(
                "raft %s: term %d is ahead of the leader's (%s); standing for election to"
                " bring them together",
                self._node_id,
                term,
                message.get("term"),
            )
