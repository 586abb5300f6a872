"""How close asynchronous peers stay (issue #39): the consensus distance of 4 peer processes on
a ring, each minimising its own quadratic (targets far apart: the peers' data differ) with
noisy gradients and momentum 0.9, one peer 4x slower, under Gossip (D-PSGD, lockstep) and
Asynchronous with each exchange: ``push`` (one-way push-sum pushes of a quarter of the
mass) and ``pairwise`` (AD-PSGD's atomic pairwise average), the latter as by default
(``max_staleness=1``) and with ``max_staleness=None`` (no wait: a step whose exchange is
still under way starts none). Measured when every peer has finished (stats(consensus=True):
the peers' mean distance to their average), with the distance of their average to the
optimum, the fast peers' steps per second, and (pairwise) the exchanges each fast peer
started per step and the share of them refused. The asynchronous straggler takes
1/straggler of the steps, so that every peer ends at about the same time. Medians over
--repeats runs. A step's compute is a matmul loop (4 processes on the machine's cores: the
background threads wait to be scheduled), or with --idle a 3 ms sleep (a step on an
accelerator: the cores stay free for the threads).

    python benchmarks/asynchronous_mixing.py [--repeats 3] [--steps 300] [--straggler 4] [--idle]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

# One BLAS thread per peer: 4 peers share the cores, and a matmul of each on every core made
# a step 30x longer (16 steps/s for gossip where one thread gives 436).
for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import numpy as np  # noqa: E402  (after the thread count, which it reads at import)

LENGTH = 2000


#: name -> (exchange, extra Asynchronous arguments); "gossip" is Gossip.
VARIANTS = {"gossip": None, "push": ("push", {}), "pairwise": ("pairwise", {}),
            "pairwise, max_staleness=None": ("pairwise", {"max_staleness": None})}


def peer_body(peer, variant: str, steps: int, straggler: float, idle: bool):
    import topologies
    from gossip.policies import Asynchronous, Gossip
    rng = np.random.default_rng(peer.rank)
    target = np.random.default_rng([7, peer.rank]).normal(size=LENGTH) * 3
    x = np.zeros(LENGTH)
    topology = topologies.Ring(peer.world_size)
    spec = VARIANTS[variant]
    policy = (Gossip(topology=topology) if spec is None
              else Asynchronous(topology=topology, exchange=spec[0], **spec[1])).attach(peer, [x])
    velocity = np.zeros(LENGTH)
    a = rng.standard_normal((120, 120))
    slow = peer.rank == peer.world_size - 1
    if slow and spec is not None:
        # The asynchronous peers split the work by speed (AD-PSGD's setting; the demo's
        # too): all end together, where equal counts would leave the slow one training
        # alone at the end while the others wait.
        steps = max(1, round(steps / straggler))
    start = time.perf_counter()
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
    rate = steps / (time.perf_counter() - start)
    stats = policy.stats()
    consensus = policy.stats(consensus=True)["consensus_distance"]
    mean = x.copy()
    peer.allreduce(mean, op="mean")
    optimum = np.mean([np.random.default_rng([7, r]).normal(size=LENGTH) * 3
                       for r in range(peer.world_size)], axis=0)
    policy.close()
    # (Pairwise: exchanges this peer started per step, and the share of them refused.)
    started = stats.get("exchanges_started", 0)
    refused = stats.get("exchange_refusals_taken", 0) / started if started else 0.0
    return consensus, float(np.linalg.norm(mean - optimum)), rate, started / steps, refused


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
    for variant in VARIANTS:
        runs = [spawn(peer_body, n=4, timeout=300, args=(variant, args.steps, args.straggler,
                                                          args.idle))
                for _ in range(args.repeats)]
        fast = [peer for run in runs for peer in run[:-1]]   # (rank 3 is the straggler)
        results[variant] = {"consensus": [r[0][0] for r in runs],
                            "mean_to_optimum": [r[0][1] for r in runs],
                            "fast_steps_per_second": [p[2] for p in fast],
                            "fast_exchanges_per_step": [p[3] for p in fast],
                            "fast_refused": [p[4] for p in fast]}
    base = statistics.median(results["gossip"]["consensus"])
    rate = statistics.median(results["gossip"]["fast_steps_per_second"])
    print(f"4 peers, ring, {args.steps} steps, peer 3 {args.straggler:g}x slower, "
          f"{'sleeping' if args.idle else 'computing'} steps, medians of {args.repeats}")
    print(f"{'policy':<44}{'consensus':>10}{'x gossip':>9}{'to optimum':>11}"
          f"{'fast steps/s':>13}{'x gossip':>9}{'exch/step':>10}{'refused':>8}")
    for variant, r in results.items():
        name = "gossip" if variant == "gossip" else f"asynchronous ({variant})"
        c = statistics.median(r["consensus"])
        speed = statistics.median(r["fast_steps_per_second"])
        exchanging = variant.startswith("pairwise")
        per_step = (f"{statistics.median(r['fast_exchanges_per_step']):>10.2f}"
                    f"{statistics.median(r['fast_refused']):>8.0%}" if exchanging
                    else f"{'':>10}{'':>8}")
        print(f"{name:<44}{c:>10.2f}{c / base:>9.2f}"
              f"{statistics.median(r['mean_to_optimum']):>11.2f}{speed:>13.0f}"
              f"{speed / rate:>9.2f}{per_step}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
