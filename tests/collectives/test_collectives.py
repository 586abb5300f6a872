"""Collectives against numpy references, with real peers: every op, every dtype, awkward
lengths and world sizes; in-place semantics; bitwise-identical results on every peer."""
from __future__ import annotations

import hashlib
import zlib

import numpy as np
import pytest

import gossip
from collectives.transport.wire import ALLOWED_DTYPES
from gossip.testing import spawn

NUMPY_DTYPES = [d for d in ALLOWED_DTYPES if d != "bfloat16"]
OPS = ["sum", "mean", "max", "min", "prod", "band", "bor", "bxor"]
BITWISE = {"band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}


def data(dtype: str, length: int, rank: int, op: str) -> np.ndarray:
    rng = np.random.default_rng(zlib.crc32(f"{dtype}-{length}-{rank}-{op}".encode()))
    if dtype == "bool":
        return rng.integers(0, 2, length).astype(bool)
    if dtype.startswith("complex"):
        return (rng.uniform(0.5, 1.5, length) + 1j * rng.uniform(-0.5, 0.5, length)).astype(dtype)
    if dtype.startswith("float"):
        low, high = (0.5, 1.5) if op == "prod" else (-4, 4)
        return rng.uniform(low, high, length).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -1000), min(info.max, 1000), length, dtype=dtype)


def applicable(op: str, dtype: str) -> bool:
    if op in BITWISE:
        return dtype == "bool" or dtype.startswith(("int", "uint"))
    if op in ("max", "min") and dtype.startswith("complex"):
        return False
    return not (op == "mean" and dtype == "bool")


def reference(op: str, arrays: list[np.ndarray]) -> np.ndarray:
    stack = np.stack(arrays)
    dtype = stack.dtype
    if op in BITWISE:
        return BITWISE[op].reduce(stack, axis=0)
    if dtype == np.bool_:
        return {"sum": stack.any(0), "max": stack.any(0), "min": stack.all(0),
                "prod": stack.all(0)}[op]
    if op in ("sum", "mean"):
        total = stack.sum(0, dtype=dtype)
        if op == "sum":
            return total
        return total // len(arrays) if dtype.kind in "iu" else (total / len(arrays)).astype(dtype)
    return {"max": stack.max(0), "min": stack.min(0), "prod": stack.prod(0, dtype=dtype)}[op]


def close_enough(got: np.ndarray, want: np.ndarray, dtype: str, n: int) -> bool:
    if dtype.startswith(("float", "complex")):
        rtol = {"float16": 2e-2, "float32": 1e-5, "complex64": 1e-5}.get(dtype, 1e-12)
        return np.allclose(got, want, rtol=rtol, atol=rtol * n)
    return np.array_equal(got, want)


def check_allreduce(peer, lengths, dtypes, ops, algorithm):
    n, failures, digests = peer.world_size, [], []
    for dtype in dtypes:
        for op in ops:
            if not applicable(op, dtype):
                continue
            for length in lengths:
                x = data(dtype, length, peer.rank, op)
                result = peer.allreduce(x, op=op, algorithm=algorithm)
                assert result is x  # in place, returns the array
                want = reference(op, [data(dtype, length, r, op) for r in range(n)])
                if not close_enough(x, want, dtype, n):
                    failures.append((dtype, op, length))
                digests.append(hashlib.sha1(x.tobytes()).hexdigest())
    return failures, hashlib.sha1("".join(digests).encode()).hexdigest()


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, pytest.param(8, marks=pytest.mark.slow)])
def test_allreduce_every_op_dtype_and_length(n):
    lengths = [0, 1, 3, 10, 1000]
    results = spawn(check_allreduce, n=n, timeout=240,
                    args=(lengths, NUMPY_DTYPES, OPS, "auto"))
    assert all(failures == [] for failures, _ in results), results[0][0]
    assert len({digest for _, digest in results}) == 1  # bitwise identical on every peer


@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.parametrize("algorithm", ["ring", "recursive-doubling"])
def test_both_algorithms_on_awkward_lengths(n, algorithm):
    results = spawn(check_allreduce, n=n, timeout=240,
                    args=([0, 1, 3, 10, 1000, 4099], ["float32", "int64", "complex64", "bool"],
                          OPS, algorithm))
    assert all(failures == [] for failures, _ in results), results[0][0]
    assert len({digest for _, digest in results}) == 1


