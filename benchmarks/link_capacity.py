#!/usr/bin/env python3
"""How much of a shaped link the allreduce and the gossip round fill, against iperf3 on the
same links in the same run (issue #37, item 4). Needs root, ``ip netns`` and iperf3.

Four "hosts" (network namespaces on one bridge, tests/netfault.py), every directed pair of
hosts a link of its own shaped by tc (htb at ``--rate``); one real peer per host. The kernel
here has no netem: with ``--rtt`` (such as 50ms) each host's cable is a pair of taps joined by
a user-space wire that holds every frame a quarter of the round trip (tests/netfault.py,
``Network(wire_delay=...)``), so TCP sees the round trip end to end. In each invocation:

- iperf3 for 3 s: one link alone (host 1 -> host 0), then every link the allreduce uses at
  once (the ring, i -> i + 1), then every link the gossip round uses at once (the ring both
  ways: 8 links), what the links and this machine carry in the op's own pattern; each with one
  TCP stream a link and with ``--streams`` (4) a link (``-P``: what a pool of connections
  carries where one stream cannot fill a long fat pipe);
- ``allreduce`` of each size (the ring over TCP: every link i -> i + 1 carries 2 (n - 1) / n
  of the array one way), and a gossip round (``neighbor_allreduce`` on the ring, weights 1/3:
  every link carries the whole array each way at once), each timed as the slowest peer's
  time, the median of ``--reps`` after one untimed call.

Fraction = the bytes each link carried / time, against iperf3's mean rate a link on the op's
own links at once, the better of one stream and ``--streams`` a link (and, in brackets,
against one link alone, likewise). ``--congestion reno,bbr`` runs
it all under each TCP congestion control in turn within every invocation (the hosts' own;
default: the machine's, which a new namespace takes): under BBR a round, both directions of
every link busy at once, fills less of its links than under reno or cubic
(tests/netfault.Network.congestion). Usage:

    python benchmarks/link_capacity.py [--rate 1gbit] [--rtt 50ms] [--sizes 64M,256M]
        [--invocations 3] [--congestion reno,bbr]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
HOSTS = 4
PORT = 29531


def worker(sizes: list[int], reps: int, out: str) -> None:
    """One peer: every size's allreduce and ring round, the slowest peer's times (rank 0
    writes them to ``out``)."""
    import numpy as np

    import gossip

    peer = gossip.init()
    n, r = peer.world_size, peer.rank
    left, right = (r - 1) % n, (r + 1) % n
    rows = []
    for nbytes in sizes:
        x = np.ones(nbytes // 4, np.float32)
        scratch = np.empty_like(x)
        calls = {"allreduce": lambda: peer.allreduce(x),
                 "round": lambda: peer.neighbor_allreduce(
                     x, 1 / 3, {left: 1 / 3, right: 1 / 3}, [left, right], scratch=scratch)}
        for op, call in calls.items():
            times = []
            for k in range(reps + 1):
                peer.barrier()
                start = time.perf_counter()
                call()
                took = np.array([time.perf_counter() - start])
                peer.allreduce(took, op="max")
                if k:
                    times.append(float(took[0]))
            rows.append({"op": op, "bytes": nbytes, "times": times})
    if r == 0:
        with open(out, "w") as f:
            json.dump(rows, f)
    peer.close()


def iperf_rates(net, pairs: list[tuple[int, int]], tmp: str, streams: int = 1) -> list[float]:
    """iperf3's rate (bits/s) on each directed link ``(src, dst)`` of ``pairs``, all of them
    at once for 3 s (``streams`` TCP streams each, a server per link on the destination)."""
    for attempt in range(5):
        servers = [net.run(net.hosts[dst], ["iperf3", "-s", "-1", "-p", str(5201 + k)],
                           dict(os.environ)) for k, (_, dst) in enumerate(pairs)]
        time.sleep(0.5 + attempt)   # (a server says nothing when it listens)
        logs = [os.path.join(tmp, f"iperf.{k}.json") for k in range(len(pairs))]
        clients = [net.run(net.hosts[src], ["iperf3", "-c", net.hosts[dst].addr, "-p",
                                            str(5201 + k), "-t", "3", "-P", str(streams),
                                            "-J"], dict(os.environ),
                           log_path=logs[k]) for k, (src, dst) in enumerate(pairs)]
        for proc in clients + servers:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        rates = []
        for log in logs:
            try:
                with open(log) as f:
                    rates.append(float(json.load(f)["end"]["sum_received"]["bits_per_second"]))
            except (OSError, ValueError, KeyError):
                break
        if len(rates) == len(pairs):
            return rates
    raise SystemExit(f"iperf3 failed on {pairs}: {open(logs[0], errors='replace').read()[-500:]}")


def _peers(net, sizes: list[int], reps: int, tmp: str) -> list[dict]:
    out = os.path.join(tmp, "rows.json")
    procs = net.start_peers([sys.executable, os.path.abspath(__file__), "--worker", "--sizes",
                             ",".join(map(str, sizes)), "--reps", str(reps), "--out", out],
                            port=PORT, log_dir=tmp, timeout=120, env={"OMP_NUM_THREADS": "1"})
    failed = net.peers_failed(procs, tmp, 900)
    if failed:
        raise SystemExit(f"a peer failed or did not end within 900 s:\n{failed}")
    with open(out) as f:
        return json.load(f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--rtt", default="",
                        help="round trip between two hosts, such as 50ms (default: none "
                             "added; the wire's quarter on each cable each way)")
    parser.add_argument("--sizes", default="64M,256M")
    parser.add_argument("--streams", type=int, default=4,
                        help="iperf3's streams a link in its second measurement (-P)")
    parser.add_argument("--invocations", type=int, default=3)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--congestion", default="",
                        help="TCP congestion controls to run under, comma-separated "
                             "(default: the machine's)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path[:0] = [REPO]   # (before tests/, whose collectives/ is the tests')
    from collectives.transport.emulation import parse_link
    from gossip.bench.sizes import parse_sizes

    sizes = parse_sizes(args.sizes)
    if args.worker:
        return worker(sizes, args.reps, args.out)
    sys.path.append(os.path.join(REPO, "tests"))
    import netfault

    reason = netfault.netns_unavailable() if not args.rtt else netfault.wire_unavailable()
    if reason:
        raise SystemExit(f"link_capacity: {reason}")
    ring = [(i, (i + 1) % HOSTS) for i in range(HOSTS)]
    links = {"one link": [(1, 0)], "allreduce": ring, "round": ring + [(b, a) for a, b in ring]}
    patterns = {(name, streams): pairs for name, pairs in links.items()
                for streams in dict.fromkeys((1, args.streams))}
    # (--rtt read as GOSSIP_LINK's latency is: 50ms, 500us, 0.05)
    rtt = parse_link(f"{args.rate},{args.rtt}", "--rate,--rtt").latency if args.rtt else None
    controls = [c for c in args.congestion.split(",") if c] or [""]
    iperf: dict[tuple[str, str], list[float]] = {}
    times: dict[tuple[str, str, int], list[float]] = {}
    for invocation in range(args.invocations):
        for control in controls:
            with netfault.Network(HOSTS, wire_delay=None if rtt is None else rtt / 4) as net, \
                    tempfile.TemporaryDirectory() as tmp:
                net.shape(args.rate)
                default = net.congestion(control) if control else ""
                control = control or default or _current(net)
                for (name, streams), pairs in patterns.items():
                    rates = iperf_rates(net, pairs, tmp, streams)
                    label = name if streams == 1 else f"{name} x{streams}"
                    iperf.setdefault((control, label), []).append(statistics.mean(rates))
                    iperf.setdefault((control, label + " slowest"), []).append(min(rates))
                for row in _peers(net, sizes, args.reps, tmp):
                    times.setdefault((control, row["op"], row["bytes"]), []).append(
                        statistics.median(row["times"]))
            print(f"# invocation {invocation}, TCP {control}: iperf3 "
                  + ", ".join(f"{name} {r[-1] / 1e6:.0f}" for (c, name), r in iperf.items()
                              if c == control)
                  + " Mbit/s; "
                  + ", ".join(f"{op} {b >> 20} MiB {t[-1]:.3f} s"
                              for (c, op, b), t in times.items() if c == control),
                  flush=True)
    rate_of = {key: statistics.median(r) for key, r in iperf.items()}
    many = f" x{args.streams}"

    def best(control: str, name: str) -> float:   # the better of 1 and --streams a link
        return max(rate_of[control, name], rate_of.get((control, name + many), 0.0))
    print(f"\n{HOSTS} hosts, every directed pair a {args.rate} htb link"
          + (f", {args.rtt} round trip (a wire)" if rtt else "") + ". iperf3, one TCP "
          f"stream a link, medians of {args.invocations} invocations:")
    for control in dict.fromkeys(c for c, _ in rate_of):
        print(f"- TCP {control}: " + "; ".join(
            f"{what} {rate_of[control, name] / 1e6:.1f} Mbit/s a link (slowest "
            f"{rate_of[control, name + ' slowest'] / 1e6:.1f}), {args.streams} streams a link "
            f"{rate_of.get((control, name + many), math.nan) / 1e6:.1f}"
            for name, what in (("one link", "one link alone"),
                               ("allreduce", f"the allreduce's {len(ring)} ring links at once"),
                               ("round", f"the round's {2 * len(ring)} at once"))) + ".")
    print("\nFraction: against the op's own links at once (and against one link alone).\n")
    print("| TCP | op | size | time (median) | bytes a link carries | rate a link | iperf3, its "
          "links at once (the better of 1 and --streams) | fraction (of one link alone) |")
    print("|---|---|---|---|---|---|---|---|")
    for (control, op, nbytes), ts in times.items():
        t = statistics.median(ts)
        carried = nbytes * 2 * (HOSTS - 1) / HOSTS if op == "allreduce" else nbytes
        rate = carried * 8 / t
        own, alone = best(control, op), best(control, "one link")
        print(f"| {control} | {op} | {nbytes >> 20} MiB | {t:.3f} s | {carried / 1e6:.1f} MB | "
              f"{rate / 1e6:.1f} Mbit/s | {own / 1e6:.1f} Mbit/s | "
              f"{rate / own:.2f} ({rate / alone:.2f}) |")


def _current(net) -> str:
    """The TCP congestion control the hosts' namespaces have."""
    return net.ns_exec(net.hosts[0], "sysctl", "-n",
                       "net.ipv4.tcp_congestion_control").stdout.strip() or "?"


if __name__ == "__main__":
    main()
