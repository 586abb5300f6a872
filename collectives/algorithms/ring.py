"""Bandwidth-optimal ring algorithms: reduce-scatter, allgather, and allreduce as the two back
to back. Each peer sends 2(n-1)/n of the array in an allreduce, the lower bound.

Everything is pipelined chunk by chunk: a chunk is forwarded to the right neighbour the moment
it has been reduced (or copied), so sending, receiving and reducing overlap across steps and
across the two phases. Every element of the result is reduced by exactly one peer and copied to
the others, so all peers end with bitwise-identical arrays.
"""
from __future__ import annotations

import operator
import zlib
from typing import Any

from collectives.algorithms.p2p import Call, post_range, recv_range, wait_sent
from collectives.arrays.adapter import ArrayAdapter

__all__ = ["segments", "segments_of_counts", "counts_digest", "ring_reduce_scatter",
           "ring_allgather", "ring_allreduce"]


def segments(count: int, n: int) -> list[tuple[int, int]]:
    """Split ``count`` elements into ``n`` balanced contiguous segments (some may be empty)."""
    bounds = [count * i // n for i in range(n + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(n)]


def segments_of_counts(counts: Any, size: int | None, n: int, rank: int,
                       what: str) -> list[tuple[int, int]]:
    """Per-peer [lo, hi) runs of ``counts`` (n non-negative ints adding up to ``size`` unless
    it is None; MPI's recvcounts), else ValueError naming ``what``, before the call takes a
    sequence number."""
    try:   # (integers only: int(1.7) would cut a float count short, silently)
        values = [operator.index(c) for c in counts]
    except (TypeError, ValueError):
        raise ValueError(f"rank {rank}: {what} counts must be {n} integers, got "
                         f"{counts!r}") from None
    if len(values) != n or any(c < 0 for c in values) or \
            (size is not None and sum(values) != size):
        total = "" if size is None else f" adding up to the {size} elements"
        raise ValueError(f"rank {rank}: {what} counts {values} must be {n} non-negative "
                         f"integers{total}")
    bounds = [0]
    for c in values:
        bounds.append(bounds[-1] + c)
    return [(bounds[i], bounds[i + 1]) for i in range(n)]


def counts_digest(values: list[int]) -> str:
    """Counts as a call's signature names them: in full when short, else a CRC of them (peers
    that disagree still differ)."""
    text = ",".join(map(str, values))
    return f"[{text}]" if len(text) <= 48 else f"crc32:{zlib.crc32(text.encode()):08x}"


def _place(call: Call, ring: list[int] | None) -> tuple[int, int, int, int]:
    """(n, position, right, left) of this peer in ``ring`` (ranks in ring order; default:
    every rank in rank order)."""
    t = call.transport
    if ring is None:
        n, r = t.world_size, t.rank
        return n, r, (r + 1) % n, (r - 1) % n
    n, r = len(ring), ring.index(t.rank)
    return n, r, ring[(r + 1) % n], ring[(r - 1) % n]


def ring_reduce_scatter(call: Call, adapter: ArrayAdapter, flat: Any, op: str, *,
                        segs: list[tuple[int, int]], divide_by: int = 0,
                        forward_final: bool = False, ring: list[int] | None = None,
                        aside: bool = False, into: Any = None):
    """Reduce-scatter in place: afterwards the peer at position r of ``ring`` (default: rank
    r of every rank) holds the reduced segment (r + 1) % n; ``segs`` has one per position.

    With ``divide_by``, the owned segment is divided (op "mean"). With ``forward_final``, each
    finished chunk goes straight on to the right neighbour as the first allgather step.
    With ``aside``, the partial sums a peer forwards are made in a buffer (two segments,
    taken in turn), not in ``flat``, which then only ever holds this peer's own values or its
    finished segment: a call that fails half-way leaves no partial sum in it. ``into``: a
    buffer of the owned segment's length that gets the reduced segment instead of ``flat``
    (forward_final then sends it from there).
    Returns the ticket of the last send (to wait on before the buffer may change).
    """
    n, r, right, left = _place(call, ring)
    lo, hi = segs[r]
    ticket = post_range(call, right, adapter, flat, lo, hi)
    buffers: list[Any] = [None, None]
    sent: list[Any] = [None, None]   # the last send out of each buffer
    for s in range(n - 1):
        lo, hi = segs[(r - s - 1) % n]
        last = s == n - 2
        buffer = None
        if aside and not last:
            k = s % 2
            wait_sent(call, sent[k])   # (sent two steps ago: long taken, in practice)
            if buffers[k] is None:
                longest = max(b - a for a, b in segs)
                buffers[k] = adapter.empty(longest, adapter.dtype_name(flat), flat)
            buffer = buffers[k]
        for a, b, chunk in recv_range(call, left, adapter, lo, hi):
            part = adapter.slice(flat, a, b)
            if buffer is not None:
                partial = adapter.slice(buffer, a - lo, b - lo)
                adapter.reduce_into(op, partial, part, chunk)
                ticket = sent[k] = post_range(call, right, adapter, buffer, a, b, track=True,
                                              at=lo)
                continue
            if last and into is not None:
                target = adapter.slice(into, a - lo, b - lo)
                adapter.reduce_into(op, target, part, chunk)
                if divide_by:
                    adapter.divide(target, divide_by)
                if forward_final:
                    ticket = post_range(call, right, adapter, into, a, b, track=True, at=lo)
                continue
            adapter.reduce(op, part, chunk)
            if last and divide_by:
                adapter.divide(part, divide_by)
            if not last or forward_final:
                ticket = post_range(call, right, adapter, flat, a, b, track=True)
    return ticket


def ring_allgather(call: Call, adapter: ArrayAdapter, flat: Any, *,
                   segs: list[tuple[int, int]], first_sent: bool = False, owned_shift: int = 1,
                   ring: list[int] | None = None):
    """Allgather in place: the peer at position r of ``ring`` (as ring_reduce_scatter's)
    starts owning segment (r + owned_shift) % n and ends with all of them. ``first_sent``: the
    owned segment was already forwarded (by a pipelined reduce-scatter). Returns the ticket of
    the last send."""
    n, r, right, left = _place(call, ring)
    ticket = None
    if not first_sent:
        lo, hi = segs[(r + owned_shift) % n]
        ticket = post_range(call, right, adapter, flat, lo, hi, track=True)
    for s in range(n - 1):
        lo, hi = segs[(r + owned_shift - s - 1) % n]
        forward = s < n - 2
        for a, b, chunk in recv_range(call, left, adapter, lo, hi):
            adapter.copy(adapter.slice(flat, a, b), chunk)
            if forward:
                ticket = post_range(call, right, adapter, flat, a, b, track=True)
    return ticket


def ring_allreduce(call: Call, adapter: ArrayAdapter, flat: Any, op: str, *,
                   ring: list[int] | None = None, lo: int = 0, hi: int | None = None,
                   divide_by: int | None = None) -> None:
    """Ring allreduce in place (reduce-scatter then allgather, pipelined across the phases)
    of elements [lo, hi) of ``flat`` among ``ring`` (ranks in ring order; default every rank).
    Op "mean" divides by ``divide_by`` (default: the ring's size). ``flat`` only ever holds
    this peer's own values or results (ring_reduce_scatter's ``aside``): a call that fails
    leaves each element one or the other."""
    n = call.transport.world_size if ring is None else len(ring)
    hi = adapter.size(flat) if hi is None else hi
    segs = [(lo + a, lo + b) for a, b in segments(hi - lo, n)]
    divide_by = (n if divide_by is None else divide_by) if op == "mean" else 0
    reduce_op = "sum" if op == "mean" else op
    ticket = ring_reduce_scatter(call, adapter, flat, reduce_op, segs=segs, divide_by=divide_by,
                                 forward_final=True, ring=ring, aside=True)
    ticket = ring_allgather(call, adapter, flat, segs=segs, first_sent=True, ring=ring) or ticket
    wait_sent(call, ticket)
