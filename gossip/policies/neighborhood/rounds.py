"""The round plan of a neighbour exchange at one step (who this peer receives from and sends
to, with which weights), with the lost peers folded out and the edges healed around them
(healing.py) merged in.

Gossip, PushSum and ``Peer.neighbor_average`` all build their rounds here, and a step asks the
transport for its lost peers once:

    neighborhood = Neighborhood(peer, topology, push=False, timeout=30.0)
    plan = neighborhood.round(step)      # lost peers read once, healing proposals exchanged
    peer.neighbor_exchange(x, plan.plan(), scratch=scratch)

Folding: a lost peer's weight stays with this peer, so a mixing row (gossip) or a push column
(push-sum) still sums to one. Gossip weights its sources (row i of W), push-sum its
destinations (column i of the push matrix), so the weighted side differs and the fold is the
same. For push-sum this is the only mass-conserving rule: the share kept is mass this peer
still holds. For gossip on a symmetric W it keeps the survivors' mixing symmetric, hence
doubly stochastic (each lost edge's weight returns to the diagonal at both ends), and the
Gossip policy heals the graph around the gap over the next rounds (healing.py), which needs
the weight of the lost edges kept free for the new ones.

``live_mixing_round`` (Peer.neighbor_average, one round with no state to heal with)
renormalises over the live neighbourhood instead: with r_i = W_ii + sum of W_ik over live k
(row i's live mass), a live neighbour j gets ``W_ij / max(r_i, r_j)`` and the peer keeps
the rest. max(r_i, r_j) is the same at both ends of an edge, so a symmetric W stays
symmetric among the survivors (doubly stochastic: their mean is kept), and no row exceeds
one; on a complete graph every survivor gets the survivors' exact mean in one round. Both
ends must agree on who is lost (r_j is computed from this peer's view of j's neighbours).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Collection

from collectives import NeighborPlan
from collectives.codecs import CodecSpec
from gossip.policies.neighborhood.healing import Healer

if TYPE_CHECKING:
    from gossip.policies.base.policy_host import PolicyHost
    from topologies import Topology

__all__ = ["Round", "Neighborhood", "mixing_round", "live_mixing_round", "push_round"]


@dataclass(frozen=True)
class Round:
    """One neighbour exchange: ``x <- self_weight x + sum_j src_weights[j] x_j``, sending to
    ``dst_ranks`` (scaled by ``dst_weights[j]`` if given: push-sum)."""

    self_weight: float
    src_weights: dict[int, float]
    dst_ranks: list[int]
    dst_weights: dict[int, float] | None = None

    def plan(self, *, partial: bool = False, check_pattern: bool = True,
             compression: CodecSpec = None) -> NeighborPlan:
        """This round with the exchange's options, as the one value the neighbour exchange
        takes down the layers (``peer.neighbor_exchange(x, round.plan())``)."""
        return NeighborPlan(self.self_weight, self.src_weights, self.dst_ranks,
                            self.dst_weights, partial=partial, check_pattern=check_pattern,
                            compression=compression)


def _fold(own: float, weighted: dict[int, float], plain: Any, lost: Collection[int],
          healed: dict[int, float] | None) -> tuple[float, dict[int, float], list[int]]:
    """(own weight, weighted side, other side) with the lost peers' weights given back to
    ``own`` and the healed edges' weights taken from it."""
    if lost:
        own += sum(w for j, w in weighted.items() if j in lost)
        weighted = {j: w for j, w in weighted.items() if j not in lost}
        plain = [j for j in plain if j not in lost]
    weighted, plain = dict(weighted), list(plain)   # (the topology may hand out shared dicts)
    for q, w in (healed or {}).items():
        own -= w
        weighted[q] = weighted.get(q, 0.0) + w
        if q not in plain:
            plain.append(q)
    return own, weighted, plain


