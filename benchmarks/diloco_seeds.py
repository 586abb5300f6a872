#!/usr/bin/env python3
"""DiLoCo against synchronous on the demo task, over several seeds: the mean gap per outer
optimizer and period.

Usage:
  python benchmarks/diloco_seeds.py [--seeds 0,1,2,3,4,5] [--periods 8,16,32] [--epochs 20]
      [--json rows.jsonl]

Each cell is one `gossip demo` run (digits, the small CNN, 4 peers, 20 epochs; the seed sets
the weights, the shards and the batch order): synchronous once per seed, and local SGD with
period H for each outer step: ``SGD(lr=0.7)`` (no momentum, the README's recommendation
behind an inner SGD with momentum), ``SGD(lr=1.0, momentum=0.3, nesterov=True)`` and none
(plain averaging, an outer ``SGD(lr=1)``). The gap is the final test accuracy (the peers'
mean) minus synchronous's of the same seed, in points; the test set holds 359 images, one
is 0.28 points, so a single seed's gap moves by an image or two: the mean over seeds is the
figure. "x less": synchronous's bytes sent per peer over these. No figure is asserted.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

from compression import append_jsonl   # benchmarks/compression.py, beside this script
from compression_accuracy import run   # one demo run, its table by policy


def outer_steps() -> dict:
    from gossip.policies import SGD
    return {"SGD(lr=0.7)": SGD(lr=0.7),
            "Nesterov(lr=1, m=0.3)": SGD(lr=1.0, momentum=0.3, nesterov=True),
            "average": None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0,1,2,3,4,5")
    ap.add_argument("--periods", default="8,16,32")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s]
    periods = [int(p) for p in args.periods.split(",") if p]
    cells = [("synchronous", None, "synchronous", {})]
    for h in periods:
        for label, outer in outer_steps().items():
            options = {"period": h} if outer is None else {"period": h, "outer_optimizer": outer}
            cells.append((label, h, "local-sgd", options))
    rows = []
    with tempfile.TemporaryDirectory(prefix="gossip-diloco-") as tmp:
        for seed in seeds:
            for label, h, policy, options in cells:
                got = run([policy], {policy: options}, args.epochs, 4, seed,
                          os.path.join(tmp, str(len(rows))), baseline=False)[policy]
                rows.append({"seed": seed, "outer": label, "period": h,
                             "accuracy": got["final_accuracy"],
                             "sent_per_peer": got["bytes_per_peer"]})
                print(" ".join(f"{k}={v}" for k, v in rows[-1].items()), flush=True)
    sync = {r["seed"]: r for r in rows if r["outer"] == "synchronous"}
    print(f"\nsynchronous: mean {statistics.mean(r['accuracy'] for r in sync.values()) * 100:.2f}% "
          f"over seeds {','.join(map(str, seeds))}")
    print(f"{'outer step':<24} {'H':>3} {'mean gap':>8} {'median':>7} {'worst':>7} {'best':>7} "
          f"{'x less':>7}")
    for label, h, _, _ in cells[1:]:
        mine = [r for r in rows if r["outer"] == label and r["period"] == h]
        gaps = [(r["accuracy"] - sync[r["seed"]]["accuracy"]) * 100 for r in mine]
        less = sync[mine[0]["seed"]]["sent_per_peer"] / mine[0]["sent_per_peer"]
        print(f"{label:<24} {h:>3} {statistics.mean(gaps):>+8.2f} "
              f"{statistics.median(gaps):>+7.2f} {min(gaps):>+7.2f} {max(gaps):>+7.2f} "
              f"{less:>7.1f}")
    append_jsonl(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
