"""The on-host shared-memory allreduce (collectives/algorithms/shm_allreduce.py, issue #18):
real peer processes on this host, their arenas mapped from each other's memfds. Results are
bitwise identical on every peer, equal to the ring's for integers and within rounding of it
for floats (the two sum in different orders); a disagreement is a ProtocolError on every peer before anyone
reads another's memory; a peer that goes away is an error, never a hang."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

import gossip
from gossip.testing import spawn


def small_rounds(direct: bool = True):
    """Rounds of 64 KiB, so a test's arrays cross many rounds and both halves of the arena,
    or, ``direct``, arrays from 64 KiB read from the peers in blocks of 16 KiB."""
    from collectives.algorithms import shm_allreduce, shm_direct, shm_entry
    shm_allreduce.ROUND_BYTES = 64 << 10
    shm_allreduce.DIRECT_MIN_BYTES = 64 << 10
    shm_direct.BLOCK_BYTES = 16 << 10
    shm_entry.SharedEntry.direct_reads = direct


def same_as_the_ring(peer, direct):
    small_rounds(direct)
    r = peer.rank
    rng = np.random.default_rng(r)
    cases = [("sum", rng.standard_normal(300_001).astype(np.float32)),
             ("mean", rng.standard_normal(70_000)),
             ("max", rng.integers(-1000, 1000, 50_003).astype(np.int32)),
             ("min", rng.integers(-1000, 1000, 50_003).astype(np.int64)),
             ("prod", (1 + rng.integers(0, 2, 40_000)).astype(np.int16)),
             ("band", rng.integers(0, 1 << 30, 40_000).astype(np.int64)),
             ("sum", rng.integers(0, 2, 100_000).astype(bool)),
             ("sum", rng.standard_normal(30).astype(np.float32))]   # one tiny round
    out = []
    for op, x in cases:
        ring, shm = x.copy(), x.copy()
        peer.allreduce(ring, op, algorithm="ring")
        peer.allreduce(shm, op, algorithm="shm")
        exact = x.dtype.kind != "f"
        same = np.array_equal(ring, shm) if exact else np.allclose(ring, shm, rtol=1e-5,
                                                                  atol=1e-5)
        out.append((op, str(x.dtype), bool(same), hashlib.sha256(shm.tobytes()).hexdigest()))
    # auto: 2 MiB and up goes through shared memory; a view with strides is staged.
    big = np.arange(3 << 20, dtype=np.float32)[::3] + r
    want = np.arange(3 << 20, dtype=np.float32)[::3] * peer.world_size + sum(
        range(peer.world_size))
    peer.allreduce(big)
    on_host = peer.communicator._on_host   # which way the calls went, and what it holds
    used = (on_host.entry.direct, on_host.large.arena.size)
    return out, bool(np.array_equal(big, want)), used


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "arenas"])
def test_every_op_and_dtype_agrees_with_the_ring_and_is_identical_on_every_peer(direct):
    results = spawn(same_as_the_ring, n=3, timeout=120, args=(direct,))
    for out, strided_ok, (direct_used, arena_bytes) in results:
        assert strided_ok
        assert direct_used == direct
        if direct:   # an arena only as large as the calls below DIRECT_MIN_BYTES need
            assert arena_bytes <= 2 * (64 << 10) + 4096, arena_bytes
        for op, dtype, equal, _ in out:
            assert equal, (op, dtype)
    digests = [[d for *_, d in out] for out, _, _ in results]
    assert digests[0] == digests[1] == digests[2]


def torch_tensors(peer):
    import torch
    small_rounds()
    x = torch.arange(1 << 19, dtype=torch.float32) * (peer.rank + 1)
    peer.allreduce(x, "mean")   # 2 MiB: auto takes shared memory
    want = torch.arange(1 << 19, dtype=torch.float32) * sum(range(1, peer.world_size + 1)) \
        / peer.world_size
    return bool(torch.equal(x, want))


def test_torch_cpu_tensors():
    assert all(spawn(torch_tensors, n=2, timeout=60, preload=("torch",)))


def disagree(peer):
    """Rank 0 passes 1 element more; rank 1 forces the ring where auto picks shm."""
    n = (1 << 20) + (peer.rank == 0)
    x = np.ones(n, np.float32)
    try:
        peer.allreduce(x, algorithm="ring" if peer.rank == 1 else "auto")
    except gossip.ProtocolError as exc:
        return "ProtocolError", str(exc), float(x[0])
    return "ok", "", float(x[0])


def test_peers_that_disagree_all_raise_and_keep_their_arrays():
    for kind, message, first in spawn(disagree, n=3, timeout=90, peer_timeout=20):
        assert kind == "ProtocolError", message
        assert "different calls" in message, message
        assert first == 1.0   # nobody read another's memory, nobody wrote a result


def _fate(peer, x) -> tuple[str, str]:
    """("ok", "") or the error's (type name, message) of a shm allreduce of ``x``."""
    try:
        peer.allreduce(x, algorithm="shm")
    except (gossip.PeerLost, gossip.OperationTimeout) as exc:
        return type(exc).__name__, str(exc)
    return "ok", ""


def one_leaves(peer):
    small_rounds()
    if peer.rank == 2:
        return "left", ""   # never calls: its process ends, its transport with it
    return _fate(peer, np.ones(1 << 20, np.float32))


def test_a_peer_that_never_comes_is_an_error_naming_it_not_a_hang():
    _rank_2_is_named(spawn(one_leaves, n=3, timeout=90, peer_timeout=15))


