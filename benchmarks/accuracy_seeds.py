#!/usr/bin/env python3
"""Codecs and DiLoCo on the demo task over several seeds: the mean accuracy gap of each against
its uncompressed reference.

Usage:
  python benchmarks/accuracy_seeds.py [--seeds 0,1,2,3,4,5] [--codecs fp16,bf16,int8,topk:0.01]
      [--policies synchronous,local-sgd,gossip] [--periods 8,16,32] [--epochs 20]
      [--json rows.jsonl]

Each cell is one `gossip demo` run (digits, the small CNN, 4 peers, 20 epochs; the seed sets
the weights, the shards and the batch order):

- each of ``--policies`` uncompressed (local-sgd with period 4), once per seed: the
  references;
- each of ``--codecs`` on each of ``--policies`` (top-k on gossip is left out: gossip takes
  no error-feedback codec, CHOCO does): gap against the same policy's uncompressed run of the
  same seed;
- DiLoCo (local SGD with period H of ``--periods``) for each outer step: ``SGD(lr=0.7)`` (no
  momentum, the README's recommendation behind an inner SGD with momentum),
  ``SGD(lr=1.0, momentum=0.3, nesterov=True)`` and none (plain averaging, an outer
  ``SGD(lr=1)``): gap against synchronous of the same seed (synchronous is always run).

The gap is the final test accuracy (the peers' mean) minus the reference's, in points; the
test set holds 359 images, one is 0.28 points, so a single seed's gap moves by an image or
two: the mean over seeds is the figure, with its standard error across seeds. "x less": the
reference's bytes sent per peer over these. No figure is asserted.
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


def cells_of(codecs: list[str], policies: list[str], periods: list[int]) -> list[tuple]:
    """(label, period, policy, options, reference policy) per cell, references first."""
    refs = list(dict.fromkeys(["synchronous", *policies]))
    plain = {"local-sgd": {"period": 4}}
    cells = [("none", None, p, dict(plain.get(p, {})), None) for p in refs]
    for codec in codecs:
        for p in policies:
            if p == "gossip" and codec.startswith("topk"):
                continue
            cells.append((codec, None, p, dict(plain.get(p, {}), compression=codec), p))
    for h in periods:
        for label, outer in outer_steps().items():
            options = {"period": h} if outer is None else {"period": h, "outer_optimizer": outer}
            cells.append((label, h, "local-sgd", options, "synchronous"))
    return cells


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0,1,2,3,4,5")
    ap.add_argument("--codecs", default="fp16,bf16,int8,topk:0.01")
    ap.add_argument("--policies", default="synchronous,local-sgd,gossip",
                    help="the policies each codec runs on")
    ap.add_argument("--periods", default="8,16,32")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s]
    cells = cells_of([c for c in args.codecs.split(",") if c],
                     [p for p in args.policies.split(",") if p],
                     [int(p) for p in args.periods.split(",") if p])
    rows = []
    with tempfile.TemporaryDirectory(prefix="gossip-seeds-") as tmp:
        for seed in seeds:
            for label, h, policy, options, _ in cells:
                got = run([policy], {policy: options}, args.epochs, 4, seed,
                          os.path.join(tmp, str(len(rows))), baseline=False)[policy]
                rows.append({"seed": seed, "config": label, "period": h, "policy": policy,
                             "accuracy": got["final_accuracy"],
                             "sent_per_peer": got["bytes_per_peer"]})
                print(" ".join(f"{k}={v}" for k, v in rows[-1].items()), flush=True)
    ref = {(r["seed"], r["policy"]): r for r in rows if r["config"] == "none"}
    print(f"\nseeds {','.join(map(str, seeds))}; references (mean accuracy): " + ", ".join(
        f"{p} {statistics.mean(r['accuracy'] for (s, q), r in ref.items() if q == p) * 100:.2f}%"
        for p in dict.fromkeys(q for _, q in ref)))
    print(f"{'config':<24} {'policy':<12} {'H':>3} {'mean gap':>8} {'+-se':>5} {'median':>7} "
          f"{'worst':>7} {'best':>7} {'x less':>7}")
    for label, h, policy, _, against in cells:
        if against is None:
            continue
        mine = [r for r in rows if r["config"] == label and r["period"] == h
                and r["policy"] == policy]
        gaps = [(r["accuracy"] - ref[r["seed"], against]["accuracy"]) * 100 for r in mine]
        se = statistics.stdev(gaps) / len(gaps) ** 0.5 if len(gaps) > 1 else float("nan")
        less = ref[mine[0]["seed"], against]["sent_per_peer"] / mine[0]["sent_per_peer"]
        print(f"{label:<24} {policy:<12} {h or '':>3} {statistics.mean(gaps):>+8.2f} "
              f"{se:>5.2f} {statistics.median(gaps):>+7.2f} {min(gaps):>+7.2f} "
              f"{max(gaps):>+7.2f} {less:>7.1f}")
    append_jsonl(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
