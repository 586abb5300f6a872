"""One ``gossip bench`` run: check what was asked, measure our operation over n peers, then
the baselines in the same run (Gloo, and plain pyzmq for p2p), and build one row per size.

    rows = run_bench("allreduce", 4, ["4K", "64M"], vs_gloo=True)
"""
from __future__ import annotations

import os
import time
from typing import Callable, Iterable, Sequence

from gossip.bench.baselines import run_gloo, run_pyzmq_p2p
from gossip.bench.measure import run_gossip
from gossip.bench.sizes import (DEFAULT_SIZES, ITEMSIZE, format_size, make_plan,
                                parse_sizes)
from gossip.bench.tables import figures

__all__ = ["OPS", "REDUCE_OPS", "ALGORITHMS", "BASELINES", "check_args",
           "supported_transports", "run_bench"]

OPS = ("allreduce", "allgather", "broadcast", "neighbor", "p2p")
REDUCE_OPS = ("sum", "mean", "max", "min", "prod")
ALGORITHMS = ("auto", "ring", "recursive-doubling")
BASELINES = ("gloo",)


def check_args(op: str, n: int, transport: str = "auto", vs: Sequence[str] = (),
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


def run_bench(op: str, n: int, sizes: str | Iterable[str | int] = DEFAULT_SIZES, *,
              transport: str = "auto", vs_gloo: bool = False, iters: int | None = None,
              warmup: int = 3, reduce_op: str = "sum", key: str | None = None,
              algorithm: str = "auto", timeout: float | None = None, gloo_threads: int = 1,
              progress: Callable[[str], None] | None = None) -> list[dict]:
    """Measure ``op`` over ``n`` peers on float32 arrays of each size (bytes); one row (dict)
    per size. ``vs_gloo``: also torch.distributed Gloo, same sizes and process count, giving
    ``gloo_*`` fields and ``ratio = gloo time / our time``. ``p2p`` (n = 2) always measures
    plain pyzmq too (``pyzmq_*`` fields; its ``ratio`` is pyzmq time / our time)."""
    vs = ("gloo",) if vs_gloo is True else tuple(vs_gloo or ())
    check_args(op, n, transport, vs, reduce_op, algorithm, iters, warmup)
    sizes = parse_sizes(sizes)
    plan = make_plan(sizes, iters, warmup)
    say = progress or (lambda msg: None)

    say(f"gossip {op}: {n} peers, sizes {', '.join(format_size(s) for s in sizes)}")
    t0 = time.perf_counter()
    ours, used = run_gossip(op, n, plan, transport=transport, key=key, reduce_op=reduce_op,
                            algorithm=algorithm, timeout=timeout)
    wall = time.perf_counter() - t0
    baselines: dict[str, dict[int, list[float]]] = {}
    if op == "p2p":
        say("plain pyzmq PAIR p2p, same sizes")
        baselines["pyzmq"] = run_pyzmq_p2p(sizes, transport="tcp" if used == "tcp" else "ipc",
                                           key=key, iters=iters,
                                           warmup=warmup, timeout=timeout)
    if "gloo" in vs:
        say(f"torch.distributed Gloo {op}: {n} processes, same sizes")
        baselines["gloo"] = run_gloo(op, n, plan, reduce_op=reduce_op, threads=gloo_threads,
                                     timeout=timeout)

    rows = []
    for nbytes, w, it in plan:
        row = {"impl": "gossip", "op": op, "nprocs": n, "bytes": nbytes,
               "count": nbytes // ITEMSIZE, "type": "float32",
               "redop": reduce_op if op == "allreduce" else None,
               "transport": transport, "transport_used": used}
        if op == "allreduce":
            row["algorithm"] = algorithm
        if key:
            row["curve"] = True
        row.update(figures(op, n, nbytes, ours[nbytes]))
        row.update({"iters": it, "warmup": w, "ncpu": os.cpu_count(), "wall_seconds": wall})
        for name in ("pyzmq", "gloo"):
            if name not in baselines:
                continue
            fig = figures(op, n, nbytes, baselines[name][nbytes])
            row.update({f"{name}_{k}": v for k, v in fig.items()})
            row[f"{name}_ratio"] = (fig["seconds_median"] / row["seconds_median"]
                                    if row["seconds_median"] > 0 else float("inf"))
        primary = "pyzmq" if op == "p2p" else "gloo"
        if f"{primary}_ratio" in row:
            row["ratio"] = row[f"{primary}_ratio"]
        rows.append(row)
    return rows
