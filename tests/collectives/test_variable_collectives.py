"""Collectives whose per-peer sizes differ, between real peer processes: all-to-all with
per-peer counts (MPI's Alltoallv, torch's all_to_all_single split sizes), reduce_scatter
with per-rank counts (MPI's Reduce_scatter), gather and scatter with per-peer counts (MPI's
Gatherv and Scatterv), and BlueFog's neighbor_allgather on a topology.
Each is checked against the result those libraries document, with empty blocks, numpy and
torch, the non-blocking twin, and peers that disagree raising on every peer."""
from __future__ import annotations

import numpy as np
import pytest

from gossip.testing import spawn, wait_until


def send_counts_of(r: int, n: int) -> list[int]:
    """Peer r sends (r + j) % 3 elements to peer j: some blocks empty, none alike."""
    return [(r + j) % 3 for j in range(n)]


def block(src: int, dst: int, count: int) -> np.ndarray:
    return 100.0 * src + 10.0 * dst + np.arange(count)


def alltoallv(peer):
    n, r = peer.world_size, peer.rank
    sends = send_counts_of(r, n)
    recvs = [send_counts_of(j, n)[r] for j in range(n)]
    x = np.concatenate([block(r, j, sends[j]) for j in range(n)])
    keep = x.copy()
    want = np.concatenate([block(j, r, recvs[j]) for j in range(n)])
    out = []
    got = peer.alltoall(x, send_counts=sends, recv_counts=recvs)
    out.append(("known counts", np.array_equal(got, want) and np.array_equal(x, keep)))
    got = peer.alltoall(x, send_counts=sends)   # the peers tell each other their counts
    out.append(("exchanged counts", np.array_equal(got, want)))
    buf = np.full(sum(recvs), -1.0)
    work = peer.alltoall(x, send_counts=sends, recv_counts=recvs, out=buf, wait=False)
    out.append(("non-blocking into out", work.wait() is buf and np.array_equal(buf, want)))
    import torch
    t = torch.from_numpy(x.astype(np.float32))
    got = peer.alltoall(t, send_counts=sends)
    out.append(("torch", isinstance(got, torch.Tensor)
                and np.array_equal(got.numpy(), want.astype(np.float32))))
    return out


