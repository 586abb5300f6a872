#!/usr/bin/env python3
"""Peak memory of a peer during a large allreduce, as a multiple of the array.

Each peer records its resident set before it allocates the array, allocates it, runs a few
allreduces, and reports (peak RSS - RSS before) / array bytes: 1.0 is the array itself, the
rest is what the allreduce costs (chunk buffers, shared-memory ring pages it touched, the
mapped pages of its neighbour's ring). Usage:

    python benchmarks/peak_memory.py [--n 2 4] [--mib 64] [--transport auto tcp] [--arenas]
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


def measure(peer, nbytes: int, rounds: int, arenas: bool = False):
    if arenas:   # as where the peers may not read each other's memory (transport/cma.py)
        from collectives.algorithms.shm_entry import SharedEntry
        SharedEntry.direct_reads = False
    peer.barrier()
    before, pss_before = _rss_bytes(), _pss_bytes()
    x = np.ones(nbytes // 4, dtype=np.float32)
    x += 0  # touch every page
    for _ in range(rounds):
        peer.allreduce(x)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
    # The allreduce keeps what it allocates (arenas) to the end: PSS now is its peak.
    pss = _pss_bytes() - pss_before
    return {"rank": peer.rank, "before_mib": before / 2**20, "peak_mib": peak / 2**20,
            "ratio": (peak - before) / nbytes, "pss_ratio": pss / nbytes,
            "correct": bool(np.all(x == peer.world_size ** rounds))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--transport", nargs="+", default=["auto", "tcp"])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--arenas", action="store_true",
                        help="on one host, keep the shared-memory arenas (no direct reads)")
    args = parser.parse_args()
    print("| transport | n | array | peak RSS over baseline, worst peer | x array "
          "| PSS after, x array (shared pages split) |")
    print("|---|---|---|---|---|---|")
    for transport in args.transport:
        for n in args.n:
            rows = spawn(measure, n=n, timeout=300, args=(args.mib << 20, args.rounds, args.arenas),
                         transport=transport)
            worst = max(rows, key=lambda r: r["ratio"])
            assert all(r["correct"] for r in rows)
            if args.json:
                print(json.dumps({"transport": transport, "n": n, "mib": args.mib, **worst}))
            print(f"| {transport} | {n} | {args.mib} MiB | "
                  f"{worst['peak_mib'] - worst['before_mib']:.0f} MiB | {worst['ratio']:.2f} | "
                  f"{max(r['pss_ratio'] for r in rows):.2f} |")


if __name__ == "__main__":
    main()
