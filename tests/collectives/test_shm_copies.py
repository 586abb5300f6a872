"""Broadcast, allgather, alltoall, gather, scatter, reduce and reduce_scatter among peers on
one host, each peer reading what it needs from the others' arrays
(collectives/algorithms/shm_copies.py, issue #37): real peer processes. Every op gives what
numpy computes from the peers' inputs, for several dtypes and sizes (one element, under a
block, many blocks), over the direct reads and over the ZeroMQ algorithms they fall back to
where a peer cannot read the others; peers that make different calls all raise before anyone
reads; a peer killed during a call is an error naming it on the others, not a hang."""
from __future__ import annotations

import numpy as np
import pytest

import gossip
from gossip.testing import spawn

SIZES = (1, 10, 70_001)   # elements per peer: under an announcement, one block, 18 blocks


def _inputs(rank: int, count: int, dtype: str) -> np.ndarray:
    rng = np.random.default_rng(1000 * rank + count)
    if dtype.startswith("int"):
        return rng.integers(-1000, 1000, count).astype(dtype)
    return rng.standard_normal(count).astype(dtype)


def _small_blocks(direct: bool) -> list:
    """Reads in blocks of 16 KiB; ``direct`` False: this peer cannot read the others (so
    none does). Returns the list the on-host calls are counted in: True for each that went
    through the slots (small enough), False for each that read the arrays or fell back."""
    from collectives.algorithms import shm_copies, shm_direct, shm_entry
    shm_direct.READ_BYTES = shm_direct.BLOCK_BYTES = 16 << 10
    shm_entry.SharedEntry.direct_reads = direct
    calls: list = []
    real = shm_copies.OnHostCopies.__call__

    def counted(self, *args, **kwargs):
        calls.append(kwargs["slot_bytes"] <= self.entry.data_bytes)
        return real(self, *args, **kwargs)
    shm_copies.OnHostCopies.__call__ = counted
    exchange = shm_copies.OnHostCopies.exchange

    def exchange_counted(self, *args, **kwargs):   # (it says which way it went)
        calls.append(exchange(self, *args, **kwargs))
        return calls[-1]
    shm_copies.OnHostCopies.exchange = exchange_counted
    return calls


def every_op(peer, direct):
    calls = _small_blocks(direct)
    n, r = peer.world_size, peer.rank
    # Whether a broadcast's root (n - 1) writes a share of the others' arrays
    # (shm_entry.crowded) is its own decision, whatever the readers would decide: with 2
    # peers it does and its reader would not, with 4 it does not and its readers would.
    from collectives.algorithms import shm_entry
    shm_entry._CPUS = (64 if r == n - 1 else 1) if n == 2 else (1 if r == n - 1 else 64)
    out = {}
    for dtype in ("float32", "float64", "int32"):
        for count in SIZES:
            x = _inputs(r, count, dtype)
            key = f"{dtype}/{count}"
            b = x.copy()
            peer.broadcast(b, root=n - 1)
            out["broadcast " + key] = b
            out["allgather " + key] = peer.allgather(x)
            whole = np.concatenate([x] * n) + r
            out["alltoall " + key] = peer.alltoall(whole)
            out["gather " + key] = peer.gather(x, root=1)
            part = np.empty(count, dtype)
            peer.scatter(np.concatenate([x + j for j in range(n)]) if r == 0 else None,
                         root=0, out=part)
            out["scatter " + key] = part
            for op in ("sum", "max") + (("mean",) if dtype != "int32" else ()):
                y = np.concatenate([x] * n)
                out[f"reduce_scatter {op} " + key] = peer.reduce_scatter(y, op).copy()
                z = np.concatenate([x] * n)
                peer.reduce(z, root=n - 1, op=op)
                out[f"reduce {op} " + key] = z
    import torch
    t = torch.arange(1000, dtype=torch.float32) + r
    out["torch allgather"] = peer.allgather(t).numpy()
    return out, calls, peer.communicator._on_host.entry.direct


