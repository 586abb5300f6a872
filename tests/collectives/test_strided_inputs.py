"""Non-contiguous arrays in every collective and in send/recv (collectives/staging.py):
a column of a matrix, every other element, a transposed tensor. The call works on a
contiguous copy and the arrays it writes take the result back (before a blocking call
returns, before a non-blocking one's Work is done); the elements around a strided view are
never touched. Real peer processes, numpy and torch."""
from __future__ import annotations

import numpy as np
import pytest

from gossip.testing import spawn


def strided_numpy(peer):
    n, r = peer.world_size, peer.rank
    out = {}
    m = np.full((4, 3), float(r + 1))
    peer.allreduce(m[:, 1])                                  # a column, in place
    out["allreduce column"] = (np.all(m[:, 1] == n * (n + 1) / 2)
                               and np.all(m[:, [0, 2]] == r + 1))
    m = np.full((4, 3), float(r + 1))
    work = peer.allreduce(m[:, 2], op="max", wait=False)
    out["non-blocking"] = work.wait() is not None and np.all(m[:, 2] == n) \
        and np.all(m[:, :2] == r + 1)
    b = np.zeros(10)
    if r == 0:
        b[::2] = np.arange(5)
    peer.broadcast(b[::2])
    out["broadcast every other"] = b[::2].tolist() == list(range(5)) and not b[1::2].any()
    x = np.arange(8.0)[::2] + 10 * r                         # strided input, read only
    g = np.zeros((n, 8))
    peer.allgather(x, out=g[:, ::2])
    out["allgather strided in and out"] = all(
        g[k, ::2].tolist() == (np.arange(8.0)[::2] + 10 * k).tolist() for k in range(n)) \
        and not g[:, 1::2].any()
    base = np.zeros(4 * n)
    base[::2] = np.arange(2.0 * n) * (r + 1)
    x = base[::2]                                            # every other element
    keep = x.copy()
    seg = peer.reduce_scatter(x)
    out["reduce_scatter leaves x"] = np.array_equal(x, keep) and np.array_equal(
        seg, np.arange(2.0 * r, 2.0 * r + 2) * n * (n + 1) / 2)
    big = np.full((3, 2), float(r + 1))
    peer.reduce(big[:, 0], root=1)
    out["reduce into a column at the root"] = (r != 1 or np.all(big[:, 0] == n * (n + 1) / 2)) \
        and np.all(big[:, 1] == r + 1)
    go = np.zeros((n, 6))
    got = peer.gather(np.full(3, float(r)), root=0, out=go[:, ::2] if r == 0 else None)
    out["gather into strided out"] = r != 0 or (
        got is not None and all(np.all(go[k, ::2] == k) for k in range(n))
        and not go[:, 1::2].any())
    part = np.zeros(6)
    src = np.arange(2.0 * n * 2)[::2] if r == 0 else None
    peer.scatter(src, root=0, out=part[::3])
    out["scatter into strided out"] = part[::3].tolist() == [2.0 * 2 * r, 2.0 * (2 * r + 1)] \
        and not part[1::3].any() and not part[2::3].any()
    a = (np.arange(2.0 * n) + 100 * r)
    wide = np.zeros(4 * n)
    peer.alltoall(np.repeat(a, 2)[::2], out=wide[::2])
    out["alltoall strided"] = wide[::2].tolist() == [
        float(2 * r + i + 100 * k) for k in range(n) for i in range(2)]
    y = np.zeros((5, 2))
    y[:, 0] = r
    peer.neighbor_average(y[:, 0])
    nbrs = peer.topology.in_neighbors(r)
    out["neighbor_average column"] = np.allclose(y[:, 0], (r + sum(nbrs)) / (1 + len(nbrs))) \
        and not y[:, 1].any()
    ng = peer.neighbor_allgather(np.full((3, 2), float(r))[:, 1])
    out["neighbor_allgather strided"] = ng.tolist() == [float(s) for s in nbrs for _ in range(3)]
    if r == 0:
        peer.send(1, np.arange(12.0).reshape(3, 4)[:, 1])
    elif r == 1:
        buf = np.zeros((3, 4))
        peer.recv(0, out=buf[:, 2])
        out["send/recv strided"] = buf[:, 2].tolist() == [1.0, 5.0, 9.0] and \
            not buf[:, [0, 1, 3]].any()
    return out


@pytest.mark.parametrize("n", [2, 3])
def test_every_collective_takes_non_contiguous_numpy_arrays(n):
    for r, result in enumerate(spawn(strided_numpy, n=n, timeout=90, topology="ring")):
        assert all(result.values()), (r, result)


def strided_torch(peer):
    import torch
    n, r = peer.world_size, peer.rank
    m = torch.full((3, 4), float(r + 1))
    t = m.t()                                      # (4, 3), not contiguous
    peer.allreduce(t)
    ok_sum = bool(torch.all(m == n * (n + 1) / 2))
    w = torch.nn.Parameter(torch.full((4, 2), float(r)))
    peer.broadcast(w[:, 1], root=1)                # a leaf tracked by autograd: as optimizers
    ok_bcast = bool(torch.all(w[:, 1] == 1.0)) and bool(torch.all(w[:, 0] == r))
    g = peer.allgather(torch.arange(6.0)[::2] + r)
    ok_gather = g.tolist() == [[0.0 + k, 2.0 + k, 4.0 + k] for k in range(n)]
    return ok_sum, ok_bcast, ok_gather


def test_non_contiguous_torch_tensors():
    for result in spawn(strided_torch, n=2, timeout=60, preload=("torch",)):
        assert result == (True, True, True), result
