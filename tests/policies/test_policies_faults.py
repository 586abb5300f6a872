"""Policies with slow and dead peers, with real peer processes: the asynchronous training loop
does not wait for a slow neighbour, and a peer killed mid-training (SIGKILL) does not stop the
others (asynchronous and synchronous gossip)."""
from __future__ import annotations

import os
import signal
import statistics
import time

import numpy as np
import pytest

import topologies
from gossip.policies import Asynchronous, Gossip
from gossip.testing import spawn, wait_until

SLEEP = 0.2   # the slow neighbour's extra time per step, seconds
STEPS = 25


def local_work(x: np.ndarray, scratch: np.ndarray) -> None:
    """A compute-bound stand-in for forward and backward (a few milliseconds)."""
    for _ in range(4):
        np.sin(scratch, out=scratch)
    x -= 1e-3 * x


def slow_neighbour(peer):
    x = np.random.default_rng(peer.rank).normal(size=20_000).astype(np.float32)
    scratch = np.linspace(0, 1, 100_000)
    policy = Asynchronous().attach(peer, [x])
    times = {}
    for phase in ("all fast", "rank 1 slow"):
        peer.barrier()
        steps = []
        for _ in range(STEPS):
            start = time.perf_counter()
            local_work(x, scratch)
            if phase == "rank 1 slow" and peer.rank == 1:
                time.sleep(SLEEP)
            policy.after_step()
            steps.append(time.perf_counter() - start)
        times[phase] = steps
    stats = policy.stats()
    peer.barrier()
    policy.close()
    return times, stats


@pytest.mark.slow
def test_asynchronous_training_loop_does_not_wait_for_a_slow_neighbour():
    out = spawn(slow_neighbour, n=4, timeout=60)
    slow_steps = out[1][0]["rank 1 slow"]
    assert statistics.median(slow_steps) >= SLEEP
    for times, stats in out:
        # Push's flow control: peers that push more often than they hear never run out of
        # weight (a pairwise exchange never leaves a peer light).
        assert stats["lightest_weight"] >= stats.get("min_weight", 1.0) / 2, stats
    for rank in (0, 2, 3):   # rank 0 pushes to rank 1; ranks 2 and 3 hear from it
        times, stats = out[rank]
        alone = statistics.median(times["all fast"])
        with_slow = sorted(times["rank 1 slow"])
        median = statistics.median(with_slow)
        summary = (rank, f"alone median {alone:.4f}", [f"{t:.4f}" for t in with_slow])
        # Waiting on the slow neighbour would cost SLEEP at every step (or every other one,
        # when it is the out-neighbour): compare with that, not with absolute figures, and
        # leave room for a loaded machine's scheduling stalls.
        assert median < alone + SLEEP / 4, summary
        assert median < 3 * alone + SLEEP / 20, summary
        assert sum(t >= SLEEP for t in with_slow) < 0.25 * len(with_slow), summary
        assert stats["background_rounds"] > 0


def killed_mid_training(peer, policy_name, neighbours_of_3):
    x = np.random.default_rng(peer.rank).normal(size=1000)
    if policy_name == "asynchronous":
        policy = Asynchronous(max_staleness=None).attach(peer, [x])
    else:
        policy = Gossip().attach(peer, [x])
    for step in range(60):
        if peer.rank == 3 and step == 15:
            os.kill(os.getpid(), signal.SIGKILL)
        x -= 0.01 * x
        np.ones((96, 96)) @ np.ones((96, 96))   # a step's compute
        policy.after_step()
    if peer.rank in neighbours_of_3:   # only peers connected to rank 3 can notice its death
        try:
            wait_until(lambda: 3 in peer.lost_peers(), 10, what="rank 3 declared lost")
        except TimeoutError:
            pass   # the test says who must have noticed
    stats = policy.stats()
    policy.close()
    return stats, bool(np.isfinite(x).all()), x


