"""The neighbour exchange that reads its sources' arrays on one host
(collectives/algorithms/neighbor_direct.py, issue #18), with real peer processes: the same
results as the copying exchange for every form of the call (weights, push-sum's per-destination
weights, out=, a directed pattern, self weight 0, several blocks), the pairing check still a
ValueError, and a peer killed in the middle of a round an error on the others, not a hang."""
from __future__ import annotations

import numpy as np
import pytest

from gossip.testing import spawn


def _read_directly(peer, direct: bool) -> list:
    """From here on, exchanges of 1 KiB and more read directly (blocks of 16 KiB) or, not
    ``direct``, never do; returns the list the direct exchanges are counted in."""
    from collectives.operations import neighbor_allreduce
    from collectives.algorithms import choice, neighbor_direct
    choice.DIRECT_NEIGHBOR_MIN_BYTES = 1024 if direct else 1 << 62
    neighbor_direct.BLOCK_BYTES = 16 << 10
    calls = []
    real = neighbor_allreduce.direct_exchange

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)
    neighbor_allreduce.direct_exchange = counted
    peer.barrier()   # a shared-memory entry: every peer knows the others can be read
    return calls


def rounds(peer, direct):
    calls = _read_directly(peer, direct)
    n, r = peer.world_size, peer.rank
    left, right = (r - 1) % n, (r + 1) % n
    rng = np.random.default_rng(r)
    out = {}
    x = rng.standard_normal(300_001).astype(np.float32)
    peer.neighbor_allreduce(x, 1 / 3, {left: 1 / 3, right: 1 / 3}, [left, right])
    out["ring"] = x
    y = rng.standard_normal(70_000)   # push-sum: keep 1/3, send 1/3 each way
    peer.neighbor_allreduce(y, 1 / 3, {left: 1.0, right: 1.0}, [left, right],
                            dst_weights={left: 1 / 3, right: 1 / 3})
    out["push"] = y
    z = rng.standard_normal(50_000)   # directed, into out=, z only sent
    into = np.empty_like(z)
    before = z.copy()
    peer.neighbor_allreduce(z, 0.5, {left: 0.5}, [right], out=into)
    out["directed"], out["kept"] = into, bool(np.array_equal(z, before))
    w = rng.standard_normal(40_000)   # self weight 0, unchecked
    peer.neighbor_allreduce(w, 0.0, {left: 0.5, right: 0.5}, [left, right],
                            check_pattern=False)
    out["unchecked"] = w
    return out, len(calls)


def test_reading_the_sources_gives_what_copying_gives():
    direct = spawn(rounds, n=4, timeout=120, args=(True,))
    copied = spawn(rounds, n=4, timeout=120, args=(False,))
    for (got, calls), (want, none) in zip(direct, copied):
        assert calls == 4 and none == 0
        assert got["kept"] and want["kept"]
        for key in ("ring", "push", "directed", "unchecked"):
            assert np.allclose(got[key], want[key], rtol=1e-6, atol=1e-6), key
    total = sum(out["push"].sum() for out, _ in direct)
    assert abs(total - sum(out["push"].sum() for out, _ in copied)) < 1e-6


def unpaired(peer, direct):
    """Ranks 0 and 1 exchange, but rank 1 does not send to rank 0, which expects it."""
    _read_directly(peer, direct)
    x = np.ones(1 << 16, np.float32)
    r = peer.rank
    if r == 2:
        return "uninvolved"
    srcs, dsts = ({1: 0.5}, [1]) if r == 0 else ({0: 0.5}, [])
    try:
        peer.neighbor_allreduce(x, 0.5, srcs, dsts)
    except ValueError as exc:
        return str(exc)
    return "no error"


def test_a_pattern_that_does_not_pair_is_still_a_value_error_on_both_ends():
    for direct in (True, False):
        results = spawn(unpaired, n=3, timeout=60, peer_timeout=20, args=(direct,))
        for message in results[:2]:
            assert "do not pair" in message and "rank 1" in message, (direct, message)