@pytest.mark.parametrize("n", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_alltoall_with_per_peer_counts_moves_each_block_to_its_peer(n):
    for rows in spawn(alltoallv, n=n, timeout=90):
        assert all(ok for _, ok in rows), rows


def alltoallv_disagreeing(peer):
    import gossip
    n, r = peer.world_size, peer.rank
    sends = [2] * n
    recvs = [2] * n
    if r == 0:
        recvs[1] = 3          # rank 0 expects 3 elements from rank 1, which sends 2
    try:
        peer.alltoall(np.zeros(2 * n), send_counts=sends, recv_counts=recvs, timeout=20)
    except gossip.GossipError as exc:
        # Every peer raised before any data moved: the next calls that pair work, small
        # (through the slots on one host) and large (read out of the arrays).
        after = [peer.alltoall(np.full(count * n, float(r)), send_counts=[count] * n)
                 for count in (2, 20_000)]
        return type(exc).__name__, str(exc), [a.tolist()[::count] for a, count
                                               in zip(after, (2, 20_000))]
    return None


def test_alltoall_counts_that_do_not_pair_raise_on_every_peer():
    n = 3
    results = spawn(alltoallv_disagreeing, n=n, timeout=60)
    assert all(res is not None and res[0] == "ProtocolError" for res in results), results
    assert all("rank 1 sends 2 elements to rank 0, which expects 3" in res[1]
               for res in results), results
    assert all(res[2] == [list(map(float, range(n)))] * 2 for res in results), results


def counts_not_integers(peer):
    import torch
    x = np.arange(2.0)
    refused = []
    for counts in ([1.7, 0.3], np.array([1.0, 1.0]), torch.ones(2)):
        try:   # int() would cut 1.7 to 1 and go on with the wrong blocks
            peer.alltoall(x, send_counts=counts, recv_counts=[1, 1])
        except ValueError as exc:
            refused.append(str(exc))
    got = peer.alltoall(x, send_counts=torch.tensor([1, 1]), recv_counts=np.array([1, 1]))
    return refused, got.tolist()


def test_counts_that_are_not_integers_are_refused_before_the_call():
    for r, (refused, got) in enumerate(spawn(counts_not_integers, n=2, timeout=60)):
        assert len(refused) == 3, refused
        assert all(f"rank {r}: alltoall send counts must be 2 integers" in m for m in refused)
        assert got == [float(r)] * 2   # (block r of both peers: element r)


def allgatherv_into(peer):
    import gossip
    n, r = peer.world_size, peer.rank
    sizes = [3 * j for j in range(n)]          # rank 0 gives nothing
    x = np.arange(sizes[r], dtype=np.float64) + 100 * r
    into = np.full(sum(sizes), -1.0)
    parts = peer.allgather(x, variable=True, out=into)
    ok = all(p.base is into for p in parts) and np.array_equal(
        into, np.concatenate([np.arange(s) + 100.0 * j for j, s in enumerate(sizes)]))
    try:   # rank 2's out= is one element too long: every peer raises, naming it
        peer.allgather(x, variable=True, out=np.empty(sum(sizes) + (r == 2)))
    except gossip.ProtocolError as exc:
        return ok, str(exc), peer.allgather(np.full(2, float(r)), variable=True)[n - 1].tolist()
    return ok, None, None


@pytest.mark.parametrize("transport", ["tcp", "auto"])
def test_allgather_of_unequal_sizes_into_a_callers_buffer(transport):
    n = 3
    for ok, message, after in spawn(allgatherv_into, n=n, timeout=60, transport=transport):
        assert ok
        assert message is not None and "the parts are 9 elements, but rank 2's out= holds 10" \
            in message, message
        assert after == [float(n - 1)] * 2


def allgatherv_into_strided(peer):
    n, r = peer.world_size, peer.rank
    sizes = [j + 1 for j in range(n)]
    x = np.arange(sizes[r], dtype=np.float64) + 100 * r
    backing = np.full(2 * sum(sizes), -1.0)
    into = backing[::2]                          # one-dimensional, not contiguous
    parts = peer.allgather(x, variable=True, out=into)
    want = np.concatenate([np.arange(s) + 100.0 * j for j, s in enumerate(sizes)])
    filled = np.array_equal(into, want) and np.all(backing[1::2] == -1.0)
    parts[n - 1][0] = 7.0                        # a view of out=, not of a copy
    views = into[sum(sizes[:n - 1])] == 7.0
    try:   # a non-contiguous 2-d out= has no views to give: refused before the call
        peer.allgather(x, variable=True, out=np.empty((sum(sizes), 2))[:, 0:1])
        refused = None
    except ValueError as exc:
        refused = str(exc)
    after = peer.allgather(np.full(2, float(r)), variable=True)[n - 1].tolist()
    return filled, views, refused, after


@pytest.mark.parametrize("transport", ["tcp", "auto"])
def test_allgather_of_unequal_sizes_into_a_strided_buffer_returns_views_of_it(transport):
    n = 3
    for filled, views, refused, after in spawn(allgatherv_into_strided, n=n, timeout=60,
                                               transport=transport):
        assert filled and views
        assert refused is not None and "out must be contiguous or one-dimensional" in refused
        assert after == [float(n - 1)] * 2


def reduce_scatter_counts(peer):
    n, r = peer.world_size, peer.rank
    counts = [2 * k + (k == 1) for k in range(n)]        # [0, 3, 4, ...]: one empty
    size = sum(counts)
    x = np.arange(size, dtype=np.float64) * (r + 1)
    mine = peer.reduce_scatter(x, counts=counts)
    lo = sum(counts[:r])
    want = np.arange(lo, lo + counts[r], dtype=np.float64) * n * (n + 1) / 2
    out = [("sum", np.array_equal(mine, want))]
    x = np.full(size, float(r))
    mine = peer.reduce_scatter(x, "max", counts=counts, wait=False).wait()
    out.append(("max non-blocking", mine.shape == (counts[r],) and np.all(mine == n - 1)))
    return out


@pytest.mark.parametrize("n", [2, 3])
def test_reduce_scatter_with_per_rank_counts(n):
    for rows in spawn(reduce_scatter_counts, n=n, timeout=60):
        assert all(ok for _, ok in rows), rows


def reduce_scatter_other_counts(peer):
    import gossip
    counts = [3, 3] if peer.rank == 0 else [2, 4]
    try:
        peer.reduce_scatter(np.ones(6), counts=counts, timeout=20)
    except gossip.GossipError as exc:
        return type(exc).__name__, str(exc)
    return None


def test_reduce_scatter_peers_with_other_counts_raise_on_every_peer():
    results = spawn(reduce_scatter_other_counts, n=2, timeout=60)
    assert all(res is not None and res[0] == "ProtocolError" for res in results), results
    assert all("counts=[3,3]" in res[1] and "counts=[2,4]" in res[1] for res in results)


def part(j: int, count: int, dtype: str) -> np.ndarray:
    return (1000 * j + np.arange(count)).astype(dtype)


def gatherv_scatterv(peer, direct):
    """MPI's Gatherv and Scatterv (mpi4py's testGatherv/testScatterv): parts of other sizes,
    one of them empty, small (through the slots), large (the peers' memory, or ZeroMQ where
    they cannot read each other), numpy and torch, root 1, and the non-blocking twins."""
    from collectives.algorithms import shm_entry
    shm_entry.SharedEntry.direct_reads = direct
    n, r = peer.world_size, peer.rank
    rows = []
    for counts in ([2, 0, 5], [100_000, 3, 70_001]):
        for dtype in ("float64", "int32"):
            total = sum(counts)
            whole = np.concatenate([part(j, c, dtype) for j, c in enumerate(counts)])
            got = peer.gather(part(r, counts[r], dtype), root=1, counts=counts)
            rows.append((f"gatherv {counts} {dtype}", got is None if r != 1 else
                         got.shape == (total,) and np.array_equal(got, whole)))
            into = np.full(total, -1, dtype) if r == 1 else None
            work = peer.gather(part(r, counts[r], dtype), root=1, counts=counts, out=into,
                               wait=False)
            rows.append((f"gatherv into out {counts} {dtype}",
                         work.wait() is into and (r != 1 or np.array_equal(into, whole))))
            mine = np.full(counts[r], -1, dtype)
            peer.scatter(whole if r == 1 else None, root=1, out=mine, counts=counts)
            rows.append((f"scatterv {counts} {dtype}",
                         np.array_equal(mine, part(r, counts[r], dtype))))
    import torch
    counts = [3, 1, 70_000]
    t = torch.arange(counts[r], dtype=torch.float32) + 10 * r
    got = peer.gather(t, root=0, counts=counts)
    want = torch.cat([torch.arange(c, dtype=torch.float32) + 10 * j
                      for j, c in enumerate(counts)])
    rows.append(("torch gatherv", got is None if r else bool(torch.equal(got, want))))
    out = torch.empty(counts[r])
    peer.scatter(want if r == 0 else None, root=0, out=out, counts=counts)
    rows.append(("torch scatterv", bool(torch.equal(out, t))))
    return rows, peer.communicator._on_host.entry.direct


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "zeromq"])
def test_gather_and_scatter_with_per_peer_counts(direct):
    for rows, entered_direct in spawn(gatherv_scatterv, n=3, timeout=120, args=(direct,)):
        bad = [row for row in rows if not row[1]]
        assert not bad and len(rows) == 14, rows
        assert entered_direct is direct