@pytest.mark.slow
def test_a_killed_peer_does_not_stop_asynchronous_gossip():
    out = spawn(killed_mid_training, n=4, timeout=60, tolerate=[3], peer_timeout=10,
                args=("asynchronous", (0, 1, 2)))
    assert out[3] is None
    for rank in (0, 1, 2):
        stats, finite, _ = out[rank]
        assert stats["steps"] == 60 and finite
    # A survivor notices only over a connection it has with rank 3, and a background thread
    # starved of CPU may not have made one before the kill: at least one did.
    assert any(3 in out[r][0]["lost_peers"] or 3 in out[r][0]["dropped_peers"]
               for r in (0, 1, 2)), [out[r][0] for r in (0, 1, 2)]


def async_with_bogus_pushes(peer, exchange):
    x = np.random.default_rng(peer.rank).normal(size=100)
    if peer.rank == 2:
        # What a buggy or hostile peer could push (or ask to exchange): a weight out of
        # (0, n], so folding it in would divide by zero or flip the sign of rank 0's model.
        tail = 1 if exchange == "push" else 2
        for weight in (-1.0, 0.0, float("nan"), 1e9):
            bogus = np.full(100 + tail, 1e6)
            bogus[-1] = weight
            peer.channel(1).send(0, bogus)
        if exchange == "pairwise":   # and answers nobody asked for, one plausible
            for weight in (1.0, float("nan")):
                bogus = np.full(102, 1e6)
                bogus[-1] = weight
                peer.channel(3).send(0, bogus)
    policy = Asynchronous(exchange=exchange).attach(peer, [x])
    for _ in range(40):
        x -= 0.01 * x
        policy.after_step()
    if peer.rank == 0:   # the receiving thread has seen the four bogus pushes (or failed)
        wait_until(lambda: policy.stats()["messages_absorbed_from"][2] >= 4, 20,
                   what="rank 2's pushes absorbed")
    policy.after_step()   # fold in whatever was accepted
    peer.barrier()
    stats = policy.stats()
    policy.close()
    return bool(np.isfinite(x).all()), float(np.abs(x).max()), stats


@pytest.mark.parametrize("exchange", ["push", "pairwise"])
def test_asynchronous_drops_pushes_with_impossible_weights(exchange):
    out = spawn(async_with_bogus_pushes, n=3, timeout=60, args=(exchange,))
    for finite, biggest, stats in out:
        assert finite and biggest < 10, (biggest, stats)   # nothing of the 1e6 got in
        assert stats["steps"] == 41 and min(stats["weights"]) > 0, stats
    # Rank 0 heard the four bogus pushes (counted, dropped) besides rank 2's real ones.
    assert out[0][2]["messages_absorbed_from"][2] >= 4, out[0][2]


def test_a_killed_peer_does_not_stop_synchronous_gossip():
    out = spawn(killed_mid_training, n=4, timeout=60, tolerate=[3], peer_timeout=10,
                topology=topologies.Ring(4), args=("gossip", (0, 2)))
    assert out[3] is None
    xs = np.stack([out[r][2] for r in (0, 1, 2)])
    for rank in (0, 1, 2):
        stats, finite, _ = out[rank]
        assert stats["steps"] == 60 and finite
        assert rank == 1 or 3 in stats["lost_peers"]    # 0 and 2 are rank 3's neighbours
    # The survivors (a path 0 - 1 - 2) kept mixing after rank 3 died.
    start = np.stack([np.random.default_rng(r).normal(size=1000) for r in (0, 1, 2)])
    assert np.ptp(xs, axis=0).max() < 0.05 * np.ptp(start, axis=0).max()


def local_sgd_killed_before_averaging(peer, victim_step):
    import torch

    from gossip.policies import LocalSGD
    # A torch parameter is a view of the policy's bucket: what an interrupted allreduce
    # leaves in the bucket is in the model. No optimizer: only the averaging moves w.
    w = torch.nn.Parameter(torch.full((13706,), float(peer.rank + 1)))
    policy = LocalSGD(period=4, elastic=True).attach(peer, [w])
    seen = []
    while policy.step < 12:
        if peer.rank == 3 and policy.step == victim_step:
            os.kill(os.getpid(), signal.SIGKILL)   # its partners are inside the allreduce
        policy.after_step()
        seen.append((policy.step, float(w.min()), float(w.max())))
    return seen, peer.world_size


