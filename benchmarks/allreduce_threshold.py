#!/usr/bin/env python3
"""Where recursive doubling stops beating the ring: the allreduce crossover size.

Usage:
  python benchmarks/allreduce_threshold.py [--nprocs 2,3,4] [--sizes 1K,4K,16K,64K,256K,1M]
      [--iters K] [--warmup W] [--repeats R] [--transport auto] [--json]

For each process count, the peers (gossip.testing.spawn) time peer.allreduce(x, "sum",
algorithm="ring") and algorithm="recursive-doubling" on float32 arrays of each size,
alternating the two algorithms iteration by iteration so both see the same machine load.
Per iteration: barrier, allreduce; the slowest rank's time; the median over iterations (and
over --repeats runs, the median of the medians).

The crossover is the smallest size from which the ring is at least as fast as recursive
doubling for that size and every larger one measured. collectives.communicator's
DEFAULT_SMALL_BYTES (recursive doubling up to and including it, ring above) should sit just
below it; the suggestion printed is the largest measured size below the crossover, over all
process counts.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from gossip.bench import default_iters, format_size, parse_sizes

ALGOS = ("ring", "recursive-doubling")


def worker(peer, sizes, iters, warmup):
    """In every peer: {algo: {nbytes: [seconds per iteration]}} on this rank."""
    import numpy as np

    out = {a: {} for a in ALGOS}
    for nbytes in sizes:
        x = np.zeros(nbytes // 4, dtype=np.float32)
        k = iters or default_iters(nbytes)
        times = {a: [] for a in ALGOS}
        for i in range(warmup + k):
            for algo in ALGOS:
                peer.barrier()
                t0 = time.perf_counter()
                peer.allreduce(x, "sum", algorithm=algo)
                dt = time.perf_counter() - t0
                if i >= warmup:
                    times[algo].append(dt)
        for algo in ALGOS:
            out[algo][nbytes] = times[algo]
    peer.barrier()
    return out


def measure(n, sizes, iters, warmup, transport):
    """{algo: {nbytes: median of the slowest rank's time}} for n peers."""
    from gossip.testing import spawn

    results = spawn(worker, n, timeout=300, args=(sizes, iters, warmup), transport=transport)
    med = {}
    for algo in ALGOS:
        med[algo] = {}
        for nbytes in sizes:
            slowest = [max(v) for v in zip(*[res[algo][nbytes] for res in results])]
            med[algo][nbytes] = statistics.median(slowest)
    return med


def crossover(sizes, ring, rd):
    """The smallest size from which the ring wins (ties count as ring) for every larger size;
    None when recursive doubling still wins at the largest size."""
    cross = None
    for nbytes in reversed(sizes):
        if ring[nbytes] <= rd[nbytes]:
            cross = nbytes
        else:
            break
    return cross


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nprocs", default="2,3,4", help="process counts (default 2,3,4)")
    ap.add_argument("--sizes", default="1K,4K,16K,64K,256K,1M",
                    help="sizes in bytes (default 1K..1M in powers of 4)")
    ap.add_argument("--iters", type=int, default=None,
                    help="timed iterations per size and algorithm (default 50, 20 at 1M)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=1,
                    help="whole runs; figures are the median of the per-run medians")
    ap.add_argument("--transport", default="auto", choices=("auto", "tcp", "ipc"))
    ap.add_argument("--json", action="store_true", help="one JSON object per (n, size)")
    args = ap.parse_args(argv)
    try:
        sizes = sorted(set(parse_sizes(args.sizes)))
        nprocs = [int(v) for v in args.nprocs.split(",") if v]
        if any(n < 2 for n in nprocs):
            raise ValueError("every process count must be at least 2")
        if args.repeats < 1:
            raise ValueError("--repeats must be at least 1")
    except ValueError as exc:
        ap.error(str(exc))

    t0 = time.perf_counter()
    table = {}
    for n in nprocs:
        runs = []
        for r in range(args.repeats):
            print(f"# n={n}: run {r + 1} of {args.repeats}", file=sys.stderr, flush=True)
            runs.append(measure(n, sizes, args.iters, args.warmup, args.transport))
        table[n] = {a: {s: statistics.median(run[a][s] for run in runs) for s in sizes}
                    for a in ALGOS}
    wall = time.perf_counter() - t0

    cross = {n: crossover(sizes, table[n]["ring"], table[n]["recursive-doubling"])
             for n in nprocs}
    if args.json:
        for n in nprocs:
            for s in sizes:
                ring, rd = table[n]["ring"][s], table[n]["recursive-doubling"][s]
                print(json.dumps({"bench": "allreduce_threshold", "nprocs": n, "bytes": s,
                                  "ring_seconds_median": ring, "rd_seconds_median": rd,
                                  "rd_over_ring": rd / ring, "crossover_bytes": cross[n],
                                  "repeats": args.repeats, "transport": args.transport}))
        return 0

    print(f"allreduce, float32 sum, ring vs recursive doubling; median time per call (us), "
          f"slowest rank; {os.cpu_count()} CPUs; transport {args.transport}; "
          f"{args.repeats} run(s); {wall:.0f} s in all.\n")
    head = "| size |" + "".join(f" n={n} ring | n={n} rec-dbl | n={n} rd/ring |" for n in nprocs)
    print(head)
    print("|---|" + "---:|---:|---:|" * len(nprocs))
    for s in sizes:
        line = f"| {format_size(s)} |"
        for n in nprocs:
            ring, rd = table[n]["ring"][s], table[n]["recursive-doubling"][s]
            line += f" {ring * 1e6:.0f} | {rd * 1e6:.0f} | {rd / ring:.2f} |"
        print(line)
    print("\nrd/ring < 1: recursive doubling is faster at that size.\n")
    below = []
    for n in nprocs:
        c = cross[n]
        if c is None:
            print(f"n={n}: recursive doubling is still faster at {format_size(sizes[-1])}; "
                  "no crossover in the sizes measured")
            below.append(sizes[-1])
        elif c == sizes[0]:
            print(f"n={n}: the ring is at least as fast from {format_size(c)} (the smallest "
                  "size measured) up")
            below.append(0)
        else:
            prev = sizes[sizes.index(c) - 1]
            print(f"n={n}: crossover between {format_size(prev)} (recursive doubling "
                  f"faster) and {format_size(c)} (ring at least as fast from here up)")
            below.append(prev)
    pick = max(below)
    try:
        from collectives.communicator import DEFAULT_SMALL_BYTES
        current = format_size(DEFAULT_SMALL_BYTES)
    except ImportError:  # pragma: no cover
        current = "?"
    print(f"\nsuggested DEFAULT_SMALL_BYTES (recursive doubling up to and including it): "
          f"{format_size(pick) if pick else 'none (always the ring)'}; currently {current}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
