"""The baselines ``gossip bench`` measures in the same run: torch.distributed's Gloo (the
same operation, sizes and process count) and plain pyzmq (a PAIR socket, rank 0 -> rank 1).
Each runs in its own processes under gossip.supervisor; torch is imported only there.

    times = run_gloo("allreduce", 4, make_plan([4096], None, 3), reduce_op="sum", threads=1,
                     timeout=None)
    times = run_pyzmq_p2p([4096, 4 << 20], transport="ipc")
"""
from __future__ import annotations

import os
import tempfile
import time
from typing import Any, Sequence

from gossip.bench.measure import expected_allreduce, timed_iterations
from gossip.bench.sizes import ITEMSIZE, deadline_for, make_plan, stream_count
from gossip.bench.tables import iteration_times
from gossip.supervisor import first_failure, free_port, supervise

__all__ = ["BenchError", "run_gloo", "run_pyzmq_p2p"]


class BenchError(RuntimeError):
    """A benchmark run failed (a process died, timed out or computed a wrong result)."""


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


def _gloo_worker(rank: int, n: int, port: int, op: str, plan, reduce_op: str, threads: int,
                 timeout: float) -> dict:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=n, timeout=timedelta(seconds=timeout))
    red = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
           "min": dist.ReduceOp.MIN, "prod": dist.ReduceOp.PRODUCT}[reduce_op]
    out: dict[int, list[float]] = {}
    try:
        for nbytes, warmup, iters in plan:
            count = nbytes // ITEMSIZE
            if op == "allreduce":
                x = torch.full((count,), float(rank + 1))

                def step() -> None:
                    dist.all_reduce(x, op=red)
                    if reduce_op == "mean":
                        x.div_(n)
                step()
                want = expected_allreduce(reduce_op, n)
                assert abs(float(x[-1]) - want) <= 1e-5 * abs(want), (float(x[-1]), want)
                x.fill_(1.0 if reduce_op == "prod" else 0.0)
            elif op == "allgather":
                x = torch.full((count,), float(rank))
                gathered = torch.empty(n * count)
                gather_one = (getattr(dist, "all_gather_single", None)  # torch >= 2.13
                              or getattr(dist, "all_gather_into_tensor", None))
                if gather_one is not None:
                    def step() -> None:
                        gather_one(gathered, x)
                else:  # pragma: no cover - old torch
                    parts = list(gathered.view(n, count))

                    def step() -> None:
                        dist.all_gather(parts, x)
                step()
                assert float(gathered[-1]) == n - 1
            elif op == "broadcast":
                x = torch.full((count,), float(rank + 1))

                def step() -> None:
                    dist.broadcast(x, 0)
                step()
                assert float(x[-1]) == 1.0
            elif op == "neighbor":
                # What a user writes with torch.distributed (bench_gossip_torch.py): isend to
                # both ring neighbours, irecv from both, wait, average. n = 2 sends twice.
                left, right = (rank - 1) % n, (rank + 1) % n
                state = {"x": torch.full((count,), float(rank))}
                xl, xr = torch.empty(count), torch.empty(count)

                def step() -> None:
                    x = state["x"]
                    if n == 1:
                        return
                    reqs = [dist.isend(x, left, tag=0), dist.isend(x, right, tag=1),
                            dist.irecv(xr, right, tag=0), dist.irecv(xl, left, tag=1)]
                    for q in reqs:
                        q.wait()
                    state["x"] = (xl + x + xr) / 3
                step()
                want = (left + rank + right) / 3 if n > 1 else rank
                assert abs(float(state["x"][-1]) - want) < 1e-5, (float(state["x"][-1]), want)
                state["x"] = torch.rand(count)
            elif op == "p2p":
                x = torch.arange(count, dtype=torch.float32)
                y = torch.empty(count)

                def step() -> None:
                    if rank == 0:
                        dist.send(x, 1)
                    else:
                        dist.recv(y, 0)
                step()
                assert rank == 0 or float(y[-1]) == count - 1
            else:
                raise ValueError(op)
            out[nbytes] = timed_iterations(dist.barrier, step, warmup, iters)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return {"times": out, "torch": torch.__version__}


def run_gloo(op: str, n: int, plan, *, reduce_op: str, threads: int,
             timeout: float | None) -> dict[int, list[float]]:
    """{bytes: per-iteration seconds} of torch.distributed Gloo doing ``op``."""
    limit = timeout if timeout else deadline_for(plan, n)
    results = _run_processes("gloo", _gloo_worker, n,
                             (n, free_port(), op, plan, reduce_op, threads, limit), limit)
    return iteration_times(op, plan, results)


def _pyzmq_endpoint(transport: str) -> str:
    if transport == "ipc":
        name = f"gossip-bench-{os.getpid()}-{time.monotonic_ns()}.sock"
        return f"ipc://{os.path.join(tempfile.gettempdir(), name)}"
    return f"tcp://127.0.0.1:{free_port()}"


def _pyzmq_worker(rank: int, endpoint: str, plan, stream: int, curve) -> dict:
    """Rank 1 binds a PAIR socket and receives; rank 0 connects and sends. Before every
    iteration both exchange one empty message (the two-peer barrier); the receiver times from
    there to its last recv(copy=False) -> np.frombuffer."""
    import numpy as np
    import zmq

    ctx = zmq.Context()
    s = ctx.socket(zmq.PAIR)
    s.linger = 0
    if curve is not None:
        public, secret = curve
        if rank == 1:
            s.curve_secretkey, s.curve_publickey, s.curve_server = secret, public, True
        else:
            s.curve_serverkey, s.curve_publickey, s.curve_secretkey = public, public, secret
    out: dict[int, list[float]] = {}
    try:
        if rank == 1:
            s.bind(endpoint)
        else:
            s.connect(endpoint)

        def barrier() -> None:
            s.send(b"")
            if not s.poll(60_000):
                raise TimeoutError("pyzmq peer did not answer within 60 s")
            s.recv()
        for nbytes, warmup, iters in plan:
            x = np.arange(nbytes // ITEMSIZE, dtype=np.float32)
            k = stream_count(stream, nbytes)
            times = []
            for i in range(warmup + iters):
                barrier()
                if rank == 0:
                    for _ in range(k):
                        s.send(x, copy=False)
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
            out[nbytes] = times
        barrier()
    finally:
        s.close(linger=0)
        ctx.term()
        if rank == 1 and endpoint.startswith("ipc://"):
            try:
                os.unlink(endpoint[len("ipc://"):])
            except OSError:
                pass
    return {"times": out}


def run_pyzmq_p2p(sizes: Sequence[int], *, transport: str = "tcp", key: str | None = None,
                  iters: int | None = None, warmup: int = 3, stream=1,
                  timeout: float | None = None) -> dict[int, list[float]]:
    """Plain pyzmq rank 0 -> rank 1 (PAIR, send(copy=False) / recv(copy=False)), receiver's
    per-iteration seconds per message, for each size. ``key``: a cluster key file (CURVE)."""
    plan = make_plan(sizes, iters, warmup)
    curve = None
    if key:
        from collectives.security import load_cluster_key
        k = load_cluster_key(key)
        curve = (k.public, k.secret)
    limit = timeout if timeout else deadline_for(plan, 2, stream)
    tr = "ipc" if transport == "ipc" else "tcp"
    results = _run_processes(f"pyzmq-{tr}", _pyzmq_worker, 2,
                             (_pyzmq_endpoint(tr), plan, stream, curve), limit)
    return {nbytes: results[1]["times"][nbytes] for nbytes, _, _ in plan}
