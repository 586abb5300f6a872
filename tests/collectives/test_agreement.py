"""Agreement between ranks (DESIGN.md): every collective call is checked against the other
peers' calls, so a disagreement is an error on the peers involved, in about one exchange's
time, never silent garbage or a wait for the timeout; a call refused by its local checks leaves
the group in step. Real peers, real sockets; the peers' timeout is 20 s and every error must
come well before it."""
from __future__ import annotations

import time

import numpy as np
import pytest

import gossip
from gossip.testing import spawn

PEER_TIMEOUT = 20.0
QUICK = 10.0  # an agreement error comes well before the peers' timeout


def outcome(fn):
    """(error type name, message, seconds) of ``fn()``, or ("ok", result, seconds)."""
    start = time.monotonic()
    try:
        result = fn()
    except (gossip.GossipError, ValueError, TypeError) as exc:
        return type(exc).__name__, str(exc), time.monotonic() - start
    return "ok", result, time.monotonic() - start


# ---------------------------------------------------------------- defect 1: out= is checked
def wrong_outs(peer):
    n, r = peer.world_size, peer.rank
    x = np.array([1, 2], dtype=np.int32) + 10 * r
    same_itemsize = outcome(lambda: peer.allgather(x, out=np.empty((n, 2), np.float32)))
    narrower = outcome(lambda: peer.allgather(x.astype(np.float32),
                                              out=np.empty((n, 2), np.float16)))
    strided_out = np.zeros((n, 4), np.int32)
    strided = outcome(lambda: peer.allgather(x, out=strided_out[:, ::2]))   # now accepted
    y = np.ones(8)
    bad_scratch = outcome(lambda: peer.neighbor_allreduce(
        y, 0.5, {(r - 1) % n: 0.5}, [(r + 1) % n], scratch=np.empty(8, np.float32)))
    bad_out = outcome(lambda: peer.neighbor_allreduce(
        y, 0.5, {(r - 1) % n: 0.5}, [(r + 1) % n], out=np.empty(7)))
    # Nothing refused above took a sequence number: the group is still in step.
    good = peer.allgather(x, out=np.empty((n, 2), np.int32))
    return [same_itemsize[:2], narrower[:2], (strided[0], strided_out.tolist()),
            bad_scratch[:2], bad_out[:2], good.tolist()]


def test_an_out_of_another_dtype_size_or_layout_is_refused_on_every_rank():
    n = 3
    for result in spawn(wrong_outs, n=n, timeout=90, peer_timeout=PEER_TIMEOUT):
        *refusals, good = result
        for kind, message in refusals[:2] + refusals[3:]:
            assert kind == "ValueError", (kind, message)
            assert "out must be" in message or "scratch" in message, message
        assert refusals[2] == ("ok", [[1 + 10 * k, 0, 2 + 10 * k, 0] for k in range(n)])
        assert "allgather" in refusals[0][1] and "int32" in refusals[0][1]
        assert "float32" in refusals[0][1]
        assert good == [[1 + 10 * r, 2 + 10 * r] for r in range(n)]


def recv_into_wrong_out(peer):
    if peer.rank == 0:
        peer.send(1, np.arange(4, dtype=np.float32))
        return None
    refused = outcome(lambda: peer.recv(0, out=np.empty(4, np.int32)))
    got = peer.recv(0, out=np.empty(4, np.float32))  # the message is still there
    return refused[:2], got.tolist()


def test_recv_into_a_wrong_out_is_refused_and_the_message_stays():
    _, (refused, got) = spawn(recv_into_wrong_out, n=2, timeout=60, peer_timeout=PEER_TIMEOUT)
    assert refused[0] == "ValueError" and "float32" in refused[1] and "int32" in refused[1]
    assert got == [0.0, 1.0, 2.0, 3.0]


# ---------------------------------------------------------------- defect 4: a refused call
def one_rank_refused(peer, op):
    n, r = peer.world_size, peer.rank
    x = np.ones(3, dtype=np.float64)
    calls = {   # every peer makes the call; rank 0's own arguments are wrong
        "allgather out=": lambda: peer.allgather(x, out=np.empty(3 * n + (r == 0))),
        "gather counts": lambda: peer.gather(np.ones(2 + (r == 0)), root=1, counts=[2] * n),
        "gather root's out=": lambda: peer.gather(x, root=0, out=np.empty(3 * n + (r == 0))
                                                  if r == 0 else None),
        "scatter root's x": lambda: peer.scatter(np.ones(2 * n + 1) if r == 0 else None,
                                                 root=0, out=np.empty(2)),
        "alltoallv counts": lambda: peer.alltoall(
            np.ones(n + (r == 0)), send_counts=[1] * n, recv_counts=[1] * n),
        "reduce_scatter counts": lambda: peer.reduce_scatter(
            np.ones(n + (r == 0)), counts=[1] * n),
    }
    refused = outcome(calls[op])[:2]
    result = outcome(lambda: peer.allreduce(np.full(4, float(r))))
    return refused, result[0], result[1].tolist() if result[0] == "ok" else result[1], result[2]