def gatherv_other_counts(peer):
    import gossip
    out = []
    # A peer whose x does not hold its count: refused here, before the call takes a
    # sequence number (the others' call waits for it and times out: not made).
    try:
        peer.gather(np.ones(3), root=0, counts=[2, 2])
    except ValueError as exc:
        out.append(str(exc))
    peer.gather(np.ones(3), root=0, counts=[3, 3])   # still in step
    counts = [3, 3] if peer.rank == 0 else [3, 4]
    try:
        peer.scatter(np.ones(6) if peer.rank == 0 else None, root=0,
                     out=np.empty(3 if peer.rank == 0 else 4), counts=counts, timeout=20)
    except gossip.GossipError as exc:
        out.append((type(exc).__name__, str(exc)))
    return out


def test_gatherv_and_scatterv_refuse_counts_that_do_not_fit_or_differ():
    for refused, (kind, message) in spawn(gatherv_other_counts, n=2, timeout=60):
        assert "counts[" in refused and "has 3 elements" in refused, refused
        assert kind == "ProtocolError", message
        assert "counts=[3,3]" in message and "counts=[3,4]" in message, message


def neighbor_gather(peer):
    """A directed ring of 4 (rank r sends to r + 1) and an exponential graph's steps."""
    n, r = peer.world_size, peer.rank
    x = np.full((r + 1, 2), float(r), dtype=np.float32)    # first dims differ
    got = peer.neighbor_allgather(x)
    srcs = peer.topology.in_neighbors(r)
    want = np.concatenate([np.full((s + 1, 2), float(s), dtype=np.float32) for s in srcs])
    comm = peer.communicator
    ring = comm.neighbor_allgather(np.array([r]), [(r - 1) % n], [(r + 1) % n])
    lonely = comm.neighbor_allgather(np.ones(3), [], [])
    return (np.array_equal(got, want), got.shape, ring.tolist(), lonely.shape)


