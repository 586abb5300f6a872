"""How close asynchronous peers stay (issue #39): the consensus distance of 4 peer processes on
a ring, each minimising its own quadratic (targets far apart: the peers' data differ) with
noisy gradients and momentum 0.9, one peer 4x slower, under Gossip (D-PSGD, lockstep) and
Asynchronous with each exchange: ``push`` (one-way push-sum pushes of a quarter of the mass)
and ``pairwise`` (AD-PSGD's atomic pairwise average). Measured when every peer has finished
(stats(consensus=True): the peers' mean distance to their average), and the distance of
their average to the optimum. The asynchronous straggler takes 1/straggler of the steps, so
that every peer ends at about the same time. Medians over --repeats runs. A step's compute is a matmul loop
(4 processes on the machine's cores: the background threads wait to be scheduled), or with
--idle a 3 ms sleep (a step on an accelerator: the cores stay free for the threads).

    python benchmarks/asynchronous_mixing.py [--repeats 3] [--steps 300] [--straggler 4] [--idle]
"""
from __future__ import annotations

import argparse
import json
import statistics

import numpy as np

LENGTH = 2000


def peer_body(peer, exchange: str, steps: int, straggler: float, idle: bool):
    import time

    import topologies
    from gossip.policies import Asynchronous, Gossip
    rng = np.random.default_rng(peer.rank)
    target = np.random.default_rng([7, peer.rank]).normal(size=LENGTH) * 3
    x = np.zeros(LENGTH)
    topology = topologies.Ring(peer.world_size)
    policy = (Gossip(topology=topology) if exchange == "gossip"
              else Asynchronous(topology=topology, exchange=exchange)).attach(peer, [x])
    velocity = np.zeros(LENGTH)
    a = rng.standard_normal((120, 120))
    slow = peer.rank == peer.world_size - 1
    if slow and exchange != "gossip":
        # The asynchronous peers split the work by speed (AD-PSGD's setting; the demo's
        # too): all end together, where equal counts would leave the slow one training
        # alone at the end while the others wait.
        steps = max(1, round(steps / straggler))
    for _ in range(steps):
        velocity = 0.9 * velocity + (x - target) + rng.normal(size=LENGTH)
        x -= 0.05 * velocity
        policy.after_step()
        factor = straggler if slow else 1
        if idle:
            time.sleep(0.003 * factor)
        else:
            for _ in range(round(3 * factor)):   # a step's compute
                a = np.tanh(a @ a.T / 120)
    consensus = policy.stats(consensus=True)["consensus_distance"]
    mean = x.copy()
    peer.allreduce(mean, op="mean")
    optimum = np.mean([np.random.default_rng([7, r]).normal(size=LENGTH) * 3
                       for r in range(peer.world_size)], axis=0)
    policy.close()
    return consensus, float(np.linalg.norm(mean - optimum))


def main() -> None:
    from gossip.testing import spawn
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--straggler", type=float, default=4.0)
    parser.add_argument("--idle", action="store_true",
                        help="a step sleeps instead of computing (the cores stay free)")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    results: dict = {}
    for exchange in ("gossip", "push", "pairwise"):
        runs = [spawn(peer_body, n=4, timeout=300, args=(exchange, args.steps, args.straggler,
                                                           args.idle))
                for _ in range(args.repeats)]
        consensus = [r[0][0] for r in runs]
        off = [r[0][1] for r in runs]
        results[exchange] = {"consensus": consensus, "mean_to_optimum": off}
    base = statistics.median(results["gossip"]["consensus"])
    print(f"4 peers, ring, {args.steps} steps, peer 3 {args.straggler:g}x slower, "
          f"{'sleeping' if args.idle else 'computing'} steps, medians of {args.repeats}")
    print(f"{'policy':<24}{'consensus':>12}{'x gossip':>10}{'mean to optimum':>18}")
    for exchange, r in results.items():
        name = "gossip" if exchange == "gossip" else f"asynchronous ({exchange})"
        c = statistics.median(r["consensus"])
        print(f"{name:<24}{c:>12.2f}{c / base:>10.2f}"
              f"{statistics.median(r['mean_to_optimum']):>18.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
