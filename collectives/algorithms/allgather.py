"""Allgather over the ring, for equal and for variable sizes: peer r's array travels n - 1 hops,
forwarded chunk by chunk as it arrives. And for small arrays, directly: every peer sends its
own to every other at once, one latency instead of n - 1 (each peer sends (n - 1) times its
array instead of forwarding, which only small arrays can afford)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from collectives.arrays.adapter import ArrayAdapter, adapter_for
from collectives.algorithms.p2p import Call, post_range, recv_range, wait_sent
from collectives.algorithms.ring import ring_allgather

__all__ = ["ring_allgather_into", "direct_allgather", "exchange_counts"]


def ring_allgather_into(call: Call, adapter: ArrayAdapter, flat: Any, out: Any,
                        segs: list[tuple[int, int]]) -> None:
    """Gather every peer's ``flat`` into ``out`` (flat), peer i's at ``segs[i]``."""
    r = call.transport.rank
    lo, hi = segs[r]
    adapter.copy(adapter.slice(out, lo, hi), flat)
    if call.transport.world_size > 1:
        wait_sent(call, ring_allgather(call, adapter, out, segs=segs, owned_shift=0))


def direct_allgather(call: Call, adapter: ArrayAdapter, flat: Any,
                     segs: list[tuple[int, int]]) -> None:
    """Allgather in place: peer r owns ``segs[r]`` of ``flat`` and ends with every peer's,
    each received from its owner (all sends posted first, so every link is busy at once)."""
    t = call.transport
    n, r = t.world_size, t.rank
    lo, hi = segs[r]
    tickets = [post_range(call, (r + k) % n, adapter, flat, lo, hi, track=True)
               for k in range(1, n)]
    for k in range(1, n):   # the nearest first: in a ring's order, as the sends went out
        src = (r - k) % n
        a0, b0 = segs[src]
        for a, b, chunk in recv_range(call, src, adapter, a0, b0):
            adapter.copy(adapter.slice(flat, a, b), chunk)
    for ticket in tickets:
        wait_sent(call, ticket)


def exchange_counts(call: Call, words: Sequence[int]) -> np.ndarray:
    """Every peer's ``words`` (as many on every peer; a variable-size allgather's element
    count and out= size), by rank: an (n, len(words)) int64 array, over the ZeroMQ ring."""
    n, r = call.transport.world_size, call.transport.rank
    k = len(words)
    rows = np.zeros(n * k, dtype=np.int64)
    rows[r * k:(r + 1) * k] = words
    if n > 1:
        counts_call = Call(call.transport, call.channel, call.seq, call.signature + "[counts]",
                           "int64", (n * k,), call.deadline)
        np_adapter = adapter_for(rows)
        segs = [(i * k, (i + 1) * k) for i in range(n)]
        wait_sent(counts_call, ring_allgather(counts_call, np_adapter, rows, segs=segs,
                                              owned_shift=0))
    return rows.reshape(n, k)
