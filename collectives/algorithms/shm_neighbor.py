"""The neighbour exchange of small arrays and the neighbour allgather among peers on one host,
through the slots of the shared-memory entry (issue #37, item 3): no ZeroMQ message, one slot
write and one wait per round, as the small allreduce (shm_small.py).

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

``allgather`` is BlueFog's neighbor_allgather the same way: each peer writes a byte per rank
(it sends to it, it expects from it) and its array, where it fits, into its slot, and its
count, whether the array is in the slot and where it is into its header; each reads its
sources' arrays out of their slots, or out of their memory (transport/cma.py; the owner
returns once its readers left), or, where peers cannot read each other, gets them as
messages. The peers' sizes differ, so each owner chooses by its own and its header says how.

A peer that did not name this one goes on to its next call without waiting for it, so its
header may already be a later call's when this one looks: SharedEntry.moved_on says so, and
the pattern check counts it as not naming this peer (never reading its slot as this call's).

Only once the arenas are mapped (choice.py's neighbors_in_slots: a mapping is a call of every
peer, the first shared-memory one, e.g. broadcast_parameters or a barrier); not for a
partial round (push-sum's rule for lost peers needs the copying exchange's accounting).
Peers choose alike and the signature says so, so a peer that copies meets a ProtocolError,
never a misread slot.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from collectives.algorithms.neighbor import combine
from collectives.algorithms.pattern import pair_problems, uninvolved, unpaired
from collectives.algorithms.p2p import Call, post_range, recv_range, wait_sent
from collectives.algorithms.shm_direct import address_of, read_range
from collectives.algorithms.shm_entry import PID, WORDS, SharedEntry, count_shared
from collectives.arrays.adapter import ArrayAdapter
from collectives.transport import cma
from collectives.neighbor_plan import NeighborPlan

__all__ = ["OnHostNeighbors", "SLOTS_SIGNATURE"]

#: What the signature of a neighbour exchange carries when it goes through the slots.
SLOTS_SIGNATURE = "+slots"


def _pattern_at(nbytes: int) -> int:
    """Where a slot's pattern starts: after the array, at a multiple of 8 bytes."""
    return -(-nbytes // 8) * 8


class OnHostNeighbors:
    """A communicator's on-host neighbour calls through its SharedEntry: the small neighbour
    exchange (``__call__``) and the neighbour allgather (``allgather``)."""

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

        def relation(p: int) -> tuple[bool, bool, bool, bool]:
            theirs = ~np.isnan(patterns[p])
            if self.entry.moved_on(call, p):   # its call did not name this peer
                return bool(mine[1, p]), bool(mine[0, p]), False, False
            return bool(mine[1, p]), bool(mine[0, p]), bool(theirs[0, r]), bool(theirs[1, r])
        _check_pairs(call, among, relation)

    def allgather(self, call: Call, adapter: ArrayAdapter, flat: Any, srcs: list[int],
                  dsts: list[int], order: list[int]) -> tuple[Any, dict[int, int]]:
        """neighbor_allgather on one host, in one entry (module docstring): this peer's
        ``flat`` to ``dsts``, the arrays of ``srcs`` concatenated in ``order`` (srcs, as the
        caller named them) into a new flat array; returns it and each source's count. Each
        peer writes its pattern (a byte per rank: 1 it sends to that rank, 2 it expects from
        it) into its slot, its array after it where it fits, and announces its count, whether
        the array is in the slot and its address. A source's array is copied out of its slot,
        else read out of its memory (this peer can read every peer's, as the entries before
        said), else sent to its destinations as messages: each sender chooses by its own size,
        its header says which, so peers of different sizes need not agree."""
        t = call.transport
        n, r = t.world_size, t.rank
        count = adapter.size(flat)
        itemsize = call.itemsize
        nbytes = count * itemsize
        at = _flags_bytes(n)
        in_slot = at + nbytes <= self.entry.data_bytes
        readable = self.entry.direct is True   # (the same on every peer: neighbors_in_slots)
        among = sorted(set(srcs) | set(dsts))

        def write() -> None:
            slot = self.entry.slot(r)
            flags = slot[:n]
            flags[:] = 0
            for d in dsts:
                flags[d] |= _SENDS
                if in_slot or readable:   # (what it reads of this peer; else sent, counted so)
                    count_shared(t, d, nbytes)
            for src in srcs:
                flags[src] |= _EXPECTS
            if in_slot and count:
                adapter.copy(adapter.from_frame(slot[at:at + nbytes], call.frame_dtype, count),
                             flat)
        address = 0 if in_slot or not readable else address_of(adapter, flat)
        data = Call(t, call.channel, call.seq, call.signature + "[data]", call.dtype, (count,),
                    call.deadline)
        tickets = []
        done = False
        with self.order.turn(call):
            try:
                headers = self.entry.enter(call, 0, (count, int(in_slot), address),
                                           write=write, among=among)
                slots = {j: self.entry.slot(j) for j in among}
                def relation(p: int) -> tuple[bool, bool, bool, bool]:
                    flags = int(slots[p][r])
                    if self.entry.moved_on(call, p):   # its call did not name this peer
                        return p in srcs, p in dsts, False, False
                    return p in srcs, p in dsts, bool(flags & _SENDS), bool(flags & _EXPECTS)
                _check_pairs(call, among, relation)
                if not in_slot and not readable:   # this peer's array as messages
                    tickets = [post_range(data, d, adapter, flat, 0, count, track=True)
                               for d in dsts]
                counts = {j: int(headers[j][WORDS]) for j in srcs}
                out = adapter.empty(sum(counts.values()), call.dtype, flat)
                start = 0
                reader = None
                for src in order:
                    got, k = counts[src], start
                    start += got
                    if headers[src][WORDS + 1]:
                        adapter.copy(adapter.slice(out, k, k + got), adapter.from_frame(
                            slots[src][at:at + got * itemsize], call.frame_dtype, got))
                    elif readable:
                        reader = reader or cma.Reader()
                        where = (int(headers[src][PID]), int(headers[src][WORDS + 2]))
                        read_range(reader, call, src, where, 0, address_of(adapter, out, k),
                                   got * itemsize)
                    else:
                        theirs = Call(t, call.channel, call.seq, data.signature, call.dtype,
                                      (got,), call.deadline)
                        for a, b, chunk in recv_range(theirs, src, adapter, 0, got):
                            adapter.copy(adapter.slice(out, k + a, k + b), chunk)
                for ticket in tickets:
                    wait_sent(call, ticket)
                done = True
            finally:
                self.entry.leave(call)
                if address and dsts and self.entry.published == call.seq:
                    # Its array is read out of its memory: it stays as it is until every
                    # destination is done with it, failed or not (one paired with this peer
                    # may be reading it though this peer failed on another pair's pattern),
                    # so no reader gets a torn one. A failure is what is raised, not this
                    # wait's (bounded by the call's deadline).
                    try:
                        self.entry.await_readers(call, dsts)
                    except Exception:
                        if done:
                            raise
        return out, counts

    def _patterns(self, at: int, n: int) -> list[np.ndarray]:
        """Every rank's pattern in its slot, by rank: (2, n) float64, its weights sent and
        received (views made once per size and mapping)."""
        arenas = self.entry.arenas
        if self._views is None or self._views[0] is not arenas or self._views[1:3] != (at, n):
            views = [self.entry.slot(j)[at:at + 16 * n].view(np.float64).reshape(2, n)
                     for j in range(n)]
            self._views = (arenas, at, n, views)
        return self._views[3]


#: A rank's byte in a gathering peer's pattern (the start of its slot): it sends to that rank,
#: it expects from it.
_SENDS, _EXPECTS = 1, 2


def _flags_bytes(n: int) -> int:
    """Where a gathering peer's array starts in its slot: after its pattern (a byte per rank),
    at a cache line."""
    return -(-n // 64) * 64


def _check_pairs(call: Call, among: list[int],
                 relation: Callable[[int], tuple[bool, bool, bool, bool]]) -> None:
    """The pattern of this peer pairs with each of ``among``'s, else the ValueError of a
    pattern that does not pair, worded as the copying exchange's (pattern.py), naming both:
    ``relation(p)`` says whether this peer expects data from p and sends to it, and whether
    p sends to this peer and expects from it."""
    r = call.transport.rank
    problems: list[str] = []
    for p in among:
        expects, sends, p_sends, p_expects = relation(p)
        if not (p_sends or p_expects):
            problems.append(uninvolved(r, p, call.seq, expects, sends))
        else:
            problems += pair_problems(r, p, expects=expects, sends=sends, p_sends=p_sends,
                                      p_expects=p_expects)
    if problems:
        raise ValueError(unpaired(call, problems))
