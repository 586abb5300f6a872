#!/usr/bin/env python3
"""Point-to-point throughput of gossip's transport against plain pyzmq, in the same run.

Usage:
  python benchmarks/transport.py [--sizes 4K,4M,64M] [--configs tcp,ipc,curve]
      [--repeats 3] [--iters K] [--warmup W] [--json]

For each configuration (tcp; ipc; tcp with CURVE on, the key made by
collectives.security.write_cluster_key in a temp dir; and shm, the shared-memory transport,
where it exists, compared with pyzmq over ipc) and each float32 array size:

  gossip single : 2 peers (gossip.testing.spawn); per iteration barrier, then rank 0
                  peer.send(1, x) and rank 1 peer.recv(0); timed at the receiver from the
                  barrier.
  gossip stream : the same with K arrays back to back per iteration (K = 32 up to 4 MiB,
                  down to 4 at 64 MiB); seconds per array = time / K.
  pyzmq  single : plain pyzmq PAIR socket, one message send(copy=False) /
                  recv(copy=False) -> np.frombuffer; the same two-peer barrier (one empty
                  message each way) before each iteration, timed at the receiver.
  pyzmq  stream : K messages back to back.

The pyzmq CURVE rows use the same key pair on a plain PAIR socket. GB/s = bytes / median
seconds (GB = 1e9 bytes); ratio = gossip GB/s / pyzmq GB/s (= pyzmq time / gossip time; > 1
means gossip is faster). The whole measurement runs --repeats times; each figure is the
median of the per-run medians.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from gossip.bench import format_size, parse_sizes, run_p2p, run_pyzmq_p2p, supported_transports

# config -> (gossip transport, CURVE on, plain pyzmq transport to compare with)
CONFIGS = {"tcp": ("tcp", False, "tcp"), "ipc": ("ipc", False, "ipc"),
           "curve": ("tcp", True, "tcp"), "shm": ("shm", False, "ipc")}
LABELS = {"tcp": "tcp", "ipc": "ipc", "curve": "tcp+CURVE", "shm": "shm (pyzmq: ipc)"}
DEFAULT_CONFIGS = ",".join(c for c in CONFIGS if c != "shm" or "shm" in supported_transports())


def stream_k(nbytes: int) -> int:
    """Arrays per streamed iteration: about 128 MiB per iteration, between 4 and 32."""
    return max(4, min(32, (128 << 20) // nbytes))


def measure_once(sizes, configs, key_path, iters, warmup, say) -> dict:
    """One pass over everything; returns {(config, variant, impl, nbytes): median seconds}."""
    out = {}
    streams = {nbytes: stream_k(nbytes) for nbytes in sizes}
    for config in configs:
        transport, curve, theirs_over = CONFIGS[config]
        key = key_path if curve else None
        for variant, stream in (("single", 1), ("stream", streams)):
            say(f"{LABELS[config]} {variant}: gossip")
            ours, used = run_p2p(sizes, transport=transport, key=key, iters=iters,
                                 warmup=warmup, stream=stream)
            if used != transport:
                raise RuntimeError(f"asked for {transport}, the peers connected over {used}")
            say(f"{LABELS[config]} {variant}: pyzmq")
            theirs = run_pyzmq_p2p(sizes, transport=theirs_over, key=key, iters=iters,
                                   warmup=warmup, stream=stream)
            for nbytes in sizes:
                out[(config, variant, "gossip", nbytes)] = statistics.median(ours[nbytes])
                out[(config, variant, "pyzmq", nbytes)] = statistics.median(theirs[nbytes])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4K,4M,64M", help="array sizes (default 4K,4M,64M)")
    ap.add_argument("--configs", default=DEFAULT_CONFIGS,
                    help="comma separated: tcp, ipc, curve (tcp with CURVE), shm (where the "
                         f"shared-memory transport exists); default {DEFAULT_CONFIGS}")
    ap.add_argument("--repeats", type=int, default=3,
                    help="run the whole measurement this many times (default 3)")
    ap.add_argument("--iters", type=int, default=None,
                    help="timed iterations per size (default 50 up to 256K, 20 up to 4M, 10)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="one JSON object per row")
    args = ap.parse_args(argv)
    try:
        sizes = parse_sizes(args.sizes)
        configs = [c for c in args.configs.split(",") if c]
        for c in configs:
            if c not in CONFIGS:
                raise ValueError(f"unknown config {c!r}; choose from {', '.join(CONFIGS)}")
            if CONFIGS[c][0] not in supported_transports():
                raise ValueError(f"config {c!r}: this build has no {CONFIGS[c][0]} transport")
        if args.repeats < 1:
            raise ValueError("--repeats must be at least 1")
    except ValueError as exc:
        ap.error(str(exc))

    def say(msg: str) -> None:
        print(f"# {msg}", file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    runs = []
    with tempfile.TemporaryDirectory(prefix="gossip-bench-key-") as tmp:
        key_path = None
        if "curve" in configs:
            from collectives.security import write_cluster_key
            key_path = write_cluster_key(os.path.join(tmp, "cluster.key")).path
        for r in range(args.repeats):
            say(f"run {r + 1} of {args.repeats}")
            runs.append(measure_once(sizes, configs, key_path, args.iters, args.warmup, say))
    wall = time.perf_counter() - t0

    rows = []
    for config in configs:
        for variant in ("single", "stream"):
            for nbytes in sizes:
                row = {"bench": "transport_p2p", "config": LABELS[config],
                       "variant": variant, "bytes": nbytes,
                       "msgs_per_iter": 1 if variant == "single" else stream_k(nbytes),
                       "repeats": args.repeats}
                for impl in ("gossip", "pyzmq"):
                    per_run = [run[(config, variant, impl, nbytes)] for run in runs]
                    med = statistics.median(per_run)
                    row[f"{impl}_seconds_median"] = med
                    row[f"{impl}_seconds_per_run"] = per_run
                    row[f"{impl}_GBps"] = nbytes / med / 1e9
                row["ratio"] = row["gossip_GBps"] / row["pyzmq_GBps"]
                rows.append(row)

    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    print(f"Point-to-point, rank 0 -> rank 1, float32 arrays; median of {args.repeats} runs "
          f"(each the median over iterations); {os.cpu_count()} CPUs; {wall:.0f} s in all.\n")
    print("| transport | size | variant | gossip time (us) | gossip GB/s | pyzmq time (us) "
          "| pyzmq GB/s | ratio |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for row in rows:
        variant = row["variant"] if row["variant"] == "single" else \
            f"stream x{row['msgs_per_iter']}"
        print(f"| {row['config']} | {format_size(row['bytes'])} | {variant} "
              f"| {row['gossip_seconds_median'] * 1e6:.1f} | {row['gossip_GBps']:.3f} "
              f"| {row['pyzmq_seconds_median'] * 1e6:.1f} | {row['pyzmq_GBps']:.3f} "
              f"| {row['ratio']:.2f} |")
    print("\nratio = gossip GB/s / pyzmq GB/s (> 1: gossip is faster). pyzmq rows use the same "
          "transport (for shm: ipc; for tcp+CURVE, the same key on a plain PAIR socket).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
