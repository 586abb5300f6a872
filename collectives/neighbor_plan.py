"""One round of the neighbour exchange as one value: who this peer hears from and with what
weights, whom it sends to (and how each destination's copy is scaled), and the round's
options. It is made once (by a policy, by ``neighbor_allreduce``'s arguments) and travels
whole through the Peer, the Communicator, the operation and the algorithms, which read its
fields; it is checked where it is made, so the layers below trust it.

    plan = NeighborPlan(1 / 3, {left: 1 / 3, right: 1 / 3}, [left, right])
    comm.neighbor_exchange(x, plan)        # x <- x / 3 + x_left / 3 + x_right / 3

What only the calling peer can check (that every rank is another peer of its group, that its
array holds real weights) is checked by ``check`` as the call begins, before it takes a
sequence number.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from collectives.codecs.codec import Codec
from collectives.codecs.catalog import CodecSpec, parse

__all__ = ["NeighborPlan"]


@dataclass(frozen=True, init=False)
class NeighborPlan:
    """``x <- self_weight x + sum_j src_weights[j] x_j``, sending ``x`` to ``dst_ranks`` (each
    copy scaled by ``dst_weights[dst]`` if given: push-sum). Normalised when made: the
    weights are floats by int rank, ``dst_ranks`` a sorted tuple of ranks (any iterable of
    distinct ranks will do: one named twice is a ValueError), ``compression`` a Codec or None (a codec name will do)."""

    #: This peer's own weight.
    self_weight: float
    #: Source rank -> the weight of what it sends (its in-neighbours this round).
    src_weights: Mapping[int, float]
    #: The ranks this peer sends ``x`` to (its out-neighbours this round).
    dst_ranks: tuple[int, ...]
    #: Destination rank -> the scale of its copy (push-sum); one per destination, or None.
    dst_weights: Mapping[int, float] | None = None
    #: A peer lost during the round is left out instead of failing it (ExchangeIncomplete
    #: afterwards, naming it); not with compression.
    partial: bool = False
    #: Check that the peers' patterns pair up before data is combined (algorithms/pattern.py).
    check_pattern: bool = True
    #: The codec the encodings travel in ("int8", a Codec, ...): None sends the array itself.
    compression: Codec | None = None

    def __init__(self, self_weight: float, src_weights: Mapping[int, float],
                 dst_ranks: Iterable[int], dst_weights: Mapping[int, float] | None = None,
                 partial: bool = False, check_pattern: bool = True,
                 compression: CodecSpec = None) -> None:
        put = object.__setattr__   # (frozen: the normalised values are set once, here)
        put(self, "self_weight", float(self_weight))
        put(self, "src_weights", {int(k): float(v) for k, v in src_weights.items()})
        ranks = [int(d) for d in dst_ranks]
        if len(set(ranks)) != len(ranks):   # (BlueFog refuses them too: a caller's slip)
            twice = sorted({d for d in ranks if ranks.count(d) > 1})
            raise ValueError(f"dst_ranks names rank{'s' if len(twice) > 1 else ''} "
                             f"{', '.join(map(str, twice))} more than once: each "
                             f"destination gets the array once")
        put(self, "dst_ranks", tuple(sorted(ranks)))
        put(self, "dst_weights", None)
        if dst_weights is not None:
            scales = {int(k): float(v) for k, v in dst_weights.items()}
            put(self, "dst_weights", scales)
            if set(scales) != set(self.dst_ranks):
                raise ValueError("dst_weights must have exactly one weight per destination "
                                 "rank")
        put(self, "partial", partial)
        put(self, "check_pattern", check_pattern)
        put(self, "compression", parse(compression))
        if self.compression is not None and (self.dst_weights is not None or self.partial):
            raise ValueError("neighbor_allreduce with compression takes neither dst_weights "
                             "nor partial=True")

    @classmethod
    def of_call(cls, rank: int, self_weight: float, src_weights: Mapping[int, float],
                dst_ranks: Iterable[int], *, dst_weights: Mapping[int, float] | None = None,
                partial: bool = False, check_pattern: bool = True,
                compression: CodecSpec = None) -> "NeighborPlan":
        """The plan of ``neighbor_allreduce``'s arguments on ``rank``: its ValueError names the
        rank and the call (the Peer's and the Communicator's neighbor_allreduce alike)."""
        try:
            return cls(self_weight, src_weights, dst_ranks, dst_weights, partial,
                       check_pattern, compression)
        except ValueError as exc:   # (the plan's own checks: the caller's arguments)
            raise ValueError(f"rank {rank}: neighbor_allreduce: {exc}") from None

    @property
    def peers(self) -> list[int]:
        """Every peer of the round (sources and destinations), ascending."""
        return sorted(set(self.src_weights) | set(self.dst_ranks))

    def check(self, rank: int, world_size: int, dtype: str) -> None:
        """The checks only the calling peer can make, before the call takes a sequence
        number: its array (``dtype``) can hold a weighted average, and every rank named is
        another peer of its ``world_size``. TypeError or ValueError otherwise."""
        if not (dtype.startswith("float") or dtype.startswith("complex")
                or dtype == "bfloat16"):
            raise TypeError(f"neighbor_allreduce averages with real weights; {dtype} arrays "
                            "cannot hold the result (use a floating-point array)")
        for r in list(self.dst_ranks) + list(self.src_weights):
            if not 0 <= r < world_size or r == rank:
                raise ValueError(f"rank {rank}: neighbour {r} is not another peer of the "
                                 f"{world_size}")
