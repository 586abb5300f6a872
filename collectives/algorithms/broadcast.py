"""Pipelined broadcast: the array flows from the root along the ring, each peer forwarding a
chunk to the next the moment it arrives, so a large broadcast costs about one array transfer
plus (n - 2) chunk latencies.

The ring is closed by an acknowledgement: the last peer sends the root one empty chunk of the
same call once it has everything. Without it the root receives nothing, so it could never
notice that the others made another call (another collective, dtype, shape or root): it would
return normally while they raise. Every peer thus checks the call of the peer before it on the
ring, the root included, and peers that pass different roots meet a chunk of the other call
where they expected theirs. The root returns about one ring traversal later than without it;
the others are not delayed."""
from __future__ import annotations

from typing import Any

from collectives.arrays.adapter import ArrayAdapter
from collectives.algorithms.p2p import Call, post_range, recv_range, wait_sent

__all__ = ["pipelined_broadcast"]


def pipelined_broadcast(call: Call, adapter: ArrayAdapter, flat: Any, root: int) -> None:
    """Copy root's ``flat`` into every peer's ``flat``, in place; returns once this peer's own
    forward is off the buffer, so the caller may change it."""
    t = call.transport
    n, r = t.world_size, t.rank
    size = adapter.size(flat)
    nxt = (r + 1) % n
    is_last = nxt == root
    prv = (r - 1) % n
    if r == root:
        ticket = post_range(call, nxt, adapter, flat, 0, size, track=True)
        for _ in recv_range(call, prv, adapter, 0, 0):  # the acknowledgement
            pass
        wait_sent(call, ticket)
        return
    ticket = None
    for a, b, chunk in recv_range(call, prv, adapter, 0, size):
        part = adapter.slice(flat, a, b)
        adapter.copy(part, chunk)
        if not is_last:
            ticket = post_range(call, nxt, adapter, flat, a, b, track=True)
    if is_last:
        post_range(call, root, adapter, flat, 0, 0)  # empty: copied, nothing to wait for
    wait_sent(call, ticket)
