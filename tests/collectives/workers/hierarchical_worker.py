"""One peer of the two-level allreduce test across hosts
(tests/collectives/test_hierarchical.py), run inside a host's network namespace, two or more
peers per namespace:

    ip netns exec NS python tests/collectives/workers/hierarchical_worker.py OUT   # GOSSIP_* set

It runs one "auto" allreduce and one flat-ring allreduce of the same integers, and writes to
OUT (JSON): whether each equals the exact sum, a digest of each result, the bytes it sent to
peers on other hosts during each, and the address of every other peer.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))   # the repository

import gossip  # noqa: E402

COUNT = 1 << 19   # 4 MiB of int64: above the small-message path


def data(rank: int) -> np.ndarray:
    return np.random.default_rng(rank).integers(-1000, 1000, COUNT).astype(np.int64)


def main() -> int:
    peer = gossip.init()
    t = peer.transport
    n, r = peer.world_size, peer.rank
    want = sum(data(j) for j in range(n))
    away = [j for j in range(n) if t.hosts[j] != t.hosts[r]]
    out = {"addresses": {j: t.address(j) for j in range(n) if j != r}, "away": away}
    for algorithm in ("auto", "ring"):
        x = data(r)
        before = sum(t.counters[j].bytes_sent for j in away)
        peer.allreduce(x, algorithm=algorithm)
        out[algorithm] = {"exact": bool(np.array_equal(x, want)),
                          "digest": hashlib.sha256(x.tobytes()).hexdigest(),
                          "away_bytes": sum(t.counters[j].bytes_sent for j in away) - before}
    return finish(peer, out, sys.argv[1])


def finish(peer, out: dict, path: str) -> int:
    """Once every peer is done, write ``out`` to ``path`` (whole, or not at all), close."""
    peer.barrier()
    with open(path + ".tmp", "w") as f:
        json.dump(out, f)
    os.replace(path + ".tmp", path)
    peer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
