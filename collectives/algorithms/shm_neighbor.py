"""The neighbour exchange of small arrays among peers on one host, through the slots of the
shared-memory entry (issue #37, item 3): no ZeroMQ message, one slot write and one wait per
round, as the small allreduce (shm_small.py).

Each peer writes its array into its own slot and, after it, its round's pattern as float64:
for every rank the weight of its copy for that rank (its ``dst_weights``; 1 without; NaN: not
a destination), then the weight it gives that rank's array (its ``src_weights``; NaN: not a
source). Every peer enters the round (shm_entry.SharedEntry.enter) with its own sources and
destinations only (``among``): it waits for their counters, compares their headers (the same
call, dtype, shape and size, before anything is read), checks that each of them names it
back (else the ValueError of a pattern that does not pair, worded as the copying exchange's,
pattern.py, on both ends of the pair), computes ``x <- self_weight x + sum_j w_j d_j x_j``
over its sources in rank order, reading their slots (d_j: the source's weight for it, its
copy scaled first as the copying exchange scales what it sends, so the bits are the copying
exchange's), and leaves. A peer writes its slot again only once the peers that read it in its
previous call (those still alive) left that call; it never waits for a peer its round does
not involve, so a dead peer fails its neighbours' round, not the others'.

Only once the arenas are mapped (choice.py's neighbors_in_slots: a mapping is a call of every
peer, the first shared-memory one, e.g. broadcast_parameters or a barrier); not for a
partial round (push-sum's rule for lost peers needs the copying exchange's accounting).
Peers choose alike and the signature says so, so a peer that copies meets a ProtocolError,
never a misread slot.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from collectives.algorithms.neighbor import combine
from collectives.algorithms.pattern import pair_problems, uninvolved, unpaired
from collectives.algorithms.p2p import Call
from collectives.algorithms.shm_entry import SharedEntry, count_shared
from collectives.arrays.adapter import ArrayAdapter
from collectives.neighbor_plan import NeighborPlan

__all__ = ["OnHostNeighbors", "SLOTS_SIGNATURE"]

#: What the signature of a neighbour exchange carries when it goes through the slots.
SLOTS_SIGNATURE = "+slots"


def _pattern_at(nbytes: int) -> int:
    """Where a slot's pattern starts: after the array, at a multiple of 8 bytes."""
    return -(-nbytes // 8) * 8


class OnHostNeighbors:
    """A communicator's small on-host neighbour exchange, through its SharedEntry's slots."""

    def __init__(self, entry: SharedEntry, order: Any) -> None:
        self.entry = entry
        self.order = order   # choice.py's SequenceOrder: one call at a time, in order
        self._views: tuple[Any, int, int, list[np.ndarray]] | None = None   # (_patterns)

    def fits(self, peers: int, nbytes: int) -> bool:
        """Whether a round of ``nbytes`` per peer among ``peers`` fits each slot (the array
        and its pattern of 2 float64 per peer)."""
        return _pattern_at(nbytes) + 16 * peers <= self.entry.data_bytes

    def __call__(self, call: Call, adapter: ArrayAdapter, flat: Any, plan: NeighborPlan, *,
                 scratch: Any, out: Any = None) -> dict[int, Exception]:
        """neighbor_exchange's result (algorithms/neighbor.py): ``flat`` combined in place,
        or into ``out``; ``scratch`` a buffer like it (unused with ``out``)."""
        with self.order.turn(call):
            try:
                self._run(call, adapter, flat, plan, scratch, out)
            finally:
                self.entry.leave(call)
        return {}

    def _run(self, call: Call, adapter: ArrayAdapter, flat: Any, plan: NeighborPlan,
             scratch: Any, out: Any) -> None:
        t = call.transport
        n, r = t.world_size, t.rank
        count = adapter.size(flat)
        nbytes = count * call.itemsize
        at = _pattern_at(nbytes)
        dst_weights = plan.dst_weights
        self.entry.ready(call)   # (the first such call maps the peers' slots: enter's first step)
        parts = self.entry.parts(adapter, call, count)
        patterns = self._patterns(at, n)

        def write() -> None:
            adapter.copy(parts[r], flat)
            pattern = patterns[r]
            pattern.fill(np.nan)
            for dst in plan.dst_ranks:
                pattern[0, dst] = 1.0 if dst_weights is None else dst_weights[dst]
                count_shared(t, dst, nbytes)   # (what it reads of this peer)
            for src, weight in plan.src_weights.items():
                pattern[1, src] = weight
        among = sorted(set(plan.src_weights) | set(plan.dst_ranks))
        self.entry.enter(call, at + 16 * n, write=write, among=among, keep=False)
        if plan.check_pattern:
            self._check(call, patterns, among)
        acc = scratch if out is None else out
        heard = False
        scaled = None
        for src in sorted(plan.src_weights):
            theirs = parts[src]
            sent = float(patterns[src][0, r])
            if sent != 1.0:   # its copy for this peer, scaled as the copying exchange does
                if scaled is None:
                    scaled = adapter.empty(count, call.dtype, flat)
                adapter.scaled_copy(scaled, sent, theirs)
                theirs = scaled
            if heard:
                adapter.axpy(acc, plan.src_weights[src], theirs)
            else:
                adapter.scaled_copy(acc, plan.src_weights[src], theirs)
                heard = True
        combine(adapter, flat, plan.self_weight, scratch, out, heard=heard)

    def _check(self, call: Call, patterns: list[np.ndarray], among: list[int]) -> None:
        """This peer's pattern pairs with its sources' and destinations' (the module
        docstring), else the ValueError of a pattern that does not pair, worded as the
        copying exchange's (pattern.py), naming both."""
        r = call.transport.rank
        mine = ~np.isnan(patterns[r])
        problems: list[str] = []
        for p in among:
            theirs = ~np.isnan(patterns[p])
            expects, sends = bool(mine[1, p]), bool(mine[0, p])
            p_sends, p_expects = bool(theirs[0, r]), bool(theirs[1, r])
            if not (p_sends or p_expects):
                problems.append(uninvolved(r, p, call.seq, expects, sends))
            else:
                problems += pair_problems(r, p, expects=expects, sends=sends, p_sends=p_sends,
                                          p_expects=p_expects)
        if problems:
            raise ValueError(unpaired(call, problems))

    def _patterns(self, at: int, n: int) -> list[np.ndarray]:
        """Every rank's pattern in its slot, by rank: (2, n) float64, its weights sent and
        received (views made once per size and mapping)."""
        arenas = self.entry.arenas
        if self._views is None or self._views[0] is not arenas or self._views[1:3] != (at, n):
            views = [self.entry.slot(j)[at:at + 16 * n].view(np.float64).reshape(2, n)
                     for j in range(n)]
            self._views = (arenas, at, n, views)
        return self._views[3]
