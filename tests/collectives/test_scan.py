"""Prefix reductions (Communicator.scan, MPI_Scan and MPI_Exscan's semantics, as mpi4py's
test_cco_buf.py testScan / testExscan check them): peer r's array becomes the reduction of
peers 0..r's (exclusive: 0..r-1's), for every op and dtype, sizes across the chunk size,
odd world sizes; a mismatched call is a ProtocolError on every peer; a prefix mean is
refused before the call takes a sequence number. Real peers over real sockets."""
from __future__ import annotations

import numpy as np
import pytest

from gossip.testing import spawn

OPS = ("sum", "prod", "max", "min")
DTYPES = ("float64", "float32", "int64", "int32", "uint8")


def _input(rank: int, count: int, dtype: str) -> np.ndarray:
    """Rank r's array: small values (a product of 5 stays exact in every dtype)."""
    values = (np.arange(count) + 3 * rank) % 3 + (rank % 2)
    return values.astype(dtype)


def _expected(rank: int, count: int, dtype: str, op: str, exclusive: bool) -> np.ndarray:
    arrays = [_input(j, count, dtype) for j in range(rank + (0 if exclusive else 1))]
    if not arrays:   # rank 0 of an exscan: the op's identity
        identity = {"sum": 0, "prod": 1}.get(op)
        if identity is None:
            info = np.finfo(dtype) if np.dtype(dtype).kind == "f" else np.iinfo(dtype)
            identity = info.min if op == "max" else info.max
            if np.dtype(dtype).kind == "f":
                identity = -np.inf if op == "max" else np.inf
        return np.full(count, identity, dtype)
    fold = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[op]
    acc = arrays[0].copy()
    for a in arrays[1:]:
        acc = fold(acc, a, dtype=dtype)
    return acc


def every_op(peer, count: int):
    """Every op, dtype and form; returns the mismatches as (op, dtype, exclusive)."""
    wrong = []
    for exclusive in (False, True):
        for op in OPS:
            for dtype in DTYPES:
                x = _input(peer.rank, count, dtype)
                got = peer.scan(x, op, exclusive=exclusive)
                want = _expected(peer.rank, count, dtype, op, exclusive)
                if got is not x or got.dtype != np.dtype(dtype) or not np.array_equal(got, want):
                    wrong.append((op, dtype, exclusive))
    for op, fold in (("band", np.logical_and), ("bor", np.logical_or),
                     ("bxor", np.logical_xor)):
        rows = [np.array([j % 2 == 0, j % 3 == 0, True]) for j in range(peer.rank + 1)]
        want = rows[0]
        for row in rows[1:]:
            want = fold(want, row)
        x = rows[-1].copy()
        peer.scan(x, op)
        if not np.array_equal(x, want):
            wrong.append((op, "bool", False))
        x = rows[-1].copy()
        peer.scan(x, op, exclusive=True)
        if peer.rank == 0:   # the identity
            want = np.full(3, op == "band")
        else:
            want = rows[0]
            for row in rows[1:-1]:
                want = fold(want, row)
        if not np.array_equal(x, want):
            wrong.append((op, "bool", True))
    return wrong


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_scan_and_exscan_give_every_peer_its_prefix_for_every_op_and_dtype(n):
    for wrong in spawn(every_op, n=n, timeout=120, args=(7,)):
        assert wrong == [], wrong


def large(peer):
    """Arrays of several chunks, non-contiguous, and a Work."""
    r = peer.rank
    x = np.arange(3 << 20, dtype=np.float64) * (r + 1)
    peer.scan(x)
    strided = np.full((6, 4), float(r + 1))[:, ::2]   # not contiguous
    peer.scan(strided, "max", exclusive=True)
    work = peer.scan(np.full(5, r + 1, dtype=np.int64), "prod", wait=False)
    return x, strided, work.wait()


def test_large_strided_and_non_blocking_scans():
    n = 4
    for r, (x, strided, prod) in enumerate(spawn(large, n=n, timeout=120)):
        total = sum(j + 1 for j in range(r + 1))
        assert np.array_equal(x, np.arange(3 << 20, dtype=np.float64) * total), r
        assert np.array_equal(strided, np.full((6, 2), float(r) if r else -np.inf)), (r, strided)
        assert prod.tolist() == [int(np.prod(np.arange(1, r + 2)))] * 5, (r, prod)


def mismatched(peer):
    import gossip
    out = {}
    try:
        peer.scan(np.ones(4), "mean")
    except ValueError as exc:
        out["mean"] = str(exc)
    # The refusal took no sequence number: the next call still pairs.
    out["after"] = peer.scan(np.ones(2)).tolist()
    try:
        peer.scan(np.ones(4), "max" if peer.rank == 1 else "sum", timeout=20)
    except gossip.GossipError as exc:
        out["mismatch"] = f"{type(exc).__name__}: {exc}"
    return out


def test_a_mismatched_scan_raises_on_every_peer_and_a_mean_is_refused():
    for r, out in enumerate(spawn(mismatched, n=3, timeout=120)):
        assert "a prefix mean is not a reduction" in out["mean"], out
        assert out["after"] == [r + 1.0] * 2, out
        assert out.get("mismatch", "").startswith("ProtocolError"), (r, out)
