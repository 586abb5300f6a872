"""Communicator.isend, send's non-blocking twin (MPI's Isend): it posts at once, its
request completes when the buffer may change and the destination was reached, and messages
arrive in order. (send() is isend().wait(): a destination dead before any connection is
PeerLost at the deadline, tests/policies/test_policies.py.)"""
from __future__ import annotations

import numpy as np

from gossip.testing import spawn


def isend_in_order(peer):
    comm = peer.communicator
    if peer.rank == 0:
        big = np.arange(2 ** 21, dtype=np.float32)          # 8 MiB: chunked, tracked
        requests = [comm.isend(1, np.full(3, float(k))) for k in range(3)]
        requests.append(comm.isend(1, big))
        for request in requests:
            request.wait()
        return all(request.test() for request in requests)
    got = [comm.recv(0).tolist() for _ in range(3)]
    last = comm.recv(0)
    return got == [[float(k)] * 3 for k in range(3)] and float(last[-1]) == 2 ** 21 - 1


def test_isend_posts_in_order_and_completes():
    assert spawn(isend_in_order, n=2, timeout=60) == [True, True]
