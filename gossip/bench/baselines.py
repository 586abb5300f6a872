"""The baselines ``gossip bench`` measures in the same run: torch.distributed's Gloo (the
same operation, sizes and process count; gossip.bench.gloo_steps) and plain pyzmq (a PAIR
socket, rank 0 -> rank 1). Each is a group of its own processes under gossip.launch.supervisor,
measuring one size at a time (gossip.bench.groups); torch is imported only there.

    group = gloo_group("allreduce", 4, reduce_op="sum", threads=1, limit=600)
    times = run_gloo("allreduce", 4, make_plan([4096], None, 3), reduce_op="sum", threads=1,
                     timeout=None)
    times = run_pyzmq_p2p([4096, 4 << 20], transport="ipc")
"""
from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Sequence

from gossip.bench.groups import BenchError, Group, announce, run_plan, serve
from gossip.bench.measure import timed_iterations
from gossip.bench.sizes import ITEMSIZE, STARTUP_LIMIT, deadline_for, make_plan
from gossip.bench.tables import iteration_times
from gossip.launch.supervisor import first_failure, free_port, supervise

__all__ = ["BenchError", "gloo_group", "pyzmq_group", "run_gloo", "run_pyzmq_p2p"]


def _run_processes(name: str, target, n: int, args: tuple, timeout: float) -> list[Any]:
    """Run target(rank, *args) in n supervised processes with a deadline. Returns each rank's
    result or raises BenchError naming the rank that failed first, with its traceback."""
    outcomes = supervise(target, n, args=args, timeout=timeout, name=f"bench-{name}")
    failed = first_failure(outcomes)
    if failed is not None and failed.status == "error":
        raise BenchError(f"{name}: rank {failed.rank} failed:\n{failed.error}")
    if failed is not None:
        output = f"; its output:\n{failed.output.rstrip()}" if failed.output.strip() else ""
        raise BenchError(f"{name}: rank {failed.rank} died (exit code {failed.exitcode})"
                         f"{output}")
    late = [o.rank for o in outcomes if o.status != "ok"]
    if late:
        raise BenchError(f"{name}: ranks {late} did not finish within {timeout:.0f}s")
    return [o.result for o in outcomes]


@dataclass(frozen=True)
class _GlooSetup:
    """What every process of a Gloo group is started with."""
    n: int            # the group's size
    port: int         # rank 0's TCP port on 127.0.0.1 (torch's tcp:// init method)
    op: str           # the operation measured (gossip.bench.ops)
    reduce_op: str    # its reduction, for the reducing operations
    threads: int      # torch's intra-op threads (and OMP_NUM_THREADS) per process
    timeout: float    # seconds: Gloo's own timeout of every call


