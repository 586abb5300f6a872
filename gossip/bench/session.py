"""One ``gossip bench`` run: check what was asked, start our peers and the baselines' processes
(Gloo, OpenMPI through mpi4py, and plain pyzmq for p2p), then (allreduce) measure this host's
memory bound, then measure size by size, ours then each baseline, and hand each row on as soon
as its size is measured.

    rows = run_bench("allreduce", 4, ["4K", "64M"], vs_gloo=("gloo", "mpi"), on_row=print)
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable, Iterable, Sequence

from collectives.algorithms.choice import ALLREDUCE_ALGORITHMS
from gossip.bench.baselines import gloo_group, pyzmq_group
from gossip.bench.groups import MeasuringGroup, stop_all
from gossip.bench.measure import gossip_group, scheme
from gossip.bench.membound import bound_applies, bound_fields, memory_rates
from gossip.bench.mpi import check_mpi, mpi_group
from gossip.bench.ops import OPS, REDUCING, layout
from gossip.bench.sizes import (DEFAULT_SIZES, STARTUP_LIMIT, format_size, make_plan,
                                parse_sizes, size_limit)
from gossip.bench.tables import figures, iteration_times

__all__ = ["OPS", "REDUCE_OPS", "ALGORITHMS", "BASELINES", "check_args",
           "supported_transports", "row_sizes", "run_bench"]

REDUCE_OPS = ("sum", "mean", "max", "min", "prod")
ALGORITHMS = ("auto",) + ALLREDUCE_ALGORITHMS   # collectives' own list
BASELINES = ("gloo", "mpi")
#: The groups measured after ours, in their order (pyzmq: p2p only).
_OTHERS = ("pyzmq", "gloo", "mpi")


def check_args(op: str, n: int, *, transport: str = "auto", vs: Sequence[str] = (),
               reduce_op: str = "sum", algorithm: str = "auto", iters: int | None = None,
               warmup: int = 3) -> None:
    """Raise ValueError (one line) for arguments run_bench would refuse."""
    if op not in OPS:
        raise ValueError(f"unknown operation {op!r}; choose one of {', '.join(OPS)}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"the number of peers must be at least 1, got {n!r}")
    if op == "p2p" and n != 2:
        raise ValueError(f"p2p measures rank 0 -> rank 1 and needs exactly 2 peers (-n 2), "
                         f"got {n}")
    if transport not in supported_transports():
        raise ValueError(f"unknown transport {transport!r}; choose one of "
                         f"{', '.join(supported_transports())}")
    for v in vs:
        if v not in BASELINES:
            raise ValueError(f"unknown comparison {v!r}; choose one of {', '.join(BASELINES)}")
    if "mpi" in vs:
        check_mpi()
    if reduce_op not in REDUCE_OPS:
        raise ValueError(f"unknown reduce op {reduce_op!r}; choose one of {', '.join(REDUCE_OPS)}")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose one of "
                         f"{', '.join(ALGORITHMS)}")
    if iters is not None and iters < 1:
        raise ValueError(f"iters must be at least 1, got {iters}")
    if warmup < 0:
        raise ValueError(f"warmup must be at least 0, got {warmup}")


def supported_transports() -> tuple[str, ...]:
    """The transports this build of collectives accepts (auto, tcp, ipc, and shm where the
    shared-memory transport exists)."""
    from collectives.config import TransportConfig

    found = []
    for name in ("auto", "tcp", "ipc", "shm"):
        try:
            TransportConfig(transport=name)
        except ValueError:
            continue
        found.append(name)
    return tuple(found)


def row_sizes(op: str, n: int, sizes: str | Iterable[str | int]) -> list[int]:
    """The sizes as the rows will show them (ops.layout: the split operations' sizes rounded
    down to n equal parts); ValueError for a bad or too small size."""
    return [layout(op, n, nbytes)[0] for nbytes in parse_sizes(sizes)]


def run_bench(op: str, n: int, sizes: str | Iterable[str | int] = DEFAULT_SIZES, *,
              transport: str = "auto", vs_gloo: bool | Sequence[str] = False,
              iters: int | None = None, warmup: int = 3, reduce_op: str = "sum",
              key: str | None = None, algorithm: str = "auto", timeout: float | None = None,
              gloo_threads: int = 1, progress: Callable[[str], None] | None = None,
              on_row: Callable[[dict], None] | None = None) -> list[dict]:
    """Measure ``op`` over ``n`` peers on float32 arrays of each size (bytes; what a size is
    per operation: gossip.bench.ops); one row (dict) per size, each also handed to ``on_row``
    as soon as its size is measured, ours and the baselines'. ``vs_gloo``: also
    torch.distributed Gloo, same sizes and process count, giving ``gloo_*`` fields and
    ``ratio = gloo time / our time`` (or ``gloo_note`` where this torch's Gloo lacks the
    operation); "mpi" in ``vs_gloo``: also mpi4py under OpenMPI's mpirun on shared memory
    (``mpi_*`` fields, ``mpi_ratio``; ValueError when mpi4py or mpirun is missing). An
    allreduce with a size of at least 1 MiB measures numpy's copy and add rates on the
    largest size first and gives its rows of 1 MiB and more the memory bound
    (gossip.bench.membound: ``membound_busbw_GBps``, ``membound_fraction``). ``p2p`` (n = 2) always measures plain pyzmq too (``pyzmq_*`` fields; its
    ``ratio`` is pyzmq time / our time). ``timeout``: the wall limit of each size's
    measurement by each implementation (default: from the size). On an error or Ctrl-C
    (KeyboardInterrupt) every process is stopped before the exception goes on."""
    vs = ("gloo",) if vs_gloo is True else tuple(vs_gloo or ())
    check_args(op, n, transport=transport, vs=vs, reduce_op=reduce_op, algorithm=algorithm,
               iters=iters, warmup=warmup)
    plan = make_plan(row_sizes(op, n, sizes), iters, warmup)
    say = progress or (lambda msg: None)
    emit = on_row or (lambda row: None)
    limits = [timeout or size_limit(entry, n) for entry in plan]
    # Every group waits idle while the others measure: each one's deadline is the whole run's.
    run_limit = STARTUP_LIMIT * 3 + (1 + len(vs) + (op == "p2p")) * sum(limits)
    longest = max(limits, default=60.0)

    groups: dict[str, MeasuringGroup] = {}
    rows: list[dict] = []
    try:
        say(f"starting {n} gossip peers for {op}, sizes "
            f"{', '.join(format_size(e[0]) for e in plan)}")
        groups["gossip"] = gossip_group(op, n, transport=transport, key=key,
                                        reduce_op=reduce_op, algorithm=algorithm,
                                        limit=run_limit, size_limit_s=longest)
        groups["gossip"].start()
        groups["gossip"].ready(STARTUP_LIMIT)
        addresses = groups["gossip"].hello[0]["addresses"]
        if op == "p2p":
            say("starting plain pyzmq PAIR p2p")
            over = "tcp" if scheme(addresses, False, transport) == "tcp" else "ipc"
            groups["pyzmq"] = pyzmq_group(transport=over, key=key, limit=run_limit)
        if "gloo" in vs:
            say(f"starting {n} torch.distributed Gloo processes")
            groups["gloo"] = gloo_group(op, n, reduce_op=reduce_op, threads=gloo_threads,
                                        limit=run_limit, size_limit_s=longest)
        if "mpi" in vs:
            say(f"starting {n} OpenMPI ranks (mpi4py, mpirun)")
            groups["mpi"] = mpi_group(op, n, reduce_op=reduce_op)
        for name in _OTHERS:
            if name in groups:
                groups[name].start()
                groups[name].ready(STARTUP_LIMIT)
        rates = None
        if bound_applies(op, n, [e[0] for e in plan]):
            # Every process is up and idle: the host's memory is ours alone for a moment.
            largest = max(e[0] for e in plan)
            say(f"measuring numpy copy and add rates on {format_size(largest)}")
            rates = memory_rates(largest)
        notes: dict[str, str] = {}
        for entry, limit in zip(plan, limits):
            t0 = time.perf_counter()
            ours = groups["gossip"].measure((*entry, 1), limit)
            wall = time.perf_counter() - t0
            used = scheme(addresses, ours[0]["shm"], transport) if n > 1 else "none"
            theirs = {}
            for name in _OTHERS:
                if name not in groups or name in notes:
                    continue
                per_rank = groups[name].measure((*entry, 1), limit)
                if "unsupported" in per_rank[0]:
                    version = (groups[name].hello[0] or {}).get("torch", "?")
                    notes[name] = (f"not measured, torch {version} refused it "
                                   f"({per_rank[0]['unsupported']})")
                    groups.pop(name).close(abort=True)
                    continue
                theirs[name] = iteration_times(op, per_rank)
            row = _row(op, n, entry, transport=transport, used=used, algorithm=algorithm,
                       reduce_op=reduce_op, key=key, ours=iteration_times(op, ours),
                       theirs=theirs, notes=notes, wall=wall)
            if "mpi" in theirs:
                row["mpi_library"] = groups["mpi"].hello[0]["library"]
            if rates is not None:
                row.update(bound_fields(row, *rates))
            rows.append(row)
            emit(row)
        for name in list(groups):
            groups.pop(name).close()
    finally:
        stop_all(groups)   # after an error or Ctrl-C: stop everything, then let it go on
    return rows


def _row(op: str, n: int, entry: tuple[int, int, int], *, transport: str, used: str,
         algorithm: str, reduce_op: str, key: str | None, ours: list[float],
         theirs: dict[str, list[float]], notes: dict[str, str], wall: float) -> dict:
    nbytes, warmup, iters = entry
    row: dict[str, Any] = {"impl": "gossip", "op": op, "nprocs": n, "bytes": nbytes,
           "count": layout(op, n, nbytes)[1], "type": "float32",
           "redop": reduce_op if op in REDUCING else None,
           "transport": transport, "transport_used": used}
    if op == "allreduce":
        row["algorithm"] = algorithm
    if key:
        row["curve"] = True
    row.update(figures(op, n, nbytes, ours))
    row.update({"iters": iters, "warmup": warmup, "ncpu": os.cpu_count(), "wall_seconds": wall})
    for name in _OTHERS:
        if name in notes:
            row[f"{name}_note"] = notes[name]
        if name not in theirs:
            continue
        fig = figures(op, n, nbytes, theirs[name])
        row.update({f"{name}_{k}": v for k, v in fig.items()})
        row[f"{name}_ratio"] = (fig["seconds_median"] / row["seconds_median"]
                                if row["seconds_median"] > 0 else float("inf"))
    primary = "pyzmq" if op == "p2p" else "gloo"
    if f"{primary}_ratio" in row:
        row["ratio"] = row[f"{primary}_ratio"]
    return row