def killed_mid_round(peer):
    """Rank 2 SIGKILLs itself while its neighbours read its 64 MiB in blocks of 16 KiB; each
    element of the survivors' arrays is then its own value or the round's result."""
    import os
    import signal
    import threading
    import gossip
    _read_directly(peer, True)
    n, r = peer.world_size, peer.rank
    x = np.full(16 << 20, float(r + 1), np.float32)
    left, right = (r - 1) % n, (r + 1) % n
    peer.barrier()
    if r == 2:
        threading.Timer(0.01, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    try:
        peer.neighbor_allreduce(x, 1 / 3, {left: 1 / 3, right: 1 / 3}, [left, right])
    except (gossip.PeerLost, gossip.OperationTimeout) as exc:
        return type(exc).__name__, str(exc), np.unique(x).tolist()
    return "ok", "", np.unique(x).tolist()


def test_a_source_killed_mid_round_is_an_error_naming_it():
    results = spawn(killed_mid_round, n=4, timeout=90, peer_timeout=15, tolerate=(2,))
    assert results[2] is None
    n = 4
    for r in (1, 3):   # rank 2's neighbours
        kind, message, values = results[r]
        assert kind == "PeerLost", (kind, message)
        assert "rank 2" in message, message
        result = (r + 1 + (r - 1) % n + 1 + (r + 1) % n + 1) / 3
        for v in values:   # its own value, or the round's result: nothing in between
            assert v == r + 1 or abs(v - result) < 1e-5, (r, values, result)


def slow_reader(peer, wait_seconds):
    """A ring round of 64 blocks in which rank 1 reads each block 2 ms late, so its sources
    (ranks 0 and 2) reach blocks it has not read yet; they wait ``wait_seconds`` for it
    before writing such a block aside. Returns the result and the blocks written aside."""
    import time
    from collectives.algorithms import neighbor_direct
    _read_directly(peer, True)
    neighbor_direct.WAIT_SECONDS = wait_seconds
    combine, aside = neighbor_direct._combine, []

    def counted(*args, **kwargs):
        blocks = combine(*args, **kwargs)
        aside.append(len(blocks))
        return blocks
    neighbor_direct._combine = counted
    if peer.rank == 1:
        read = neighbor_direct.read_peer

        def late(*args, **kwargs):
            time.sleep(0.002)   # a reader the scheduler runs late
            return read(*args, **kwargs)
        neighbor_direct.read_peer = late
    n, r = peer.world_size, peer.rank
    x = np.random.default_rng(r).standard_normal(64 * 4096).astype(np.float32)
    peer.neighbor_allreduce(x, 0.2, {(r - 1) % n: 0.5, (r + 1) % n: 0.3},
                            [(r - 1) % n, (r + 1) % n])
    return x, sum(aside)


def test_a_block_is_overwritten_only_after_its_readers_read_it():
    """Whether the writers wait for the late reader or write its blocks aside, every peer
    gets the round's result (computed here from the peers' inputs), so no peer overwrote a
    block before its readers had it."""
    n = 4
    inputs = [np.random.default_rng(r).standard_normal(64 * 4096).astype(np.float32)
              for r in range(n)]
    want = [0.2 * inputs[r] + 0.5 * inputs[(r - 1) % n] + 0.3 * inputs[(r + 1) % n]
            for r in range(n)]
    for wait_seconds in (0.0, 5.0):
        results = spawn(slow_reader, n=n, timeout=120, args=(wait_seconds,))
        for r, (got, aside) in enumerate(results):
            assert np.allclose(got, want[r], rtol=1e-5, atol=1e-6), (wait_seconds, r)
        if wait_seconds == 0.0:   # the late reader's sources wrote blocks aside
            assert results[0][1] > 0 and results[2][1] > 0, [a for _, a in results]


def gathered(peer, way, dtype):
    """neighbor_allgather on a ring with arrays of another size on every peer (rank r's 10 +
    5000 r elements), one of the ways a peer on this host gets its sources' arrays:
    "entry" (the default: through the shared-memory entry, each array in its owner's slot
    where it fits, else read out of its owner's memory), "entry-sent" (the same where peers
    cannot read each other: what does not fit a slot is sent), "offered" (the copying call,
    the peers with 4 KiB or more, all but rank 0, offering theirs to be read: as across hosts
    with neighbours on this one) and "sent" (the copying call, every array sent). Returns
    what it got, the bytes counted towards its right neighbour and how many arrays it read
    out of another's memory (what the others read of it, or it sent, is counted as sent)."""
    from collectives.algorithms import shm_neighbor
    from collectives.operations import neighbor_allgather
    if way in ("offered", "sent"):
        neighbor_allgather.gather_may_use_slots = lambda *args, **kwargs: False
    neighbor_allgather.READ_MIN_BYTES = 4096 if way == "offered" else 1 << 62
    reads = []
    real_read, real_range = neighbor_allgather._read, shm_neighbor.read_range

    def counted(*args, **kwargs):
        reads.append(1)
        return real_read(*args, **kwargs)

    def counted_range(*args, **kwargs):
        reads.append(1)
        return real_range(*args, **kwargs)
    neighbor_allgather._read = counted
    shm_neighbor.read_range = counted_range
    peer.barrier()   # a shared-memory entry: every peer knows the others can be read
    if way == "entry-sent":
        peer.communicator.engine.on_host.entry.direct = False   # (alike on every peer)
    n, r = peer.world_size, peer.rank
    x = (np.arange(10 + 5000 * r, dtype=dtype) + 1000 * r).reshape(-1, 1)
    sent = peer.communicator.transport.counters[(r + 1) % n].bytes_sent
    got = peer.neighbor_allgather(x)
    moved = peer.communicator.transport.counters[(r + 1) % n].bytes_sent - sent
    slot = peer.communicator.engine.on_host.entry.data_bytes
    return got, moved, len(reads), slot


# float32 as well as float64: the reads were sized by the count message's int64 until
# 2026-12-07, so a float32 array was read twice its length, past both arrays' ends (wrong
# values, EFAULT, or the reader's heap overrun); float64's 8 bytes hid it.
@pytest.mark.parametrize("dtype", ["float64", "float32", "int16"])
@pytest.mark.parametrize("way", ["entry", "entry-sent", "offered", "sent"])
def test_neighbor_allgather_gets_every_source_whichever_way_it_travels(way, dtype):
    n = 4
    want = []
    for r in range(n):
        parts = [np.arange(10 + 5000 * s, dtype=dtype) + 1000 * s
                 for s in sorted({(r - 1) % n, (r + 1) % n})]
        want.append(np.concatenate(parts).reshape(-1, 1))
    itemsize = np.dtype(dtype).itemsize
    results = spawn(gathered, n=n, timeout=120, args=(way, dtype))
    for r, (got, moved, reads, slot) in enumerate(results):
        assert got.dtype == want[r].dtype and np.array_equal(got, want[r]), (way, r)
        sources = {(r - 1) % n, (r + 1) % n}
        if way == "entry":   # the sources whose array is larger than a slot are read
            expected = sum(1 for s in sources if 64 + (10 + 5000 * s) * itemsize > slot)
        elif way == "offered":   # ranks 1-3 offer their arrays; rank 0's is too small
            expected = sum(1 for s in sources if s != 0)
        else:
            expected = 0
        assert reads == expected, (way, r, reads, expected)
        # read, copied out of a slot or sent: counted once, at the array's size (the reads'
        # count was doubled once)
        assert (10 + 5000 * r) * itemsize <= moved <= (10 + 5000 * r) * itemsize + 1024, \
            (way, r, moved)


def two_at_once(peer):
    """Two rounds at once on every peer, one as a Work and one blocking, each on its own
    array, five times: both read their sources directly and write in place."""
    calls = _read_directly(peer, True)
    n, r = peer.world_size, peer.rank
    srcs, dsts = {(r - 1) % n: 0.25, (r + 1) % n: 0.5}, [(r - 1) % n, (r + 1) % n]
    results = []
    for k in range(5):
        a = np.random.default_rng(100 * k + r).standard_normal(1 << 18).astype(np.float32)
        b = np.random.default_rng(100 * k + r + 50).standard_normal(1 << 18).astype(np.float32)
        work = peer.neighbor_allreduce(a, 0.25, srcs, dsts, wait=False)
        peer.neighbor_allreduce(b, 0.25, srcs, dsts)
        work.wait()
        results.append((a, b))
    return results, len(calls)


def test_two_rounds_at_once_each_get_their_own_result():
    n = 4
    results = spawn(two_at_once, n=n, timeout=120)
    for r, (rounds, calls) in enumerate(results):
        assert calls == 10, calls
        for k, (a, b) in enumerate(rounds):
            for got, offset in ((a, 0), (b, 50)):
                x = [np.random.default_rng(100 * k + j + offset).standard_normal(1 << 18)
                     .astype(np.float32) for j in range(n)]
                want = 0.25 * x[r] + 0.25 * x[(r - 1) % n] + 0.5 * x[(r + 1) % n]
                assert np.allclose(got, want, rtol=1e-5, atol=1e-6), (r, k, offset)
