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


def to_itself(peer):
    # mpi4py's testISendAndRecv: a rank sends to itself, then receives; in order, a copy taken
    # at the send (the array changed after it), into out= or not, and among other sources.
    import torch
    r, comm = peer.rank, peer.communicator
    x = np.arange(4.0) + 10 * r
    request = comm.isend(r, x)
    assert request.test()
    x[:] = -1.0
    peer.send(r, np.full((2, 2), r, dtype=np.int32))
    peer.send(r, torch.ones(3, dtype=torch.bfloat16))
    first = peer.recv(r).tolist()
    into = np.zeros((2, 2), np.int32)
    try:
        peer.recv(r, out=np.zeros(3))   # does not fit: refused, the message stays
        refused = None
    except ValueError as exc:
        refused = str(exc)
    peer.recv(r, out=into)
    half = peer.recv(r)
    ready = comm.wait_any([(r + 1) % peer.world_size, r], timeout=0)   # nothing waits
    peer.send(r, np.ones(1))
    ready_after = comm.wait_any([(r + 1) % peer.world_size, r], timeout=5)
    peer.recv(r)
    return first, into.tolist(), refused, str(half.dtype), ready, ready_after


def test_a_peer_sends_to_itself_as_mpi_allows():
    for r, (first, into, refused, half, ready, ready_after) in enumerate(
            spawn(to_itself, n=2, timeout=60)):
        assert first == [10.0 * r + k for k in range(4)]
        assert into == [[r, r], [r, r]]
        assert refused is not None and f"rank {r}: recv from rank {r} (itself)" in refused
        assert half == "torch.bfloat16"
        assert ready is None and ready_after == r
