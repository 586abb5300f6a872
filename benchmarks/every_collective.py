#!/usr/bin/env python3
"""Every collective on one host against OpenMPI, as a table of ratios (docs/results.md, "Every
collective against OpenMPI"): ``gossip bench OP -n N --sizes SIZES --vs mpi --json`` for each
row, the rows in turn within each invocation, then the median over the invocations of each
side's median. Ratio = OpenMPI's time / ours (above 1: faster than OpenMPI). Needs OpenMPI's
``mpirun`` and mpi4py (the bench says so otherwise). Usage:

    python benchmarks/every_collective.py [--invocations 3] [--sizes 4K,4M,64M]
                                          [--ops allreduce:2,4 broadcast:2,4 ...] [--json]

About 4 minutes an invocation with the defaults on 2 cores.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

ROWS = ("allreduce:2,4", "broadcast:2,4", "allgather:2,4", "allgatherv:2,4", "alltoall:2,4",
        "alltoallv:2,4", "reduce_scatter:2,4", "gather:4", "scatter:4", "reduce:4",
        "neighbor:4", "p2p:2")


def bench(op: str, n: int, sizes: str) -> list[dict]:
    """One invocation of ``gossip bench`` for ``op`` on ``n`` peers: its JSON rows."""
    proc = subprocess.run([sys.executable, "-m", "gossip", "bench", op, "-n", str(n),
                           "--sizes", sizes, "--vs", "mpi", "--json"],
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"gossip bench {op} -n {n} failed:\n{proc.stderr[-2000:]}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def _time(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} us" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


def _size(nbytes: int) -> str:
    """4096 -> "4 KiB"; a size rounded to whole shares or blocks (4080) -> "3.98 KiB"."""
    unit, name = (1 << 20, "MiB") if nbytes >= 1 << 20 else (1 << 10, "KiB")
    return f"{nbytes // unit} {name}" if nbytes % unit == 0 else f"{nbytes / unit:.2f} {name}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--invocations", type=int, default=3)
    parser.add_argument("--sizes", default="4K,4M,64M")
    parser.add_argument("--ops", nargs="+", default=list(ROWS),
                        help="OP:N[,N...] for each row (default: every collective)")
    parser.add_argument("--json", action="store_true", help="also print every bench row")
    args = parser.parse_args()
    runs: dict[tuple[str, int, int], list[dict]] = {}
    for invocation in range(args.invocations):
        for spec in args.ops:
            op, ns = spec.split(":")
            for n in (int(v) for v in ns.split(",")):
                for row in bench(op, n, args.sizes):
                    runs.setdefault((op, n, row["bytes"]), []).append(row)
                    if args.json:
                        print(json.dumps({"invocation": invocation, **row}), flush=True)
    print(f"| op | n | size | gossip (median of {args.invocations}) | OpenMPI | ratio |")
    print("|---|---|---|---|---|---|")
    for (op, n, nbytes), rows in runs.items():
        ours = statistics.median(r["seconds_median"] for r in rows)
        theirs = [r["mpi_seconds_median"] for r in rows if r.get("mpi_seconds_median")]
        mpi = statistics.median(theirs) if theirs else None
        print(f"| {op} | {n} | {_size(nbytes)} | {_time(ours)} | "
              f"{_time(mpi) if mpi else '-'} | {f'{mpi / ours:.2f}x' if mpi else '-'} |")


if __name__ == "__main__":
    main()