def test_neighbor_allgather_concatenates_in_neighbours_in_rank_order():
    results = spawn(neighbor_gather, n=4, topology="exponential", timeout=60)
    for r, (ok, shape, ring, lonely) in enumerate(results):
        assert ok, (r, shape)
        assert ring == [(r - 1) % 4] and lonely == (0,)


def neighbor_gather_in_given_order(peer, rows):
    """BlueFog's test_neighbor_allgather_order_dynamic: sources named in a shuffled order
    (each rank its own), destinations in another; the result follows the sources' order.
    ``rows``: rows of each array (large ones are read straight from the senders' memory once
    a barrier mapped the shared-memory entry)."""
    n, r = peer.world_size, peer.rank
    peer.barrier()
    others = [p for p in range(n) if p != r]
    srcs = [int(p) for p in np.random.default_rng(7 + r).permutation(others)]
    dsts = [int(p) for p in np.random.default_rng(70 + r).permutation(others)]
    x = np.full((rows + r, 3), float(r))
    got = peer.communicator.neighbor_allgather(x, srcs, dsts)
    named_twice = peer.communicator.neighbor_allgather(np.array([float(r)]),
                                                       [srcs[1], srcs[0], srcs[1], srcs[2]],
                                                       dsts)
    return srcs, got, named_twice.tolist()


@pytest.mark.parametrize("rows", [1, 20_000])
def test_neighbor_allgather_follows_the_order_the_sources_are_named_in(rows):
    results = spawn(neighbor_gather_in_given_order, n=4, timeout=90, args=(rows,))
    assert any(srcs != sorted(srcs) for srcs, _, _ in results)   # (the shuffles moved some)
    for r, (srcs, got, named_twice) in enumerate(results):
        want = np.concatenate([np.full((rows + s, 3), float(s)) for s in srcs])
        assert np.array_equal(got, want), (r, srcs, got[:, 0].tolist()[:10])
        assert named_twice == [float(srcs[1]), float(srcs[0]), float(srcs[2])], (r, named_twice)


