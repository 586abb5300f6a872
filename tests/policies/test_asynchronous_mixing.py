"""Asynchronous gossip under CPU contention (4-8 peer processes on the machine's cores).

Fixed (issue #15): a tight loop now pushes in most of its steps. Before, pushes were handed
to a thread that the loop starved, and went only along the rotation, so fast peers' weights
halved towards min_weight while slow peers' grew: 8 peers below pushed in 53-71 of 220 steps
(the issue's report: 26-220); then 83-183 (a loaded machine to a quiet one), and 126-206 with
push_fraction 1/4 (flow control holds back fewer rounds).

Fixed (issue #15): on the issue's task the peers ended about 3 points below training alone
with push-sum's halves, which left most of the mass in transit at each step (the weight held
at a step averaged 0.04-0.46): 0.954-0.966 in batches of 8 runs. The mass in transit carries
models that go stale on the way, and a peer holding little of it barely moves the group's sum:
push_fraction 1/4 and flow control keeping w >= 3/8 (min_weight 1/2) bound both: 0.986 over 8
runs, Gossip 0.987, alone 0.990. (SGP's step scaling, the move divided by w, gave 0.987 here
but diverged with momentum beside a straggler: see Asynchronous's docstring.)"""
from __future__ import annotations

import numpy as np
import pytest

from gossip.testing import spawn

STEPS = 220


def tight_loop(peer, exchange):
    """lr 0: only mixing moves the models. A ~1 ms step of compute (a 120x120 matmul)."""
    import gossip
    x = np.full(1000, float(peer.rank))
    policy = gossip.policies.Asynchronous(exchange=exchange).attach(peer, [x])
    a = np.random.default_rng(peer.rank).standard_normal((120, 120))
    for _ in range(STEPS):
        for _ in range(3):
            a = np.tanh(a @ a.T / 120)
        policy.after_step()
    stats = policy.stats()
    pushed, rounds = stats["messages_sent"], stats["background_rounds"]
    # Counts drift apart (own_steps): a peer the scheduler starved runs its last steps after
    # the others stopped, pushing into peers that no longer push back (a CI run ended at
    # 3.5011 vs 3.4995 that way). So every peer mixes on until all have finished the loop.
    everyone_done = peer.allreduce(np.zeros(1), wait=False)
    while not everyone_done.done():
        policy.after_step()
    everyone_done.wait()
    policy.quiesce()
    return pushed, float(x.mean()), policy.weights[0], rounds


@pytest.mark.slow
@pytest.mark.parametrize("exchange", ["push", "pairwise"])
def test_a_tight_loop_pushes_nearly_every_step_and_the_models_meet(exchange):
    out = spawn(tight_loop, n=8, timeout=180, args=(exchange,))
    pushes = [p for p, _, _, _ in out]
    means = [m for _, m, _, _ in out]
    weights = [w for _, _, w, _ in out]
    rounds = [r for _, _, _, r in out]
    print(f"\npushes per peer in {STEPS} steps: {pushes} (rounds the pusher was free: "
          f"{rounds}); models after quiesce: {min(means):.7f}..{max(means):.7f}, spread "
          f"{max(means) - min(means):.1e} (the mean is 3.5)")
    # The pusher is free at nearly every step (192-220 of 220 rounds, quiet machine): the
    # loop does not starve it. Of those rounds, flow control (min_weight 1/2) holds back the
    # ones where too much of the peer's mass is still in transit: 43-222 pushes. Before the
    # fix, 53-71 pushes with no flow control involved.
    # Pairwise: an exchange is a round trip, often longer than this loop's 1 ms step, and a
    # peer starts the next one only when the last is answered: 52-170 of 220 rounds free
    # (8 peers on 2 cores, while other tests shared the machine).
    assert min(rounds) >= (STEPS // 2 if exchange == "push" else STEPS // 8), rounds
    assert min(pushes) >= STEPS // 8, pushes
    assert max(means) - min(means) < 1e-4, means
    # Push-sum keeps the weighted mean exactly, and the weights add up to n.
    assert abs(sum(weights) - 8) < 1e-9, weights
    assert abs(np.dot(weights, means) / sum(weights) - 3.5) < 1e-9, (weights, means)


def own_samples(peer, policy_name, steps=200):
    """The issue's task: a 10-16-2 MLP on 512 own samples (label x0 + x1 > 0), batch 32,
    SGD lr 0.1, the same start everywhere; accuracy on the own samples."""
    import torch
    import gossip
    torch.manual_seed(0)
    torch.set_num_threads(1)
    rng = np.random.default_rng(100 + peer.rank)
    xs = rng.standard_normal((512, 10)).astype(np.float32)
    ys = (xs[:, 0] + xs[:, 1] > 0).astype(np.int64)
    xs, ys = torch.from_numpy(xs), torch.from_numpy(ys)
    model = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if policy_name != "alone":
        opt = gossip.DistributedOptimizer(opt, peer=peer, policy=policy_name)
    for _ in range(steps):
        idx = torch.from_numpy(rng.integers(0, 512, 32))
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xs[idx]), ys[idx]).backward()
        opt.step()
    with torch.no_grad():
        return float((model(xs).argmax(1) == ys).float().mean())


@pytest.mark.slow   # five trainings of 4 peers: about 50 s on 2 cores
def test_asynchronous_trains_as_well_as_alone_and_within_a_point_of_gossip():
    """Alone and Gossip are deterministic here; Asynchronous is not (the scheduler decides
    what arrives when): its mean over three trainings, each one ranging 0.982-0.990."""
    runs = {"alone": 1, "asynchronous": 3, "gossip": 1}
    mean = {name: float(np.mean([spawn(own_samples, n=4, args=(name,), timeout=240,
                                       preload=("torch",)) for _ in range(k)]))
            for name, k in runs.items()}
    print(f"\nmean accuracy on the peers' own samples: {mean}")
    assert mean["asynchronous"] >= mean["alone"] - 0.005, mean   # 2-3 of 512 samples
    assert mean["asynchronous"] >= mean["gossip"] - 0.01, mean