@pytest.mark.slow
def test_an_elastic_local_sgd_peer_killed_in_the_averaging_leaves_the_others_at_their_mean():
    out = spawn(local_sgd_killed_before_averaging, n=4, timeout=90, tolerate=[3],
                peer_timeout=20, args=(7,))
    assert out[3] is None
    # 1, 2, 3, 4 averaged at step 4 to 2.5; the averaging of step 8, cut by the death, is
    # done again by the 3 survivors: 2.5 still (before: 5.0 = 2.5 + 2.5, a partial sum of the
    # recursive doubling, then 4.17 on every survivor). Unless every message the victim sent
    # in the averaging of step 4 was still in its process when it died (it arrived last, had
    # all it needed and went on to step 8 at once: seen once in 80 runs under load): then
    # that averaging is done again by the 3, to 2.0 everywhere.
    mean = out[0][0][-1][1]
    assert mean in (2.5, 2.0), out[0][0]
    for seen, world in out[:3]:
        assert world == 3
        off = [(step, lo, hi) for step, lo, hi in seen if step >= 4 and not lo == hi == mean]
        assert not off, (off, world)   # (the steps whose values are not the mean)


def local_sgd_victim_loses_its_last_message(peer, kind):
    import torch

    from gossip.policies import LocalSGD
    # torch: the parameter is a view of the bucket (restored from a copy after a loss);
    # numpy: the user's array is apart from it (the bucket is packed from it again).
    w = torch.nn.Parameter(torch.full((13706,), float(peer.rank + 1))) if kind == "torch" \
        else np.full(13706, float(peer.rank + 1), dtype=np.float32)
    policy = LocalSGD(period=4, elastic=True).attach(peer, [w])
    seen = []
    while policy.step < 8:
        if peer.rank == 3 and policy.step == 3:
            # A faulty victim: what it posts to rank 1 never leaves the process, as a send
            # still queued when a peer is killed. It gets all it needs (recursive doubling:
            # rank 2, then rank 1), completes the averaging and dies; rank 1 never can.
            post_chunk = peer._transport.post_chunk
            peer._transport.post_chunk = lambda dst, *a, **k: (
                None if dst == 1 else post_chunk(dst, *a, **k))
        if peer.rank == 3 and policy.step == 4:
            os.kill(os.getpid(), signal.SIGKILL)
        policy.after_step()
        seen.append((policy.step, float(w.min()), float(w.max())))
    return seen, peer.world_size


@pytest.mark.parametrize("kind", [pytest.param("torch", marks=pytest.mark.slow), "numpy"])
def test_an_elastic_local_sgd_survivor_left_inside_the_averaging_takes_the_others_state(kind):
    # Under load this happened by itself (1 run in 3 of the suite, 3 in 80 alone): the victim
    # completed the averaging of step 3 and was killed before its last send to rank 1 was
    # out. Ranks 0 and 2 went on from the mean, 2.5; rank 1 went on from its own 2.0 (its
    # model from before the averaging, restored), and the next averaging, done again by the
    # three, gave 7/3 on every replica: a wrong model, no error.
    # tcp: the scenario is recursive doubling's pattern (on one host with shared memory the
    # averaging is shm-small's, where a victim's lost announcement stops every peer alike).
    out = spawn(local_sgd_victim_loses_its_last_message, n=4, timeout=90, tolerate=[3],
                transport="tcp",
                peer_timeout=20, args=(kind,))
    assert out[3] is None
    # As in the test above: if the victim was killed before its sends to ranks 0 and 2 left
    # its process (seen 1 run in 30 of this test under the suite's load), no survivor
    # completed that averaging and the three do it again, to 2.0 on every replica.
    mean = out[0][0][-1][1]
    assert mean in (2.5, 2.0), out[0][0]
    for seen, world in out[:3]:
        assert world == 3
        off = [(step, lo, hi) for step, lo, hi in seen if step >= 4 and not lo == hi == mean]
        assert not off, (off, world)
    if mean == 2.5:
        # Rank 1 was the one behind: its averaging of step 3 failed, its step count jumped
        # to the source's.
        steps = [step for step, _, _ in out[1][0]]
        assert steps[:3] == [1, 2, 3] and steps[3] >= 4, steps
