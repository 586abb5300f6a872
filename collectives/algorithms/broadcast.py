"""Pipelined broadcast: the array flows from the root along the ring, each peer forwarding a
chunk to the next the moment it arrives, so a large broadcast costs about one array transfer
plus (n - 2) chunk latencies."""
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
    if r == root:
        wait_sent(call, post_range(call, nxt, adapter, flat, 0, size, track=True))
        return
    ticket = None
    for a, b, chunk in recv_range(call, (r - 1) % n, adapter, 0, size):
        part = adapter.slice(flat, a, b)
        adapter.copy(part, chunk)
        if not is_last:
            ticket = post_range(call, nxt, adapter, flat, a, b, track=True)
    wait_sent(call, ticket)
