"""The push rotation of asynchronous gossip: the out-neighbours a peer pushes to, one per round
in turn, and how it heals around a lost one (its own out-neighbours take its place)."""
from __future__ import annotations

import logging
from typing import Any, Callable

__all__ = ["Rotation"]

log = logging.getLogger("gossip")


class Rotation:
    """Every out-neighbour of ``rank`` over all phases of ``topology`` (a time-varying
    schedule's phases become successive turns). No agreement is needed to heal: every peer
    absorbs pushes from any peer, not only from its in-neighbours."""

    def __init__(self, topology: Any, rank: int) -> None:
        self._topology = topology
        self._rank = rank
        self._phases = getattr(topology, "period", 1)
        self.ranks = [j for phase in range(self._phases)
                      for j in topology.out_neighbors(rank, phase)]
        self.healed: set[int] = set()   # lost out-neighbours whose own ones joined

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
                log.info("rank %d: asynchronous gossip heals around lost rank %d: now also "
                         "pushes to %s", rank, d, added)
