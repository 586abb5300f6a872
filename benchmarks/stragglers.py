#!/usr/bin/env python3
"""What a straggler costs the other peers, per averaging policy.

Usage:
  python benchmarks/stragglers.py [-n 4] [--steps 60] [--repeats 3] [--slowdown 5]
      [--only asynchronous,gossip] [--json rows.jsonl]

Each peer runs a compute-bound step (``--compute`` sin passes over 200k doubles, a few
milliseconds) on a 64 KiB parameter, then the policy's after_step(), ``--steps`` times.
With a straggler, rank 1 sleeps ``slowdown - 1`` times its own compute time after each
step (so it is ``slowdown`` times slower whatever the load on the machine). The figure per
policy is the median step rate of the *other* peers with the straggler divided by their
rate without it (1.0: the straggler costs them nothing; 1/slowdown: they wait for it every
step), median over ``--repeats`` runs of each. Each peer's rate is its own steps over its
own time: an asynchronous peer that finishes early closes and the straggler carries on alone.
On a shared 2-core machine the peers contend
for the cores, so expect +-10% between runs; compare within a run.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time

import numpy as np

from gossip.testing import spawn

POLICIES = ["synchronous", "local-sgd", "gossip", "asynchronous", "push-sum", "elastic"]


def worker(peer, name, steps, slowdown, compute, straggle):
    import gossip
    kwargs = {"period": 4} if name in ("local-sgd", "elastic") else {}
    x = np.random.default_rng(peer.rank).normal(size=16_384).astype(np.float32)
    scratch = np.linspace(0, 1, 200_000)
    policy = gossip.policies.make(name, **kwargs).attach(peer, [x])
    peer.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        for _ in range(compute):
            np.sin(scratch, out=scratch)
        x *= 0.999
        if straggle and peer.rank == 1:
            threading.Event().wait((slowdown - 1) * (time.perf_counter() - t0))
        policy.after_step()
    rate = steps / (time.perf_counter() - start)
    if name != "asynchronous":
        peer.barrier()   # lockstep policies: nobody closes while a neighbour still needs it
    policy.close()
    return rate


def measure(name, n, steps, slowdown, compute, straggle) -> float:
    rates = spawn(worker, n=n, timeout=600, args=(name, steps, slowdown, compute, straggle))
    return statistics.median(r for rank, r in enumerate(rates) if rank != 1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=4)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--slowdown", type=float, default=5.0)
    ap.add_argument("--compute", type=int, default=4, help="sin passes per step")
    ap.add_argument("--only", default=",".join(POLICIES))
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rows = []
    print(f"{args.n} peers, rank 1 {args.slowdown:g}x slower, {args.steps} steps each, "
          f"median of {args.repeats} runs")
    print("policy | others' steps/s alone | with a straggler | ratio")
    for name in args.only.split(","):
        alone, slowed, ratios = [], [], []
        for _ in range(args.repeats):
            a = measure(name, args.n, args.steps, args.slowdown, args.compute, False)
            s = measure(name, args.n, args.steps, args.slowdown, args.compute, True)
            alone.append(a)
            slowed.append(s)
            ratios.append(s / a)
        row = {"policy": name, "alone": statistics.median(alone),
               "with_straggler": statistics.median(slowed), "ratio": statistics.median(ratios),
               "ratios": ratios}
        rows.append(row)
        print(f"{name} | {row['alone']:.1f} | {row['with_straggler']:.1f} | "
              f"{row['ratio']:.2f} ({', '.join(f'{r:.2f}' for r in ratios)})", flush=True)
    if args.json:
        with open(args.json, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
