"""Faults on a schedule that leaves quiet periods, and the final heal.

Each fault is applied, held for a while, then undone (restart, resume, heal); between faults the
cluster gets a quiet period to elect a leader and catch up. Every action is an ``info`` line of
process ``nemesis`` in the history. Faults:

=================  ==========================================================================
kill-follower      kill -9 one follower, restart it
kill-leader        kill -9 the leader, restart it
kill-minority      kill -9 a minority (random), restart them
kill-all           kill -9 every node, restart them all
pause-leader       SIGSTOP the leader, SIGCONT
pause-follower     SIGSTOP one follower, SIGCONT
partition-leader   isolate the leader from every other node
partition-half     a random minority / majority split
partition-bridge   two sides that both see one bridge node (which sees everyone)
partition-ring     5+ nodes: each node sees only its two ring neighbours
rolling-restart    graceful stop + start of every node in turn, waiting for each
membership         kill a follower, remove it from the cluster, replace its disk, start it and
                   add it back (POST / DELETE /cluster/members)
=================  ==========================================================================
"""

from __future__ import annotations

import asyncio
import random
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field

from raftq.client import RaftqError
from raftq_chaos.cluster import Cluster
from raftq_chaos.history import History

FAULTS = (
    "kill-follower",
    "kill-leader",
    "kill-minority",
    "kill-all",
    "pause-leader",
    "pause-follower",
    "partition-leader",
    "partition-half",
    "partition-bridge",
    "partition-ring",
    "rolling-restart",
    "membership",
)
SKIPPED: dict[str, str] = {}


@dataclass
class Nemesis:
    cluster: Cluster
    history: History
    faults: list[str]
    rng: random.Random
    quiet: tuple[float, float] = (2.0, 4.0)
    hold: tuple[float, float] = (3.0, 6.0)
    done: Counter[str] = field(default_factory=Counter)

    def note(self, f: str, **value: object) -> None:
        self.history.note(f, value or None)

    async def _leader_or_any(self) -> str:
        lid = await self.cluster.leader()
        if lid is not None:
            return lid
        alive = [n for n, node in self.cluster.nodes.items() if node.alive]
        return self.rng.choice(alive or list(self.cluster.nodes))

    async def _follower(self) -> str:
        lid = await self.cluster.leader()
        others = [n for n in self.cluster.nodes if n != lid]
        return self.rng.choice(others)

    def _minority(self) -> list[str]:
        ids = list(self.cluster.nodes)
        k = self.rng.randint(1, (len(ids) - 1) // 2)
        return self.rng.sample(ids, k)

    async def _hold(self) -> None:
        await asyncio.sleep(self.rng.uniform(*self.hold))

    async def run(self, duration: float) -> None:
        """Faults until ``duration`` seconds are up (a fault in progress is finished), in the
        order given (cycled), each after a quiet period."""
        end = time.monotonic() + duration
        i = 0
        while True:
            await asyncio.sleep(self.rng.uniform(*self.quiet))
            if time.monotonic() >= end or not self.faults:
                return
            fault = self.faults[i % len(self.faults)]
            i += 1
            await self.apply(fault)

    async def apply(self, fault: str) -> None:
        c, net = self.cluster, self.cluster.net
        n = len(c.nodes)
        if fault in SKIPPED:
            self.note("nemesis-skip", fault=fault, why=SKIPPED[fault])
            return
        if fault.startswith("kill-"):
            if fault == "kill-follower":
                victims = [await self._follower()]
            elif fault == "kill-leader":
                victims = [await self._leader_or_any()]
            elif fault == "kill-minority":
                victims = self._minority()
            else:
                victims = list(c.nodes)
            for v in victims:
                c.kill(v)
            self.note("kill", nodes=victims)
            await self._hold()
            for v in victims:
                c.start(v)
            self.note("restart", nodes=victims)
        elif fault.startswith("pause-"):
            v = await (self._leader_or_any() if fault == "pause-leader" else self._follower())
            c.pause(v)
            self.note("pause", nodes=[v])
            await self._hold()
            c.resume(v)
            self.note("resume", nodes=[v])
        elif fault.startswith("partition-"):
            ids = list(c.nodes)
            self.rng.shuffle(ids)
            if fault == "partition-leader":
                lid = await self._leader_or_any()
                net.partition([[lid], [x for x in ids if x != lid]])
            elif fault == "partition-half":
                k = self.rng.randint(1, (n - 1) // 2)
                net.partition([ids[:k], ids[k:]])
            elif fault == "partition-bridge":
                # ids[0] is the bridge: it keeps every link; the two sides lose theirs
                a, b = ids[1 : 1 + (n - 1) // 2], ids[1 + (n - 1) // 2 :]
                for x in a:
                    for y in b:
                        net.cut(x, y)
            elif fault == "partition-ring":
                if n < 5:
                    self.note("nemesis-skip", fault=fault, why="a ring needs 5+ nodes")
                    return
                for j, x in enumerate(ids):
                    for y in ids[j + 2 :]:
                        if not (j == 0 and y == ids[-1]):
                            net.cut(x, y)
            else:
                raise ValueError(f"unknown fault {fault!r}")
            self.note("partition", fault=fault, cuts=sorted(sorted(x) for x in net.cuts))
            await self._hold()
            net.heal()
            self.note("heal")
        elif fault == "membership":
            v = await self._follower()
            c.kill(v)
            self.note("kill", nodes=[v])
            await self._member_change(v, add=False)
            await self._hold()
            shutil.rmtree(c.nodes[v].data_dir / "data", ignore_errors=True)  # a new disk
            c.start(v)
            await self._member_change(v, add=True)
            self.note("restart", nodes=[v], fresh_disk=True)
            await c.wait_up(v, 30)
        elif fault == "rolling-restart":
            for v in list(c.nodes):
                code = await asyncio.to_thread(c.stop, v)
                self.note("stop", nodes=[v], exit=code)
                c.start(v)
                self.note("restart", nodes=[v])
                await c.wait_up(v, 30)
                await c.wait_leader(30)
        else:
            raise ValueError(f"unknown fault {fault!r}")
        self.done[fault] += 1

    async def _member_change(self, nid: str, add: bool) -> None:
        """Remove or add ``nid`` through the HTTP API, retrying (an unknown outcome, a leader
        change) until the leader's member list shows it done."""
        c = self.cluster
        node = c.nodes[nid]
        others = [n.url for m, n in c.nodes.items() if m != nid]
        what = "add" if add else "remove"

        async def done() -> bool:
            lid = await c.leader()
            st = await c.status(lid) if lid else None
            if st is None:
                return False
            if (nid in st.get("members", {})) == add:
                return True
            async with c.client(others, timeout=10) as cl:
                try:
                    if add:
                        await cl.add_member(nid, node.raft, node.api)
                    else:
                        await cl.remove_member(nid)
                except RaftqError as e:
                    self.note("member-retry", op=what, node=nid, error=e.code)
            return False

        await c.wait(f"{what} member {nid}", done, 60, every=0.5)
        self.note(f"member-{what}", nodes=[nid])

    async def heal_all(self) -> None:
        """Undo everything: heal the network, resume paused nodes, start dead ones."""
        c = self.cluster
        c.net.heal()
        for nid, node in c.nodes.items():
            if node.paused:
                c.resume(nid)
            if not node.alive:
                c.start(nid)
        self.note("heal-all")
        for nid in c.nodes:
            await c.wait_up(nid, 30)
