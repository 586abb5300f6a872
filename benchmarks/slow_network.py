#!/usr/bin/env python3
"""Time to the target accuracy over a slow network: synchronous, local SGD and DiLoCo, each
without and with int8, under the transport's link emulation.

Usage:
  python benchmarks/slow_network.py [--link 100mbit,5ms] [--epochs 20] [--peers 4]
      [--seed 0] [--period 4] [--diloco-period 16] [--repeats 1] [--json rows.jsonl]

Each configuration is one `gossip demo` run (gossip.demo.run_demo: the digits of
scikit-learn, the small CNN, 4 peers, the same seed, weights and batches) with every link
emulated at ``--link`` (GOSSIP_LINK: a token bucket at the rate and a one-way latency per
outgoing link on the sending path, collectives/transport/emulation.py), read back from its
demo.json: time to the demo's target accuracy (95%, on the training clock, which pauses
while the peers evaluate), training wall time, final accuracy (the peers' mean) and bytes
each peer sent. Configurations:

- ``synchronous``: an averaged gradient every step;
- ``local-sgd``: the parameters averaged every ``--period`` steps;
- ``diloco``: local SGD every ``--diloco-period`` steps with an outer optimizer on the
  averaged pseudo-gradient: ``SGD(lr=0.7)`` (no momentum), the outer step this project's
  sweep found best behind an inner SGD with momentum 0.9 (README, Compression: DiLoCo's own
  Nesterov 0.9 diverges on this task);

each without a codec and with ``compression="int8"``. With ``--repeats`` above 1, each
configuration runs that many times (interleaved) and the medians are printed. The 2-core
machine runs 4 peers: they contend for the cores, and the figures say so (compute is slower
than on 4 cores, which makes communication's share smaller, not larger). No figure is
asserted anywhere.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

from compression import append_jsonl   # benchmarks/compression.py, beside this script
from compression_accuracy import run   # one demo run, its table by policy


def configurations(period: int, diloco_period: int) -> list[tuple[str, str, dict]]:
    """(label, policy, policy options) for each configuration, in the order run."""
    from gossip.policies import SGD
    out = []
    for codec in (None, "int8"):
        suffix = f" {codec}" if codec else ""
        out += [
            ("synchronous" + suffix, "synchronous", {"compression": codec}),
            (f"local-sgd H={period}" + suffix, "local-sgd",
             {"period": period, "compression": codec}),
            (f"diloco H={diloco_period}" + suffix, "local-sgd",
             {"period": diloco_period, "outer_optimizer": SGD(lr=0.7), "compression": codec}),
        ]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--link", default="100mbit,5ms")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--peers", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--period", type=int, default=4)
    ap.add_argument("--diloco-period", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    configs = configurations(args.period, args.diloco_period)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="gossip-slow-") as tmp:
        for repeat in range(args.repeats):
            for label, policy, options in configs:
                got = run([policy], {policy: options}, args.epochs, args.peers, args.seed,
                          os.path.join(tmp, str(len(rows))), baseline=False, link=args.link)
                row = got[policy]
                rows.append({"config": label, "repeat": repeat, "link": args.link,
                             "time_to_target": row.get("time_to_target"),
                             "train_seconds": row.get("train_seconds"),
                             "accuracy": row.get("final_accuracy"),
                             "sent_per_peer": row.get("bytes_per_peer")})
                print(" ".join(f"{k}={v}" for k, v in rows[-1].items()), flush=True)
    print(f"\nevery link {args.link} (emulated), {args.peers} peers on {os.cpu_count()} cores, "
          f"{args.epochs} epochs; medians of {args.repeats}")
    print(f"{'config':<22} {'to 95% s':>9} {'train s':>8} {'test acc':>8} {'sent/peer':>11} "
          f"{'x less':>7} {'x faster':>8}")
    base = _median(rows, "synchronous")
    for label, _, _ in configs:
        m = _median(rows, label)
        less = base["sent_per_peer"] / m["sent_per_peer"] if m["sent_per_peer"] else None
        faster = (base["time_to_target"] / m["time_to_target"]
                  if base["time_to_target"] and m["time_to_target"] else None)
        print(f"{label:<22} {_num(m['time_to_target'], '9.1f')} {_num(m['train_seconds'], '8.1f')} "
              f"{_num(m['accuracy'] and m['accuracy'] * 100, '7.2f')}% "
              f"{(m['sent_per_peer'] or 0) / 1e6:>9.2f}MB {_num(less, '7.1f')} "
              f"{_num(faster, '8.2f')}")
    append_jsonl(args.json, rows)
    return 0


def _median(rows: list[dict], label: str) -> dict:
    """Each figure's median over the repeats of ``label`` (None if a repeat lacks it: a run
    that never reached the target has no time to it)."""
    mine = [r for r in rows if r["config"] == label]
    out = {}
    for key in ("time_to_target", "train_seconds", "accuracy", "sent_per_peer"):
        values = [r[key] for r in mine]
        out[key] = None if any(v is None for v in values) else statistics.median(values)
    return out


def _num(value, spec: str) -> str:
    width = int(spec.split(".")[0])
    return f"{value:{spec}}" if value is not None else "-".rjust(width)


if __name__ == "__main__":
    sys.exit(main())
