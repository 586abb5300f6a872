"""The peers' side of ``gossip bench``: what each gossip peer times for each operation
(allreduce, allgather, reduce_scatter, broadcast, reduce, gather, scatter, alltoall, neighbor,
p2p), checked once for a right result before the timed iterations, and the group of n peers
(gossip.testing.spawn) that measures one size at a time (gossip.bench.groups).

    group = gossip_group("allreduce", 4, transport="auto", key=None, reduce_op="sum",
                         algorithm="auto", limit=600)
    times, used = run_gossip("allreduce", 4, make_plan([4096], None, 3), transport="auto",
                             key=None, reduce_op="sum", algorithm="auto", timeout=None)
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence

from gossip.bench.groups import Group, announce, run_plan, serve
from gossip.bench.ops import allgatherv_counts, alltoallv_counts
from gossip.bench.sizes import ITEMSIZE, STARTUP_LIMIT, deadline_for, make_plan, size_limit
from gossip.bench.tables import iteration_times

__all__ = ["expected_allreduce", "timed_iterations", "gossip_group", "scheme", "run_gossip",
           "run_p2p"]


def expected_allreduce(reduce_op: str, n: int) -> float:
    """Every element's value after allreduce(``reduce_op``) over ``n`` peers, each contributing its
    rank + 1: the result check before timing (reduce_scatter's and reduce's too)."""
    # Rank r contributes r + 1.
    return {"sum": n * (n + 1) / 2, "mean": (n + 1) / 2, "max": float(n), "min": 1.0,
            "prod": float(math.factorial(n))}[reduce_op]


def timed_iterations(barrier: Callable[[], Any], step: Callable[[], Any], warmup: int,
                     iters: int, calls: int = 1) -> list[float]:
    """The method, for ours and the baselines alike: each iteration is ``barrier(); t0;
    step(); t1``; returns the ``iters`` timed durations after ``warmup`` untimed ones, per
    call when one step makes ``calls`` calls."""
    times = []
    for i in range(warmup + iters):
        barrier()
        t0 = time.perf_counter()
        step()
        dt = time.perf_counter() - t0
        if i >= warmup:
            times.append(dt / calls)
    return times


def _ring_weights(rank: int, n: int) -> tuple[float, dict[int, float], list[int]]:
    """Self 1/3 and 1/3 for each ring neighbour (n = 2: one neighbour at 2/3; n = 1: alone)."""
    if n == 1:
        return 1.0, {}, []
    left, right = (rank - 1) % n, (rank + 1) % n
    src: dict[int, float] = {}
    for j in (left, right):
        src[j] = src.get(j, 0.0) + 1.0 / 3.0
    return 1.0 / 3.0, src, sorted(src)


def _gossip_step(peer, op: str, count: int, reduce_op: str, algorithm: str,
                 stream: int) -> Callable[[], Any]:
    """Set up one size: check the result once, then return the callable that is timed."""
    import numpy as np

    n, r = peer.world_size, peer.rank
    if op == "allreduce":
        x = np.full(count, r + 1, dtype=np.float32)
        peer.allreduce(x, reduce_op, algorithm=algorithm)
        want = expected_allreduce(reduce_op, n)
        if not (np.allclose(x[[0, -1]], want) and np.allclose(x[count // 2], want)):
            raise AssertionError(f"rank {r}: allreduce({reduce_op}) gave {x[0]}, expected {want}")
        x[:] = 1.0 if reduce_op == "prod" else 0.0  # values stay finite over the iterations
        return lambda: peer.allreduce(x, reduce_op, algorithm=algorithm)
    if op == "allgather":
        x = np.full(count, r, dtype=np.float32)
        out = np.empty((n, count), dtype=np.float32)
        peer.allgather(x, out=out)
        if not np.array_equal(out[:, -1], np.arange(n, dtype=np.float32)):
            raise AssertionError(f"rank {r}: allgather gave {out[:, -1]}")
        return lambda: peer.allgather(x, out=out)
    if op == "broadcast":
        x = np.full(count, r + 1, dtype=np.float32)
        peer.broadcast(x, 0)
        if not (x[0] == 1 and x[-1] == 1):
            raise AssertionError(f"rank {r}: broadcast gave {x[0]}, expected 1")
        return lambda: peer.broadcast(x, 0)
    if op == "reduce_scatter":
        # The whole array, reduced in place; this peer's part comes back as a view of it.
        x = np.full(count, r + 1, dtype=np.float32)
        mine = peer.reduce_scatter(x, reduce_op)
        want = expected_allreduce(reduce_op, n)
        if mine.size != count // n or not np.allclose(mine[[0, -1]], want):
            raise AssertionError(f"rank {r}: reduce_scatter({reduce_op}) gave {mine.size} "
                                 f"elements ending {mine[-1]}, expected {count // n} of {want}")
        x[:] = 1.0 if reduce_op == "prod" else 0.0  # values stay finite over the iterations
        return lambda: peer.reduce_scatter(x, reduce_op)
    if op == "reduce":
        x = np.full(count, r + 1, dtype=np.float32)
        peer.reduce(x, 0, reduce_op)
        want = expected_allreduce(reduce_op, n)
        if r == 0 and not np.allclose(x[[0, -1]], want):
            raise AssertionError(f"rank 0: reduce({reduce_op}) gave {x[0]}, expected {want}")
        x[:] = 1.0 if reduce_op == "prod" else 0.0
        return lambda: peer.reduce(x, 0, reduce_op)
    if op == "gather":
        part = count // n
        x = np.full(part, r, dtype=np.float32)
        into = np.empty((n, part), dtype=np.float32) if r == 0 else None
        peer.gather(x, 0, out=into)
        if into is not None and not np.array_equal(into[:, -1], np.arange(n, dtype=np.float32)):
            raise AssertionError(f"rank 0: gather gave {into[:, -1]}")
        return lambda: peer.gather(x, 0, out=into)
    if op == "scatter":
        part = count // n
        source = np.repeat(np.arange(n, dtype=np.float32), part) if r == 0 else None
        out = np.empty(part, dtype=np.float32)
        peer.scatter(source, 0, out=out)
        if not (out[0] == r and out[-1] == r):
            raise AssertionError(f"rank {r}: scatter gave {out[0]}, expected {r}")
        return lambda: peer.scatter(source, 0, out=out)
    if op == "alltoall":
        part = count // n
        x = np.repeat(r * n + np.arange(n, dtype=np.float32), part)   # block j: r*n + j
        out = np.empty_like(x)
        peer.alltoall(x, out=out)
        want = np.arange(n, dtype=np.float32) * n + r
        if not np.array_equal(out.reshape(n, part)[:, -1], want):
            raise AssertionError(f"rank {r}: alltoall gave {out.reshape(n, part)[:, -1]}, "
                                 f"expected {want}")
        return lambda: peer.alltoall(x, out=out)
    if op == "alltoallv":
        sends, recvs = alltoallv_counts(n, r, count)
        x = np.repeat(r * n + np.arange(n, dtype=np.float32), sends)   # block j: r*n + j
        out = np.empty(sum(recvs), dtype=np.float32)
        peer.alltoall(x, send_counts=sends, recv_counts=recvs, out=out)
        want = np.arange(n, dtype=np.float32) * n + r
        got = out[np.cumsum(recvs) - 1]   # each block's last element
        if not np.array_equal(got, want):
            raise AssertionError(f"rank {r}: alltoallv gave {got}, expected {want}")
        return lambda: peer.alltoall(x, send_counts=sends, recv_counts=recvs, out=out)
    if op == "allgatherv":
        parts = allgatherv_counts(n, count)
        x = np.full(parts[r], r, dtype=np.float32)
        out = np.empty(sum(parts), dtype=np.float32)   # (reused, as MPI's receive buffer)
        got = [int(p[-1]) for p in peer.allgather(x, variable=True, out=out)]
        if got != list(range(n)):
            raise AssertionError(f"rank {r}: allgatherv gave parts ending {got}")
        return lambda: peer.allgather(x, variable=True, out=out)
    if op == "neighbor":
        self_w, src_w, dst = _ring_weights(r, n)
        x = np.full(count, r, dtype=np.float32)
        scratch = np.empty_like(x)
        peer.neighbor_allreduce(x, self_w, src_w, dst, scratch=scratch)
        want = self_w * r + sum(w * j for j, w in src_w.items())
        if not np.allclose(x[[0, -1]], want, rtol=1e-5, atol=1e-5):
            raise AssertionError(f"rank {r}: neighbor_allreduce gave {x[0]}, expected {want}")
        x[:] = np.random.default_rng(r).random(count, dtype=np.float32)
        return lambda: peer.neighbor_allreduce(x, self_w, src_w, dst, scratch=scratch)
    if op == "neighbor_allgather":
        ring = sorted({(r - 1) % n, (r + 1) % n} - {r})
        x = np.full(count, r, dtype=np.float32)
        got = peer.communicator.neighbor_allgather(x, ring, ring)
        if got.size != len(ring) * count or sorted(set(got.tolist())) != ring:
            raise AssertionError(f"rank {r}: neighbor_allgather gave {got.size} elements of "
                                 f"{sorted(set(got.tolist()))}, expected {ring}")
        return lambda: peer.communicator.neighbor_allgather(x, ring, ring)
    if op == "p2p":
        x = np.arange(count, dtype=np.float32)
        if r == 0:
            peer.send(1, x)

            def send() -> None:
                for _ in range(stream):
                    peer.send(1, x)
            return send
        y = peer.recv(0)
        if y.shape != x.shape or y[-1] != x[-1]:
            raise AssertionError(f"rank 1: recv gave {y.shape} ending {y[-1]}")

        # As the API intends: an array that travels whole (up to whole_message_bytes) comes
        # back without a copy; a larger one is received chunk by chunk into the same array
        # every time, as a training loop receives parameters, so no fresh buffer is faulted in.
        whole = x.nbytes <= peer.transport.config.whole_message_bytes
        reuse = None if whole else y

        def recv() -> None:
            for _ in range(stream):
                peer.recv(0, out=reuse)
        return recv
    raise ValueError(f"unknown operation {op!r}")


def _gossip_worker(peer, ends: list, op: str, reduce_op: str, algorithm: str) -> None:
    """Runs in every peer: serve the parent's sizes, each answered with this rank's
    per-iteration durations (and what its links turned out to be)."""
    conn = announce(ends, peer.rank)

    def measure(nbytes: int, warmup: int, iters: int, k: int) -> dict:
        step = _gossip_step(peer, op, nbytes // ITEMSIZE, reduce_op, algorithm, k)
        times = timed_iterations(peer.barrier, step, warmup, iters, k)
        shm = bool(peer.stats().get("endpoints", {}).get("shm"))
        return {"times": times, "shm": shm}

    addresses = {j: peer.transport.address(j) for j in range(peer.world_size) if j != peer.rank}
    # The parent sends the stop only once every rank has answered the last size: nothing is
    # in flight between the peers when they close.
    serve(conn, measure, hello={"addresses": addresses})


def scheme(addresses: dict, shm: bool, transport: str) -> str:
    """What the peers used: tcp / ipc, or shm when payloads go through shared memory (the
    ZeroMQ connection, then ipc, carries only control messages)."""
    kinds = sorted({str(a).split("://", 1)[0] for a in addresses.values()})
    if shm and transport in ("auto", "shm"):
        kinds = ["shm" if k == "ipc" else k for k in kinds]
    return "+".join(kinds) if kinds else "none"


def gossip_group(op: str, n: int, *, transport: str, key: str | None, reduce_op: str,
                 algorithm: str, limit: float, size_limit_s: float = 60.0) -> Group:
    """The n gossip peers of a run, not started: ``limit`` is the run's wall limit (the
    supervisor's deadline), ``size_limit_s`` the longest one size may take (the peers'
    operation timeout is a third of it plus the start-up's)."""
    from gossip.testing import spawn

    # Without --key the peers run open, as the Gloo and MPI runs they are compared with do
    # (the header says "CURVE on" when they do not): spawn would make a key of its own.
    init: dict[str, Any] = {"transport": transport,   # gossip.init's keywords
                            **({"key": key} if key else {"insecure": True})}

    def launch(ends: list) -> None:
        spawn(_gossip_worker, n, timeout=limit,
              peer_timeout=max(5.0, (STARTUP_LIMIT + size_limit_s) / 3),
              args=(ends, op, reduce_op, algorithm), **init)
    return Group("gossip", n, launch)