@pytest.mark.parametrize("n", [3, 4, pytest.param(8, marks=pytest.mark.slow)])   # (8: 13-16 s)
def test_allreduce_large_lengths(n):
    # 2**20 + 7 elements: not divisible by n, several chunks per segment.
    results = spawn(check_allreduce, n=n, timeout=240,
                    args=([2**20 + 7], ["float32", "float64", "int32", "uint8", "float16"],
                          ["sum", "mean", "max"], "auto"))
    assert all(failures == [] for failures, _ in results), results[0][0]
    assert len({digest for _, digest in results}) == 1


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_allreduce_large_lengths_every_dtype_and_op(n):
    results = spawn(check_allreduce, n=n, timeout=900,
                    args=([2**20 + 7], NUMPY_DTYPES, OPS, "auto"))
    assert all(failures == [] for failures, _ in results), results[0][0]


def check_complex_order_refused(peer):
    with pytest.raises(TypeError, match="complex"):
        peer.allreduce(np.ones(3, dtype=np.complex64), op="max")
    with pytest.raises(ValueError, match="unknown reduce op"):
        peer.allreduce(np.ones(3), op="avg")
    with pytest.raises(TypeError, match="bitwise"):
        peer.allreduce(np.ones(3), op="bxor")
    with pytest.raises(ValueError, match="read-only"):
        x = np.ones(3)
        x.flags.writeable = False
        peer.allreduce(x)
    # The refusals consumed no sequence number: the next call still matches up.
    y = np.full((2, 3), peer.rank + 1.0)
    peer.allreduce(y)
    return y.tolist()


def test_bad_arguments_are_refused_clearly():
    assert spawn(check_complex_order_refused, n=2) == [[[3.0] * 3] * 2] * 2


def torch_allreduce(peer):
    import torch
    out = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64):
        x = torch.arange(1000, dtype=dtype) + peer.rank
        assert peer.allreduce(x, op="sum") is x
        out[str(dtype)] = x.float().tolist()
    # Autograd leaves work as optimizers use them.
    w = torch.ones(5, requires_grad=True)
    peer.allreduce(w.data, op="mean")
    big = torch.full((300_000,), float(peer.rank), dtype=torch.bfloat16)
    peer.allreduce(big, op="max")
    out["big"] = float(big.max()), float(big.min())
    return out


def test_torch_tensors_including_bfloat16():
    results = spawn(torch_allreduce, n=3, timeout=120)
    expected = [3.0 * i + 3.0 for i in range(1000)]
    for res in results:
        assert res["torch.float32"] == expected
        assert res["torch.int64"] == expected
        # bfloat16 holds 8 significant bits: compare with its own rounding of the result
        import torch
        assert res["torch.bfloat16"] == torch.tensor(expected).bfloat16().float().tolist() or \
            np.allclose(res["torch.bfloat16"], expected, rtol=1e-2)
        assert res["big"] == (2.0, 2.0)
    assert results[0] == results[1] == results[2]