def _rank_2_is_named(results) -> None:
    assert results[2] == ("left", "")
    for kind, message in results[:2]:
        assert kind in ("PeerLost", "OperationTimeout"), (kind, message)
        assert "rank 2" in message, message


def killed_midway(peer, direct):
    """Rank 2 SIGKILLs itself while the allreduce runs (64 MiB in rounds of 64 KiB: a
    thousand rounds, two barriers each; or read in blocks of 16 KiB, thousands of reads);
    wherever it dies, the others must raise, and each element of their arrays is either as
    it was or the sum, never a partial sum: hivemind's averager promises as much (the first
    1M elements are 3 after the first call, then 9; the rest 1, then 3)."""
    import os
    import signal
    import threading
    small_rounds(direct)
    x = np.ones(16 << 20, np.float32)
    peer.allreduce(x[:1 << 20], algorithm="shm")   # together from here
    if peer.rank == 2:
        threading.Timer(0.01, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    kind, message = _fate(peer, x)
    head, rest = x[:1 << 20], x[1 << 20:]
    return kind, message, (sorted(set(np.unique(head).tolist())),
                           sorted(set(np.unique(rest).tolist())))


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "arenas"])
def test_a_peer_killed_during_the_barriers_is_an_error_naming_it(direct):
    results = spawn(killed_midway, n=3, timeout=90, peer_timeout=15, tolerate=(2,),
                    args=(direct,))
    assert results[2] is None
    for kind, message, (head, rest) in results[:2]:
        assert kind == "PeerLost", (kind, message)
        assert "rank 2" in message, message
        assert set(head) <= {3.0, 9.0} and set(rest) <= {1.0, 3.0}, (head, rest)


def arena_grows(peer):
    small_rounds(direct=False)
    sums = []
    for count in (1 << 18, 5 << 18, 1 << 16, 9 << 18):   # grows twice, maps again
        x = np.full(count, float(peer.rank + 1), np.float32)
        peer.allreduce(x, algorithm="shm")
        sums.append(bool((x == sum(range(1, peer.world_size + 1))).all()))
    return sums


def test_the_arena_grows_and_the_peers_map_it_again():
    for sums in spawn(arena_grows, n=2, timeout=60):
        assert sums == [True] * 4


def disagree_after_entering_once(peer):
    """After a first call has mapped the arenas, calls are entered through shared memory
    alone (shm_entry.py): a size, algorithm or operation that differs is still a
    ProtocolError on every peer, before anything is read, and the next matching call works."""
    r, n = peer.rank, peer.world_size
    mib = 1 << 18   # float32s
    peer.allreduce(np.ones(mib, np.float32), algorithm="shm")
    peer.barrier()
    outcomes = []

    def attempt(call, x):
        try:
            call()
        except gossip.ProtocolError as exc:
            outcomes.append(("ProtocolError", str(exc), float(x[0])))
        else:
            outcomes.append(("ok", "", float(x[0])))

    x = np.ones(mib + (r == 0), np.float32)   # rank 0: one element more
    attempt(lambda: peer.allreduce(x), x)
    y = np.ones(1024, np.float32)             # rank 1: a barrier instead
    attempt(peer.barrier if r == 1 else lambda: peer.allreduce(y, algorithm="shm-small"), y)
    z = np.ones(1024, np.float32)             # rank 2: the large algorithm
    attempt(lambda: peer.allreduce(z, algorithm="shm" if r == 2 else "shm-small"), z)
    w = np.full(mib, float(r + 1), np.float32)
    peer.allreduce(w)
    peer.barrier()
    return outcomes, bool((w == n * (n + 1) / 2).all())


def test_calls_entered_through_shared_memory_that_disagree_all_raise():
    for outcomes, recovered in spawn(disagree_after_entering_once, n=3, timeout=90,
                                     peer_timeout=20):
        assert recovered
        assert len(outcomes) == 3
        for kind, message, first in outcomes:
            assert kind == "ProtocolError", message
            assert "different calls" in message, message
            assert first == 1.0, message


def leaves_after_entering_once(peer):
    small_rounds()
    peer.allreduce(np.ones(1 << 18, np.float32), algorithm="shm")
    if peer.rank == 2:
        return "left", ""   # its process ends before the second call
    return _fate(peer, np.ones(1 << 20, np.float32))


def test_a_peer_gone_after_the_first_call_is_named():
    _rank_2_is_named(spawn(leaves_after_entering_once, n=3, timeout=90, peer_timeout=15))


def one_cannot_read(peer):
    """Rank 1 may not read the others' memory (as where ptrace is refused); the others can,
    and the first call is a large one: they expected direct reads and hold no arena, so that
    call goes over the ring, and the next through the arenas, every result exact."""
    small_rounds(direct=peer.rank != 1)
    n = peer.world_size
    out = []
    for k in range(3):
        x = np.arange(1 << 17, dtype=np.int64) * (peer.rank + 1) + k
        peer.allreduce(x, algorithm="shm")
        want = np.arange(1 << 17, dtype=np.int64) * (n * (n + 1) // 2) + n * k
        out.append(bool(np.array_equal(x, want)))
    return out, peer.communicator._on_host.entry.direct


def test_a_peer_that_cannot_read_the_others_keeps_everyone_on_the_arenas():
    for exact, direct in spawn(one_cannot_read, n=3, timeout=60):
        assert exact == [True, True, True]
        assert direct is False
