"""The consensus distance: how far the replicas' parameters are apart, a diagnostic of the
decentralized policies (Policy.stats(consensus=True))."""
from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np

__all__ = ["consensus_distance"]


def consensus_distance(peer: Any, buffers: Iterable[Any], timeout: float) -> float:
    """||x_i - mean_j x_j|| over ``buffers`` (this peer's flat parameters), averaged over the
    peers, by allreduces on the peer's main channel: a collective, so every peer calls it
    at the same point with the same buffers. Allocates a float64 copy of each buffer."""
    total = 0.0
    for flat in buffers:
        # In float64: a float32 mean rounds, and identical replicas would read as apart.
        if isinstance(flat, np.ndarray):
            mine = flat.astype(np.float64)
        else:
            mine = flat.detach().double().contiguous()
        mean = mine.copy() if isinstance(mine, np.ndarray) else mine.clone()
        peer.allreduce(mean, op="mean", timeout=timeout)
        diff = mine - mean
        total += float((diff * diff).sum())
    distance = np.array([math.sqrt(total)], dtype=np.float64)
    peer.allreduce(distance, op="mean", timeout=timeout)
    return float(distance[0])