def _gloo_worker(rank: int, setup: _GlooSetup, ends: list) -> None:
    n, port, op, reduce_op = setup.n, setup.port, setup.op, setup.reduce_op
    threads, timeout = setup.threads, setup.timeout
    conn = announce(ends, rank)   # before torch's import: seconds in which Ctrl-C may come
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from gossip.bench.gloo_steps import Unsupported, gloo_step

    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=n, timeout=timedelta(seconds=timeout))

    def measure(nbytes: int, warmup: int, iters: int, k: int) -> dict:
        try:
            step = gloo_step(dist, torch, op, rank, n, nbytes // ITEMSIZE, reduce_op)
        except Unsupported as exc:
            return {"unsupported": str(exc)}
        return {"times": timed_iterations(dist.barrier, step, warmup, iters)}
    try:
        serve(conn, measure, hello={"torch": torch.__version__})
    finally:
        dist.destroy_process_group()


def gloo_group(op: str, n: int, *, reduce_op: str, threads: int, limit: float,
               size_limit_s: float = 60.0) -> Group:
    """torch.distributed Gloo doing ``op`` in n processes, not started. ``limit``: the run's
    wall limit; ``size_limit_s``: the longest one size may take (Gloo's own timeout)."""
    def launch(ends: list) -> None:
        setup = _GlooSetup(n=n, port=free_port(), op=op, reduce_op=reduce_op, threads=threads,
                           timeout=STARTUP_LIMIT + size_limit_s)
        _run_processes("gloo", _gloo_worker, n, (setup, ends), limit)
    return Group("gloo", n, launch)


def run_gloo(op: str, n: int, plan, *, reduce_op: str, threads: int,
             timeout: float | None) -> dict[int, list[float]]:
    """{bytes: per-iteration seconds} of torch.distributed Gloo doing ``op`` over the plan
    (BenchError if this torch's Gloo does not do it). ``timeout``: the limit of each size."""
    limit = deadline_for(plan, n) if not timeout else STARTUP_LIMIT + timeout * len(plan)
    group = gloo_group(op, n, reduce_op=reduce_op, threads=threads, limit=limit,
                       size_limit_s=timeout or 60.0)
    results = run_plan(group, plan, n, timeout=timeout)
    out = {}
    for nbytes, per_rank in results.items():
        if "unsupported" in per_rank[0]:
            raise BenchError(f"gloo: {per_rank[0]['unsupported']}")
        out[nbytes] = iteration_times(op, per_rank)
    return out


def _pyzmq_endpoint(transport: str) -> str:
    if transport == "ipc":
        name = f"gossip-bench-{os.getpid()}-{time.monotonic_ns()}.sock"
        return f"ipc://{os.path.join(tempfile.gettempdir(), name)}"
    return f"tcp://127.0.0.1:{free_port()}"


def _pyzmq_worker(rank: int, endpoint: str, curve, ends: list) -> None:
    """Rank 1 binds a PAIR socket and receives; rank 0 connects and sends. Before every
    iteration both exchange one empty message (the two-peer barrier); the receiver times from
    there to its last recv(copy=False) -> np.frombuffer."""
    import numpy as np
    import zmq

    conn = announce(ends, rank)
    ctx = zmq.Context()
    s = ctx.socket(zmq.PAIR)
    s.linger = 0
    if curve is not None:
        public, secret = curve
        if rank == 1:
            s.curve_secretkey, s.curve_publickey, s.curve_server = secret, public, True
        else:
            s.curve_serverkey, s.curve_publickey, s.curve_secretkey = public, public, secret

    def barrier() -> None:
        s.send(b"")
        if not s.poll(60_000):
            raise TimeoutError("pyzmq peer did not answer within 60 s")
        s.recv()

    def measure(nbytes: int, warmup: int, iters: int, k: int) -> dict:
        x = np.arange(nbytes // ITEMSIZE, dtype=np.float32)
        times = []
        for i in range(warmup + iters):
            barrier()
            if rank == 0:
                for _ in range(k):
                    s.send(x.data, copy=False)
                continue
            t0 = time.perf_counter()
            for _ in range(k):
                frame = s.recv(copy=False)
                y = np.frombuffer(frame.buffer, dtype=np.float32)
            dt = time.perf_counter() - t0
            if y.nbytes != nbytes:
                raise AssertionError(f"received {y.nbytes} bytes, expected {nbytes}")
            if i >= warmup:
                times.append(dt / k)
        # The sender's last sends must be in before either side answers: the next size (or
        # the stop) starts from a quiet socket.
        barrier()
        return {"times": times}
    try:
        if rank == 1:
            s.bind(endpoint)
        else:
            s.connect(endpoint)
        serve(conn, measure)
    finally:
        s.close(linger=0)
        ctx.term()
        _unlink_ipc(endpoint)


def _unlink_ipc(endpoint: str) -> None:
    if endpoint.startswith("ipc://"):
        try:
            os.unlink(endpoint[len("ipc://"):])
        except OSError:
            pass


def pyzmq_group(*, transport: str = "tcp", key: str | None = None, limit: float) -> Group:
    """Plain pyzmq rank 0 -> rank 1 (PAIR, send(copy=False) / recv(copy=False)), not started.
    ``key``: a cluster key file (CURVE). The ipc socket file goes when the group closes, even
    when its processes were killed."""
    curve = None
    if key:
        from collectives.security import load_cluster_key
        k = load_cluster_key(key)
        curve = (k.public, k.secret)
    tr = "ipc" if transport == "ipc" else "tcp"
    endpoint = _pyzmq_endpoint(tr)

    def launch(ends: list) -> None:
        _run_processes(f"pyzmq-{tr}", _pyzmq_worker, 2, (endpoint, curve, ends), limit)
    return Group("pyzmq", 2, launch, cleanup=lambda: _unlink_ipc(endpoint))


def run_pyzmq_p2p(sizes: Sequence[int], *, transport: str = "tcp", key: str | None = None,
                  iters: int | None = None, warmup: int = 3, stream=1,
                  timeout: float | None = None) -> dict[int, list[float]]:
    """Plain pyzmq rank 0 -> rank 1, receiver's per-iteration seconds per message, for each
    size. ``timeout``: the limit of each size (default: from the size)."""
    plan = make_plan(sizes, iters, warmup)
    limit = deadline_for(plan, 2, stream) if not timeout else STARTUP_LIMIT + timeout * len(plan)
    group = pyzmq_group(transport=transport, key=key, limit=limit)
    results = run_plan(group, plan, 2, stream=stream, timeout=timeout)
    return {nbytes: iteration_times("p2p", per_rank) for nbytes, per_rank in results.items()}