@pytest.mark.parametrize("op", ["allgather out=", "gather counts", "gather root's out=",
                                "scatter root's x", "alltoallv counts", "reduce_scatter counts"])
def test_a_call_one_rank_refuses_fails_on_every_rank_and_leaves_the_group_in_step(op):
    # A check only rank 0 can make (of its own arrays) fails a call of its own number there:
    # the others raise at once, naming rank 0 and why, and the next call runs on every rank.
    n = 3
    results = spawn(one_rank_refused, n=n, timeout=90, peer_timeout=PEER_TIMEOUT,
                    args=(op,))
    assert results[0][0][0] == "ValueError" and "rank 0: " in results[0][0][1], results[0]
    why = results[0][0][1]
    for r, (refused, kind, value, elapsed) in enumerate(results[1:], start=1):
        if op == "gather root's out=" and refused[0] == "ok":
            continue   # a gather's sender may be done before its root refuses (known-limits)
        assert refused[0] == "ProtocolError", refused
        # (directly, or relayed by another peer that heard it first)
        assert refused[1].startswith(f"rank {r}: ") and "abandoned the operation" in \
            refused[1] and why[:40] in refused[1], refused
    for _, kind, value, elapsed in results:
        assert kind == "ok", value
        assert value == [float(sum(range(n)))] * 4
        assert elapsed < QUICK


# ---------------------------------------------------------------- defects 2 and 3: broadcast
def broadcast_own_root(peer):
    x = np.full(16, float(peer.rank))
    return outcome(lambda: peer.broadcast(x, root=peer.rank))


def test_ranks_that_pass_different_roots_all_raise():
    for kind, message, elapsed in spawn(broadcast_own_root, n=3, timeout=90,
                                        peer_timeout=PEER_TIMEOUT):
        assert kind == "ProtocolError", message
        assert "broadcast(root=" in message
        assert elapsed < QUICK


def broadcast_against(peer, other):
    x = np.full(1000, float(peer.rank), dtype=np.float32)
    if peer.rank == 0:
        return outcome(lambda: peer.broadcast(x, root=0))
    if other == "dtype":
        return outcome(lambda: peer.broadcast(x.astype(np.float64), root=0))
    if other == "root":
        return outcome(lambda: peer.broadcast(x, root=1))
    return outcome(lambda: peer.allreduce(x))


def test_the_root_of_a_broadcast_learns_of_a_mismatch():
    for other, names in (("dtype", ("float32", "float64")), ("collective", ("allreduce",)),
                         ("root", ("root=0", "root=1"))):
        results = spawn(broadcast_against, n=3, timeout=90, args=(other,),
                        peer_timeout=PEER_TIMEOUT)
        kind, message, elapsed = results[0]
        assert kind == "ProtocolError", (other, results)
        assert "broadcast" in message and all(name in message for name in names), message
        assert elapsed < QUICK
        # Every rank, rank 2 too when it agrees with rank 1 on root 1: the barrier that closes
        # a broadcast lets no rank return before it heard from every other.
        assert all(r[0] == "ProtocolError" and r[2] < QUICK for r in results), (other, results)


def broadcast_tail_disagrees(peer):
    x = np.full(4096, float(peer.rank), dtype=np.float32)
    if peer.rank == peer.world_size - 1:   # the ring's last rank: its predecessors all agree
        x = x.astype(np.float64)
    results = [outcome(lambda: peer.broadcast(x, root=0))[0] for _ in range(3)]
    return results, peer.allreduce(np.ones(1)).tolist()


def test_no_rank_returns_from_a_broadcast_that_a_later_rank_refuses():
    # Ranks 1 and 2 agree with the root; only rank 3 does not. Before the closing barrier,
    # ranks 1 and 2 returned the root's data while rank 3 raised.
    for results, after in spawn(broadcast_tail_disagrees, n=4, timeout=120,
                                peer_timeout=PEER_TIMEOUT):
        assert results == ["ProtocolError"] * 3, results
        assert after == [4.0]  # and the group is still in step


