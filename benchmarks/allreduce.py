#!/usr/bin/env python3
"""Allreduce against torch.distributed Gloo: runs `gossip bench allreduce --vs gloo --json`
for each process count and writes a markdown summary.

Usage:
  python benchmarks/allreduce.py [--nprocs 2,4] [--sizes 4K,256K,4M,64M] [--repeats 1]
      [--transport auto] [--iters K] [--out summary.md] [--jsonl raw.jsonl]

Each repeat is a separate `gossip bench` invocation (gossip first, then Gloo, same sizes and
process count); the figures are the median over repeats of the per-run medians (each the
median over iterations of the slowest rank). ratio = Gloo time / gossip time (> 1: gossip is
faster), computed from those medians.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from gossip.bench import format_size, parse_sizes


def run_once(n, sizes, transport, iters, timeout):
    cmd = [sys.executable, "-m", "gossip", "bench", "allreduce", "-n", str(n), "--sizes", sizes,
           "--transport", transport, "--vs", "gloo", "--json"]
    if iters:
        cmd += ["--iters", str(iters)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stderr}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nprocs", default="2,4", help="process counts (default 2,4)")
    ap.add_argument("--sizes", default="4K,256K,4M,64M")
    ap.add_argument("--repeats", type=int, default=1, help="invocations per process count")
    ap.add_argument("--transport", default="auto", choices=("auto", "tcp", "ipc"))
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=900, help="per invocation, seconds")
    ap.add_argument("--out", default=None, help="also write the markdown summary here")
    ap.add_argument("--jsonl", default=None, help="also append every raw row here")
    args = ap.parse_args(argv)
    try:
        sizes = parse_sizes(args.sizes)
        nprocs = [int(v) for v in args.nprocs.split(",") if v]
        if args.repeats < 1 or any(n < 1 for n in nprocs):
            raise ValueError("--repeats and every process count must be at least 1")
    except ValueError as exc:
        ap.error(str(exc))

    t0 = time.perf_counter()
    summary = []
    for n in nprocs:
        runs = []
        for r in range(args.repeats):
            print(f"# allreduce n={n}: run {r + 1} of {args.repeats}", file=sys.stderr,
                  flush=True)
            rows = run_once(n, args.sizes, args.transport, args.iters, args.timeout)
            if args.jsonl:
                with open(args.jsonl, "a") as f:
                    for row in rows:
                        f.write(json.dumps({**row, "repeat": r}) + "\n")
            runs.append({row["bytes"]: row for row in rows})
        for nbytes in sizes:
            ours = statistics.median(run[nbytes]["seconds_median"] for run in runs)
            gloo = statistics.median(run[nbytes]["gloo_seconds_median"] for run in runs)
            factor = 2 * (n - 1) / n
            summary.append({"n": n, "bytes": nbytes, "ours": ours, "gloo": gloo,
                            "busbw": nbytes / ours / 1e9 * factor,
                            "gloo_busbw": nbytes / gloo / 1e9 * factor,
                            "used": runs[0][nbytes].get("transport_used", "?")})
    wall = time.perf_counter() - t0

    lines = [f"## allreduce: gossip vs torch.distributed Gloo ({os.cpu_count()} CPUs, "
             f"transport {args.transport}, median of {args.repeats} run(s), {wall:.0f} s)", "",
             "| n | size | gossip time (ms) | gossip busbw (GB/s) | Gloo time (ms) "
             "| Gloo busbw (GB/s) | ratio |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for s in summary:
        lines.append(f"| {s['n']} | {format_size(s['bytes'])} | {s['ours'] * 1e3:.3f} "
                     f"| {s['busbw']:.3f} | {s['gloo'] * 1e3:.3f} | {s['gloo_busbw']:.3f} "
                     f"| {s['gloo'] / s['ours']:.2f} |")
    lines += ["", "busbw = bytes/time * 2(n-1)/n; ratio = Gloo time / gossip time "
              "(> 1: gossip is faster). Peers connected over: "
              + ", ".join(sorted({s['used'] for s in summary})) + "."]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