# ---------------------------------------------------------------- companions
def companions(peer):
    n, r = peer.world_size, peer.rank
    out = {}
    x = np.arange(7, dtype=np.float32) + 10 * r
    out["allgather"] = peer.allgather(x).tolist()
    v = np.full(r + 1, r, dtype=np.int16)  # sizes differ per peer
    out["allgatherv"] = [a.tolist() for a in peer.allgather(v, variable=True)]
    b = np.full(100_003, r, dtype=np.float64)
    peer.broadcast(b, root=n - 1)
    out["broadcast"] = bool(np.all(b == n - 1))
    rs = np.arange(10, dtype=np.float64) * (r + 1)
    seg = peer.reduce_scatter(rs, op="sum")
    out["reduce_scatter"] = seg.tolist()
    peer.barrier()
    return out


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_allgather_broadcast_reduce_scatter_barrier(n):
    results = spawn(companions, n=n, timeout=120)
    total = sum(range(1, n + 1))
    full = (np.arange(10) * total).tolist()
    for r, res in enumerate(results):
        assert res["allgather"] == [(np.arange(7) + 10 * i).tolist() for i in range(n)]
        assert res["allgatherv"] == [[i] * (i + 1) for i in range(n)]
        assert res["broadcast"]
        assert res["reduce_scatter"] == full[10 * r // n:10 * (r + 1) // n]


def neighbor_rounds(peer, rounds):
    """D-PSGD on a directed ring and on time-varying one-peer exponential patterns."""
    n, r = peer.world_size, peer.rank
    x = np.full(1000, float(r))
    for t in range(rounds):
        shift = 1 << (t % max(1, (n - 1).bit_length()))
        peer.neighbor_allreduce(x, 0.5, {(r - shift) % n: 0.5}, [(r + shift) % n])
    y = np.full(10, float(r))
    # Push with per-destination weights (push-sum style): keep 1/3, send 1/3 to each side.
    peer.neighbor_allreduce(y, 1 / 3, {(r - 1) % n: 1.0, (r + 1) % n: 1.0},
                            [(r - 1) % n, (r + 1) % n],
                            dst_weights={(r - 1) % n: 1 / 3, (r + 1) % n: 1 / 3})
    return x[0], y[0]


def test_neighbor_allreduce_reaches_the_average():
    n = 8
    results = spawn(neighbor_rounds, n=n, timeout=120, args=(3,))
    # One-peer exponential with weights 1/2 reaches the exact average in log2(n) rounds.
    assert all(abs(x - 3.5) < 1e-12 for x, _ in results)
    ys = [y for _, y in results]
    assert abs(sum(ys) - sum(range(n))) < 1e-9  # mass conserved by the push weights


def neighbor_into_out(peer):
    """out=: the result lands in out, x is only sent; also with self_weight 0, unequal
    per-destination weights, and a zero-copy sized (multi-chunk) float32 array."""
    n, r = peer.world_size, peer.rank
    left, right = (r - 1) % n, (r + 1) % n
    x = np.arange(5000, dtype=np.float64) + 1000 * r
    before = x.copy()
    out = np.empty_like(x)
    got = peer.neighbor_allreduce(x, 0.25, {left: 0.5, right: 0.25}, [left, right], out=out)
    plain = x.copy()
    peer.neighbor_allreduce(plain, 0.25, {left: 0.5, right: 0.25}, [left, right])
    only = np.empty_like(x)
    peer.neighbor_allreduce(x, 0.0, {left: 1.0, right: 1.0}, [left, right],
                            dst_weights={left: 0.5, right: 0.125}, out=only)
    big = np.full(3 << 20, float(r), dtype=np.float32)
    big_out = np.zeros_like(big)
    handle = peer.neighbor_allreduce(big, 0.5, {left: 0.5}, [right], out=big_out, wait=False)
    handle.wait(30)
    return (got is out, np.array_equal(x, before), out, plain, only,
            bool(np.all(big == r)), float(big_out[0]), float(big_out[-1]))


def test_neighbor_allreduce_into_out_leaves_x_unchanged():
    n = 3
    results = spawn(neighbor_into_out, n=n, timeout=120)
    xs = [np.arange(5000, dtype=np.float64) + 1000 * r for r in range(n)]
    for r, (same, unchanged, out, plain, only, big_kept, lo, hi) in enumerate(results):
        left, right = (r - 1) % n, (r + 1) % n
        assert same and unchanged and big_kept
        expected = 0.25 * xs[r] + 0.5 * xs[left] + 0.25 * xs[right]
        assert np.allclose(out, expected, rtol=1e-15, atol=0)
        assert np.allclose(out, plain, rtol=1e-15, atol=0)
        # What r's neighbours pushed to it: left sent 0.125 of its x to its right (r), right
        # sent 0.5 of its x to its left (r).
        assert np.allclose(only, 0.125 * xs[left] + 0.5 * xs[right], rtol=1e-15, atol=0)
        assert lo == hi == 0.5 * r + 0.5 * left


def bluefog_defaults(peer):
    """neighbor_allreduce with BlueFog's defaults: no weights (the topology's), dst_weights as a
    plain list of ranks or as a dict (dst_ranks its keys), and half the weights refused."""
    n, r = peer.world_size, peer.rank
    left, right = (r - 1) % n, (r + 1) % n
    x = np.full(7, float(r))
    plain = peer.neighbor_allreduce(x.copy())
    averaged = peer.neighbor_average(x.copy())
    listed = peer.neighbor_allreduce(x.copy(), self_weight=0.5, src_weights={left: 0.5},
                                     dst_weights=[right])
    pushed = peer.neighbor_allreduce(x.copy(), 0.5, {left: 1.0}, dst_weights={right: 0.5})
    try:
        peer.neighbor_allreduce(x.copy(), self_weight=0.5)
        refused = ""
    except ValueError as exc:
        refused = str(exc)
    try:   # BlueFog's "unique ranks": a destination named twice is a slip, refused
        peer.neighbor_allreduce(x.copy(), 0.5, {left: 0.5}, dst_weights=[right, right])
        twice = ""
    except ValueError as exc:
        twice = str(exc)
    return plain, averaged, listed, pushed, refused, twice


def test_neighbor_allreduce_takes_bluefog_s_defaults():
    n = 4
    for r, (plain, averaged, listed, pushed, refused, twice) in enumerate(
            spawn(bluefog_defaults, n=n, timeout=120, topology="ring")):
        left, right = (r - 1) % n, (r + 1) % n
        assert np.array_equal(plain, averaged)
        assert np.allclose(plain, (left + r + right) / 3, rtol=1e-15)
        assert np.allclose(listed, 0.5 * r + 0.5 * left, rtol=1e-15)
        assert np.allclose(pushed, 0.5 * r + 0.5 * left, rtol=1e-15)
        assert f"rank {r}: neighbor_allreduce: give self_weight and src_weights together" \
            in refused
        assert f"rank {r}: neighbor_allreduce: dst_ranks names rank {right} more than once" \
            in twice


# ---------------------------------------------------------------- non-blocking, mismatch, faults
def many_in_flight(peer, count):
    handles, arrays = [], []
    for i in range(count):
        x = np.full(64, float(i * 10 + peer.rank))
        arrays.append(x)
        handles.append(peer.allreduce(x, wait=False))
    peer.barrier()  # implies every earlier operation finished
    assert all(h.done() for h in handles)
    n = peer.world_size
    return all(np.all(a == i * 10 * n + n * (n - 1) / 2) for i, a in enumerate(arrays))


def test_thousand_nonblocking_allreduces_do_not_mix():
    assert all(spawn(many_in_flight, n=3, timeout=180, args=(1000,)))


def barrier_after_a_failed_work(peer):
    # A non-blocking call that fails (sizes differ): its Work raises, the barriers after it
    # do not (the error is the Work's), and every rank's barriers stay in step.
    r = peer.rank
    work = peer.allreduce(np.ones(3 + (r == 2)), wait=False)
    failed = None
    try:
        work.wait()
    except gossip.GossipError as exc:
        failed = type(exc).__name__
    barriers = []
    for _ in range(3):
        try:
            peer.barrier()
            barriers.append("ok")
        except gossip.GossipError as exc:
            barriers.append(type(exc).__name__)
    # An Ibarrier: a Work at once, rank 0 sending while its barrier is pending.
    if r == 0:
        pending = peer.barrier(wait=False)
        peer.send(1, np.ones(2))
        pending.wait(30)
    else:
        if r == 1:
            peer.recv(0)
        peer.barrier()
    return failed, barriers, peer.allreduce(np.ones(1)).tolist()


def test_a_barrier_does_not_raise_an_earlier_works_error_and_can_be_waited_on_later():
    for failed, barriers, after in spawn(barrier_after_a_failed_work, n=3, timeout=60):
        assert failed in ("ProtocolError", "PeerLost"), failed
        assert barriers == ["ok"] * 3
        assert after == [3.0]


def mismatched_calls(peer):
    try:
        if peer.rank == 0:
            peer.allreduce(np.ones(10, dtype=np.float32))
        elif peer.rank == 1:
            peer.broadcast(np.ones(10, dtype=np.float32), root=0)
        else:
            peer.allreduce(np.ones(12, dtype=np.float32))
    except (gossip.ProtocolError, gossip.PeerLost) as exc:
        return type(exc).__name__, str(exc)
    return None


def test_mismatched_calls_raise_instead_of_hanging():
    results = spawn(mismatched_calls, n=3, timeout=60, peer_timeout=20)
    assert all(r is not None for r in results), results
    assert all(kind == "ProtocolError" for kind, _ in results), results
    detector = [msg for _, msg in results if "different calls" in msg]
    assert detector and "sequence 0" in detector[0]
    assert any("broadcast(root=0)" in msg or "allreduce" in msg for msg in detector)


def killed_mid_allreduce(peer):
    import os
    import signal
    import time
    peer.barrier()
    # Rank 1 dies only once every survivor has left the barrier (their notes prove it), so
    # the barrier's own last messages cannot be what goes missing.
    if peer.rank == 1:
        for src in (0, 2, 3):
            peer.recv(src)
        os.kill(os.getpid(), signal.SIGKILL)
    peer.send(1, np.zeros(1))
    x = np.ones(4 << 20, dtype=np.float32)
    start = time.monotonic()
    try:
        peer.allreduce(x)
    except gossip.PeerLost as exc:
        return exc.rank, time.monotonic() - start
    return None


def test_peer_killed_mid_allreduce_is_peer_lost_on_every_survivor():
    results = spawn(killed_mid_allreduce, n=4, timeout=60, peer_timeout=8, tolerate=[1])
    for rank in (0, 2, 3):
        lost, elapsed = results[rank]
        assert lost == 1
        assert elapsed < 8 + 2


def killed_within_a_call(peer, algorithm, labels=None):
    """Rank 1 dies 5 ms into an allreduce (4 MiB of rank + 1 on each of 4 peers, a few tens of
    ms through the ring): wherever the others were, each element of their arrays is either
    their own value or the sum (10), never a partial sum (hivemind's averager promises as much;
    the ring used to leave its partial sums in the array)."""
    import os
    import signal
    import threading
    if labels:   # which peers count as one host (the two-level allreduce)
        peer.transport.hosts = {j: labels[j] for j in range(peer.world_size)}
    x = np.full(1 << 20, float(peer.rank + 1), np.float32)
    peer.allreduce(x.copy(), algorithm=algorithm)   # connected, and together from here
    if peer.rank == 1:
        threading.Timer(0.005, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    try:
        peer.allreduce(x, algorithm=algorithm)
        kind = "ok"
    except (gossip.PeerLost, gossip.OperationTimeout) as exc:
        kind = type(exc).__name__
    return kind, sorted(set(np.unique(x).tolist()))


@pytest.mark.parametrize("algorithm, labels", [("ring", None), ("recursive-doubling", None),
                                               ("hierarchical", "abab"),
                                               ("hierarchical", "aaab")],
                         ids=["ring", "recursive-doubling", "two-levels", "two-levels-unequal"])
def test_a_peer_killed_within_an_allreduce_leaves_each_element_own_or_summed(algorithm, labels):
    results = spawn(killed_within_a_call, n=4, timeout=60, peer_timeout=8, tolerate=[1],
                    args=(algorithm, labels))
    for rank in (0, 2, 3):
        kind, values = results[rank]
        assert kind in ("PeerLost", "ok"), (rank, kind)
        assert set(values) <= {float(rank + 1), 10.0}, (rank, kind, values)


def killed_within_a_reduction(peer, op, count):
    """As killed_within_a_call, for reduce_scatter, reduce (root 2, which reads rank 0's
    block before rank 1's on one host) and scan: what a survivor's x holds, element by
    element, is its own value or its result, never a partial one."""
    import os
    import signal
    import threading
    x = np.full(count, float(peer.rank + 1), np.float32)
    call = {"reduce_scatter": lambda y: peer.communicator.reduce_scatter(y),
            "reduce": lambda y: peer.communicator.reduce(y, root=2),
            "scan": lambda y: peer.communicator.scan(y)}[op]
    call(x.copy())   # connected (and the arenas mapped), and together from here
    if peer.rank == 1:
        threading.Timer(0.005, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    try:
        call(x)
        kind = "ok"
    except (gossip.PeerLost, gossip.OperationTimeout) as exc:
        kind = type(exc).__name__
    return kind, sorted(set(np.unique(x).tolist()))


# (over tcp the messages' algorithms; on one host the direct reads, 16 MiB a segment. A scan
# has messages only)
@pytest.mark.parametrize("op, transport, count", [
    ("reduce_scatter", "tcp", 1 << 20), ("reduce_scatter", "auto", 16 << 20),
    ("reduce", "tcp", 1 << 20), ("reduce", "auto", 16 << 20), ("scan", "tcp", 1 << 20)],
    ids=["reduce_scatter-ring", "reduce_scatter-on-host", "reduce-ring", "reduce-on-host",
         "scan"])
def test_a_peer_killed_within_a_reduction_leaves_each_element_own_or_reduced(op, transport,
                                                                             count):
    results = spawn(killed_within_a_reduction, n=4, timeout=90, peer_timeout=8, tolerate=[1],
                    args=(op, count), transport=transport)
    for rank in (0, 2, 3):
        kind, values = results[rank]
        # (the sum of every x, or for a scan of the x of ranks 0..rank)
        result = sum(range(1, (rank + 2 if op == "scan" else 5)))
        assert kind in ("PeerLost", "ok"), (rank, kind)
        assert set(values) <= {float(rank + 1), float(result)}, (rank, kind, values)


def count_bytes(peer, count):
    x = np.ones(count, dtype=np.float32)
    before = peer.stats()["bytes_sent"]
    peer.allreduce(x, algorithm="ring")
    return peer.stats()["bytes_sent"] - before, bool(np.all(x == peer.world_size))


@pytest.mark.parametrize("n", [2, 4])
def test_ring_sends_the_bandwidth_optimal_share(n):
    count = 4 << 20
    for sent, ok in spawn(count_bytes, n=n, timeout=120, args=(count,)):
        assert ok
        assert sent == pytest.approx(2 * (n - 1) / n * count * 4, rel=1e-3)
