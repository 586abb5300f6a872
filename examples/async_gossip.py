"""Asynchronous gossip (AD-PSGD): the training loop never waits for another peer.

    gossip run -n 4 examples/async_gossip.py                          # all peers equal
    gossip run -n 4 examples/async_gossip.py --slow-rank 1            # a straggler
    gossip run --keep-going -n 4 examples/async_gossip.py --leave-rank 3 --leave-at 100

Each peer runs SGD on its own, biased shard of a least-squares problem. ``after_step()``
adds to the parameters what the peer's exchanges changed since the last step, and asks one
random neighbour (one-peer exponential graph) to average with it: the neighbour's background
thread pools the two models and both keep the average, atomically (AD-PSGD's pairwise
average; the push-sum weight beside the model keeps the mass exact when peers join or
leave). after_step() only takes a lock for a few vector operations.

What to expect, per rank: its test error every quarter of the run (a peer alone would stay
near 10; gossiping peers get to about 1.5), then how long its loop took, its push-sum
weight (1 while nobody joins or leaves) and how many of its exchanges were answered. Then
rank 0 prints the consensus: the replicas' distance from their mean (well below |x|) and the
mean model's test error, lower than most single replicas'.

A slow peer: with ``--slow-rank 1`` (sleeping ``--delay`` s more per step) rank 1's loop takes
several times longer, the others' about as long as without it: nobody waits for it.

A dead peer: with ``--leave-rank 3 --leave-at 100`` rank 3 exits abruptly at step 100
without closing, with exit code 9, as a crashed or pre-empted process would (``--keep-going``
tells `gossip run` not to stop the others on the first failure). The others never
wait for it and never fail: they notice the dropped connection, take rank 3 out of their
rotation, train on and list it under "lost". The mass rank 3 held is gone with it (an
exchange it did not answer leaves the asker as it was), and mixing goes on: the errors jump
while the dead peer's pull is replaced and settle at the three survivors' optimum (about 3.4 here:
rank 3's shard no longer cancels the others' bias). A collective would now fail, so each
survivor reports only its own model.

A dead peer started again (``gossip run --max-restarts 1``) rejoins instead: it takes a
member's model, a share of its push-sum weight and its step count when the policy attaches,
and the loop, driven by the policy's step count, ends with the others at the consensus.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

import gossip

DIM = 50


def make_data(rank: int, world: int, n: int, seed: int, offset: float):
    """y = x @ (teacher + bias[rank]) + noise. The biases come from the shared seed and sum to
    zero over the peers, so the teacher is the best model for all the data together, and a
    peer trained alone would be off by its bias (test error about offset**2 * DIM)."""
    shared = np.random.default_rng(seed)
    teacher = shared.normal(size=DIM)
    biases = offset * shared.normal(size=(world, DIM))
    biases -= biases.mean(axis=0)
    rng = np.random.default_rng([seed, rank])
    x = rng.normal(size=(n, DIM))
    bias = biases[rank] if rank < world else 0.0
    return x, x @ (teacher + bias) + rng.normal(size=n)


def test_error(w: np.ndarray, test) -> float:
    x, y = test
    return float(np.mean((x @ w - y) ** 2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=400, help="SGD steps per peer")
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--offset", type=float, default=0.5, help="how much shards disagree")
    parser.add_argument("--step-time", type=float, default=0.002,
                        help="seconds of stand-in compute per step (default 0.002)")
    parser.add_argument("--slow-rank", type=int, default=-1, help="this rank sleeps each step")
    parser.add_argument("--delay", type=float, default=0.01, help="its sleep, seconds")
    parser.add_argument("--leave-rank", type=int, default=-1, help="this rank dies mid-run")
    parser.add_argument("--leave-at", type=int, default=100, help="at this step")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    with gossip.init() as peer:
        x, y = make_data(peer.rank, peer.world_size, 1000, args.seed, args.offset)
        test = make_data(10**6, peer.world_size, 2000, args.seed, 0.0)  # the teacher's
        w = np.zeros(DIM)
        policy = gossip.policies.Asynchronous().attach(peer, [w])
        rng = np.random.default_rng([args.seed, peer.rank, 1])
        start = time.perf_counter()
        while policy.step < args.steps:   # (a rejoining peer goes on from the job's step)
            step = policy.step
            if peer.rank == args.leave_rank and step == args.leave_at:
                os._exit(9)   # no close(), no goodbye: the others see the connection drop
            b = rng.integers(0, len(y), size=args.batch_size)
            w -= args.lr * x[b].T @ (x[b] @ w - y[b]) / args.batch_size
            # Stand-in for a real model's forward and backward, which take milliseconds
            # (and, on an accelerator, release the GIL as sleep does): the background threads
            # mix while they run. A numpy step alone is faster than one exchange.
            time.sleep(args.step_time + (args.delay if peer.rank == args.slow_rank else 0))
            policy.after_step()   # never blocks on a peer: the thread does the talking
            if (step + 1) % max(1, args.steps // 4) == 0:
                print(f"rank {peer.rank} step {step + 1} test error "
                      f"{test_error(w, test):.4f}", flush=True)
        took = time.perf_counter() - start
        stats = policy.stats()
        lost = sorted(set(stats["lost_peers"]) | set(stats["dropped_peers"]))
        print(f"rank {peer.rank} loop took {took:.2f} s, push-sum weight "
              f"{stats['weights'][0]:.3f}, {stats['exchange_answers_taken']} of "
              f"{stats['exchanges_started']} exchanges answered, lost {lost}", flush=True)

        if args.leave_rank >= 0:
            policy.close()   # a collective would wait for the dead peer: stop here
            return
        # Collectives from here on (every live peer calls them): how far the replicas are
        # apart, then the mean model, what a checkpoint would hold.
        distance = policy.stats(consensus=True)["consensus_distance"]
        policy.close()
        peer.allreduce(w, op="mean")
        if peer.rank == 0:
            print(f"final: consensus distance {distance:.3f} (|x| {np.linalg.norm(w):.2f}), "
                  f"mean model test error {test_error(w, test):.4f}", flush=True)


if __name__ == "__main__":
    main()
