#!/usr/bin/env python3
"""How much of a shaped link the allreduce and the gossip round fill, against iperf3 on the
same links in the same run (issue #37, item 4). Needs root, ``ip netns`` and iperf3.

Four "hosts" (network namespaces on one bridge, tests/netfault.py), every directed pair of
hosts a link of its own shaped by tc (htb at ``--rate``; the kernel here has no netem, so the
links have no added latency); one real peer per host. In each invocation:

- iperf3, one TCP stream host 1 -> host 0 for 3 s (what one direction of a link carries),
  then both directions at once (``--bidir``: what a link carries when the gossip round sends
  each way);
- ``allreduce`` of each size (the ring over TCP: every link i -> i + 1 carries 2 (n - 1) / n
  of the array one way), and a gossip round (``neighbor_allreduce`` on the ring, weights 1/3:
  every link carries the whole array each way at once), each timed as the slowest peer's
  time, the median of ``--reps`` after one untimed call.

Fraction = the bytes each link carried / time, against iperf3's rate (one way for the
allreduce, each way of ``--bidir`` for the round). Usage:

    python benchmarks/link_capacity.py [--rate 1gbit] [--sizes 64M,256M] [--invocations 3]
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

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
HOSTS = 4
PORT = 29531


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


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


def _iperf(net, netfault, bidir: bool) -> tuple[float, float]:
    """iperf3's rate (bits/s) host 1 -> host 0 over 3 s, and with ``bidir`` the reverse
    direction's at the same time (else 0)."""
    server = net.run(net.hosts[0], ["iperf3", "-s", "-1", "-p", "5201"], dict(os.environ))
    try:
        for _ in range(100):
            argv = ["iperf3", "-c", net.hosts[0].addr, "-p", "5201", "-t", "3", "-J"]
            run = net.ns_exec(net.hosts[1], *argv, *(["--bidir"] if bidir else []))
            end = json.loads(run.stdout or "{}").get("end", {}) if run.returncode == 0 else {}
            if "sum_received" in end and (not bidir or "sum_received_bidir_reverse" in end):
                there = float(end["sum_received"]["bits_per_second"])
                back = float(end.get("sum_received_bidir_reverse", {}).get("bits_per_second", 0))
                return there, back
            time.sleep(0.2)   # (the server says nothing when it listens: try again)
        raise SystemExit(f"iperf3 failed: {run.stdout[-500:]} {run.stderr[-500:]}")
    finally:
        server.kill()
        server.wait()


def _peers(net, sizes: list[int], reps: int, tmp: str) -> list[dict]:
    out = os.path.join(tmp, "rows.json")
    procs = []
    for host in net.hosts:
        env = dict(os.environ, GOSSIP_RANK=str(host.index), GOSSIP_WORLD_SIZE=str(HOSTS),
                   GOSSIP_MASTER_ADDR=net.hosts[0].addr, GOSSIP_MASTER_PORT=str(PORT),
                   GOSSIP_TIMEOUT="120", PYTHONPATH=REPO, PYTHONUNBUFFERED="1",
                   OMP_NUM_THREADS="1")
        env.pop("GOSSIP_TRANSPORT", None)
        procs.append(net.run(host, [sys.executable, os.path.abspath(__file__), "--worker",
                                    "--sizes", ",".join(map(str, sizes)), "--reps", str(reps),
                                    "--out", out], env,
                             log_path=os.path.join(tmp, f"log.{host.index}")))
    deadline = time.monotonic() + 900
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.2)
    if any(p.returncode != 0 for p in procs):
        logs = "\n".join(open(os.path.join(tmp, f"log.{i}"), errors="replace").read()[-2000:]
                         for i in range(HOSTS))
        raise SystemExit(f"a peer failed or did not end within 900 s:\n{logs}")
    with open(out) as f:
        return json.load(f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--sizes", default="64M,256M")
    parser.add_argument("--invocations", type=int, default=3)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [_size(s) for s in args.sizes.split(",")]
    if args.worker:
        return worker(sizes, args.reps, args.out)
    sys.path[:0] = [REPO]   # (before tests/, whose collectives/ is the tests')
    sys.path.append(os.path.join(REPO, "tests"))
    import netfault

    reason = netfault.netns_unavailable()
    if reason:
        raise SystemExit(f"link_capacity: {reason}")
    one_way, each_way, times = [], [], {}
    for invocation in range(args.invocations):
        tmp = tempfile.mkdtemp(); print(tmp)
        with netfault.Network(HOSTS) as net:
            net.shape(args.rate)
            one_way.append(_iperf(net, netfault, False)[0])
            each_way.append(min(_iperf(net, netfault, True)))
            for row in _peers(net, sizes, args.reps, tmp):
                times.setdefault((row["op"], row["bytes"]), []).append(
                    statistics.median(row["times"]))
        print(f"# invocation {invocation}: iperf3 {one_way[-1] / 1e6:.0f} Mbit/s one way, "
              f"{each_way[-1] / 1e6:.0f} each way at once; "
              + ", ".join(f"{op} {b >> 20} MiB {t[-1]:.3f} s" for (op, b), t in times.items()),
              flush=True)
    there, both = statistics.median(one_way), statistics.median(each_way)
    print(f"\n{HOSTS} hosts, every directed pair a {args.rate} htb link; iperf3 (median of "
          f"{args.invocations}): {there / 1e6:.1f} Mbit/s one way, {both / 1e6:.1f} Mbit/s each "
          "way at once")
    print("| op | size | time (median) | bytes a link carries | rate | iperf3 | fraction |")
    print("|---|---|---|---|---|---|---|")
    for (op, nbytes), ts in times.items():
        t = statistics.median(ts)
        carried = nbytes * 2 * (HOSTS - 1) / HOSTS if op == "allreduce" else nbytes
        reference = there if op == "allreduce" else both
        rate = carried * 8 / t
        print(f"| {op} | {nbytes >> 20} MiB | {t:.3f} s | {carried / 1e6:.1f} MB | "
              f"{rate / 1e6:.1f} Mbit/s | {reference / 1e6:.1f} Mbit/s | "
              f"{rate / reference:.2f} |")


if __name__ == "__main__":
    main()
