"""What a torch.distributed Gloo process times for each ``gossip bench`` operation (the same
operation, sizes and values as the gossip peers, gossip.bench.measure), checked once for a
right result before timing. Runs only in the Gloo processes: torch is imported by the caller.

    step = gloo_step(dist, torch, "alltoall", rank, n, count, "sum")
    # None where this torch's Gloo lacks the operation: see Unsupported
"""
from __future__ import annotations

from typing import Any, Callable

from gossip.bench.measure import expected_allreduce
from gossip.bench.ops import alltoallv_counts

__all__ = ["Unsupported", "gloo_step"]


class Unsupported(Exception):
    """This torch's Gloo backend does not do the operation; the row says so, nothing fails."""


def _first(dist: Any, *names: str) -> Callable | None:
    for name in names:
        fn = getattr(dist, name, None)
        if fn is not None:
            return fn
    return None


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise AssertionError(what)


def gloo_step(dist: Any, torch: Any, op: str, rank: int, n: int, count: int,
              reduce_op: str) -> Callable[[], Any]:
    """Set up one size (``count`` float32s, the row's count times n for the split ops): run
    it once and check, then return the callable that is timed. Unsupported when Gloo
    refuses the operation on its first call."""
    try:
        return _step(dist, torch, op, rank, n, count, reduce_op)
    except (RuntimeError, NotImplementedError) as exc:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "support" in text.lower() or "not implemented" in text.lower():
            raise Unsupported(f"{op}: {text}") from None
        raise


def _step(dist: Any, torch: Any, op: str, rank: int, n: int, count: int,
          reduce_op: str) -> Callable[[], Any]:
    red = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
           "min": dist.ReduceOp.MIN, "prod": dist.ReduceOp.PRODUCT}[reduce_op]
    if op == "allgatherv":
        # ProcessGroupGloo::allgather refuses tensors of different sizes ("invalid tensor
        # size"): there is no Gloo row to compare with.
        raise Unsupported("allgatherv: Gloo's allgather takes equal sizes only")
    part = count // n
    want = expected_allreduce(reduce_op, n)
    rest = 1.0 if reduce_op == "prod" else 0.0   # values stay finite over the iterations
    if op == "allreduce":
        x = torch.full((count,), float(rank + 1))

        def step() -> None:
            dist.all_reduce(x, op=red)
            if reduce_op == "mean":
                x.div_(n)
        step()
        _check(abs(float(x[-1]) - want) <= 1e-5 * abs(want), f"allreduce {float(x[-1])}")
        x.fill_(rest)
        return step
    if op == "allgather":
        x = torch.full((count,), float(rank))
        gathered = torch.empty(n * count)
        gather_one = _first(dist, "all_gather_single", "all_gather_into_tensor")
        if gather_one is not None:
            def step() -> None:
                gather_one(gathered, x)
        else:  # pragma: no cover - old torch
            parts = list(gathered.view(n, count))

            def step() -> None:
                dist.all_gather(parts, x)
        step()
        _check(float(gathered[-1]) == n - 1, f"allgather {float(gathered[-1])}")
        return step
    if op == "reduce_scatter":
        x = torch.full((n * part,), float(rank + 1))
        y = torch.empty(part)
        scatter_one = _first(dist, "reduce_scatter_single", "reduce_scatter_tensor")
        chunks = list(x.view(n, part))

        def step() -> None:
            if scatter_one is not None:
                scatter_one(y, x, op=red)
            else:   # pragma: no cover - old torch
                dist.reduce_scatter(y, chunks, op=red)
            if reduce_op == "mean":
                y.div_(n)
        step()
        _check(abs(float(y[-1]) - want) <= 1e-5 * abs(want), f"reduce_scatter {float(y[-1])}")
        return step
    if op == "broadcast":
        x = torch.full((count,), float(rank + 1))

        def step() -> None:
            dist.broadcast(x, 0)
        step()
        _check(float(x[-1]) == 1.0, f"broadcast {float(x[-1])}")
        return step
    if op == "reduce":
        x = torch.full((count,), float(rank + 1))

        def step() -> None:
            dist.reduce(x, 0, op=red)
            if reduce_op == "mean" and rank == 0:
                x.div_(n)
        step()
        _check(rank != 0 or abs(float(x[-1]) - want) <= 1e-5 * abs(want),
               f"reduce {float(x[-1])}")
        x.fill_(rest)
        return step
    if op == "gather":
        x = torch.full((part,), float(rank))
        out = torch.empty(n * part) if rank == 0 else None
        into = list(out.view(n, part)) if out is not None else None

        def step() -> None:
            dist.gather(x, into, dst=0)
        step()
        _check(out is None or out.view(n, part)[:, -1].tolist() == list(map(float, range(n))),
               "gather")
        return step
    if op == "scatter":
        x = torch.arange(n, dtype=torch.float32).repeat_interleave(part) if rank == 0 else None
        pieces = list(x.view(n, part)) if x is not None else None
        out = torch.empty(part)

        def step() -> None:
            dist.scatter(out, pieces, src=0)
        step()
        _check(float(out[-1]) == rank, f"scatter {float(out[-1])}")
        return step
    if op == "alltoall":
        x = (rank * n + torch.arange(n, dtype=torch.float32)).repeat_interleave(part)
        out = torch.empty(n * part)

        def step() -> None:
            dist.all_to_all_single(out, x)
        step()
        _check(out.view(n, part)[:, -1].tolist() == [float(j * n + rank) for j in range(n)],
               "alltoall")
        return step
    if op == "alltoallv":
        sends, recvs = alltoallv_counts(n, rank, count)
        x = (rank * n + torch.arange(n, dtype=torch.float32)).repeat_interleave(
            torch.tensor(sends))
        out = torch.empty(sum(recvs))

        def step() -> None:
            dist.all_to_all_single(out, x, output_split_sizes=recvs, input_split_sizes=sends)
        step()
        ends = torch.tensor(recvs).cumsum(0) - 1
        _check(out[ends].tolist() == [float(j * n + rank) for j in range(n)], "alltoallv")
        return step
    if op == "neighbor":
        # What a user writes with torch.distributed (bench_gossip_torch.py): isend to both
        # ring neighbours, irecv from both, wait, average. n = 2 sends twice.
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
        expect = (left + rank + right) / 3 if n > 1 else rank
        _check(abs(float(state["x"][-1]) - expect) < 1e-5, f"neighbor {float(state['x'][-1])}")
        state["x"] = torch.rand(count)
        return step
    if op == "neighbor_allgather":
        # What a user writes with torch.distributed: isend to both ring neighbours, irecv
        # from both into one buffer (n = 2: the one neighbour once).
        ring = sorted({(rank - 1) % n, (rank + 1) % n} - {rank})
        x = torch.full((count,), float(rank))
        out = torch.empty(len(ring) * count)

        def step() -> None:
            reqs = [dist.isend(x, j) for j in ring]
            reqs += [dist.irecv(out[k * count:(k + 1) * count], j) for k, j in enumerate(ring)]
            for q in reqs:
                q.wait()
        step()
        _check(sorted(set(out.tolist())) == [float(j) for j in ring], "neighbor_allgather")
        return step
    if op == "p2p":
        x = torch.arange(count, dtype=torch.float32)
        y = torch.empty(count)

        def step() -> None:
            if rank == 0:
                dist.send(x, 1)
            else:
                dist.recv(y, 0)
        step()
        _check(rank == 0 or float(y[-1]) == count - 1, f"p2p {float(y[-1])}")
        return step
    raise ValueError(op)
