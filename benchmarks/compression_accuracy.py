#!/usr/bin/env python3
"""Accuracy of the demo task with each codec and with DiLoCo, against the same run's
uncompressed policies.

Usage:
  python benchmarks/compression_accuracy.py [--epochs 20] [--peers 4] [--seed 0]
      [--codecs fp16,bf16,int8,topk:0.01] [--periods 8,16,32] [--json rows.jsonl]

Each configuration is one `gossip demo` run (gossip.demo.run_demo: the digits of
scikit-learn, the small CNN, 4 peers on a ring, the same seed, weights and batches for every
policy), read back from its demo.json: the peers' mean test accuracy after the last epoch
and the bytes each peer sent while training. Runs:

- ``none``: synchronous, local-sgd (period 4), gossip, elastic, choco (top-k 1%, gamma 0.05),
  and the one-process baseline;
- each codec on synchronous, local-sgd, gossip (fp16, bf16, int8 only) and elastic;
- DiLoCo: local-sgd with period H (``--periods``) and outer_optimizer="diloco" (Nesterov,
  lr 0.7, momentum 0.9), and "nest0.5" (Nesterov, lr 0.7, momentum 0.5), each with no codec
  and with int8.

"gap" is the accuracy minus the same policy's uncompressed accuracy, in points (DiLoCo rows:
minus synchronous's, and "x less" against synchronous's bytes); "x less" the uncompressed bytes over these. The test set holds 359
images: one image is 0.28 points. Not asserted anywhere; one seed, so a gap of an image or
two is noise.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from compression import append_jsonl   # benchmarks/compression.py, beside this script

PLAIN = ("synchronous", "local-sgd", "gossip", "elastic", "choco")


def run(policies, options, epochs, peers, seed, out, baseline, link=None):
    """One demo run of ``policies`` (``link``: every link emulated, "100mbit,5ms"); its
    table's rows by policy."""
    from gossip.demo.runner import DemoOptions, run_demo
    with open(os.devnull, "w") as quiet:
        run_demo(DemoOptions(policies=tuple(policies), peers=peers, epochs=epochs, seed=seed,
                             out=out, policy_options=options, bars=False,
                             baseline=baseline, link=link),
                 stdout=quiet, stderr=quiet)
    with open(os.path.join(out, "demo.json")) as f:
        table = json.load(f)["table"]
    return {row["policy"]: row for row in table}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--peers", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--codecs", default="fp16,bf16,int8,topk:0.01")
    ap.add_argument("--periods", default="8,16,32")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="gossip-acc-") as tmp:
        def once(label, policies, options):
            got = run(policies, options, args.epochs, args.peers, args.seed,
                      os.path.join(tmp, str(len(rows))), baseline=label == "none")
            for name, row in got.items():
                rows.append({"config": label, "policy": name,
                             "accuracy": row.get("final_accuracy"),
                             "sent_per_peer": row.get("bytes_per_peer")})
                print(json.dumps(rows[-1]), flush=True)

        once("none", PLAIN, {"local-sgd": {"period": 4},
                             "choco": {"compression": "topk:0.01"}})   # its default gamma
        for codec in (c for c in args.codecs.split(",") if c):
            names = ["synchronous", "local-sgd", "elastic"]
            if not codec.startswith("topk"):
                names.insert(2, "gossip")
            options = {n: {"compression": codec} for n in names}
            options["local-sgd"]["period"] = 4
            once(codec, names, options)
        from gossip.policies import SGD
        outers = {"diloco": "diloco", "nest0.5": SGD(lr=0.7, momentum=0.5, nesterov=True)}
        for h in (int(p) for p in args.periods.split(",") if p):
            for label, outer in outers.items():
                for codec in (None, "int8"):
                    once(f"{label} H={h}" + (f" {codec}" if codec else ""), ["local-sgd"],
                         {"local-sgd": {"period": h, "outer_optimizer": outer,
                                        "compression": codec}})
    base = {r["policy"]: r for r in rows if r["config"] == "none"}
    print(f"\n{'config':<18} {'policy':<22} {'test acc':>8} {'gap':>6} {'sent/peer':>11} "
          f"{'x less':>7}")
    for r in rows:
        outer = r["config"].startswith(("diloco", "nest"))
        ref = base.get("synchronous" if outer else r["policy"])
        acc = r["accuracy"]
        gap = (acc - ref["accuracy"]) * 100 if ref and acc is not None and ref["accuracy"] \
            is not None else None
        less = ref["sent_per_peer"] / r["sent_per_peer"] if ref and r["sent_per_peer"] else None
        print(f"{r['config']:<18} {r['policy']:<22} "
              f"{'-' if acc is None else f'{acc * 100:.2f}%':>8} "
              f"{'-' if gap is None or r['config'] == 'none' else f'{gap:+.2f}':>6} "
              f"{(r['sent_per_peer'] or 0) / 1e6:>9.2f}MB "
              f"{'-' if less is None or r['config'] == 'none' else f'{less:.1f}':>7}")
    append_jsonl(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
