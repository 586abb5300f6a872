"""One peer of the measured-ring test across hosts (tests/collectives/test_ring_order.py), run
inside a host's network namespace, one peer per namespace:

    ip netns exec NS python tests/collectives/workers/ring_order_worker.py OUT   # GOSSIP_* set

It measures the links and orders the ring (``peer.order_ring``), then runs one "auto" allreduce
(across hosts with one peer a host: the ring, in that order) of integers, and writes to OUT
(JSON): the measured rates (its row is its own links), the ring, whether the result equals the
exact sum, a digest of it, and the bytes it sent to each other peer during the allreduce. The
arrays are the two-level test's (hierarchical_worker.data).
"""
from __future__ import annotations

import hashlib
import sys

import numpy as np

from hierarchical_worker import data, finish   # (this folder: sys.path[0])

import gossip  # noqa: E402  (hierarchical_worker put the repository on sys.path)


def main() -> int:
    peer = gossip.init()
    t = peer.transport
    n, r = peer.world_size, peer.rank
    ring = peer.order_ring(256 << 10, repeats=2)
    rates = peer.communicator.measure_links(256 << 10, repeats=1)   # a second call: it agrees
    want = sum(data(j) for j in range(n))
    x = data(r)
    before = {j: t.counters[j].bytes_sent for j in range(n) if j != r}
    peer.allreduce(x)
    sent = {j: t.counters[j].bytes_sent - before[j] for j in before}
    out = {"ring": ring, "communicator_ring": peer.communicator.ring,
           "rates": [list(row) for row in rates.rates], "exact": bool(np.array_equal(x, want)),
           "digest": hashlib.sha256(x.tobytes()).hexdigest(), "sent": sent}
    return finish(peer, out, sys.argv[1])


if __name__ == "__main__":
    sys.exit(main())
