"""What an OpenMPI rank runs for ``gossip bench --vs mpi`` (under mpirun, started by
gossip.bench.mpi): the same operation, sizes and values as the gossip peers
(gossip.bench.measure) and Gloo (gossip.bench.gloo_steps), through mpi4py's buffer methods on
numpy float32 arrays, timed as they are (gossip.bench.measure.timed_iterations: barrier, then
the operation; the parent takes each iteration's slowest rank and the median).

    python -m gossip.bench.mpi_rank allreduce sum      # under mpirun -np N; nothing else

Protocol with the parent, through mpirun's own forwarding: rank 0 reads one JSON task per
line on its stdin (``[bytes, warm-up, iterations, messages per iteration]``, or null to
stop) and writes one JSON reply per line on its stdout, each after MARK (mpirun may print
its own lines there). The other ranks get each task from rank 0 and wait for the next by
polling with short sleeps: a blocking MPI receive spins, which would take a CPU from
whichever implementation is measuring meanwhile. Any failure aborts the whole job
(MPI_Abort) after printing its traceback, so the parent sees mpirun exit.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any, Callable

from gossip.bench.measure import expected_allreduce, timed_iterations
from gossip.bench.mpi import MARK
from gossip.bench.ops import allgatherv_counts, alltoallv_counts

__all__ = ["mpi_step", "main"]

_TASK_TAG = 7
_IDLE_SLEEP = 0.005   # seconds between polls of an idle rank (about 1% of a CPU per rank)


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise AssertionError(what)


def mpi_step(comm: Any, MPI: Any, np: Any, op: str, *, rank: int, n: int, count: int,
             reduce_op: str) -> Callable[[], Any]:
    """Set up one size (``count`` float32s, the row's count times n for the split ops): run
    it once and check the result, then return the callable that is timed. Out-of-place where
    MPI offers it (Allreduce, Reduce, Reduce_scatter_block): OpenMPI's fastest form."""
    red = {"sum": MPI.SUM, "mean": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN,
           "prod": MPI.PROD}[reduce_op]
    f32 = np.float32
    part = count // n
    want = expected_allreduce(reduce_op, n)
    rest = 1.0 if reduce_op == "prod" else 0.0   # values stay finite over the iterations

    def near(value: float) -> bool:
        return abs(float(value) - want) <= 1e-5 * abs(want)

    if op in ("allreduce", "reduce", "reduce_scatter"):
        x = np.full(n * part if op == "reduce_scatter" else count, rank + 1, dtype=f32)
        y = np.empty(part if op == "reduce_scatter" else count, dtype=f32)

        def step() -> None:
            if op == "allreduce":
                comm.Allreduce(x, y, op=red)
            elif op == "reduce":
                comm.Reduce(x, y if rank == 0 else None, op=red, root=0)
            else:
                comm.Reduce_scatter_block(x, y, op=red)
            if reduce_op == "mean" and (op != "reduce" or rank == 0):
                np.divide(y, n, out=y)
        step()
        _check(op == "reduce" and rank != 0 or near(y[-1]), f"{op} gave {float(y[-1])}")
        x.fill(rest)
        return step
    if op == "allgather":
        x = np.full(count, rank, dtype=f32)
        out = np.empty(n * count, dtype=f32)

        def step() -> None:
            comm.Allgather(x, out)
        step()
        _check(out.reshape(n, count)[:, -1].tolist() == list(range(n)), "allgather")
        return step
    if op == "broadcast":
        x = np.full(count, rank + 1, dtype=f32)

        def step() -> None:
            comm.Bcast(x, root=0)
        step()
        _check(x[-1] == 1.0, f"broadcast gave {float(x[-1])}")
        return step
    if op == "gather":
        x = np.full(part, rank, dtype=f32)
        out = np.empty(n * part, dtype=f32) if rank == 0 else None

        def step() -> None:
            comm.Gather(x, out, root=0)
        step()
        _check(out is None or out.reshape(n, part)[:, -1].tolist() == list(range(n)), "gather")
        return step
    if op == "scatter":
        x = np.repeat(np.arange(n, dtype=f32), part) if rank == 0 else None
        out = np.empty(part, dtype=f32)

        def step() -> None:
            comm.Scatter(x, out, root=0)
        step()
        _check(out[-1] == rank, f"scatter gave {float(out[-1])}")
        return step
    if op == "alltoall":
        x = np.repeat(rank * n + np.arange(n, dtype=f32), part)
        out = np.empty(n * part, dtype=f32)

        def step() -> None:
            comm.Alltoall(x, out)
        step()
        _check(out.reshape(n, part)[:, -1].tolist() == [j * n + rank for j in range(n)],
               "alltoall")
        return step
    if op == "alltoallv":
        sends, recvs = alltoallv_counts(n, rank, count)
        x = np.repeat(rank * n + np.arange(n, dtype=f32), sends)
        out = np.empty(sum(recvs), dtype=f32)
        sdispls = [sum(sends[:j]) for j in range(n)]
        rdispls = [sum(recvs[:j]) for j in range(n)]

        def step() -> None:
            comm.Alltoallv([x, (sends, sdispls), MPI.FLOAT], [out, (recvs, rdispls), MPI.FLOAT])
        step()
        _check(out[np.cumsum(recvs) - 1].tolist() == [j * n + rank for j in range(n)],
               "alltoallv")
        return step
    if op == "allgatherv":
        parts = allgatherv_counts(n, count)
        x = np.full(parts[rank], rank, dtype=f32)
        out = np.empty(sum(parts), dtype=f32)
        displs = [sum(parts[:j]) for j in range(n)]

        def step() -> None:
            comm.Allgatherv(x, [out, (parts, displs), MPI.FLOAT])
        step()
        _check(out[np.cumsum(parts) - 1].tolist() == list(range(n)), "allgatherv")
        return step
    if op == "neighbor":
        # What a user writes with MPI, as with Gloo: Isend to both ring neighbours, Irecv from
        # both, wait, average (n = 2: the one neighbour twice).
        left, right = (rank - 1) % n, (rank + 1) % n
        state = {"x": np.full(count, rank, dtype=f32)}
        xl, xr = np.empty(count, dtype=f32), np.empty(count, dtype=f32)

        def step() -> None:
            x = state["x"]
            if n == 1:
                return
            MPI.Request.Waitall([comm.Isend(x, left, tag=0), comm.Isend(x, right, tag=1),
                                 comm.Irecv(xr, right, tag=0), comm.Irecv(xl, left, tag=1)])
            state["x"] = (xl + x + xr) / 3
        step()
        expect = (left + rank + right) / 3 if n > 1 else rank
        _check(abs(float(state["x"][-1]) - expect) < 1e-5, f"neighbor {state['x'][-1]}")
        state["x"] = np.random.default_rng(rank).random(count, dtype=f32)
        return step
    if op == "neighbor_allgather":
        ring = sorted({(rank - 1) % n, (rank + 1) % n} - {rank})
        x = np.full(count, rank, dtype=f32)
        out = np.empty(len(ring) * count, dtype=f32)

        def step() -> None:
            reqs = [comm.Isend(x, j) for j in ring]
            reqs += [comm.Irecv(out[k * count:(k + 1) * count], j) for k, j in enumerate(ring)]
            MPI.Request.Waitall(reqs)
        step()
        _check(sorted(set(out.tolist())) == ring, "neighbor_allgather")
        return step
    if op == "p2p":
        x = np.arange(count, dtype=f32)
        y = np.empty(count, dtype=f32)

        def step() -> None:
            if rank == 0:
                comm.Send(x, 1)
            elif rank == 1:
                comm.Recv(y, 0)
        step()
        _check(rank != 1 or y[-1] == count - 1, f"p2p {float(y[-1])}")
        return step
    raise ValueError(f"unknown operation {op!r}")


def _say(message: dict) -> None:
    sys.stdout.write(MARK + json.dumps(message) + "\n")
    sys.stdout.flush()


def _next_task(comm: Any, np: Any, rank: int, n: int) -> tuple[int, ...] | None:
    """Rank 0: the parent's next task from stdin (EOF: stop), passed on to the other ranks;
    the others: that task, waited for without spinning."""
    buf = np.zeros(4, dtype=np.int64)
    if rank == 0:
        line = sys.stdin.readline()
        task = json.loads(line) if line.strip() else None
        if task is not None:
            buf[:] = [int(v) for v in task]
        else:
            buf[:] = -1
        for r in range(1, n):
            comm.Send(buf, r, tag=_TASK_TAG)
    else:
        req = comm.Irecv(buf, 0, tag=_TASK_TAG)
        while not req.Test():
            time.sleep(_IDLE_SLEEP)
    return None if buf[0] < 0 else tuple(int(v) for v in buf)


def main(argv: list[str] | None = None) -> int:
    op, reduce_op = (argv if argv is not None else sys.argv[1:])[:2]
    import mpi4py
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    try:
        pids = np.empty(n, dtype=np.int64)
        comm.Allgather(np.array([os.getpid()], dtype=np.int64), pids)
        if rank == 0:
            library = MPI.Get_library_version().splitlines()[0].split(",")[0].strip("\x00 ")
            _say({"pids": pids.tolist(), "library": f"{library}, mpi4py {mpi4py.__version__}"})
        while True:
            task = _next_task(comm, np, rank, n)
            if task is None:
                break
            nbytes, warmup, iters, k = task
            step = mpi_step(comm, MPI, np, op, rank=rank, n=n, count=nbytes // 4,
                            reduce_op=reduce_op)

            def steps() -> None:
                for _ in range(k):
                    step()
            times = np.array(timed_iterations(comm.Barrier, steps, warmup, iters, k))
            every = np.empty((n, iters)) if rank == 0 else None
            comm.Gather(times, every, root=0)
            del step
            if every is not None:   # rank 0
                _say({"result": [{"times": row.tolist()} for row in every]})
    except BaseException:
        sys.stderr.write(f"mpi rank {rank} of {n}: {traceback.format_exc()}")
        sys.stderr.flush()
        comm.Abort(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
