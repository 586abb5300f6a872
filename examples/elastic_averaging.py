"""Elastic averaging SGD (EASGD) on a noisy least-squares problem, in numpy.

    gossip run -n 4 examples/elastic_averaging.py                    # replicated centre
    gossip run -n 4 examples/elastic_averaging.py --center sharded --slow-rank 1

Each worker runs SGD with a large step on its own data, so its weights jitter around the
optimum; every ``--period`` steps it is pulled towards a centre variable by ``--alpha`` of
the distance, and the centre towards it by as much. The centre is a running average of all
the workers: it is the model to evaluate.

What to expect: per rank, every quarter of the run, the worker's test error and its distance
to the centre (which stays bounded: larger alpha or smaller period keep workers closer; alpha
defaults to 0.9/n, the paper's beta = n*alpha = 0.9). At the end, rank 0 prints the centre's
test error next to the workers': the centre's is lower than their average (about half of it
with the defaults), because it averages away much of the workers' SGD noise.

Centre and slow peers: ``--center replicated`` keeps a full copy of the centre on every peer
and updates it with one allreduce per elastic round, so every peer waits for the slowest
one at each round. ``--center sharded`` gives each peer 1/n of the centre, served by a
background thread: a worker's elastic step waits only for those threads, never for another
worker's training, so with ``--slow-rank 1`` the other ranks finish their loop long before
rank 1 (compare the "loop took" lines). A dead peer fails the replicated allreduce
(gossip.PeerLost); in the sharded form the others skip its shard and go on. With
``--elastic`` the survivors re-form the group instead (``elastic=True``), and a peer started
again (``gossip run --max-restarts 1``) rejoins the running job: it takes a member's model,
the centre and the step count when its policy attaches, and the loop, driven by the
policy's step count, takes it to the end with the others.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import gossip

DIM = 50


def make_data(rank: int, n: int, seed: int, noise: float):
    """y = x @ teacher + noise; the teacher is the same everywhere (shared seed)."""
    teacher = np.random.default_rng(seed).normal(size=DIM)
    rng = np.random.default_rng([seed, rank])
    x = rng.normal(size=(n, DIM))
    return x, x @ teacher + noise * rng.normal(size=n)


def test_error(w: np.ndarray, test) -> float:
    x, y = test
    return float(np.mean((x @ w - y) ** 2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=400, help="SGD steps per worker")
    parser.add_argument("--center", choices=["replicated", "sharded"], default="replicated")
    parser.add_argument("--alpha", type=float, default=None, help="elastic pull (default 0.9/n)")
    parser.add_argument("--period", type=int, default=4, help="steps between elastic rounds")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--slow-rank", type=int, default=-1, help="this rank sleeps each step")
    parser.add_argument("--delay", type=float, default=0.01, help="its sleep, seconds")
    parser.add_argument("--elastic", action="store_true",
                        help="re-form the group after a death (elastic=True)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    with gossip.init() as peer:
        x, y = make_data(peer.rank, 1000, args.seed, noise=1.0)
        test = make_data(10**6, 2000, args.seed, noise=0.0)  # noise-free: error is excess
        w = np.zeros(DIM)
        # attach() is a collective: the centre starts at the workers' mean.
        policy = gossip.policies.ElasticAveraging(alpha=args.alpha, period=args.period,
                                                  center=args.center,
                                                  elastic=args.elastic).attach(peer, [w])
        rng = np.random.default_rng([args.seed, peer.rank, 1])
        start = time.perf_counter()
        while policy.step < args.steps:   # (a rejoining peer goes on from the job's step)
            step = policy.step
            b = rng.integers(0, len(y), size=args.batch_size)
            w -= args.lr * x[b].T @ (x[b] @ w - y[b]) / args.batch_size
            if peer.rank == args.slow_rank:
                time.sleep(args.delay)       # a straggler: a slower GPU, a busy node
            policy.after_step()              # every period-th call is an elastic round
            if (step + 1) % max(1, args.steps // 4) == 0:
                line = (f"rank {peer.rank} step {step + 1} worker test error "
                        f"{test_error(w, test):.4f}")
                if args.center == "replicated":   # sharded: this peer holds 1/n of it only
                    line += f", distance to centre {np.linalg.norm(w - policy.center[0]):.3f}"
                print(line, flush=True)
        took = time.perf_counter() - start
        print(f"rank {peer.rank} loop took {took:.2f} s", flush=True)

        # Every worker's final error, for rank 0 to compare with the centre.
        errors = peer.allgather(np.array([test_error(w, test)]))
        # Sharded: a collective that assembles the shards, so it also waits for the slow
        # rank to finish before any peer closes its shard server.
        policy.load_center()
        stats = policy.stats()
        policy.close()
        if peer.rank == 0:
            print(f"alpha {stats['alpha']:.3f} (beta {stats['beta']:.2f}), period "
                  f"{stats['period']}, {stats['elastic_rounds']} elastic rounds, centre "
                  f"{args.center}", flush=True)
            print(f"final: centre test error {test_error(w, test):.4f}, workers' "
                  f"{' '.join(f'{e:.4f}' for e in np.ravel(errors))}", flush=True)


if __name__ == "__main__":
    main()
