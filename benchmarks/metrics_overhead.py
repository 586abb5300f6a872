#!/usr/bin/env python3
"""What the metrics cost: `gossip bench allreduce` with the Prometheus exporter on
(GOSSIP_METRICS_PORT, every peer scraped once a second by this script while it runs) and off,
in interleaved invocations.

Usage:
  python benchmarks/metrics_overhead.py [--repeats 5] [--nprocs 2,4] [--sizes 4K,64M]
      [--iters K] [--json]
  python benchmarks/metrics_overhead.py --blocks 150 [--nprocs 2,4] [--sizes 4K,64M,demo]
      [--scrape-interval 1] [--json]

Each repeat runs, for each n, `gossip bench allreduce -n N --sizes SIZES --json` twice, once
off and once on (the order alternates between repeats, so a drift of the machine's load falls
on both); each invocation's figure per size is gossip bench's median over its iterations (the
slowest rank's, after warm-up: benchmarks/README.md's method). The table shows, for each n and
size, the median over the repeats of the off and on figures and their ratio on / off (above 1:
the metrics cost time). The exporter's scrapes collect in the peer's exporter thread, never in
the allreduce's: what they cost is CPU time taken from the peers (2 cores here), which the
ratio shows. Check `uptime` first: the machine's other load moves these figures more than the
metrics do.

Between invocations this machine's speed moves by more than the metrics could cost (1.5-3x
on the 2-core VM), so ``--blocks K`` compares them inside one job instead: the same n peers
run 2K blocks of allreduces of each size (or, for ``demo`` in ``--sizes``, of the demo's
synchronous training steps: its CNN on the digits, one epoch of 22 steps a block), the exporter started before every other block and
closed after it (in the order on, off, off, on, on, off, ...: a drift falls on both), every
port scraped by this script every ``--scrape-interval`` seconds (0.25 by default, 60 times
Prometheus's default rate) while it serves; each block's time is the
slowest peer's median call; the ratio is the median over the K pairs of adjacent blocks of
on / off.

The exporter also counts its own cost (`gossip_metrics_cpu_seconds_total`: CPU time of the
threads that collect and render, read from the last scrape of each peer). That is the
metrics' whole cost to a peer but for the GIL its threads hold meanwhile (at most the same
time again, taken from the peer's other threads), and it does not move with the machine's
load as wall-clock ratios do: the script prints it per collection and as a fraction of the
peers' time at this script's rate (one scrape a second) and at Prometheus's default (15 s).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(os.path.realpath(__file__)).parents[1]


def _free_ports(n: int) -> int:
    """A port P with P .. P + n - 1 free a moment ago."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n >= 65536:
            continue
        try:
            for port in range(base, base + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no {n} consecutive free ports")


def _value(text: str, name: str) -> float | None:
    """The value of the one series of ``name`` in an exposition (None if absent)."""
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


class Scraper:
    """Scrapes http://127.0.0.1:PORT/metrics of each port once a second until stopped; counts
    the answers (a peer not up yet, or gone, is skipped) and keeps, per port, the metrics' own
    cost at the last answer: (collections, CPU seconds, seconds since the first answer)."""

    def __init__(self, ports: list[int]) -> None:
        self.ports, self.answers = ports, 0
        self.cost: dict[int, tuple[float, float, float]] = {}
        self._first: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            for port in self.ports:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                                timeout=2) as answer:
                        text = answer.read().decode()
                        self.answers += 1
                except OSError:
                    continue
                now = time.monotonic()
                self._first.setdefault(port, now)
                count = _value(text, "gossip_metrics_collections_total")
                cpu = _value(text, "gossip_metrics_cpu_seconds_total")
                if count is not None and cpu is not None:
                    self.cost[port] = (count, cpu, now - self._first[port])

    def __enter__(self) -> "Scraper":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def bench(n: int, sizes: str, iters: int | None, metrics: bool
          ) -> tuple[dict[int, float], int, list[tuple[float, float, float]]]:
    """One `gossip bench allreduce` invocation: {bytes: median seconds}, the scrapes, and each
    peer's last (collections, CPU seconds, seconds scraped)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOSSIP_METRICS")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "gossip", "bench", "allreduce", "-n", str(n), "--sizes",
               sizes, "--json"] + (["--iters", str(iters)] if iters else [])
    scraper = None
    if metrics:
        base = _free_ports(n)
        env["GOSSIP_METRICS_PORT"] = str(base)
        scraper = Scraper([base + k for k in range(n)])
        scraper.__enter__()
    try:
        out = subprocess.run(command, env=env, capture_output=True, text=True, check=False,
                             timeout=900)
    finally:
        if scraper is not None:
            scraper.__exit__()
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {out.returncode}:\n{out.stderr}")
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return ({row["bytes"]: row["seconds_median"] for row in rows},
            scraper.answers if scraper else 0, list(scraper.cost.values()) if scraper else [])


_SIZES = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _bytes(text: str) -> int:
    text = text.strip().upper()
    return int(text[:-1]) * _SIZES[text[-1]] if text[-1] in _SIZES else int(text)


def _allreduce_step(peer, nbytes: int):
    """An allreduce of ``nbytes`` as one timed call, and the calls a block makes of it."""
    import numpy as np

    x = np.ones(max(1, nbytes // 4), dtype=np.float32)
    return (lambda: peer.allreduce(x)), max(5, min(2000, int(6.4e8 // max(nbytes, 1 << 16))))


def _demo_step(peer):
    """One step of `gossip demo --policy synchronous` (its CNN on this peer's shard of the
    digits, SGD with momentum, a batch of 16 through gossip.DistributedOptimizer) as one timed
    call, and the steps a block makes (22: one epoch of the demo's)."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    import gossip
    from gossip.demo.data import load_digits, shard
    from gossip.demo.evaluation import pixel_statistics, tensors
    from gossip.demo.model import make_cnn

    torch.set_num_threads(1)
    torch.manual_seed(0)
    dataset = load_digits()
    mean, std = pixel_statistics(dataset)
    rows = shard(len(dataset.train_labels), peer.rank, peer.world_size, seed=0)
    x, y = tensors(dataset.train_images[rows], dataset.train_labels[rows], dataset.max_value,
                   mean, std)
    model = make_cnn(dataset.image_shape, dataset.classes)
    optimizer = gossip.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), peer=peer,
        policy=gossip.policies.make("synchronous"))
    order = np.random.default_rng([0, peer.rank])

    def step() -> None:
        batch = torch.from_numpy(order.integers(0, len(y), 16))
        optimizer.zero_grad()
        F.cross_entropy(model(x[batch]), y[batch]).backward()
        optimizer.step()
    return step, 22


