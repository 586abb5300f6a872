"""A what-if study on the simulator (issue #38, item 5): allreduce (synchronous), gossip,
push-sum, DiLoCo (local SGD with DiLoCo's outer optimizer) and asynchronous (AD-PSGD's pairwise
exchanges, on the simulator's virtual threads) at 16 to 1,024 peers over a slow
and a fast network, each run the project's own policy classes on gossip.simulation's virtual
clock. Prints, per peer count and network, each policy's simulated seconds for the steps, its
bytes per peer, the peers' own accuracy and the averaged model's, and the ratio of each
policy's time to synchronous's. Deterministic: the simulated figures do not depend on the
machine (the real seconds each run took are printed beside them).

    python benchmarks/what_if.py [--peers 16,64,256,1024] [--steps 50] [--json OUT.json]
                                 [--async-peers 1024]

The topology of gossip and push-sum is the exponential graph (log2(n) neighbours, mixing
in a few rounds at any n); DiLoCo averages every --period steps (default 10) and takes an
outer Nesterov step (lr 0.7, momentum 0.9, as in Douillard et al. 2023). Asynchronous runs
up to --async-peers peers (default 1,024): three virtual threads a peer, 1,024 peers take
about 40 s for 20 steps (docs/how-to/simulate.md, Scale). Deaths are not in this grid
(`gossip simulate train --mtbf S` runs them).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

LINKS = ("100mbit,20ms", "10gbit,1ms")


def policies(period: int) -> list[tuple[str, str, dict]]:
    """(label, policy name, options) of the study."""
    return [("synchronous", "synchronous", {}),
            ("gossip", "gossip", {}),
            ("push-sum", "push-sum", {}),
            (f"diloco (H={period})", "local-sgd",
             {"period": period, "outer_optimizer": "diloco"}),
            ("asynchronous", "asynchronous", {})]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", default="16,64,256,1024",
                        help="peer counts, comma-separated (default 16,64,256,1024)")
    parser.add_argument("--steps", type=int, default=50, help="steps per peer (default 50)")
    parser.add_argument("--period", type=int, default=10,
                        help="DiLoCo's steps between outer steps (default 10)")
    parser.add_argument("--links", default=";".join(LINKS),
                        help="networks, ';'-separated RATE,LATENCY (default "
                             "100mbit,20ms;10gbit,1ms)")
    parser.add_argument("--async-peers", type=int, default=1024, metavar="N",
                        help="run asynchronous up to N peers (default 1024; more take long: "
                             "three virtual threads a peer)")
    parser.add_argument("--json", metavar="FILE", help="write every run as JSON")
    args = parser.parse_args()
    from gossip.simulation import TrainingSpec, simulate_training

    links = [link.strip() for link in args.links.split(";") if link.strip()]
    counts = [int(n) for n in args.peers.split(",")]
    runs = []
    for n in counts:
        for link in links:
            print(f"\n{n} peers, every link {link}, {args.steps} steps of 10 ms compute")
            print(f"{'policy':<16}{'simulated s':>12}{'x sync':>8}{'MB/peer':>10}"
                  f"{'own acc':>9}{'averaged':>10}{'real s':>8}", flush=True)
            sync_seconds = None
            for label, name, options in policies(args.period):
                if name == "asynchronous" and n > args.async_peers:
                    print(f"{label:<16}not run above --async-peers {args.async_peers}",
                          flush=True)
                    continue
                spec = TrainingSpec(policy=name, peers=n, topology="exponential",
                                    steps=args.steps, link=link, seed=0,
                                    policy_options=options)
                started = time.perf_counter()
                result = simulate_training(spec, timeout=1800.0).to_dict()
                real = time.perf_counter() - started
                if name == "synchronous":
                    sync_seconds = result["simulated_seconds"]
                ratio = (result["simulated_seconds"] / sync_seconds) if sync_seconds else 1.0
                print(f"{label:<16}{result['simulated_seconds']:>12.2f}{ratio:>8.2f}"
                      f"{result['bytes_per_peer'] / 1e6:>10.2f}{result['accuracy']:>9.2%}"
                      f"{result['averaged_accuracy']:>10.2%}{real:>8.0f}", flush=True)
                runs.append({"label": label, "peers": n, "link": link, "ratio_to_sync": ratio,
                             **{k: v for k, v in result.items() if k not in ("loss", "time")}})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"steps": args.steps, "period": args.period, "runs": runs}, f, indent=1)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
