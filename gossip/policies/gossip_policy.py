"""Decentralized gossip SGD (D-PSGD): after each step, parameters mixed with the neighbours'."""
from __future__ import annotations

import logging
import warnings
from typing import Any

import numpy as np

from gossip.errors import OperationTimeout, PeerLost, TopologyError
from gossip.policies.base import Policy
from gossip.policies.buckets import DEFAULT_BUCKET_BYTES
from gossip.policies.healing import Healer

__all__ = ["Gossip", "check_topology"]

log = logging.getLogger("gossip")

# Row and column sums of a mixing matrix may be this far from one and still count as exact.
_STOCHASTIC_TOL = 1e-9


def check_topology(topology: Any, world_size: int) -> Any:
    """The topology, if it is one for ``world_size`` peers; TopologyError (a ValueError)
    otherwise."""
    for attr in ("weights", "push_weights", "in_neighbors", "out_neighbors", "size"):
        if not hasattr(topology, attr):
            raise TopologyError(f"{topology!r} is not a topology (see the topologies package)")
    if topology.size != world_size:
        raise TopologyError(f"topology {topology!r} has {topology.size} peers but the world "
                            f"size is {world_size}")
    return topology


class Gossip(Policy):
    """D-PSGD (Lian et al. 2017): after every local step each peer replaces its parameters by
    the weighted average of its own and its in-neighbours' (``x_i <- sum_j W_ij x_j``, row
    ``i`` of the topology's mixing matrix; time-varying topologies use the step number).

    When to use it: many peers, or a network where allreduce's global synchronisation hurts;
    each peer only waits for its neighbours. The replicas agree only approximately; the
    disagreement shrinks by the topology's second eigenvalue (SLEM) per round, and the
    peers' mean is kept exactly when W is doubly stochastic (undirected graphs with the
    default Metropolis weights, or OnePeerExponential). On directed graphs whose W is not
    doubly stochastic the mean drifts: use PushSum there.

    Lost peers: neighbours already lost are left out (their weight stays with this peer); a
    neighbour lost during a round costs that round (the parameters stay as they were) and
    training goes on. On a static undirected graph the survivors heal it: the lost peer's
    neighbours become neighbours of each other a few rounds later (see
    gossip/policies/healing.py), so a ring stays a ring and the mean is still kept.

    Cost per step: one neighbour exchange, ``deg_out * P`` bytes sent per peer for P bytes
    of parameters (e.g. 2P on a ring, P on OnePeerExponential), and a wait for the
    in-neighbours only.

    ``topology``: default, the peer's own (``peer.topology``).
    """

    name = "gossip"

    def __init__(self, *, topology: Any = None, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 timeout: float | None = None, nan_guard: bool = False) -> None:
        super().__init__(bucket_bytes=bucket_bytes, timeout=timeout, nan_guard=nan_guard)
        self._topology_arg = topology
        self._rounds_skipped = 0

    @property
    def topology(self) -> Any:
        return self._topology_arg if self._topology_arg is not None else (
            self._peer.topology if self._peer is not None else None)

    def _setup(self) -> None:
        topo = check_topology(self.topology, self._peer.world_size)
        for phase in range(getattr(topo, "period", 1)):
            w = topo.mixing_matrix(phase)
            if np.abs(w.sum(axis=1) - 1).max() > _STOCHASTIC_TOL:
                raise TopologyError(
                    f"the mixing matrix of {topo!r} is not row-stochastic (step {phase}): "
                    "gossip would scale the parameters; use PushSum on this graph, or "
                    "weights='uniform' / 'metropolis'")
            if np.abs(w.sum(axis=0) - 1).max() > _STOCHASTIC_TOL:
                warnings.warn(f"the mixing matrix of {topo!r} is not doubly stochastic: "
                              "gossip will not keep the peers' mean (it converges to a "
                              "weighted average); PushSum corrects for that", UserWarning,
                              stacklevel=3)
                break
        self._scratch = [b.new() for b in self._buckets]
        self._topo = topo
        self._healer = Healer(self._peer, topo, topo.mixing_matrix(0), timeout=self.timeout)

    def _pattern(self, step: int) -> tuple[float, dict[int, float], list[int]]:
        """(self weight, {in-neighbour: weight}, out-neighbours) of this round: lost
        neighbours left out (their weight stays here), healed ones added."""
        topo, rank = self._topo, self._peer.rank
        self_weight, src_weights = topo.weights(rank, step)
        dst_ranks = list(topo.out_neighbors(rank, step))
        lost = self._peer.lost_peers()
        if lost:
            self_weight += sum(w for j, w in src_weights.items() if j in lost)
            src_weights = {j: w for j, w in src_weights.items() if j not in lost}
            dst_ranks = [j for j in dst_ranks if j not in lost]
        src_weights = dict(src_weights)   # (the topology may hand out shared dicts)
        for q, w in self._healer.extra(step).items():
            self_weight -= w
            src_weights[q] = src_weights.get(q, 0.0) + w
            if q not in dst_ranks:
                dst_ranks.append(q)
        return self_weight, src_weights, dst_ranks

    def _after_step(self, step: int) -> None:
        buckets = self._buckets
        buckets.copy_in()
        self._healer.update(step)
        self_weight, src_weights, dst_ranks = self._pattern(step)
        for b, scratch in zip(buckets, self._scratch):
            # Every bucket's exchange is called even after one failed, so this peer's
            # sequence numbers stay in step with its neighbours'.
            try:
                self._peer.neighbor_allreduce(b.flat, self_weight, src_weights, dst_ranks,
                                              scratch=scratch, timeout=self.timeout)
            except (PeerLost, OperationTimeout) as exc:
                self._rounds_skipped += 1
                log.warning("rank %d: gossip round %d skipped for bucket %d: %s",
                            self._peer.rank, step, b.index, exc)
        buckets.copy_out()

    def _extra_stats(self) -> dict:
        return {"rounds_skipped": self._rounds_skipped, "topology": repr(self.topology),
                "healed_links": self._healer.linked()
                if self._peer is not None else []}
