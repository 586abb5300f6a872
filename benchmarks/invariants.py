#!/usr/bin/env python3
"""The averaging policies' mathematical promises, measured on real peers (numpy float64
parameters, real ZeroMQ sockets between processes on this machine).

Usage:
  python benchmarks/invariants.py [--json rows.jsonl]

What it prints, one row per promise (the tests in tests/policies/test_policies*.py assert the same
things with tolerances; this prints the figures themselves):

- Gossip on Ring(8): the per-round contraction of the disagreement |x - mean|, the geometric
  mean over rounds 20 to 40 (once the faster modes have died out), against the spectral
  prediction (1 + 2 cos(2 pi / 8)) / 3 = 0.804738; and how far the peers' mean drifts.
- Gossip on OnePeerExponential(8): max |x - mean| after log2(8) = 3 rounds (exact average).
- PushSum on a directed 5-peer graph whose push matrix is column- but not row-stochastic,
  with and without overlap, 60 rounds: the relative error of sum(x) and of sum(w), how far
  x / w is from the true mean, and how far x alone is (biased).
- PushSum on Ring(8), with and without overlap, rank 5 SIGKILLed after round 3 (at a point
  where nothing is in transit, having written its x and w), 40 more rounds: the relative
  error of the survivors' sum of x against the initial total minus the dead peer's x, and of
  their sum of w against 8 minus its w (exact accounting when a peer dies).
- Asynchronous, 4 peers, 200 steps of a toy local update, then quiesce(): sum of the push-sum
  weights minus n (mass kept), and the pushes absorbed.
- ElasticAveraging (replicated and sharded centre), 4 peers, 40 steps: the drift of
  sum(workers) + centre beyond the local steps' own contribution (relative).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import tempfile

import numpy as np

from gossip.testing import spawn

LENGTH = 512
DIRECTED_EDGES = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 0), (0, 2), (0, 3), (1, 3)]


def start_vector(rank: int, seed: int) -> np.ndarray:
    return np.random.default_rng([seed, rank]).normal(loc=rank, size=LENGTH)


def gossip_contraction(peer, spec: str, rounds: int):
    import topologies
    from gossip.policies import Gossip
    graph = topologies.parse(spec, peer.world_size)
    x = start_vector(peer.rank, 1)
    policy = Gossip(topology=graph).attach(peer, [x])
    gaps, means = [], []
    for _ in range(rounds + 1):
        mean = x.copy()
        peer.allreduce(mean, op="mean")
        gap = (x - mean) ** 2
        peer.allreduce(gap, op="sum")
        gaps.append(math.sqrt(gap.sum()))
        means.append(mean)
        if len(gaps) <= rounds:
            policy.after_step()
    policy.close()
    drift = np.abs(means[-1] - means[0]).max() / np.abs(means[0]).max()
    return gaps, drift


def push_sum_rounds(peer, overlap: bool, rounds: int):
    import topologies
    from gossip.policies import PushSum
    graph = topologies.from_edges(peer.world_size, DIRECTED_EDGES, directed=True)
    x = start_vector(peer.rank, 7)
    total = x.copy()
    peer.allreduce(total, op="sum")
    policy = PushSum(topology=graph, overlap=overlap).attach(peer, [x])
    for _ in range(rounds):
        policy.after_step()
    policy.flush()
    z = np.concatenate([policy.numerators[0], [policy.weights[0]]])
    peer.allreduce(z, op="sum")
    numerator = policy.numerators[0].copy()
    policy.close()
    mean = total / peer.world_size
    return {"sum_x": float(np.abs(z[:-1] - total).max() / np.abs(total).max()),
            "sum_w": float(abs(z[-1] - peer.world_size) / peer.world_size),
            "debiased": float(np.abs(x - mean).max()),
            "numerator_alone": float(np.abs(numerator - mean).max())}


def push_sum_killed(peer, overlap: bool, victim: int, path: str, rounds: int):
    import topologies
    from gossip.policies import PushSum
    x = start_vector(peer.rank, 9)
    policy = PushSum(topology=topologies.Ring(peer.world_size), overlap=overlap).attach(peer, [x])
    for _ in range(3):
        policy.after_step()
    policy.flush()
    # Quiet point: every round complete everywhere, and the victim dies only after every
    # survivor has left the barrier (each tells it so): none of its messages is in transit.
    peer.barrier()
    if peer.rank == victim:
        for r in range(peer.world_size):
            if r != victim:
                peer.recv(r, np.zeros(1))
        np.save(path + ".tmp.npy", np.concatenate([policy.numerators[0], policy.weights[:1]]))
        os.replace(path + ".tmp.npy", path)
        os.kill(os.getpid(), signal.SIGKILL)
    peer.send(victim, np.ones(1))
    for _ in range(rounds):
        policy.after_step()
    policy.flush()
    out = policy.numerators[0].copy(), policy.weights[0]
    policy.close()
    return out


def asynchronous_mass(peer, steps: int):
    from gossip.policies import Asynchronous
    x = start_vector(peer.rank, 3)
    target = np.random.default_rng([5, peer.rank]).normal(size=LENGTH)

    policy = Asynchronous().attach(peer, [x])
    work = np.random.default_rng(peer.rank).normal(size=(128, 128)) / 128
    for _ in range(steps):
        policy.after_backward()
        for _ in range(5):   # a step's compute (a push takes longer than the update alone)
            work = np.tanh(work @ work)
        x += 0.01 * (target - x)
        policy.after_step()
    policy.quiesce()
    total = np.array(policy.weights, dtype=np.float64)
    peer.allreduce(total, op="sum")
    absorbed = policy.stats()["messages_absorbed"]
    policy.close()
    return {"weights_minus_n": float(total.max() - peer.world_size), "absorbed": absorbed}


def elastic_drift(peer, center: str, steps: int):
    from gossip.policies import ElasticAveraging
    n = peer.world_size
    x = start_vector(peer.rank, 11)
    target = np.random.default_rng([13, peer.rank]).normal(size=LENGTH)
    policy = ElasticAveraging(period=2, center=center).attach(peer, [x])

    def invariant():
        peer.barrier()     # no elastic exchange in flight anywhere
        c = np.zeros(LENGTH)
        if center == "replicated":
            c[:] = policy.center[0]
        else:
            lo, hi = LENGTH * peer.rank // n, LENGTH * (peer.rank + 1) // n
            c[lo:hi] = policy.center[0]
            peer.allreduce(c, op="sum")
        s = x.copy()
        peer.allreduce(s, op="sum")
        return s + c

    drift = 0.0
    for _ in range(steps):
        before = invariant()
        local = 0.05 * (target - x)
        x += local
        moved = local.copy()
        peer.allreduce(moved, op="sum")
        policy.after_step()
        after = invariant()
        drift = max(drift, float(np.abs(after - before - moved).max()
                                 / np.abs(before).max()))
    policy.close()
    return drift


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=None, help="also append every row here (JSON lines)")
    args = ap.parse_args(argv)
    rows = []

    def row(what: str, figure: str, **values) -> None:
        rows.append((what, figure))
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps({"what": what, **values}) + "\n")

    gaps, drift = spawn(gossip_contraction, n=8, timeout=120, args=("ring", 40))[0]
    rate = (gaps[40] / gaps[20]) ** (1 / 20)
    predicted = (1 + 2 * math.cos(2 * math.pi / 8)) / 3
    row("Gossip, Ring(8): contraction per round (rounds 20-40)",
        f"{rate:.6f} (predicted {predicted:.6f}); mean drift {drift:.1e} (relative)",
        rate=rate, predicted=predicted, mean_drift=drift)
    gaps, drift = spawn(gossip_contraction, n=8, timeout=120,
                        args=("one-peer-exponential", 3))[0]
    row("Gossip, OnePeerExponential(8): |x - mean| after 3 rounds",
        f"{gaps[-1]:.1e} (from {gaps[0]:.1f}); mean drift {drift:.1e}",
        gap=gaps[-1], start=gaps[0], mean_drift=drift)
    for overlap in (False, True):
        results = spawn(push_sum_rounds, n=5, timeout=120, args=(overlap, 60))
        r = {k: max(q[k] for q in results) for k in results[0]}   # the worst peer
        row(f"PushSum(overlap={overlap}), directed 5-peer graph, 60 rounds",
            f"sum x rel. error {r['sum_x']:.1e}, sum w {r['sum_w']:.1e}; |x/w - mean| "
            f"{r['debiased']:.1e}, |x - mean| {r['numerator_alone']:.2f} (biased)",
            overlap=overlap, **r)
    for overlap in (False, True):
        n, victim = 8, 5
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "victim.npy")
            results = spawn(push_sum_killed, n=n, timeout=120, tolerate=[victim],
                            peer_timeout=10, args=(overlap, victim, path, 40))
            dead = np.load(path)
        initial = sum(start_vector(r, 9) for r in range(n))
        live = [r for r in range(n) if r != victim]
        sum_x = float(np.abs(sum(results[r][0] for r in live) - (initial - dead[:-1])).max()
                      / np.abs(initial).max())
        sum_w = abs(sum(results[r][1] for r in live) - (n - dead[-1])) / n
        row(f"PushSum(overlap={overlap}), Ring(8), rank 5 killed after round 3, 40 rounds",
            f"survivors' sum x vs initial - dead's: rel. error {sum_x:.1e}, sum w {sum_w:.1e}",
            overlap=overlap, killed=victim, sum_x=sum_x, sum_w=sum_w)
    results = spawn(asynchronous_mass, n=4, timeout=120, args=(200,))
    worst = max(abs(r["weights_minus_n"]) for r in results)
    absorbed = sum(r["absorbed"] for r in results)
    row("Asynchronous, 4 peers, 200 steps, then quiesce()",
        f"sum of weights - n: {worst:.1e} after {absorbed} pushes absorbed",
        weights_minus_n=worst, absorbed=absorbed)
    for center in ("replicated", "sharded"):
        drift = max(spawn(elastic_drift, n=4, timeout=120, args=(center, 40)))
        row(f"ElasticAveraging(center={center!r}), 4 peers, 40 steps",
            f"workers + centre drift {drift:.1e} (relative)", center=center, drift=drift)
    width = max(len(w) for w, _ in rows)
    for what, figure in rows:
        print(f"{what:<{width}}  {figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
