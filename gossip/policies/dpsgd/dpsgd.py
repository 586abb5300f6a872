"""Decentralized gossip SGD (D-PSGD): after each step, parameters mixed with the neighbours'."""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import numpy as np

from collectives.codecs import CodecSpec
from gossip.errors import TopologyError
from gossip.policies.base import DEFAULT_BUCKET_BYTES, Policy
from gossip.policies.neighborhood import PEER_TOPOLOGY, Neighborhood
from gossip.policies.neighborhood.disagreement import DisagreementProbe

if TYPE_CHECKING:
    from topologies import Topology

__all__ = ["Gossip"]

# Row and column sums of a mixing matrix may be this far from one and still count as exact.
_STOCHASTIC_TOL = 1e-9


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

    Lost peers: neighbours already lost are left out (their weight stays with this peer: on
    a symmetric W both ends of a lost edge keep its weight, so the survivors' mixing stays
    symmetric, hence doubly stochastic, and the weight is free for the healed edges below;
    Peer.neighbor_average, with no later rounds to heal in, spreads it over the live
    neighbours instead); a neighbour lost during a round costs that round (the parameters
    stay as they were) and training goes on. On a static undirected graph the survivors heal
    it: the lost peer's neighbours become neighbours of each other a few rounds later (see
    gossip/policies/neighborhood/healing.py), so a ring stays a ring and the mean is still kept.

    Cost per step: one neighbour exchange, ``deg_out * P`` bytes sent per peer for P bytes
    of parameters (e.g. 2P on a ring, P on OnePeerExponential), and a wait for the
    in-neighbours only.

    ``topology``: default, the peer's own (``peer.topology``).

    ``compression`` (fp16, bf16 or int8: codecs that can stand for parameters; top-k
    cannot, use Choco): each peer sends one encoding and combines the decoded encodings,
    its own included (collectives/algorithms/compressed.py), so the mean of the decoded
    values is kept; the quantisation error is added again every round (CHOCO-SGD, Choco,
    removes it).
    """

    name = "gossip"
    default_topology = PEER_TOPOLOGY

    def __init__(self, *, topology: Topology | None = None,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, timeout: float | None = None,
                 nan_guard: bool = False,
                 compression: CodecSpec = None) -> None:
        super().__init__(bucket_bytes=bucket_bytes, timeout=timeout, nan_guard=nan_guard,
                         compression=compression)
        self._compression.require_dense("Gossip", "Choco (compressed differences)")
        self._topology_arg = topology
        self._probe = DisagreementProbe()   # the consensus estimate of each round's movement

    def _setup(self) -> None:
        topo = self._graph()
        for phase in range(getattr(topo, "period", 1)):
            w = topo.sparse_mixing_matrix(phase)   # (n x (degree + 1), not n x n)
            if np.abs(w.row_sums() - 1).max() > _STOCHASTIC_TOL:
                raise TopologyError(
                    f"the mixing matrix of {topo!r} is not row-stochastic (step {phase}): "
                    "gossip would scale the parameters; use PushSum on this graph, or "
                    "weights='uniform' / 'metropolis'")
            if np.abs(w.column_sums() - 1).max() > _STOCHASTIC_TOL:
                warnings.warn(f"the mixing matrix of {topo!r} is not doubly stochastic: "
                              "gossip will not keep the peers' mean (it converges to a "
                              "weighted average); PushSum corrects for that", UserWarning,
                              stacklevel=3)
                break
        self._scratch = [b.new() for b in self._packed()]
        self._neighborhood = Neighborhood(self._host(), topo, push=False, timeout=self.timeout)

    def _after_step(self, step: int) -> None:
        buckets = self._packed()
        buckets.copy_in()
        mixing = self._neighborhood.round(step)
        plan = mixing.plan(compression=self.compression)
        flats = [b.flat for b in buckets]
        self._probe.before(flats)
        for b, scratch in zip(buckets, self._scratch):
            # Every bucket's exchange is called even after one failed, so this peer's
            # sequence numbers stay in step with its neighbours'.
            with self._tolerate(f"round {step}, bucket {b.index}"):
                self._host().neighbor_exchange(b.flat, plan, timeout=self.timeout,
                                               scratch=None if self.compression else scratch)
        self._probe.after(flats, mixing.self_weight)
        buckets.copy_out()

    def view_changed(self) -> None:
        # The graph over the new view, and healing starts afresh (no lost peer in a new view).
        super().view_changed()
        self._neighborhood = Neighborhood(self._host(), self._graph(), push=False,
                                          timeout=self.timeout)

    def _extra_stats(self) -> dict:
        stats = {"rounds_skipped": self._rounds_skipped, "topology": repr(self.topology),
                 "healed_links": self._neighborhood.linked()}
        if self._probe.last is not None:
            # This peer's distance to its neighbours' mean, from its last round's own
            # movement (neighborhood/disagreement.py): no communication.
            stats["consensus_distance_estimate"] = self._probe.last
        return stats
