"""Healing a gossip graph around lost peers: the lost peer's neighbours become neighbours of
each other (on a ring, the dead rank's two neighbours are linked), so the survivors' graph
stays connected and mixes at nearly the old rate.

Synchronous rounds (Gossip, PushSum) need both ends of a new edge to start using it in the
same round, or one of them waits for a message that never comes. Each end proposes a start
step ``now + lead`` to the other on its own channel and never waits for the answer: the edge
is used from ``max(both proposals)`` once both are known. ``lead`` exceeds how far apart
two peers' round counters can drift in lockstep gossip (at most the graph distance, so the
world size), so both learn the agreed step before it comes. A proposal that arrives too late
(or never: the other end did not notice the loss) leaves that edge out on both ends.

Only static undirected topologies heal (the proposal is symmetric); time-varying schedules
(OnePeerExponential, the push-sum default) already reach every survivor through their other
phases, and are left as they are.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Collection

import numpy as np

from collectives.notices import events
from gossip.errors import GossipError
from gossip.peer_channels import PeerChannel

if TYPE_CHECKING:
    from gossip.policies.base.policy_host import PolicyHost
    from topologies import Topology

__all__ = ["Healer", "HEAL_CHANNEL"]

log = logging.getLogger("gossip")

#: peer.channel() number of the healing proposals (see gossip/peer_channels.py).
HEAL_CHANNEL = PeerChannel.HEALING


class Healer:
    """One peer's view of the edges added around lost neighbours, for a weight matrix ``m``
    (m[i, j]: the weight i gives to j's value: the mixing matrix, or push-sum's push matrix
    transposed). A new edge r - q around a lost d gets weight
    ``min(m[r, d], m[d, r], m[q, d], m[d, q]) / (deg(d) - 1)``: both ends compute the same
    value, and it never exceeds what the lost edge carried, so rows and columns keep summing
    to one (the rest stays with the peer itself)."""

    def __init__(self, peer: PolicyHost, topology: Topology, matrix: np.ndarray, *,
                 channel: int = HEAL_CHANNEL, timeout: float = 5.0) -> None:
        self.peer = peer
        self.rank = peer.rank
        self.n = peer.world_size
        self.enabled = (getattr(topology, "period", 1) == 1
                        and not getattr(topology, "is_directed", True))
        self.topology = topology
        self.matrix = np.asarray(matrix, dtype=np.float64)
        self.lead = self.n + 4
        self.timeout = timeout
        self._comm = peer.channel(channel) if self.enabled and self.n > 2 else None
        self._handled: set[int] = set()
        self._mine: dict[tuple[int, int], int] = {}     # (q, d) -> step I proposed
        self._theirs: dict[tuple[int, int], int] = {}   # (q, d) -> step q proposed
        self.links: dict[tuple[int, int], tuple[int, float]] = {}  # (q, d) -> (start, weight)

    def _neighbours(self, rank: int) -> set[int]:
        return set(self.topology.out_neighbors(rank, 0)) | set(self.topology.in_neighbors(rank, 0))

    def update(self, step: int, lost: Collection[int]) -> None:
        """Propose edges around neighbours newly found lost (``lost``: the step's lost
        peers) and read the other ends' proposals; never waits for a message."""
        if self._comm is None:
            return
        mine = self._neighbours(self.rank)
        for d in sorted(set(lost) - self._handled):
            self._handled.add(d)
            if d not in mine:
                continue
            for q in sorted(self._neighbours(d) - {self.rank} - set(lost)):
                start = step + self.lead
                try:
                    self._comm.send(q, np.array([d, start], dtype=np.int64),
                                    timeout=self.timeout)
                except GossipError as exc:
                    log.warning("rank %d: cannot propose to heal around rank %d with rank %d: "
                                "%s", self.rank, d, q, exc)
                    continue
                self._mine[(q, d)] = start
                events.info("rank %d: lost neighbour %d; proposes rank %d as a neighbour "
                            "from step %d (healing)", self.rank, d, q, start)
        for q in sorted({q for q, _ in self._mine} | {q for q, _ in self._theirs}):
            while q not in lost and self._comm.probe(q):
                try:
                    msg = self._comm.recv(q, timeout=self.timeout)
                except GossipError as exc:
                    log.warning("rank %d: bad healing proposal from rank %d: %s", self.rank,
                                q, exc)
                    break
                if msg.shape != (2,) or msg.dtype != np.int64:
                    continue
                self._theirs[(q, int(msg[0]))] = int(msg[1])
        for key in [k for k in self._mine if k in self._theirs]:
            q, d = key
            start = max(self._mine.pop(key), self._theirs.pop(key))
            if start <= step:
                log.warning("rank %d: healing around rank %d with rank %d agreed too late "
                            "(step %d, now %d): left out", self.rank, d, q, start, step)
                continue
            m = self.matrix
            degree = len(self._neighbours(d))
            weight = min(m[self.rank, d], m[d, self.rank], m[q, d], m[d, q]) / max(1, degree - 1)
            self.links[key] = (start, float(weight))

    def linked(self) -> list[int]:
        """Every peer an edge was agreed with (in use, due, or since lost itself)."""
        return sorted({q for q, _ in self.links})

    def extra(self, step: int, lost: Collection[int]) -> dict[int, float]:
        """The added neighbours in use at ``step`` (those not in ``lost``), with their
        weights."""
        out: dict[int, float] = {}
        if not self.links:
            return out
        for (q, _), (start, weight) in self.links.items():
            if step >= start and q not in lost:
                out[q] = out.get(q, 0.0) + weight
        return out