def mixing_round(topology: Topology, rank: int, step: int, lost: Collection[int] = (),
                 healed: dict[int, float] | None = None) -> Round:
    """Gossip (D-PSGD): row ``rank`` of the mixing matrix at ``step``; sends to the
    out-neighbours unscaled."""
    self_weight, src_weights = topology.weights(rank, step)
    dst_ranks = topology.out_neighbors(rank, step)
    self_weight, src_weights, dst_ranks = _fold(self_weight, src_weights, dst_ranks, lost,
                                                healed)
    return Round(self_weight, src_weights, dst_ranks)


def live_mixing_round(topology: Topology, rank: int, step: int,
                      lost: Collection[int] = ()) -> Round:
    """Gossip over the live neighbourhood (the module's docstring): row ``rank`` of the
    mixing matrix at ``step`` with the lost peers' weight spread over the live neighbours
    symmetrically, W_ij / max(r_i, r_j). Without lost peers, mixing_round's plan."""
    self_weight, src_weights = topology.weights(rank, step)
    dst_ranks = topology.out_neighbors(rank, step)
    if not any(j in lost for j in src_weights):
        return mixing_round(topology, rank, step, lost)

    def live_mass(own: float, weights: dict[int, float]) -> float:
        return own + sum(w for k, w in weights.items() if k not in lost)

    mine = live_mass(self_weight, src_weights)
    live = {j: w / max(mine, live_mass(*topology.weights(j, step)))
            for j, w in src_weights.items() if j not in lost}
    return Round(1.0 - sum(live.values()), live, [j for j in dst_ranks if j not in lost])


def push_round(topology: Topology, rank: int, step: int, lost: Collection[int] = (),
               healed: dict[int, float] | None = None) -> Round:
    """Push-sum: column ``rank`` of the push matrix at ``step``: keep ``p_ii``, send the share
    ``p_ji`` to each out-neighbour j, add what the in-neighbours sent (weight 1 each)."""
    keep, shares = topology.push_weights(rank, step)
    srcs = topology.in_neighbors(rank, step)
    keep, shares, srcs = _fold(keep, shares, srcs, lost, healed)
    return Round(keep, {j: 1.0 for j in srcs}, list(shares), dst_weights=shares)


def _weight_of(topology: Topology, *, push: bool) -> Callable[[int, int], float]:
    """m(i, j) for the healer: the weight receiver i gives sender j (the mixing matrix), or
    with ``push`` the share of j's mass that j sends to i (0 for a time-varying schedule,
    which does not heal); read from the topology's own rows, not an n x n matrix."""
    if push:
        def weight(i: int, j: int) -> float:
            if getattr(topology, "period", 1) != 1:
                return 0.0
            keep, shares = topology.push_weights(j, 0)
            return keep if i == j else shares.get(i, 0.0)
    else:
        def weight(i: int, j: int) -> float:
            own, heard = topology.weights(i, 0)
            return own if i == j else heard.get(j, 0.0)
    return weight


class Neighborhood:
    """A peer's rounds over ``topology``: mixing rounds (``push=False``, Gossip) or push-sum
    rounds (``push=True``), with the edges healed around lost neighbours (healing.Healer,
    whose proposals wait at most ``timeout``)."""

    def __init__(self, peer: PolicyHost, topology: Topology, *, push: bool, timeout: float) -> None:
        self.peer = peer
        self.topology = topology
        self._plan = push_round if push else mixing_round
        self.healer = Healer(peer, topology, _weight_of(topology, push=push), timeout=timeout)

    def round(self, step: int) -> Round:
        """The plan of ``step``: reads the lost peers once, exchanges healing proposals (never
        waits for one) and folds both in."""
        lost = self.peer.lost_peers()
        self.healer.update(step, lost)
        return self._plan(self.topology, self.peer.rank, step, lost,
                          self.healer.extra(step, lost))

    def linked(self) -> list[int]:
        """Every peer an edge was healed with (see Healer.linked)."""
        return self.healer.linked()
