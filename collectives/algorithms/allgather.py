"""Allgather over the ring, for equal and for variable sizes. Peer r's array travels n - 1 hops,
forwarded chunk by chunk as it arrives."""
from __future__ import annotations

from typing import Any

import numpy as np

from collectives.arrays.adapter import ArrayAdapter, adapter_for
from collectives.algorithms.p2p import Call, wait_sent
from collectives.algorithms.ring import ring_allgather

__all__ = ["ring_allgather_into", "exchange_counts"]


def ring_allgather_into(call: Call, adapter: ArrayAdapter, flat: Any, out: Any,
                        segs: list[tuple[int, int]]) -> None:
    """Gather every peer's ``flat`` into ``out`` (flat), peer i's at ``segs[i]``."""
    r = call.transport.rank
    lo, hi = segs[r]
    adapter.copy(adapter.slice(out, lo, hi), flat)
    if call.transport.world_size > 1:
        wait_sent(call, ring_allgather(call, adapter, out, segs=segs, owned_shift=0))


def exchange_counts(call: Call, count: int) -> list[int]:
    """Every peer's element count (the first phase of a variable-size allgather)."""
    n, r = call.transport.world_size, call.transport.rank
    counts = np.zeros(n, dtype=np.int64)
    counts[r] = count
    if n > 1:
        counts_call = Call(call.transport, call.channel, call.seq, call.signature + "[counts]",
                           "int64", (n,), call.deadline)
        np_adapter = adapter_for(counts)
        segs = [(i, i + 1) for i in range(n)]
        wait_sent(counts_call, ring_allgather(counts_call, np_adapter, counts, segs=segs,
                                              owned_shift=0))
    return [int(c) for c in counts]