def neighbor_gather_unpaired(peer, case, entry):
    """``entry``: a barrier first maps the shared-memory entry, and the call goes through it
    (OnHostNeighbors.allgather); else the copying call. "late": rank 0 calls only once rank
    1, whose call names nobody, has gone on to its next call (its slot holds that call's)."""
    import gossip
    r = peer.rank
    if entry:
        peer.barrier()
    if entry == "late" and r == 0:
        from types import SimpleNamespace
        shm = peer.communicator.engine.on_host.entry
        wait_until(lambda: shm.moved_on(SimpleNamespace(seq=1), 1), 30, what="rank 1 on")
    if case == "one-sided":     # both send to each other; rank 0 expects nothing back
        srcs, dsts = ([] if r == 0 else [0]), [1 - r]
    else:                       # rank 0 expects rank 1's array; rank 1's call names nobody
        srcs, dsts = ([1] if r == 0 else []), []
    try:
        peer.communicator.neighbor_allgather(np.ones(2), srcs, dsts, timeout=20)
        first = None
    except (gossip.GossipError, ValueError) as exc:
        first = type(exc).__name__, str(exc)
    # The group stays usable; and a peer whose call completed stays until the other has
    # its answer (else that one could find it closed instead: PeerLost, not the refusal).
    # (64 elements: on one host through the entry, which "late" waits to see rank 1 enter.)
    assert peer.allreduce(np.ones(64)).tolist() == [2.0] * 64
    return first


@pytest.mark.parametrize("entry", [False, True], ids=["copying", "entry"])
def test_neighbor_allgather_a_send_nobody_expects_raises_on_both_ends(entry):
    results = spawn(neighbor_gather_unpaired, n=2, timeout=60, args=("one-sided", entry))
    assert all(res is not None and res[0] == "ValueError" for res in results), results
    assert all("rank 1 plans to send to rank 0" in res[1] for res in results), results
    assert all(("+slots" in res[1]) == entry for res in results), results


@pytest.mark.parametrize("entry", [False, True, "late"], ids=["copying", "entry", "late"])
def test_neighbor_allgather_naming_a_peer_whose_call_does_not_name_it_raises_there(entry):
    # As neighbor_allreduce: rank 1's own call (no neighbours) is complete and right. Through
    # the entry rank 1 goes on to its next call without waiting for rank 0: whether rank 0
    # reads rank 1's slot before or after, the error is the same.
    for _ in range(3 if entry is True else 1):
        results = spawn(neighbor_gather_unpaired, n=2, timeout=60, args=("stranger", entry))
        assert results[0] is not None and results[0][0] == "ValueError", results
        assert f"rank 1's call at sequence {int(bool(entry))} does not involve rank 0" \
            in results[0][1], results
        # (Through the entry rank 1 never waits for rank 0; the copying call may still be
        # told of rank 0's refusal.)
        assert results[1] is None or not entry, results


def coalesced(peer):
    import torch
    n, r = peer.world_size, peer.rank
    matrix = np.full((4, 4), float(r))
    arrays = [np.full((2, 3), float(r)), np.arange(5.0) * (r + 1), matrix[:, 1]]   # a column
    keep = matrix.copy()
    out = peer.allreduce(arrays)
    total = n * (n - 1) / 2
    ok = (out is arrays and np.all(arrays[0] == total)
          and np.array_equal(arrays[1], np.arange(5.0) * n * (n + 1) / 2)
          and np.all(arrays[2] == total)
          and np.array_equal(np.delete(matrix, 1, axis=1), np.delete(keep, 1, axis=1)))
    tensors = [torch.full((3,), float(r)), torch.arange(4.0)]
    work = peer.allreduce(tensors, op="max", wait=False)
    got = work.wait()
    ok_torch = got is tensors and tensors[0].tolist() == [n - 1.0] * 3 \
        and tensors[1].tolist() == [0.0, 1.0, 2.0, 3.0]
    # Several dtypes and families in one list (Horovod's grouped_allreduce, hivemind's
    # averaged tensors): one packed call per dtype, in the order each first appears.
    mixed = [np.full(3, r, dtype=np.int64), torch.full((2,), float(r), dtype=torch.float64),
             np.full((2, 2), float(r), dtype=np.float32), np.arange(4, dtype=np.int64) * r]
    peer.allreduce(mixed, op="sum")
    total = n * (n - 1) // 2
    ok_mixed = (mixed[0].tolist() == [total] * 3 and mixed[0].dtype == np.int64
                and mixed[1].tolist() == [float(total)] * 2
                and mixed[1].dtype == torch.float64
                and np.all(mixed[2] == total) and mixed[2].dtype == np.float32
                and mixed[3].tolist() == [i * total for i in range(4)])
    after = peer.allreduce(np.ones(3))
    return ok, ok_torch, ok_mixed, after.tolist() == [float(n)] * 3


