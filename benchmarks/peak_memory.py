#!/usr/bin/env python3
"""Peak memory of a peer during a large collective, as a multiple of the array.

Each peer records its resident set before it allocates the array, allocates it (and the
operation's output, where it has one: ``out=``), runs the operation a few times, and reports
(peak RSS - RSS before) / array bytes: 1.0 is the array itself (plus the output's share: an
allgather's output is n arrays), the rest is what the operation costs (chunk buffers,
shared-memory ring pages it touched, the mapped pages of its neighbour's ring, a neighbour
round's scratch). Usage:

    python benchmarks/peak_memory.py [--n 2 4] [--mib 64] [--transport auto tcp] [--arenas]
                                     [--op allreduce broadcast ...]
"""
from __future__ import annotations

import argparse
import json
import resource

import numpy as np

from gossip.testing import spawn


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _pss_bytes() -> int:
    """Proportional set size: pages shared with other processes (the peers' arenas, mapped
    by each) count 1/k in each of the k that map them, so the peers' PSS add up to what the
    host holds; RSS counts them in full in every peer."""
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return 0


OPS = ("allreduce", "broadcast", "allgather", "alltoall", "reduce_scatter", "gather", "scatter",
       "reduce", "neighbor")
#: The output an operation writes besides its array, in arrays: allocated after the baseline,
#: so counted in the peak, and named in the table's column.
OUTPUT = {"allgather": "n", "alltoall": 1, "gather": "n at the root", "scatter": "1/n"}


def measure(peer, nbytes: int, rounds: int, arenas: bool = False, op: str = "allreduce"):
    if arenas:   # as where the peers may not read each other's memory (transport/cma.py)
        from collectives.algorithms.shm_entry import SharedEntry
        SharedEntry.direct_reads = False
    peer.barrier()
    n, r = peer.world_size, peer.rank
    before, pss_before = _rss_bytes(), _pss_bytes()
    x = np.ones(nbytes // 4, dtype=np.float32)
    x += 0  # touch every page
    out = None
    if op in ("allgather", "gather"):
        out = np.zeros((n,) + x.shape, np.float32) if op == "allgather" or r == 0 else None
    elif op == "alltoall":
        out = np.zeros_like(x)
    elif op == "scatter":
        out = np.zeros(x.size // n, np.float32)
    for _ in range(rounds):
        if op == "allreduce":
            peer.allreduce(x)
        elif op == "broadcast":
            peer.broadcast(x, 0)
        elif op == "allgather":
            peer.allgather(x, out=out)
        elif op == "alltoall":
            peer.alltoall(x, out=out)
        elif op == "reduce_scatter":
            peer.reduce_scatter(x)
        elif op == "gather":
            peer.gather(x, 0, out=out)
        elif op == "scatter":
            peer.scatter(x[:out.size * n], 0, out=out)
        elif op == "reduce":
            peer.reduce(x, 0)
        elif op == "neighbor":
            peer.neighbor_allreduce(x, 1 / 3, {(r - 1) % n: 1 / 3, (r + 1) % n: 1 / 3},
                                    [(r - 1) % n, (r + 1) % n])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
    # The allreduce keeps what it allocates (arenas) to the end: PSS now is its peak.
    pss = _pss_bytes() - pss_before
    correct = bool(np.all(x == n ** rounds)) if op == "allreduce" else True
    return {"rank": r, "before_mib": before / 2**20, "peak_mib": peak / 2**20,
            "ratio": (peak - before) / nbytes, "pss_ratio": pss / nbytes, "correct": correct}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--transport", nargs="+", default=["auto", "tcp"])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--arenas", action="store_true",
                        help="on one host, keep the shared-memory arenas (no direct reads)")
    parser.add_argument("--op", nargs="+", default=["allreduce"], choices=OPS)
    args = parser.parse_args()
    print("| op | transport | n | array | output (arrays) | peak RSS over baseline, worst "
          "peer | x array | PSS after, x array (shared pages split) |")
    print("|---|---|---|---|---|---|---|---|")
    for op in args.op:
        for transport in args.transport:
            for n in args.n:
                if op == "neighbor" and n < 3:
                    continue
                rows = spawn(measure, n=n, timeout=300, transport=transport,
                             args=(args.mib << 20, args.rounds, args.arenas, op))
                worst = max(rows, key=lambda r: r["ratio"])
                assert all(r["correct"] for r in rows)
                if args.json:
                    print(json.dumps({"op": op, "transport": transport, "n": n,
                                      "mib": args.mib, **worst}))
                print(f"| {op} | {transport} | {n} | {args.mib} MiB | {OUTPUT.get(op, 0)} | "
                      f"{worst['peak_mib'] - worst['before_mib']:.0f} MiB | "
                      f"{worst['ratio']:.2f} | {max(r['pss_ratio'] for r in rows):.2f} |")


if __name__ == "__main__":
    main()