def _expected(n: int) -> dict:
    want = {}
    for dtype in ("float32", "float64", "int32"):
        for count in SIZES:
            xs = [_inputs(j, count, dtype) for j in range(n)]
            key = f"{dtype}/{count}"
            for r in range(n):
                want[r, "broadcast " + key] = xs[n - 1]
                want[r, "allgather " + key] = np.stack(xs)
                want[r, "alltoall " + key] = np.concatenate([xs[j] + j for j in range(n)])
                want[r, "gather " + key] = np.stack(xs) if r == 1 else None
                want[r, "scatter " + key] = xs[0] + r
                stacked = np.stack([np.concatenate([xs[j]] * n) for j in range(n)])
                for op, f in (("sum", np.sum), ("max", np.max), ("mean", np.mean)):
                    if op == "mean" and dtype == "int32":
                        continue
                    whole = f(stacked, axis=0).astype(dtype)
                    want[r, f"reduce_scatter {op} " + key] = whole[count * r:count * (r + 1)]
                    # the root's x holds the result, the others' x is left as it was
                    want[r, f"reduce {op} " + key] = whole if r == n - 1 else stacked[r]
    return want


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("direct", [True, False], ids=["direct", "zeromq"])
def test_every_op_gives_what_numpy_computes(n, direct):
    results = spawn(every_op, n=n, timeout=180, args=(direct,))
    want = _expected(n)
    for r, (got, calls, entered_direct) in enumerate(results):
        # Every op of 10 elements and more went through the entry (3 dtypes x 2 sizes x 11
        # calls, one reduce_scatter and one reduce fewer for int32), plus the torch allgather;
        # those of 10 elements (and the torch one, 4000 bytes) through the slots, direct or
        # not, those of 70,001 reading the arrays (or falling back).
        assert len(calls) == 2 * (11 + 11 + 9) + 1, calls
        assert calls == [True] * 11 + [False] * 11 + [True] * 11 + [False] * 11 \
            + [True] * 9 + [False] * 9 + [True], calls
        assert entered_direct is direct
        for key, value in got.items():
            if key == "torch allgather":
                assert np.array_equal(value, np.stack([np.arange(1000) + j for j in range(n)]))
                continue
            expected = want[r, key]
            if expected is None:
                assert value is None, key
            elif key.startswith("reduce") and not key.split()[-1].startswith("int"):
                assert np.allclose(value, expected, rtol=1e-5, atol=1e-5), (r, key)
            else:
                assert np.array_equal(value, expected), (r, key)


def _variable_sends(r: int, n: int, case: str) -> list[int]:
    """What rank r sends each peer in the variable alltoall of ``case``: zeros among them;
    "small" through the slots, "large" read out of the arrays, "silent": rank 0 sends
    nothing at all (its array is empty) and the others large blocks."""
    if case == "silent":
        return [0 if r == 0 else (j + 1) * 20_000 for j in range(n)]
    return [((r + 2 * j) % 3) * (1 if case == "small" else 20_001) for j in range(n)]


VARIABLE_CASES = ("small", "large", "silent")


def variable_alltoall(peer, direct):
    calls = _small_blocks(direct)
    n, r = peer.world_size, peer.rank
    out = {}
    for dtype in ("float32", "int32"):
        for case in VARIABLE_CASES:
            sends = _variable_sends(r, n, case)
            x = _inputs(r, sum(sends), dtype)
            out[f"{dtype}/{case} taken"] = peer.alltoall(x, send_counts=sends)
            recvs = [_variable_sends(j, n, case)[r] for j in range(n)]
            into = np.full(sum(recvs), -1, dtype)
            peer.alltoall(x, send_counts=sends, recv_counts=recvs, out=into)
            out[f"{dtype}/{case} into"] = into
    return out, calls, peer.communicator._on_host.entry.direct


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("direct", [True, False], ids=["direct", "zeromq"])
def test_variable_alltoall_reads_the_blocks_where_the_senders_have_them(n, direct):
    """Unequal blocks (MPI's Alltoallv) go through the entry as equal ones do: through the
    slots when every peer's array fits one, else each block read out of its sender's array
    at the offset the exchanged counts give, or the ZeroMQ algorithm where the peers cannot
    read each other."""
    results = spawn(variable_alltoall, n=n, timeout=180, args=(direct,))
    for r, (got, calls, entered_direct) in enumerate(results):
        assert calls == [True, True, False, False, False, False] * 2, calls
        assert entered_direct is direct
        for dtype in ("float32", "int32"):
            for case in VARIABLE_CASES:
                blocks = []
                for j in range(n):
                    theirs = _variable_sends(j, n, case)
                    xj = _inputs(j, sum(theirs), dtype)
                    at = sum(theirs[:r])
                    blocks.append(xj[at:at + theirs[r]])
                want = np.concatenate(blocks)
                for how in ("taken", "into"):
                    value = got[f"{dtype}/{case} {how}"]
                    assert value.dtype == want.dtype and np.array_equal(value, want), \
                        (r, dtype, case, how)


def _variable_count(r: int, case: str) -> int:
    """Rank r's size in the variable allgather of ``case`` (VARIABLE_CASES)."""
    return {"small": r + 1, "large": 20_001 * (r + 1), "silent": 0 if r == 0 else 30_000}[case]


