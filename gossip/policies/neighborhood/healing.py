"""Healing a gossip graph around lost peers: the lost peer's neighbours become neighbours of
each other (on a ring, the dead rank's two neighbours are linked), so the survivors' graph
stays connected and mixes at nearly the old rate.

Synchronous rounds (Gossip, PushSum) need both ends of a new edge to start using it in the
same round, or one of them waits for a message that never comes. Each end proposes a start
step ``now + lead`` to the other on its own channel, and the edge is used from ``max(both
proposals)``. ``lead`` exceeds how far apart two peers' round counters can drift in lockstep
gossip (at most the graph distance, so the world size), so the other end's proposal is
usually there long before it is needed and nobody waits. It may not be: the two ends were
not neighbours, so the proposal may be the first message of a new connection, and over a
lossy link a lost SYN alone costs a second, dozens of rounds. So an end that reaches its own
proposed step without the other's proposal waits for it there (at most ``timeout``): neither
end passes its own proposal's step without knowing both, so both know the agreed step (the
later of the two) before it comes, and use the edge from the same round. An end whose wait
runs out (the other end never noticed the loss) leaves the edge out and withdraws its
proposal, which the other end then drops too.

Only static undirected topologies heal (the proposal is symmetric); time-varying schedules
(OnePeerExponential, the push-sum default) already reach every survivor through their other
phases, and are left as they are.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Callable, Collection

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
    """One peer's view of the edges added around lost neighbours, for weights ``m(i, j)``
    (the weight i gives to j's value: the mixing matrix's, or push-sum's push shares). A new
    edge r - q around a lost d gets weight
    ``min(m(r, d), m(d, r), m(q, d), m(d, q)) / (deg(d) - 1)``: both ends compute the same
    value, and it never exceeds what the lost edge carried, so rows and columns keep summing
    to one (the rest stays with the peer itself)."""

    def __init__(self, peer: PolicyHost, topology: Topology,
                 weight: Callable[[int, int], float], *,
                 channel: int = HEAL_CHANNEL, timeout: float = 5.0) -> None:
        self.peer = peer
        self.rank = peer.rank
        self.n = peer.world_size
        self.enabled = (getattr(topology, "period", 1) == 1
                        and not getattr(topology, "is_directed", True))
        self.topology = topology
        self.weight = weight
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
                if not self._read(q, self.timeout):
                    break
        for key in [k for k, start in self._mine.items()
                    if start <= step and k not in self._theirs]:
            self._await(key, lost)
        for key in [k for k in self._mine if k in self._theirs]:
            q, d = key
            start = max(self._mine.pop(key), self._theirs.pop(key))
            if start < step:
                log.warning("rank %d: healing around rank %d with rank %d agreed too late "
                            "(step %d, now %d): left out", self.rank, d, q, start, step)
                continue
            m, r = self.weight, self.rank
            degree = len(self._neighbours(d))
            weight = min(m(r, d), m(d, r), m(q, d), m(d, q)) / max(1, degree - 1)
            self.links[key] = (start, float(weight))

    def _read(self, q: int, timeout: float) -> bool:
        """Read one message of ``q``'s (waiting at most ``timeout``): a proposal, or the
        withdrawal of one (start -1). False if none could be read."""
        if self._comm is None:
            return False
        try:
            msg = self._comm.recv(q, timeout=timeout)
        except GossipError as exc:
            log.warning("rank %d: no healing proposal read from rank %d: %s", self.rank, q, exc)
            return False
        if msg.shape != (2,) or msg.dtype != np.int64:
            return True
        d, start = int(msg[0]), int(msg[1])
        if start < 0:
            self._theirs.pop((q, d), None)
            if self.links.pop((q, d), None) is not None:
                events.warning("rank %d: rank %d withdrew its healing edge around rank %d",
                               self.rank, q, d)
        else:
            self._theirs[(q, d)] = start
        return True

    def _await(self, key: tuple[int, int], lost: Collection[int]) -> None:
        """At the step this peer proposed for the edge ``key``, wait for the other end's
        proposal (module docstring); if it does not come, leave the edge out and withdraw."""
        q, d = key
        deadline = time.monotonic() + self.timeout
        while key not in self._theirs and q not in lost:
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(q, left):
                break
        if key in self._theirs:
            return
        self._mine.pop(key)
        events.warning("rank %d: rank %d did not answer the proposal to heal around rank %d "
                       "within %gs: the edge is left out", self.rank, q, d, self.timeout)
        try:
            if self._comm is not None:
                self._comm.send(q, np.array([d, -1], dtype=np.int64), timeout=self.timeout)
        except GossipError as exc:
            log.warning("rank %d: cannot withdraw the healing proposal to rank %d: %s",
                        self.rank, q, exc)

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