def _blocks_job(peer, cases: list[str], blocks: int, base: int) -> dict:
    """One peer of ``--blocks``: per case (a size of allreduce, or ``demo``: the demo's
    synchronous training step), 2 * ``blocks`` timed blocks of calls, the exporter serving in
    the "on" ones; each block's median call time, this peer's."""
    from gossip.metrics import MetricsService, MetricsSettings

    settings = MetricsSettings.from_environment({"GOSSIP_METRICS_PORT": str(base)},
                                                rank=peer.rank)
    peer.barrier()
    out: dict = {"blocks": {}, "cost": None}
    collections, cpu = 0, 0.0
    for case in cases:
        call, calls = _demo_step(peer) if case == "demo" else _allreduce_step(peer, _bytes(case))
        for _ in range(max(3, calls // 10)):   # warm-up
            call()
        rows = []
        for block in range(2 * blocks):
            on = (block // 2 + block) % 2 == 0          # on, off, off, on, on, off, ...
            service = None
            if on:
                service = MetricsService(peer, settings, rank=peer.rank,
                                         local_rank=peer.local_rank, world_size=peer.world_size)
                service.start()
            peer.barrier()
            times = []
            for _ in range(calls):
                began = time.perf_counter()
                call()
                times.append(time.perf_counter() - began)
            peer.barrier()
            if service is not None:
                count, seconds = service.cost()
                collections, cpu = collections + count, cpu + seconds
                service.close()
            rows.append((on, statistics.median(times)))
        out["blocks"][case] = rows
    out["cost"] = (collections, cpu)
    return out


class FastScraper(Scraper):
    """Scraper of every port each ``interval`` seconds (refused ports, between blocks,
    skipped)."""

    def __init__(self, ports: list[int], interval: float) -> None:
        super().__init__(ports)
        self.interval = interval

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            for port in self.ports:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                                timeout=2) as answer:
                        answer.read()
                        self.answers += 1
                except OSError:
                    continue


def blocks_main(args: argparse.Namespace) -> None:
    """``--blocks``: on and off inside one job (module docstring)."""
    sys.path.insert(0, str(REPO))
    from gossip.testing import spawn

    cases = args.sizes.split(",")
    print(f"# load before: {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs; {args.blocks} "
          f"pairs of blocks per size; every peer scraped each {args.scrape_interval:g} s",
          flush=True)
    if not args.json:
        print(f"{'n':>3} {'case':>10} {'off (us)':>12} {'on (us)':>12} {'on/off':>7} "
              f"{'pairs q1-q3':>13} {'scrapes':>8} {'ms CPU/scrape':>13}")
    for n in [int(x) for x in args.nprocs.split(",")]:
        base = _free_ports(n)
        with FastScraper([base + k for k in range(n)], args.scrape_interval) as scraper:
            results = spawn(_blocks_job, n=n, args=(cases, args.blocks, base), timeout=3600)
        collections = sum(r["cost"][0] for r in results)
        cpu = sum(r["cost"][1] for r in results)
        per = cpu / collections if collections else float("nan")
        for case in cases:
            # each block: the slowest peer's median call
            blocks = [(results[0]["blocks"][case][b][0],
                       max(r["blocks"][case][b][1] for r in results))
                      for b in range(2 * args.blocks)]
            ratios = []
            for b in range(0, 2 * args.blocks, 2):
                (on_a, t_a), (_, t_b) = blocks[b], blocks[b + 1]
                ratios.append(t_a / t_b if on_a else t_b / t_a)
            off = statistics.median(t for on, t in blocks if not on)
            on = statistics.median(t for on, t in blocks if on)
            ratio = statistics.median(ratios)
            q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratio, ratio, ratio]
            row = {"nprocs": n, "case": case, "off_seconds_median": off,
                   "on_seconds_median": on, "ratio": ratio, "ratio_q1": q[0], "ratio_q3": q[2],
                   "pairs": args.blocks, "scrapes": scraper.answers,
                   "cpu_seconds_per_collection": per}
            print(json.dumps(row) if args.json else
                  f"{n:>3} {case:>10} {off * 1e6:>12.1f} {on * 1e6:>12.1f} {ratio:>7.3f} "
                  f"{q[0]:>6.3f}-{q[2]:<6.3f} {scraper.answers:>8} {per * 1e3:>13.2f}",
                  flush=True)
    print(f"# load after: {os.getloadavg()[0]:.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--nprocs", default="2,4")
    parser.add_argument("--sizes", default="4K,64M")
    parser.add_argument("--iters", type=int, default=None)
    parser.add_argument("--json", action="store_true", help="one JSON row per n and size")
    parser.add_argument("--blocks", type=int, default=0,
                        help="compare on and off inside one job, in this many pairs of blocks")
    parser.add_argument("--scrape-interval", type=float, default=0.25,
                        help="with --blocks: seconds between two scrapes of every peer "
                             "(Prometheus's default is 15)")
    args = parser.parse_args()
    if args.blocks:
        blocks_main(args)
        return
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    counts = [int(x) for x in args.nprocs.split(",")]
    runs: dict[tuple[int, bool], list[dict[int, float]]] = {}
    scrapes = 0
    costs: list[tuple[float, float, float]] = []
    print(f"# load before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} "
          f"{os.getloadavg()[2]:.2f} (1, 5, 15 min), {os.cpu_count()} CPUs", flush=True)
    for repeat in range(args.repeats):
        for n in counts:
            order = (False, True) if repeat % 2 == 0 else (True, False)
            for metrics in order:
                figures, answered, cost = bench(n, args.sizes, args.iters, metrics)
                scrapes += answered
                costs += cost
                runs.setdefault((n, metrics), []).append(figures)
                print(f"# repeat {repeat + 1}/{args.repeats} n={n} metrics "
                      f"{'on ' if metrics else 'off'}: " + ", ".join(
                          f"{b} B {s * 1e6:.0f} us" for b, s in sorted(figures.items())),
                      file=sys.stderr, flush=True)
    print(f"# load after: {os.getloadavg()[0]:.2f}; scrapes answered during the on runs: "
          f"{scrapes}", flush=True)
    measured = [(count, cpu, span) for count, cpu, span in costs if count > 1 and span > 0]
    if measured:
        per = statistics.median(cpu / count for count, cpu, _ in measured)
        rate = statistics.median(count / span for count, _, span in measured)
        print(f"# the metrics' own CPU time (gossip_metrics_cpu_seconds_total, {len(measured)} "
              f"peers' last scrapes): {per * 1e3:.2f} ms per collection (median); at "
              f"{rate:.2f} scrapes/s {per * rate:.3%} of a peer's time, at Prometheus's 15 s "
              f"{per / 15:.4%}", flush=True)
    if not args.json:
        print(f"{'n':>3} {'bytes':>10} {'off (us)':>12} {'on (us)':>12} {'on/off':>7}")
    for n in counts:
        for nbytes in sorted(runs[(n, False)][0]):
            off = statistics.median(r[nbytes] for r in runs[(n, False)])
            on = statistics.median(r[nbytes] for r in runs[(n, True)])
            row = {"nprocs": n, "bytes": nbytes, "off_seconds_median": off,
                   "on_seconds_median": on, "ratio": on / off, "repeats": args.repeats}
            print(json.dumps(row) if args.json else
                  f"{n:>3} {nbytes:>10} {off * 1e6:>12.0f} {on * 1e6:>12.0f} {on / off:>7.3f}",
                  flush=True)


if __name__ == "__main__":
    main()
