"""The memory bound of an allreduce on one host, from this machine's numpy copy and add rates
measured in the same run (``gossip bench allreduce``: a '%bound' column and a footer line).

    copy, add = memory_rates(64 << 20)           # GB/s of array bytes, medians
    allreduce_bound(2, copy, add)                # busbw GB/s no on-host allreduce can pass

The model. n peers on one host, each holding a private array of S bytes; afterwards every
array must hold the sum of all n. However the work is split, the sum of n arrays takes n - 1
additions of S bytes ((n - 1) S bytes through ``a += b``: reduce-scatter by slices, each
slice's owner adding the n - 1 other peers' slices straight out of their memory), and every
peer must end up with the n - 1 slices it did not reduce: n (n - 1) S / n = (n - 1) S bytes
through a copy. Nothing cheaper is possible with private arrays: a byte of the result is
either added into place or copied there. So

    time >= (n - 1) S (1 / add + 1 / copy)
    busbw = (S / time) 2 (n - 1) / n <= (2 / n) / (1 / add + 1 / copy)

with ``add`` and ``copy`` the array bytes per second of one numpy ``a += b`` and
``np.copyto`` (GB = 1e9 B). The rates are one process's; the bound takes them as the host's,
that is, it assumes the peers running at once do not add memory bandwidth (true where one
core already saturates memory, and where the peers share fewer cores than there are peers;
on a machine where each core adds bandwidth the true ceiling is higher, up to min(n, CPUs)
times). At n = 2 the bound is the harmonic combination of the two rates: 11.4 and 8.3 GB/s
give 4.8 GB/s (issue #18's figure).
"""
from __future__ import annotations

import statistics
import time
from typing import Sequence

__all__ = ["MIN_BOUND_BYTES", "MODEL", "bound_applies", "memory_rates", "allreduce_bound",
           "bound_fields"]

#: Rows below this size get no bound: small allreduces are latency-bound, not memory-bound.
MIN_BOUND_BYTES = 1 << 20

#: The footer's one-line statement of the model (the module docstring derives it).
MODEL = ("bound = (2/n) / (1/add + 1/copy): n peers' private arrays of S bytes need (n-1)S "
         "bytes added and (n-1)S copied out, at the rates of one numpy process taken as the "
         "host's (busbw = S/time * 2(n-1)/n)")


def bound_applies(op: str, n: int, sizes: Sequence[int]) -> bool:
    """Whether a run of ``op`` over ``n`` peers at these row sizes measures and prints the
    memory bound: allreduce, more than one peer, a size of at least MIN_BOUND_BYTES."""
    return op == "allreduce" and n > 1 and any(s >= MIN_BOUND_BYTES for s in sizes)


def memory_rates(nbytes: int, reps: int = 5, warmup: int = 2) -> tuple[float, float]:
    """(copy, add): array GB/s of ``np.copyto(dst, src)`` and of ``a += b`` on float32 arrays
    of ``nbytes``, each the median of ``reps`` timed repetitions after ``warmup`` (the arrays
    are written first, so no page is faulted in while timed)."""
    import numpy as np

    count = max(nbytes // 4, 1)
    src = np.ones(count, dtype=np.float32)
    dst = np.zeros(count, dtype=np.float32)
    zeros = np.zeros(count, dtype=np.float32)   # a += 0 keeps a's values and its scale

    def rate(step) -> float:
        times = []
        for i in range(warmup + reps):
            t0 = time.perf_counter()
            step()
            dt = time.perf_counter() - t0
            if i >= warmup:
                times.append(dt)
        return count * 4 / statistics.median(times) / 1e9

    def add() -> None:
        np.add(src, zeros, out=src)

    copy = rate(lambda: np.copyto(dst, src))
    return copy, rate(add)


def allreduce_bound(n: int, copy: float, add: float) -> float:
    """The busbw (GB/s) no allreduce over ``n`` peers on one host can pass, given the copy and
    add rates (GB/s of array bytes): (2/n) / (1/add + 1/copy); see the module docstring."""
    if n < 2:
        raise ValueError(f"an allreduce bound needs at least 2 peers, got {n}")
    return (2.0 / n) / (1.0 / add + 1.0 / copy)


def bound_fields(row: dict, copy: float, add: float) -> dict:
    """The memory-bound fields of a row (none below MIN_BOUND_BYTES): the rates, the bound and
    the fraction of it reached by gossip and by each comparison measured in the row."""
    if row["bytes"] < MIN_BOUND_BYTES:
        return {}
    bound = allreduce_bound(row["nprocs"], copy, add)
    out = {"mem_copy_GBps": copy, "mem_add_GBps": add, "membound_busbw_GBps": bound,
           "membound_fraction": row["busbw_GBps"] / bound}
    for name in ("gloo", "mpi"):
        if f"{name}_busbw_GBps" in row:
            out[f"{name}_membound_fraction"] = row[f"{name}_busbw_GBps"] / bound
    return out