def test_a_list_of_arrays_is_reduced_in_one_call():
    for result in spawn(coalesced, n=3, timeout=60, preload=("torch",)):
        assert result == (True, True, True, True), result


def coalesced_other_layouts(peer):
    import gossip
    sizes = (3, 2) if peer.rank == 0 else (2, 3)      # the same 5 elements in all
    errors = []
    try:
        peer.allreduce([np.ones(sizes[0]), np.ones(sizes[1])], timeout=20)
        errors.append(None)
    except gossip.GossipError as exc:
        errors.append((type(exc).__name__, str(exc)))
    # The same arrays in another order of dtypes: the first calls differ.
    pair = [np.ones(2, dtype=np.float32), np.ones(2)]
    try:
        peer.allreduce(pair if peer.rank == 0 else pair[::-1], timeout=20)
        errors.append(None)
    except gossip.GossipError as exc:
        errors.append((type(exc).__name__, str(exc)))
    return errors


def test_lists_of_other_sizes_raise_on_every_peer():
    results = spawn(coalesced_other_layouts, n=2, timeout=60)
    assert all(res[0] is not None and res[0][0] == "ProtocolError" for res in results), results
    assert all("arrays=[3,2]" in res[0][1] and "arrays=[2,3]" in res[0][1] for res in results)
    assert all(res[1] is not None and res[1][0] == "ProtocolError" for res in results), results
    assert all("float32" in res[1][1] and "float64" in res[1][1] for res in results), results


def coalesced_compressed(peer):
    import torch
    n, r = peer.world_size, peer.rank
    tensors = [torch.full((300,), float(r + 1)), torch.arange(7.0) * (r + 1),
               torch.full((2, 5), -float(r))]
    got = peer.allreduce(tensors, op="mean", compression="fp16")
    mean = (n + 1) / 2
    ok = (got is tensors and torch.allclose(tensors[0], torch.full((300,), mean))
          and torch.allclose(tensors[1], torch.arange(7.0) * mean)
          and torch.allclose(tensors[2], torch.full((2, 5), -(n - 1) / 2)))
    sizes = (3, 2) if r == 0 else (2, 3)      # the layout is the call's, with a codec too
    try:
        peer.allreduce([np.ones(sizes[0], np.float32), np.ones(sizes[1], np.float32)],
                       compression="int8", timeout=20)
        other = None
    except Exception as exc:   # (gossip's errors: imported by the peer)
        other = type(exc).__name__
    return ok, other


def test_a_list_of_arrays_goes_through_a_codec_in_one_call():
    for ok, other in spawn(coalesced_compressed, n=3, timeout=60, preload=("torch",)):
        assert ok
        assert other == "ProtocolError"


def gather_fails_while_read(peer):
    """Rank 0 offers a 32 MiB array to rank 1, which reads it out of rank 0's memory, but
    names rank 2 as a source, whose call names nobody: rank 0 raises (the pattern) and at once
    overwrites its array. Rank 1, paired with rank 0, must get rank 0's array whole or an
    error, never a mix of the two."""
    import gossip
    r = peer.rank
    peer.barrier()   # the entry mapped: the call goes through it
    x = np.full(8 << 20, float(r + 1), dtype=np.float32)
    srcs, dsts = {0: ([2], [1]), 1: ([0], []), 2: ([], [])}[r]
    try:
        got = peer.communicator.neighbor_allgather(x, srcs, dsts, timeout=30)
    except (gossip.GossipError, ValueError) as exc:
        x[:] = -1.0   # what a caller may do with its array once the call returned
        return type(exc).__name__, None
    return "ok", (sorted(set(got.tolist())), got.size) if got.size else None


def test_a_gather_that_fails_leaves_its_array_as_it_was_until_its_readers_are_done():
    for _ in range(3):
        results = spawn(gather_fails_while_read, n=3, timeout=90)
        assert results[0] == ("ValueError", None), results
        kind, seen = results[1]
        assert kind != "ok" or seen == ([1.0], 8 << 20), results   # whole, or an error
