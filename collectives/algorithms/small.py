"""Latency-optimal allreduce for small arrays: recursive doubling, log2(n) exchanges of the
whole array instead of the ring's 2(n-1) steps.

For a world size that is not a power of two, the ranks above the largest power of two p first
fold their array into rank (r - p), sit out the doubling, and get the result back at the end.
Partners at each level compute the same pair with the operands in the same order, so all peers
end with identical bytes.
"""
from __future__ import annotations

from typing import Any

from collectives.arrays.adapter import ArrayAdapter
from collectives.algorithms.p2p import Call, post_range, recv_range, wait_sent

__all__ = ["recursive_doubling_allreduce"]


def _exchange(call: Call, adapter: ArrayAdapter, flat: Any, partner: int, op: str,
              size: int, scratch: Any) -> None:
    # The send reads `flat` without a copy while the partner's data arrives, so reduce into a
    # scratch buffer and write back only once our own send is off the buffer. Both partners
    # compute (lower rank's block) op (higher rank's block) with the operands in that order:
    # with fused multiply-add, complex products are not commutative bit for bit.
    ticket = post_range(call, partner, adapter, flat, 0, size, track=True)
    lower = call.transport.rank < partner
    for a, b, chunk in recv_range(call, partner, adapter, 0, size):
        part, own = adapter.slice(scratch, a, b), adapter.slice(flat, a, b)
        if lower:
            adapter.reduce_into(op, part, own, chunk)
        else:
            adapter.reduce_into(op, part, chunk, own)
    wait_sent(call, ticket)
    adapter.copy(flat, scratch)


def recursive_doubling_allreduce(call: Call, adapter: ArrayAdapter, flat: Any, op: str) -> None:
    """Reduce ``flat`` in place across all peers with ``op`` ("mean": a sum, divided at the end);
    every peer ends with the same bytes."""
    t = call.transport
    n, r = t.world_size, t.rank
    size = adapter.size(flat)
    reduce_op = "sum" if op == "mean" else op
    p = 1 << (n.bit_length() - 1)  # largest power of two <= n
    if r >= p:  # fold in, wait for the result
        wait_sent(call, post_range(call, r - p, adapter, flat, 0, size, track=True))
        for a, b, chunk in recv_range(call, r - p, adapter, 0, size):
            adapter.copy(adapter.slice(flat, a, b), chunk)
        return
    # The levels work on a copy: a call that fails leaves ``flat`` as it was (or, where the
    # last copy back ran, at its result), never a partial sum.
    work = adapter.clone(flat)
    scratch = adapter.empty(size, adapter.dtype_name(flat), flat)
    if r + p < n:
        for a, b, chunk in recv_range(call, r + p, adapter, 0, size):
            adapter.reduce(reduce_op, adapter.slice(work, a, b), chunk)
    mask = 1
    while mask < p:
        _exchange(call, adapter, work, r ^ mask, reduce_op, size, scratch)
        mask <<= 1
    if op == "mean":
        adapter.divide(work, n)
    adapter.copy(flat, work)
    if r + p < n:
        wait_sent(call, post_range(call, r + p, adapter, flat, 0, size, track=True))