def run_gossip(op: str, n: int, plan, *, transport: str, key: str | None, reduce_op: str,
               algorithm: str, timeout: float | None, stream=1) -> tuple[dict, str]:
    """n peers over the whole plan; returns ({nbytes: per-iteration times}, the transport
    the peers used). ``timeout``: the limit of each size (default: from the size)."""
    limit = deadline_for(plan, n, stream) if not timeout else STARTUP_LIMIT + timeout * len(plan)
    longest = max((timeout or size_limit(e, n, stream) for e in plan), default=60.0)
    group = gossip_group(op, n, transport=transport, key=key, reduce_op=reduce_op,
                         algorithm=algorithm, limit=limit, size_limit_s=longest)
    results = run_plan(group, plan, n, stream=stream, timeout=timeout)
    last = results[plan[-1][0]][0] if plan else {"shm": False}
    used = scheme(group.hello[0]["addresses"], last["shm"], transport) if n > 1 else "none"
    times = {nbytes: iteration_times(op, per_rank) for nbytes, per_rank in results.items()}
    return times, used


def run_p2p(sizes: Sequence[int], *, transport: str = "tcp", key: str | None = None,
            iters: int | None = None, warmup: int = 3, stream=1,
            timeout: float | None = None) -> tuple[dict[int, list[float]], str]:
    """gossip peer.send / peer.recv rank 0 -> rank 1, receiver's per-iteration seconds per
    array, for each size; and the transport the peers used."""
    plan = make_plan(sizes, iters, warmup)
    return run_gossip("p2p", 2, plan, transport=transport, key=key, reduce_op="sum",
                      algorithm="auto", timeout=timeout, stream=stream)