# ---------------------------------------------------------------- defect 5: unpaired patterns
def unpaired_pattern(peer, case):
    n, r = peer.world_size, peer.rank
    x = np.ones(256)
    if case == "shifted":  # everyone hears from r-1, everyone sends to r+2
        src, dst = {(r - 1) % n: 0.5}, [(r + 2) % n]
    elif case == "stranger":  # rank 0 expects rank 2, whose call names nobody
        src, dst = ({2: 0.5} if r == 0 else {}), []
    else:  # "one-sided": rank 1 sends to rank 0 on top of a valid ring that rank 0 keeps
        src, dst = {(r - 1) % n: 0.5}, [(r + 1) % n] + ([0] if r == 1 else [])
    first = outcome(lambda: peer.neighbor_allreduce(x, 0.5, src, dst))
    # The group stays usable: a pattern that pairs works next.
    ok = outcome(lambda: peer.neighbor_allreduce(np.full(4, float(r)), 0.5,
                                                 {(r - 1) % n: 0.5}, [(r + 1) % n]))
    return first, ok[0]


def test_patterns_that_can_never_pair_are_refused_up_front():
    n = 4
    results = spawn(unpaired_pattern, n=n, timeout=120, args=("shifted",),
                    peer_timeout=PEER_TIMEOUT)
    for r, ((kind, message, elapsed), after) in enumerate(results):
        assert kind == "ValueError", message
        assert "do not pair" in message and f"rank {r}" in message, message
        assert f"rank {(r - 1) % n}" in message or f"rank {(r + 2) % n}" in message, message
        assert elapsed < QUICK
        assert after == "ok"


def test_a_peer_named_by_a_call_that_it_does_not_name_answers_at_once():
    results = spawn(unpaired_pattern, n=3, timeout=120, args=("stranger",),
                    peer_timeout=PEER_TIMEOUT)
    kind, message, elapsed = results[0][0]
    assert kind == "ValueError" and "rank 2" in message and "does not involve" in message
    assert elapsed < QUICK
    assert all(after == "ok" for _, after in results)


def test_a_send_nobody_expects_is_refused_on_both_ends():
    results = spawn(unpaired_pattern, n=3, timeout=120, args=("one-sided",),
                    peer_timeout=PEER_TIMEOUT)
    for r in (0, 1):
        kind, message, elapsed = results[r][0]
        assert kind == "ValueError", message
        assert "rank 1 plans to send to rank 0" in message, message
        assert elapsed < QUICK
    assert all(after == "ok" for _, after in results)


# ---------------------------------------------------------------- defect 6: who is missing
def one_rank_idle(peer, rounds):
    x = np.ones(4)
    for _ in range(rounds):
        peer.allreduce(x)
    if peer.rank == 3:
        # Rank 3 makes no more calls: it only waits (on its point-to-point channel) for every
        # survivor's note that it has raised; its I/O thread still answers questions.
        for src in range(3):
            peer.recv(src, timeout=60)
        return None
    start = time.monotonic()
    try:
        peer.allreduce(x)
        result = None
    except gossip.GossipError as exc:
        result = type(exc).__name__, str(exc), getattr(exc, "rank", None), \
            time.monotonic() - start
    peer.send(3, np.zeros(1))
    return result


def test_a_timeout_names_the_rank_that_never_started_the_call():
    timeout = 6.0
    results = spawn(one_rank_idle, n=4, timeout=120, args=(20,), peer_timeout=timeout)
    for r in range(3):
        kind, message, rank, elapsed = results[r]
        assert kind == "OperationTimeout", message
        assert rank == 3, message
        assert "rank 3 has not started allreduce" in message, message
        assert "at sequence 20" in message and "idle since allreduce" in message, message
        assert "alive but sent nothing" not in message, message
        assert elapsed < timeout + 5


def broadcast_among_allreduces(peer):
    x = np.ones(16, dtype=np.float32)
    if peer.rank == 2:
        return outcome(lambda: peer.broadcast(x, root=0))
    return outcome(lambda: peer.allreduce(x))


def assert_both_calls_named(results, within: float) -> None:
    """Every rank raised ProtocolError naming the broadcast and the allreduce, in time."""
    for kind, message, elapsed in results:
        assert kind == "ProtocolError", (kind, message)
        assert "broadcast(root=0)" in message and "allreduce" in message, message
        assert elapsed < within


def test_mismatched_calls_name_both_calls_on_every_rank():
    timeout = 6.0
    for _ in range(3):
        assert_both_calls_named(spawn(broadcast_among_allreduces, n=4, timeout=120,
                                      peer_timeout=timeout), timeout + 5)


def mismatch_that_arrived_first(peer):
    """Rank 3's allreduce chunks reach rank 2 before rank 2 makes its (other) call."""
    from gossip.testing import wait_until
    x = np.ones(16, dtype=np.float32)
    if peer.rank == 3:
        before = peer.stats()["messages_sent"]
        handle = peer.allreduce(x, wait=False)
        wait_until(lambda: peer.stats()["messages_sent"] > before, 10,
                   what="rank 3's first allreduce chunk leaving")
        peer.send(2, np.zeros(1))  # behind the chunk on the same connection
        return outcome(handle.wait)
    if peer.rank == 2:
        peer.recv(3)
        return outcome(lambda: peer.broadcast(x, root=0))
    return outcome(lambda: peer.allreduce(x))