def variable_allgather(peer, direct):
    calls = _small_blocks(direct)
    r = peer.rank
    out = {}
    n = peer.world_size
    for dtype in ("float32", "int32"):
        for case in VARIABLE_CASES:
            x = _inputs(r, _variable_count(r, case), dtype)
            parts = peer.allgather(x, variable=True)
            out[f"{dtype}/{case}"] = [np.asarray(p).copy() for p in parts]
            # Into a caller's buffer: the parts are views of it.
            into = np.full(sum(_variable_count(j, case) for j in range(n)), -1, dtype)
            parts = peer.allgather(x, variable=True, out=into)
            out[f"{dtype}/{case} into"] = [np.asarray(p).copy() for p in parts]
            assert all(p.base is into or p.size == 0 for p in parts)
    # One peer's out= one element short: every peer raises, naming it, and goes on.
    x = _inputs(r, _variable_count(r, "large"), "float32")
    total = sum(_variable_count(j, "large") for j in range(n))
    try:
        peer.allgather(x, variable=True, out=np.empty(total - (r == 1), np.float32))
    except gossip.ProtocolError as exc:
        out["short out"] = str(exc)
    import torch
    parts = peer.allgather(torch.arange(3 * r, dtype=torch.float64), variable=True)
    out["torch"] = [p.tolist() for p in parts if isinstance(p, torch.Tensor)]
    return out, calls, peer.communicator._on_host.entry.direct


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("direct", [True, False], ids=["direct", "zeromq"])
def test_variable_allgather_reads_each_peer_where_it_is(n, direct):
    """allgather(variable=True) (MPI's Allgatherv) is entered once on one host, each peer's
    size in its slot: the parts out of the slots where every peer's fits, else out of the
    peers' arrays, or the ZeroMQ ring where the peers cannot read each other."""
    results = spawn(variable_allgather, n=n, timeout=180, args=(direct,))
    for r, (got, calls, entered_direct) in enumerate(results):
        # (The call with a short out= raised inside the entry: not counted.)
        assert calls == [True, True, False, False, False, False] * 2 + [True], calls
        assert entered_direct is direct
        for dtype in ("float32", "int32"):
            for case in VARIABLE_CASES:
                want = [_inputs(j, _variable_count(j, case), dtype) for j in range(n)]
                for how in ("", " into"):
                    value = got[f"{dtype}/{case}{how}"]
                    assert len(value) == n and all(
                        v.dtype == w.dtype and np.array_equal(v, w)
                        for v, w in zip(value, want)), (r, dtype, case, how)
        total = sum(_variable_count(j, "large") for j in range(n))
        assert f"the parts are {total} elements, but rank 1's out= holds {total - 1}" \
            in got["short out"], got["short out"]
        assert got["torch"] == [list(map(float, range(3 * j))) for j in range(n)]


def different_roots(peer):
    x = np.zeros(1000, np.float32)
    try:
        peer.broadcast(x, root=peer.rank % 2)
    except gossip.ProtocolError as exc:
        return str(exc)
    return "no error"


def test_peers_that_name_different_roots_all_raise_before_reading():
    for message in spawn(different_roots, n=3, timeout=60, peer_timeout=20):
        assert "broadcast(root=0)" in message and "broadcast(root=1)" in message, message


def killed_during_allgather(peer):
    """Rank 2 SIGKILLs itself while the others read its 64 MiB in blocks of 16 KiB."""
    import os
    import signal
    import threading
    _small_blocks(True)
    x = np.ones(16 << 20, np.float32)
    peer.barrier()
    if peer.rank == 2:
        threading.Timer(0.01, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    try:
        for _ in range(20):
            peer.allgather(x)
    except (gossip.PeerLost, gossip.OperationTimeout) as exc:
        return type(exc).__name__, str(exc)
    return "ok", ""


def test_a_peer_killed_during_the_copies_is_an_error_naming_it():
    results = spawn(killed_during_allgather, n=4, timeout=90, peer_timeout=15, tolerate=(2,))
    assert results[2] is None
    for r in (0, 1, 3):
        kind, message = results[r]
        assert kind == "PeerLost", (kind, message)
        assert "rank 2" in message, message


def late_writer(peer, gave_up):
    """Rank 1 comes to a gather after the root (rank 0) gave up on it: it still writes its
    part into the root's output, which the root must keep alive, not free under the write."""
    import os
    from gossip.testing import wait_until
    x = np.full(100_000, peer.rank + 1, np.float32)   # 400 kB: past the slots
    peer.barrier()
    held = peer.communicator._on_host.copies.held
    if peer.rank == 1:
        wait_until(lambda: os.path.exists(gave_up), 30, what="the root's timeout")
        peer.gather(x, root=0)
        peer.barrier()   # (its part is written)
        peer.gather(x, root=0)
        return None
    try:
        peer.gather(x, root=0, timeout=0.5)
    except gossip.OperationTimeout:
        pass
    else:
        return "the gather did not time out"
    kept = len(held)
    open(gave_up, "w").close()
    peer.barrier()
    landed = [a.copy() for a in held]
    peer.gather(x, root=0)   # all in step again: nothing held any more
    return kept, [(a[:100_000].min(), a[100_000:].min(), a[100_000:].max())
                  for a in landed], len(held)


def test_a_late_writer_writes_into_an_array_the_failed_root_keeps(tmp_path):
    results = spawn(late_writer, n=2, timeout=60, peer_timeout=10,
                    args=(str(tmp_path / "gave-up"),))
    assert results[1] is None
    kept, landed, after = results[0]
    assert kept == 1, results[0]
    # rank 1's part landed in the array the root kept (its own part was never written)
    assert [tuple(map(float, v))[1:] for v in landed] == [(2.0, 2.0)], landed
    assert after == 0, results[0]
