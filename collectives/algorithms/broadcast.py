"""Pipelined broadcast: the array flows from the root along the ring, each peer forwarding a
chunk to the next the moment it arrives, so a large broadcast costs about one array transfer
plus (n - 2) chunk latencies.

The data closes with a dissemination barrier inside the same call. Data flows one way only,
so without it a peer hears only from the ranks before it on the ring: the root would never
notice that the others made another call (another collective, dtype, shape or root), and a
peer whose predecessor agrees with it would return while a peer further on raises (rank 0
root 0 against ranks 1 and 2 root 1: rank 2 would return rank 1's data). Every message of the
barrier carries this call's signature, and a peer leaves the barrier only once it has heard,
directly or through others, from every peer that finished its part of the data without error;
a peer that raised sends ABORT instead, so all the others raise too. Every ring link was
checked by its receiver before the barrier, so all the peers' calls were the same. It costs
ceil(log2 n) empty messages after the data (measured in the README's reliability table)."""
from __future__ import annotations

from typing import Any

from collectives.arrays.adapter import ArrayAdapter
from collectives.algorithms.barrier import dissemination_barrier
from collectives.algorithms.p2p import Call, post_range, recv_range, wait_sent

__all__ = ["pipelined_broadcast"]


def pipelined_broadcast(call: Call, adapter: ArrayAdapter, flat: Any, root: int) -> None:
    """Copy root's ``flat`` into every peer's ``flat``, in place; returns once every peer has
    its copy and this peer's own forward is off the buffer, so the caller may change it."""
    t = call.transport
    n, r = t.world_size, t.rank
    size = adapter.size(flat)
    nxt = (r + 1) % n
    is_last = nxt == root
    prv = (r - 1) % n
    ticket = None
    if r == root:
        ticket = post_range(call, nxt, adapter, flat, 0, size, track=True)
    else:
        for a, b, chunk in recv_range(call, prv, adapter, 0, size):
            part = adapter.slice(flat, a, b)
            adapter.copy(part, chunk)
            if not is_last:
                ticket = post_range(call, nxt, adapter, flat, a, b, track=True)
    dissemination_barrier(call)
    wait_sent(call, ticket)
