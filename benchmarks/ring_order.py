#!/usr/bin/env python3
"""The ring ordered by measured bandwidth against the rank order, where links differ (issue
#37, item 4: "a ring ordered by measured bandwidth when links differ"), each against iperf3 on
its own links in the same run. Needs root, ``ip netns`` and iperf3.

Four "hosts" (network namespaces on one bridge, tests/netfault.py), one peer each, every
directed pair of hosts a link of its own shaped by htb at ``--rate``, but the pairs of
``--slow`` (both directions) at ``--slow-rate``: by default hosts 0 and 1, and 2 and 3, so the
rank order's ring 0 -> 1 -> 2 -> 3 -> 0 crosses two slow links and a ring such as
0 -> 2 -> 1 -> 3 -> 0 none. In each invocation the peers:

- run the allreduce (the ring, as "auto" takes across hosts with one peer a host) of each size
  in rank order, ``--reps`` timed calls after one untimed, the slowest peer's time;
- call ``peer.order_ring(--probe)`` (measure every link, order the ring), timed;
- run the same allreduces in the measured order.

Then iperf3 (one TCP stream a link, 3 s) on each ring's four links at once. Fraction = what
each link of the ring carries (2 (n - 1) / n of the array) / time, against the slowest of that
ring's links as iperf3 measured them at once (a ring goes at its slowest link's pace).
Medians of the invocations. Usage:

    python benchmarks/ring_order.py [--rate 1gbit] [--slow-rate 100mbit] [--slow 0-1,2-3]
        [--sizes 16M,64M] [--probe 4M] [--invocations 3] [--reps 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
HOSTS = 4
PORT = 29541


def worker(sizes: list[int], reps: int, probe: int, out: str) -> None:
    """One peer: every size's allreduce in rank order, order_ring, every size again (rank 0
    writes the slowest peer's times to ``out``)."""
    import numpy as np

    import gossip

    peer = gossip.init()

    def timed(x) -> list[float]:
        times = []
        for k in range(reps + 1):
            peer.barrier()
            start = time.perf_counter()
            peer.allreduce(x)
            took = np.array([time.perf_counter() - start])
            peer.allreduce(took, op="max")
            if k:
                times.append(float(took[0]))
        return times

    arrays = {nbytes: np.ones(nbytes // 4, np.float32) for nbytes in sizes}
    rows = [{"order": "rank", "bytes": nbytes, "times": timed(x)} for nbytes, x in arrays.items()]
    peer.barrier()
    start = time.perf_counter()
    ring = peer.order_ring(probe)
    took = time.perf_counter() - start
    rows += [{"order": "measured", "bytes": nbytes, "times": timed(x)}
             for nbytes, x in arrays.items()]
    if peer.rank == 0:
        with open(out, "w") as f:
            json.dump({"ring": ring, "order_ring_seconds": took, "rows": rows}, f)
    peer.close()


def _peers(net, sizes: list[int], reps: int, probe: int, tmp: str) -> dict:
    out = os.path.join(tmp, "rows.json")
    procs = net.start_peers([sys.executable, os.path.abspath(__file__), "--worker", "--sizes",
                             ",".join(map(str, sizes)), "--reps", str(reps), "--probe",
                             str(probe), "--out", out], port=PORT, log_dir=tmp, timeout=300,
                            env={"OMP_NUM_THREADS": "1"})
    failed = net.peers_failed(procs, tmp, 1800)
    if failed:
        raise SystemExit(f"a peer failed or did not end within 1800 s:\n{failed}")
    with open(out) as f:
        return json.load(f)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--slow-rate", default="100mbit")
    parser.add_argument("--slow", default="0-1,2-3",
                        help="host pairs whose links (both directions) run at --slow-rate")
    parser.add_argument("--sizes", default="16M,64M")
    parser.add_argument("--probe", default="4M", help="order_ring's bytes each way a link")
    parser.add_argument("--invocations", type=int, default=3)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sys.path[:0] = [REPO]   # (before tests/, whose collectives/ is the tests')
    from gossip.bench.sizes import parse_sizes

    sizes = parse_sizes(args.sizes)
    probe = parse_sizes(args.probe)[0]
    if args.worker:
        return worker(sizes, args.reps, probe, args.out)
    sys.path += [os.path.join(REPO, "tests"), HERE]
    import netfault
    from link_capacity import iperf_rates

    reason = netfault.netns_unavailable()
    if reason:
        raise SystemExit(f"ring_order: {reason}")
    slow: dict[tuple[int, int], str] = {}
    for pair in filter(None, args.slow.split(",")):
        a, b = (int(v) for v in pair.split("-"))
        slow[a, b] = slow[b, a] = args.slow_rate
    times: dict[tuple[str, int], list[float]] = {}
    iperf: dict[str, list[float]] = {}
    rings, costs = [], []
    for invocation in range(args.invocations):
        with netfault.Network(HOSTS) as net, tempfile.TemporaryDirectory() as tmp:
            net.shape(args.rate, rates=slow)
            result = _peers(net, sizes, args.reps, probe, tmp)
            ring = result["ring"]
            rings.append(ring)
            costs.append(result["order_ring_seconds"])
            for row in result["rows"]:
                times.setdefault((row["order"], row["bytes"]), []).append(
                    statistics.median(row["times"]))
            for order, members in (("rank", list(range(HOSTS))), ("measured", ring)):
                pairs = [(members[k], members[(k + 1) % HOSTS]) for k in range(HOSTS)]
                iperf.setdefault(order, []).append(min(iperf_rates(net, pairs, tmp)))
        print(f"# invocation {invocation}: measured ring {ring} (order_ring {costs[-1]:.2f} s); "
              + ", ".join(f"{order} {b >> 20} MiB {t[-1]:.3f} s" for (order, b), t in
                          times.items())
              + "; iperf3 slowest link of each ring at once: "
              + ", ".join(f"{o} {r[-1] / 1e6:.0f} Mbit/s" for o, r in iperf.items()), flush=True)
    print(f"\n{HOSTS} hosts, every directed pair a {args.rate} htb link, {args.slow} both ways "
          f"at {args.slow_rate}; one peer a host; medians of {args.invocations} invocations. "
          f"Measured rings: {rings}; order_ring({args.probe}) took "
          f"{statistics.median(costs):.2f} s.\n")
    print("| size | ring | time | rate a link | iperf3, the ring's slowest link (its links at "
          "once) | fraction | speed-up |")
    print("|---|---|---|---|---|---|---|")
    for nbytes in sizes:
        rank_t = statistics.median(times["rank", nbytes])
        for order in ("rank", "measured"):
            t = statistics.median(times[order, nbytes])
            carried = nbytes * 2 * (HOSTS - 1) / HOSTS
            rate, bound = carried * 8 / t, statistics.median(iperf[order])
            print(f"| {nbytes >> 20} MiB | {order} order | {t:.3f} s | {rate / 1e6:.1f} Mbit/s | "
                  f"{bound / 1e6:.1f} Mbit/s | {rate / bound:.2f} | {rank_t / t:.2f}x |")


if __name__ == "__main__":
    main()
