"""Decentralized logistic regression in plain numpy: a hand-written loop, no torch at all.

    gossip run -n 4 examples/numpy_custom_loop.py            # --steps 50 for a quick run

Every peer holds its own shard of a synthetic, linearly separable-ish data set and the same
shared test set. Two ways to average, one after the other:

1. by hand: after each gradient step, ``peer.neighbor_average(w, step=t)`` mixes ``w`` with the
   neighbours' copies (D-PSGD on the peer's topology, a ring by default);
2. with a policy: the same loop with ``policy.after_step()`` instead, here local SGD
   (``--policy`` takes any name of gossip.policies.names(); the policy updates the numpy
   arrays it was attached to, in place).

Expect each rank's test accuracy to rise to about 0.94 (chance is 0.5) and the replicas to
agree closely: after phase 1 no replica is more than about 0.1 from the consensus, whose norm
|w| is about 2 (gossip on a ring only shrinks the disagreement, it never quite removes it;
with 2 peers a ring round is an exact average). Local SGD ends on an averaging step
(every 4th), so its distance is 0.

A peer that dies in phase 2 and is started again (``gossip run --max-restarts 1``, with a
policy that trains through a death: ``--policy gossip``) rejoins the running job: it goes
straight to phase 2, where the job is (``peer.joining``: joins are admitted at a policy's
step boundary, and phase 1 has none), takes a member's ``w`` and step count when its
policy attaches, and trains on from that step with the others.
"""
from __future__ import annotations

import argparse

import numpy as np

import gossip

DIM = 20


def make_shard(rank: int, n: int, seed: int, flip: float = 0.1):
    """Labels from one hidden "teacher" (the same on every peer, from the shared seed), a
    fraction ``flip`` of them wrong so that no peer can trust its shard alone; features differ
    per rank."""
    teacher = np.random.default_rng(seed).normal(size=DIM)
    rng = np.random.default_rng([seed, rank])
    x = rng.normal(size=(n, DIM))
    y = (x @ teacher > 0).astype(np.float64)
    wrong = rng.random(n) < flip
    y[wrong] = 1 - y[wrong]
    return x, y


def gradient(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Of the mean logistic loss; the clip keeps exp() from overflowing on large margins."""
    p = 1 / (1 + np.exp(-np.clip(x @ w, -30, 30)))
    return x.T @ (p - y) / len(y)


def accuracy(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    return float(((x @ w > 0) == (y > 0.5)).mean())


def train(peer, w, data, test, args, label, policy=None) -> None:
    x, y = data
    # With a policy the loop follows its step count: a peer that rejoined the running job
    # goes on from the step it took with the state, and ends with the others.
    rng = np.random.default_rng([args.seed, peer.rank, 1])
    step = 0 if policy is None else policy.step
    while step < args.steps:
        batch = rng.integers(0, len(y), size=args.batch_size)
        w -= args.lr * gradient(w, x[batch], y[batch])   # in place: the policy holds w
        if policy is None:
            peer.neighbor_average(w, step=step)           # one D-PSGD round, by hand
            step += 1
        else:
            policy.after_step()                           # the policy decides what to send
            step = policy.step
        if step % max(1, args.steps // 4) == 0:
            print(f"[{label}] rank {peer.rank} step {step} test accuracy "
                  f"{accuracy(w, *test):.3f}", flush=True)


def report(peer, w, test, label) -> None:
    """The consensus (the replicas' mean) and how far this replica is from it. Collectives:
    every peer calls this at the same point."""
    mean = w.copy()
    peer.allreduce(mean, op="mean")
    gap = np.array([np.linalg.norm(w - mean)])
    peer.allreduce(gap, op="max")
    if peer.rank == 0:
        print(f"[{label}] consensus: test accuracy {accuracy(mean, *test):.3f}, "
              f"largest distance of a replica from it {gap[0]:.2e}, "
              f"|w| {np.linalg.norm(mean):.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="steps per phase (default 200)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--samples", type=int, default=500, help="training samples per peer")
    parser.add_argument("--policy", default="local-sgd", choices=gossip.policies.names(),
                        help="policy of phase 2 (default local-sgd)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    with gossip.init() as peer:
        data = make_shard(peer.rank, args.samples, args.seed)
        test = make_shard(10**6, 2000, args.seed, flip=0.0)  # a "rank" no peer has
        print(f"rank {peer.rank}/{peer.world_size} on {peer.topology!r}", flush=True)

        # Phase 1: different starting points on purpose, to watch gossip pull them together.
        # (A peer joining the running job skips it: the job is in phase 2.)
        if not peer.joining:
            w = np.random.default_rng([args.seed, peer.rank, 2]).normal(size=DIM)
            train(peer, w, data, test, args, "by hand")
            report(peer, w, test, "by hand")

        # Phase 2: a policy packs the arrays once at attach() and updates them in place.
        w = np.zeros(DIM)
        policy = gossip.policies.make(args.policy).attach(peer, [w])
        train(peer, w, data, test, args, args.policy, policy)
        # Collective, like report(): the policy's own view of the disagreement.
        distance = policy.stats(consensus=True)["consensus_distance"]
        policy.close()
        if peer.rank == 0:
            print(f"[{args.policy}] policy consensus distance {distance:.2e}", flush=True)
        report(peer, w, test, args.policy)


if __name__ == "__main__":
    main()
