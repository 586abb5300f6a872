"""reduce, gather, scatter and alltoall (collectives/operations/rooted.py) between real peer
processes: the results MPI and torch.distributed document, for every root, awkward sizes (fewer
elements than peers, not a multiple of n), numpy and torch, the non-blocking twins, and a
mismatched call raising instead of hanging."""
from __future__ import annotations

import numpy as np
import pytest

from gossip.testing import spawn


def rooted_all(peer, sizes):
    n, r = peer.world_size, peer.rank
    out = []
    for count in sizes:
        for root in range(n):
            x = np.arange(count, dtype=np.float64) * (r + 1)
            keep = x.copy()
            peer.reduce(x, root)
            want = np.arange(count, dtype=np.float64) * n * (n + 1) / 2
            out.append(("reduce", count, root,
                        np.array_equal(x, want) if r == root else np.array_equal(x, keep)))
            x = np.full(count, float(r + 1))
            peer.reduce(x, root, "max")
            out.append(("max", count, root, r != root or np.all(x == n)))
            x = np.arange(count, dtype=np.float32) + 1
            peer.reduce(x, root, "mean")
            out.append(("mean", count, root, r != root or np.allclose(x, np.arange(count) + 1)))
            g = peer.gather(np.full((count, 2), r, dtype=np.int32), root)
            ok = g is None if r != root else (
                g.shape == (n, count, 2) and all(np.all(g[k] == k) for k in range(n)))
            out.append(("gather", count, root, ok))
            src = np.arange(n * count, dtype=np.int64).reshape(n, count) if r == root else None
            part = np.empty(count, dtype=np.int64)
            peer.scatter(src, root, out=part)
            out.append(("scatter", count, root,
                        np.array_equal(part, np.arange(r * count, (r + 1) * count))))
        x = (np.arange(n * count) + 1000 * r).astype(np.float32)
        y = peer.alltoall(x)
        want = np.concatenate([np.arange(r * count, (r + 1) * count) + 1000 * k
                               for k in range(n)]).astype(np.float32)
        out.append(("alltoall", count, None, np.array_equal(y, want)))
    # Non-blocking twins, in call order with a blocking call between them.
    x = np.ones(5)
    w1 = peer.reduce(x, 0, wait=False)
    g = peer.gather(np.full(2, r), 1)
    w1.wait()
    w2 = peer.alltoall(np.arange(n * 3, dtype=np.float64) + r, wait=False)
    y = w2.wait()
    out.append(("async", None, None, (r != 0 or np.all(x == n)) and (r != 1 or g.shape == (n, 2))
                and y.shape == (n * 3,)))
    return out


@pytest.mark.parametrize("n", [2, 3])
def test_reduce_gather_scatter_alltoall_every_root(n):
    for rows in spawn(rooted_all, n=n, timeout=120, args=([1, 7, 1000],)):
        bad = [row for row in rows if not row[3]]
        assert not bad and len(rows) > 10, bad


def torch_rooted(peer):
    import torch
    n, r = peer.world_size, peer.rank
    x = torch.arange(6, dtype=torch.float32) * (r + 1)
    peer.reduce(x, 1)
    g = peer.gather(torch.full((3,), float(r)), 0)
    part = torch.empty(2)
    peer.scatter(torch.arange(2.0 * n) if r == 0 else None, 0, out=part)
    y = peer.alltoall(torch.arange(2 * n, dtype=torch.float64) + 10 * r)
    return (x.tolist() if r == 1 else None, None if g is None else g.tolist(), part.tolist(),
            y.tolist(), type(y).__name__)


def test_torch_tensors():
    results = spawn(torch_rooted, n=2, timeout=60)
    assert results[1][0] == [k * 3.0 for k in range(6)]
    assert results[0][1] == [[0.0] * 3, [1.0] * 3] and results[1][1] is None
    assert results[0][2] == [0.0, 1.0] and results[1][2] == [2.0, 3.0]
    assert results[0][3] == [0.0, 1.0, 10.0, 11.0] and results[1][3] == [2.0, 3.0, 12.0, 13.0]
    assert results[0][4] == "Tensor"


def torch_large(peer):
    """Tensors past the slots, so the calls read and write the peers' memory directly (a
    reduce's segments and a gather's parts written into the root's tensors, a broadcast's
    share written by its root), 3 peers, no root at 0, a non-contiguous reduce."""
    import torch
    n, r = peer.world_size, peer.rank
    count = 100_001
    x = torch.arange(count, dtype=torch.float32) * (r + 1)
    peer.reduce(x, 2)
    wide = torch.zeros(count, 2, dtype=torch.float64)
    wide[:, 0] = torch.arange(count, dtype=torch.float64) + r
    column = wide[:, 0]   # strided: staged through a contiguous stand-in
    peer.reduce(column, 1, op="max")
    g = peer.gather(torch.full((count,), float(r)), 1)
    b = torch.full((count,), float(r))
    peer.broadcast(b, 2)
    return (x[[0, 1, -1]].tolist() if r == 2 else x[[1, -1]].tolist(),
            column[[0, -1]].tolist() if r == 1 else None,
            None if g is None else (tuple(g.shape), g[:, -1].tolist()),
            b[[0, count // 2, -1]].tolist(), peer.communicator._on_host.entry.direct)


def test_torch_tensors_past_the_slots():
    results = spawn(torch_large, n=3, timeout=90)
    count = 100_001
    assert results[2][0] == [0.0, 6.0, 6.0 * (count - 1)], results[2]
    for r in (0, 1):   # the others' x is left as it was
        assert results[r][0] == [float(r + 1), float((r + 1) * (count - 1))], results[r]
    assert results[1][1] == [2.0, float(count + 1)], results[1]
    assert results[1][2] == ((3, count), [0.0, 1.0, 2.0]) and results[0][2] is None
    for row in results:
        assert row[3] == [2.0, 2.0, 2.0], row
    assert all(row[4] for row in results) or not any(row[4] for row in results)


def mismatched_root(peer):
    import gossip
    try:
        peer.reduce(np.ones(4), root=peer.rank, timeout=20)   # each names itself the root
    except gossip.GossipError as exc:
        return type(exc).__name__, str(exc)
    return None


def test_peers_naming_different_roots_raise_on_every_peer():
    results = spawn(mismatched_root, n=2, timeout=60)
    assert all(r is not None and r[0] == "ProtocolError" for r in results), results
    assert all("reduce(sum,root=0)" in r[1] and "reduce(sum,root=1)" in r[1]
               for r in results), results
