"""The push rotation of asynchronous gossip: the out-neighbours a peer pushes to, one per round
in turn, how it heals around a lost one (its own out-neighbours take its place), and the
answer owed to a peer that pushed here (push-pull: it goes first)."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from topologies import Topology

from collectives.notices import events

__all__ = ["Rotation"]


class Rotation:
    """Every out-neighbour of ``rank`` over all phases of ``topology`` (a time-varying
    schedule's phases become successive turns). No agreement is needed to heal: every peer
    absorbs pushes from any peer, not only from its in-neighbours."""

    def __init__(self, topology: Topology, rank: int) -> None:
        self._topology = topology
        self._rank = rank
        self._phases = getattr(topology, "period", 1)
        self.ranks = [j for phase in range(self._phases)
                      for j in topology.out_neighbors(rank, phase)]
        self.healed: set[int] = set()   # lost out-neighbours whose own ones joined
        self._answered: dict[int, int] = {}   # source -> its pushes absorbed when answered

    def owed(self, absorbed_from: list[int], alive: Callable[[int], bool]) -> int | None:
        """The live peer with the most pushes absorbed here since this peer last pushed to
        it (None if none): answering it first keeps every pair's exchange two-way.

        Why: with pushes only along the rotation, a peer that steps faster than its
        neighbours (4 processes on 2 cores get unequal CPU) pushes more often than it is
        pushed to, so its push-sum weight halves towards min_weight while the slow peers'
        grows: the slow, stale models then dominate every fold and the fast peer's own steps
        count for little. Measured (8 peers in a tight loop, tests/test_asynchronous_mixing.py)
        with the pushes posted by the training thread: 109-165 pushes in 220 steps under
        double load without it, 135-183 with it."""
        best, most = None, 0
        for j, got in enumerate(absorbed_from):
            due = got - self._answered.get(j, 0)
            if due > most and alive(j):
                best, most = j, due
        if best is not None:
            self._answered[best] = absorbed_from[best]
        return best

    def next(self, turn: int, alive: Callable[[int], bool]) -> int | None:
        """The destination of round ``turn``: the first live one from that turn's place on;
        None if none is alive."""
        for k in range(len(self.ranks)):
            candidate = self.ranks[(turn + k) % len(self.ranks)]
            if alive(candidate):
                return candidate
        return None

    def heal(self, alive: Callable[[int], bool]) -> None:
        """Out-neighbours no longer alive hand their place to their own out-neighbours, so
        the graph stays connected around the gap (on a ring, the dead rank's two neighbours
        push to each other)."""
        rank, ranks = self._rank, self.ranks
        for d in [j for j in ranks if j not in self.healed and not alive(j)]:
            self.healed.add(d)
            added = []
            for phase in range(self._phases):
                for q in self._topology.out_neighbors(d, phase):
                    if q != rank and q not in ranks and alive(q):
                        ranks.append(q)
                        added.append(q)
            if added:
                events.info("rank %d: asynchronous gossip heals around lost rank %d: now "
                            "also pushes to %s", rank, d, added)
