"""Dissemination barrier: ceil(log2 n) rounds of empty messages; in round k each peer signals
rank + 2^k and waits for rank - 2^k. No peer leaves before every peer has arrived."""
from __future__ import annotations

import numpy as np

from collectives.arrays.adapter import adapter_for
from collectives.algorithms.p2p import Call, post_range, recv_range

__all__ = ["dissemination_barrier"]

_EMPTY = np.empty(0, dtype=np.uint8)


def dissemination_barrier(call: Call) -> None:
    """Return only once every peer has called it: after round k this peer has heard, directly or
    through the ranks it heard from, from the 2^(k+1) - 1 ranks below it."""
    t = call.transport
    n, r = t.world_size, t.rank
    adapter = adapter_for(_EMPTY)
    k = 1
    while k < n:
        post_range(call, (r + k) % n, adapter, _EMPTY, 0, 0)
        for _ in recv_range(call, (r - k) % n, adapter, 0, 0):
            pass
        k <<= 1
