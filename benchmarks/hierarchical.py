"""The two-level allreduce against the flat ring across hosts whose links are slower than
their memory (collectives/algorithms/hierarchical.py): network namespaces as hosts
(tests/netfault.py), several peers in each, each host's uplink limited by the kernel (a tbf
qdisc on its eth0: RATE, as a real NIC would), peers on one host talking through shared
memory. Needs root and `ip netns`.

    python benchmarks/hierarchical.py [--hosts 2] [--per-host 2] [--rate 1gbit]
                                      [--sizes 4M,64M] [--repeats 5] [--invocations 3]

Prints, per placement (round-robin: rank r on host r % H, as a launcher handing out ranks in
turn; blocks: ranks in host order) and size, the median seconds per call of each algorithm
over ``--repeats`` calls (each after a barrier), the ratio, the bytes each peer sent to other
hosts, and how full the busiest uplink was (the bytes its host's peers sent to other hosts a
second, against iperf3 between hosts 1 and 0 both ways at once, one TCP stream each way,
measured first in each invocation on the same uplinks: benchmarks/link_capacity.py);
``--invocations`` runs of the whole (fresh namespaces each), medians and ranges.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))   # through a link too
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.path.insert(0, REPO)

from gossip.bench.sizes import parse_size   # (after the repository's path)

ALGORITHMS = ("ring", "hierarchical")
PORT = 29517


def worker(out: str, sizes: list[int], repeats: int) -> int:
    """One peer: every size, each algorithm ``repeats`` times after a barrier; rank 0 writes
    the times, every peer its bytes sent to other hosts."""
    import numpy as np

    import gossip
    peer = gossip.init()
    t = peer.transport
    away = [j for j in range(peer.world_size) if t.hosts[j] != t.hosts[peer.rank]]
    result = {}
    for size in sizes:
        x = np.ones(size // 4, np.float32)
        for algorithm in ALGORITHMS:
            peer.allreduce(x, algorithm=algorithm)   # warm: connections, buffers
            times, before = [], sum(t.counters[j].bytes_sent for j in away)
            for _ in range(repeats):
                peer.barrier()
                start = time.perf_counter()
                peer.allreduce(x, algorithm=algorithm)
                times.append(time.perf_counter() - start)
            sent = (sum(t.counters[j].bytes_sent for j in away) - before) / repeats
            result[f"{size}/{algorithm}"] = {"seconds": times, "away_bytes": sent}
    peer.barrier()
    with open(f"{out}.tmp", "w") as f:
        json.dump(result, f)
    os.replace(f"{out}.tmp", out)
    peer.close()
    return 0


def invocation(args, placement: str) -> tuple[dict, float]:
    """One run in fresh namespaces: {(size, algorithm): (median seconds of rank 0's calls,
    the most bytes a peer sent to other hosts per call, the most bytes a host's peers sent to
    other hosts per call)}, and iperf3's rate (bits/s) from host 1 to host 0 while host 0 sends
    to host 1 too (the slower way), measured first on the same uplinks."""
    import netfault
    from link_capacity import iperf_rates
    n = args.hosts * args.per_host
    with netfault.Network(args.hosts) as net, tempfile.TemporaryDirectory() as tmp:
        for host in net.hosts:   # each host's uplink, as its NIC would be
            subprocess.run(["tc", "-n", host.ns, "qdisc", "add", "dev", "eth0", "root", "tbf",
                            "rate", args.rate, "burst", "256kb", "latency", "50ms"],
                           check=True, capture_output=True)
        iperf = min(iperf_rates(net, [(1, 0), (0, 1)], tmp))
        where = [r % args.hosts if placement == "round-robin" else r // args.per_host
                 for r in range(n)]
        procs = net.start_peers(lambda r: [sys.executable, __file__, "--worker",
                                           os.path.join(tmp, f"out.{r}"), args.sizes,
                                           str(args.repeats)],
                                port=PORT, log_dir=tmp, placement=where, timeout=120)
        failed = net.peers_failed(procs, tmp, 1800)
        if failed:
            raise SystemExit(f"a rank failed ({placement}):\n{failed}")
        outs = [json.load(open(os.path.join(tmp, f"out.{r}"))) for r in range(n)]
    return {key: (statistics.median(outs[0][key]["seconds"]),
                  max(o[key]["away_bytes"] for o in outs),
                  max(sum(o[key]["away_bytes"] for o, h in zip(outs, where) if h == host)
                      for host in range(args.hosts))) for key in outs[0]}, iperf


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        return worker(argv[1], [parse_size(s) for s in argv[2].split(",")], int(argv[3]))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--per-host", type=int, default=2)
    ap.add_argument("--rate", default="1gbit", help="each host's uplink (tc's units)")
    ap.add_argument("--sizes", default="4M,64M")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--invocations", type=int, default=3)
    args = ap.parse_args(argv)
    import netfault
    reason = netfault.netns_unavailable()
    if reason:
        raise SystemExit(f"needs network namespaces: {reason}")
    print(f"{args.hosts} hosts x {args.per_host} peers, uplinks {args.rate} (tbf), "
          f"{args.repeats} calls per invocation, {args.invocations} invocations")
    print(f"{'placement':<12} {'size':>5} {'ring s':>16} {'two levels s':>16} {'ratio':>6} "
          f"{'away MiB ring / two levels':>28} {'uplink / iperf3, ring / two levels':>36}")
    rates = []
    for placement in ("round-robin", "blocks"):
        runs = []
        for _ in range(args.invocations):
            run, iperf = invocation(args, placement)
            runs.append(run)
            rates.append(iperf)
        for size in args.sizes.split(","):
            b = parse_size(size)
            ring = [run[f"{b}/ring"][0] for run in runs]
            two = [run[f"{b}/hierarchical"][0] for run in runs]
            away = [run[f"{b}/{a}"][1] / 2**20 for a in ALGORITHMS for run in runs[:1]]
            # What the busiest uplink carried a second, against iperf3 both ways at once.
            filled = [statistics.median(run[f"{b}/{a}"][2] * 8 / run[f"{b}/{a}"][0]
                                        for run in runs) / statistics.median(rates)
                      for a in ALGORITHMS]
            print(f"{placement:<12} {size:>5} {statistics.median(ring):>7.3f} "
                  f"({min(ring):.3f}-{max(ring):.3f}) {statistics.median(two):>7.3f} "
                  f"({min(two):.3f}-{max(two):.3f}) "
                  f"{statistics.median(ring) / statistics.median(two):>5.2f}x "
                  f"{away[0]:>12.1f} / {away[1]:.1f} {filled[0]:>22.2f} / {filled[1]:.2f}",
                  flush=True)
    print(f"iperf3 between hosts 1 and 0, both ways at once (the slower way): median "
          f"{statistics.median(rates) / 1e6:.1f} Mbit/s ({min(rates) / 1e6:.1f}-"
          f"{max(rates) / 1e6:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