def test_a_chunk_of_another_call_that_came_first_is_a_mismatch_at_once():
    assert_both_calls_named(spawn(mismatch_that_arrived_first, n=4, timeout=120,
                                  peer_timeout=PEER_TIMEOUT), QUICK)


def unchecked_rounds(peer, mixed):
    n, r = peer.world_size, peer.rank
    x = np.full(8, float(r))
    check = not (mixed and r == 0)
    return outcome(lambda: peer.neighbor_allreduce(
        x, 0.5, {(r - 1) % n: 0.25, (r + 1) % n: 0.25}, [(r - 1) % n, (r + 1) % n],
        check_pattern=check).tolist())


def test_the_pattern_check_can_be_skipped_by_every_peer_alike():
    n = 3
    for r, (kind, value, _) in enumerate(spawn(unchecked_rounds, n=n, timeout=90,
                                               args=(False,), peer_timeout=PEER_TIMEOUT)):
        assert kind == "ok", value
        assert value == [0.5 * r + 0.25 * ((r - 1) % n) + 0.25 * ((r + 1) % n)] * 8
    for kind, message, elapsed in spawn(unchecked_rounds, n=n, timeout=90, args=(True,),
                                        peer_timeout=PEER_TIMEOUT):
        assert kind == "ProtocolError" and "(unchecked)" in message, message
        assert elapsed < QUICK


# ---------------------------------------------------------------- issue #35, defect 3
def unsupported_dtypes(peer):
    other = 1 - peer.rank
    refused = [outcome(call) for call in (
        lambda: peer.allreduce(np.array([1, "a"], dtype=object)),
        lambda: peer.broadcast(np.zeros(3, dtype="datetime64[s]"), root=0),
        lambda: peer.send(other, np.zeros(2, dtype="timedelta64[s]")))]
    x = np.ones(3)
    peer.allreduce(x)   # nothing refused took a sequence number: the group is in step
    return [r[:2] for r in refused], x.tolist()


def test_an_unsupported_dtype_is_a_type_error_naming_the_rank_the_call_and_the_dtypes():
    assert issubclass(gossip.UnsupportedDtype, gossip.GossipError)
    assert issubclass(gossip.UnsupportedDtype, TypeError)
    for rank, (refused, x) in enumerate(spawn(unsupported_dtypes, n=2, timeout=90,
                                              peer_timeout=PEER_TIMEOUT)):
        for (kind, message), call, dtype in zip(refused, ("allreduce", "broadcast", "send"),
                                                ("object", "datetime64[s]", "timedelta64[s]")):
            assert kind == "UnsupportedDtype", (kind, message)
            assert message.startswith(f"rank {rank}: {call}: "), message
            assert f"dtype {dtype}" in message and "float32, float64" in message, message
        assert x == [2.0] * 3


def differing_calls_in_shared_memory(peer, case):
    """After a first call (which maps the shared-memory arenas), the peers make calls that
    differ: the shared-memory entry compares them by a CRC of each call."""
    r = peer.rank
    count = 1000 if case.startswith("small") else 1 << 20   # shm-small, shm
    peer.allreduce(np.zeros(count, np.float32))
    peer.barrier()
    if case.endswith("shape"):
        return outcome(lambda: peer.allreduce(np.zeros(count + r, np.float32)))
    x = np.zeros(count, np.float32)
    return outcome(lambda: peer.allreduce(x) if r == 0 else peer.allreduce(x, op="max"))


@pytest.mark.parametrize("case", ["small-shape", "small-op", "large-shape", "large-op"])
def test_calls_that_differ_in_shared_memory_name_the_other_call_on_every_rank(case):
    count = 1000 if case.startswith("small") else 1 << 20
    results = spawn(differing_calls_in_shared_memory, n=3, timeout=120, args=(case,),
                    peer_timeout=PEER_TIMEOUT)
    for r, (kind, message, elapsed) in enumerate(results):
        assert kind == "ProtocolError", (kind, message)
        assert "CRC" not in message, message
        if case.endswith("shape"):   # its own shape and another rank's
            others = [f"({count + k},)" for k in range(3) if k != r]
            assert f"({count + r},)" in message and any(o in message for o in others), message
        else:                        # its own operation and the other
            assert "allreduce(sum," in message and "allreduce(max," in message, message
        assert elapsed < QUICK
