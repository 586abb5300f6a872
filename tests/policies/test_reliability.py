"""Reliability with real peer processes: a peer killed with SIGKILL mid-training (the gossip
policies notice, drop it, heal the ring and finish within two accuracy points of a run without
the failure; the allreduce policies fail fast with PeerLost naming it), a straggler (the
asynchronous policy's other peers keep their pace), the opt-in NaN guard, and (slow) a long
asynchronous run whose memory stays flat and whose push-sum mass is conserved."""
from __future__ import annotations

import os
import signal
import threading
import time
import warnings

import numpy as np
import pytest

import gossip
import topologies
from gossip.errors import PeerLost
from gossip.testing import spawn
from helpers import batch_plan

N = 8
VICTIM = 3
KILL_STEP = 60
EPOCHS = 30
BATCH = 16
LR = 0.1
PEER_TIMEOUT = 10.0   # also the rendezvous deadline: 8 peers start slowly on 2 busy cores


# ---------------------------------------------------------------------------- helpers
def digits():
    """sklearn's digits, loaded once in the test process and handed to the peers (which then
    start without importing sklearn or torch)."""
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    perm = np.random.default_rng(0).permutation(len(x))
    x, y = (x[perm] / 16.0).astype(np.float64), y[perm].astype(np.int64)
    return x[360:], y[360:], x[:360], y[:360]      # train, test


def schedule(n: int, n_train: int, epochs: int = EPOCHS):
    return batch_plan(n, n_train, epochs, BATCH)


class Softmax:
    """A small model in numpy: softmax regression, 64 -> 10, trained by SGD with momentum."""

    def __init__(self) -> None:
        rng = np.random.default_rng(0)
        self.params = [rng.normal(scale=0.01, size=(64, 10)), np.zeros(10)]
        self.velocity = [np.zeros_like(p) for p in self.params]

    def step(self, x, y) -> None:
        w, b = self.params
        logits = x @ w + b
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        p[np.arange(len(y)), y] -= 1.0
        p /= len(y)
        for param, v, g in zip(self.params, self.velocity, (x.T @ p, p.sum(axis=0))):
            v *= 0.9
            v += g
            param -= LR * v        # in place: the policy holds these arrays


def accuracy_of(params: list, x, y) -> float:
    w, b = params
    return float(((x @ w + b).argmax(1) == y).mean() * 100)


def make_policy(name: str):
    if name == "asynchronous":
        return gossip.policies.Asynchronous(topology=topologies.Ring(N))
    if name == "push-sum":
        return gossip.policies.PushSum(topology=topologies.Ring(N))
    if name == "local-sgd":
        return gossip.policies.LocalSGD(period=2)
    if name == "elastic":
        return gossip.policies.ElasticAveraging(period=2)
    return gossip.policies.make(name)


def kill_self(marker_dir: str) -> None:
    with open(os.path.join(marker_dir, "killed"), "w") as f:
        f.write(repr(time.time()))
    os.kill(os.getpid(), signal.SIGKILL)


def killed_at(marker_dir: str) -> float:
    with open(os.path.join(marker_dir, "killed")) as f:
        return float(f.read())


# ---------------------------------------------------------------------------- a peer dies
def train_digits(peer, name, kill, marker_dir, data):
    xtr, ytr = data
    plan = schedule(peer.world_size, len(xtr))
    model = Softmax()
    policy = make_policy(name).attach(peer, model.params)
    dropped = getattr(policy, "dropped_peers", None)   # Asynchronous: pushes that failed too
    noticed = None
    scratch = np.linspace(0, 1, 20_000)
    peer.barrier()   # start together (slow process start-up must not look like a straggler)
    for step, batches in enumerate(plan):
        if kill and peer.rank == VICTIM and step == KILL_STEP:
            kill_self(marker_dir)
        idx = batches[peer.rank]
        model.step(xtr[idx], ytr[idx])
        np.sin(scratch, out=scratch)   # the rest of a real step's compute (~0.3 ms alone)
        policy.after_step()
        if noticed is None and (VICTIM in peer.lost_peers()
                                or dropped is not None and VICTIM in policy.dropped_peers):
            noticed = time.time()
    if name == "asynchronous":
        # Asynchronous peers run at their own pace: one may finish its steps before another
        # has begun. Each waits until every survivor is done, the victim is dead and both
        # its neighbours have healed around it, so they end together: a neighbour of the
        # victim has been there to notice, and neither neighbour leaves (and so looks lost)
        # before the other has added it to its pushes. Only a neighbour that has not healed
        # yet keeps stepping (without a gradient: a hand-over is where it heals); mixing on
        # for as long as the slowest peer takes would measure a consensus, not training.
        def marker(what: str) -> str:
            return os.path.join(marker_dir, f"{what}-{kill}")

        open(marker(f"done-{peer.rank}"), "w").close()
        survivors = [r for r in range(peer.world_size) if not (kill and r == VICTIM)]
        neighbours = ((VICTIM - 1) % N, (VICTIM + 1) % N)
        deadline = time.monotonic() + 60

        def finished() -> bool:
            if (kill and peer.rank in neighbours and VICTIM in policy.healed_around
                    and not os.path.exists(marker(f"healed-{peer.rank}"))):
                open(marker(f"healed-{peer.rank}"), "w").close()
            return all(os.path.exists(marker(f"done-{r}")) for r in survivors) and (
                not kill or os.path.exists(os.path.join(marker_dir, "killed")) and all(
                    os.path.exists(marker(f"healed-{r}")) for r in neighbours))
        while not finished() and time.monotonic() < deadline:
            threading.Event().wait(0.002)
            if kill and peer.rank in neighbours and VICTIM not in policy.healed_around:
                policy.after_step()
            if noticed is None and (VICTIM in peer.lost_peers()
                                    or VICTIM in policy.dropped_peers):
                noticed = time.time()
    stats = policy.stats()
    params = [p.copy() for p in model.params]
    policy.close()
    return {"params": params, "noticed": noticed, "stats": stats}


# asynchronous and push-sum under -m slow (10-12 s each; test_demo kills them too).
@pytest.mark.parametrize("name", ["gossip", pytest.param("asynchronous", marks=pytest.mark.slow), pytest.param("push-sum", marks=pytest.mark.slow)])
def test_gossip_policies_survive_a_killed_peer_and_heal_the_ring(name, tmp_path):
    xtr, ytr, xte, yte = digits()
    clean = spawn(train_digits, n=N, timeout=120, topology=topologies.Ring(N),
                  peer_timeout=PEER_TIMEOUT, args=(name, False, str(tmp_path), (xtr, ytr)))
    out = spawn(train_digits, n=N, timeout=120, topology=topologies.Ring(N),
                peer_timeout=PEER_TIMEOUT, tolerate=[VICTIM],
                args=(name, True, str(tmp_path), (xtr, ytr)))
    assert out[VICTIM] is None
    survivors = [r for r in range(N) if r != VICTIM]
    t_kill = killed_at(str(tmp_path))
    steps = len(schedule(N, len(xtr)))
    left, right = (VICTIM - 1) % N, (VICTIM + 1) % N
    for r in survivors:
        stats = out[r]["stats"]
        assert stats["steps"] >= steps, (r, stats)
        if r in (left, right):
            # The dead rank's neighbours notice within the timeout ...
            assert out[r]["noticed"] is not None, (r, stats)
            assert out[r]["noticed"] - t_kill <= PEER_TIMEOUT, (r, out[r]["noticed"] - t_kill)
            # ... and become neighbours of each other: the ring heals around the gap.
            other = right if r == left else left
            if name == "asynchronous":
                assert other in stats["rotation"], (r, stats["rotation"], stats["dropped_peers"],
                                                    stats["healed_around"])
            else:
                assert other in stats["healed_links"], (r, stats)
    # The survivors' average model against the average model of a run without the failure.
    mean_clean = [np.mean([clean[r]["params"][k] for r in range(N)], axis=0) for k in (0, 1)]
    mean_failed = [np.mean([out[r]["params"][k] for r in survivors], axis=0) for k in (0, 1)]
    acc_clean = accuracy_of(mean_clean, xte, yte)
    acc_failed = accuracy_of(mean_failed, xte, yte)
    own_clean = [accuracy_of(clean[r]["params"], xte, yte) for r in range(N)]
    own = [accuracy_of(out[r]["params"], xte, yte) for r in survivors]
    print(f"{name}: average model {acc_clean:.2f}% without the failure, {acc_failed:.2f}% "
          f"with rank {VICTIM} killed at step {KILL_STEP} of {steps}; peers' own models "
          f"{min(own_clean):.2f}-{max(own_clean):.2f}% / {min(own):.2f}-{max(own):.2f}%; "
          f"detection by ranks {left}, {right}: "
          f"{[round(out[r]['noticed'] - t_kill, 3) for r in (left, right)]} s")
    assert acc_failed >= acc_clean - 2.0, (acc_clean, acc_failed)
    assert min(own) >= min(own_clean) - 5.0, (own_clean, own)


def fail_fast(peer, name, marker_dir, data):
    xtr, ytr = data
    plan = schedule(peer.world_size, len(xtr), epochs=2)
    model = Softmax()
    policy = make_policy(name).attach(peer, model.params)
    for step, batches in enumerate(plan):
        if peer.rank == VICTIM and step == 10:
            kill_self(marker_dir)
        idx = batches[peer.rank]
        model.step(xtr[idx], ytr[idx])
        try:
            policy.after_step()
        except PeerLost as exc:
            raised = time.time()
            return {"rank": exc.rank, "at": raised, "step": step, "message": str(exc),
                    "policy_steps": policy.step}
    return {"rank": None, "step": len(plan)}


# local-sgd under -m slow: in the final .ci/run of 2026-12-01 rank 4 of 8 blamed rank 7 (which
# had closed after its own PeerLost) instead of the dead rank 3. Not fixed (README, Known limits).
@pytest.mark.parametrize("name", ["synchronous", pytest.param("local-sgd", marks=pytest.mark.slow),
                                  "elastic"])
def test_allreduce_policies_raise_peer_lost_naming_the_dead_rank(name, tmp_path):
    xtr, ytr, _, _ = digits()
    out = spawn(fail_fast, n=N, timeout=90, peer_timeout=PEER_TIMEOUT, tolerate=[VICTIM],
                args=(name, str(tmp_path), (xtr, ytr)))
    t_kill = killed_at(str(tmp_path))
    delays = {}
    for r in range(N):
        if r == VICTIM:
            continue
        result = out[r]
        assert result["rank"] == VICTIM, (r, result)
        assert f"rank {VICTIM}" in result["message"], result["message"]
        # The failed step is not counted as done (no partial result passed off as complete).
        assert result["policy_steps"] == result["step"], result
        delays[r] = result["at"] - t_kill
    print(f"{name}: PeerLost raised {sorted(round(d, 3) for d in delays.values())} s after "
          "the kill")
    assert max(delays.values()) <= PEER_TIMEOUT + 2.0, delays


def closes_after_a_loss(peer, marker_dir):
    from gossip.testing import wait_until
    peer.barrier()       # every peer is past its start ...
    open(os.path.join(marker_dir, f"started-{peer.rank}"), "w").close()
    if peer.rank == 2:   # ... and out of the barrier (a ring of a dead peer cannot be mapped)
        wait_until(lambda: all(os.path.exists(os.path.join(marker_dir, f"started-{r}"))
                               for r in (0, 1)), 30, what="ranks 0 and 1 past the barrier")
        kill_self(marker_dir)
    if peer.rank == 0:   # rank 2 folds into rank 0 (recursive doubling of 3): this one fails
        peer.send(1, np.ones(10))   # (a link to rank 1: its goodbye goes there)
        try:
            peer.allreduce(np.ones(10))
        except PeerLost as exc:
            return exc.rank, str(exc)
        return None, "the allreduce completed without rank 2"
    peer.recv(0, np.zeros(10))
    try:                 # rank 1 waits on rank 0 elsewhere, until rank 0 gives up and closes
        peer.recv(0, np.zeros(10))
    except PeerLost as exc:
        return exc.rank, str(exc)
    return None, "rank 0 sent"


def test_a_peer_waiting_on_one_that_closed_after_a_loss_blames_the_lost_rank(tmp_path):
    # Rank 0 fails its allreduce for rank 2's death, then closes. Rank 1 was waiting on rank 0
    # in a point-to-point receive (an operation rank 0 never took part in, so no ABORT of
    # rank 0's reaches it): the goodbye of rank 0 says why it closed, and rank 1 names rank 2.
    # Before, rank 1 blamed rank 0 ("it closed its peer (left the group)"), as one survivor
    # of 8 did under load in a full run (a rank that had closed after its own PeerLost).
    out = spawn(closes_after_a_loss, n=3, timeout=60, peer_timeout=10, tolerate=[2],
                args=(str(tmp_path),))
    assert out[0][0] == 2, out[0]
    assert out[1][0] == 2, out[1]
    assert "rank 2" in out[1][1] and "reported by rank 0" in out[1][1], out[1][1]


# ---------------------------------------------------------------------------- stragglers
def straggler(peer, marker_dir, slow_steps):
    """Rank 1 is ten times slower (it sleeps nine times its compute time after each step);
    the others step until it has done ``slow_steps`` steps."""
    x = np.random.default_rng(peer.rank).normal(size=5_000).astype(np.float32)
    scratch = np.linspace(0, 1, 200_000)   # a few milliseconds of compute per step
    policy = gossip.policies.Asynchronous().attach(peer, [x])
    done = os.path.join(marker_dir, "slow-done")
    peer.barrier()
    steps = 0
    while True:
        start = time.perf_counter()
        for _ in range(4):
            np.sin(scratch, out=scratch)
        x -= 1e-3 * x
        if peer.rank == 1:
            time.sleep(9 * (time.perf_counter() - start))
        policy.after_step()
        steps += 1
        if peer.rank == 1 and steps == slow_steps:
            open(done, "w").close()
            break
        if peer.rank != 1 and os.path.exists(done):
            break
    stats = policy.stats()
    peer.barrier()
    policy.close()
    return steps, stats["lightest_weight"], stats.get("min_weight", 1.0)   # (push only)


def test_asynchronous_fast_peers_keep_their_pace_beside_a_straggler(tmp_path):
    slow_steps = 12
    out = spawn(straggler, n=4, timeout=90, args=(str(tmp_path), slow_steps))
    print(f"steps in the window of the straggler's {slow_steps}: {[o[0] for o in out]}")
    assert out[1][0] == slow_steps
    for rank in (0, 2, 3):
        # Ten times faster in the same window, less what CPU contention takes (4 peers on 2
        # cores; with the straggler 5x slower, a full run under load gave 2.9x): at least 3x.
        assert out[rank][0] >= 3 * slow_steps, [o[0] for o in out]
    for _, lightest, min_weight in out:
        assert lightest >= min_weight / 2


# ---------------------------------------------------------------------------- NaN guard
def nan_guard(peer, name):
    import torch
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 10))
    policy = gossip.policies.make(name, nan_guard=True)
    opt = gossip.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), peer=peer,
                                      policy=policy)
    rng = np.random.default_rng(peer.rank)
    caught = []
    finite_sent = True
    for step in range(6):
        x = torch.from_numpy(rng.normal(size=(8, 64)).astype(np.float32))
        if step == 3 and peer.rank == 1:
            x[0, 0] = float("nan")        # rank 1's gradients are NaN at step 3
        opt.zero_grad()
        model(x).square().mean().backward()
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            opt.step()
        caught += [str(w.message) for w in got if issubclass(w.category, RuntimeWarning)]
        finite_sent &= all(bool(torch.isfinite(p).all()) for p in model.parameters())
    state = [p.detach().numpy().copy() for p in model.parameters()]
    stats = opt.stats()
    peer.barrier()
    opt.close()
    return caught, finite_sent, state, stats["skipped_steps"]


# gossip, asynchronous and push-sum under -m slow (the 10-minute budget).
@pytest.mark.parametrize("name", ["synchronous", pytest.param("gossip", marks=pytest.mark.slow), pytest.param("asynchronous", marks=pytest.mark.slow), pytest.param("push-sum", marks=pytest.mark.slow)])
def test_nan_guard_skips_the_step_everywhere_synchronous_and_keeps_neighbours_finite(name):
    pytest.importorskip("torch")
    out = spawn(nan_guard, n=4, timeout=60, args=(name,))
    for rank, (caught, finite, state, skipped) in enumerate(out):
        assert finite, (rank, caught)
        assert all(np.isfinite(s).all() for s in state)
        if name == "synchronous" or rank == 1:
            # Synchronous: the averaged gradient is NaN on every replica, so all skip step 3.
            assert skipped == 1, (rank, skipped, caught)
            assert any(f"rank {rank}: step 3" in c for c in caught), caught
        else:
            assert skipped == 0, (rank, caught)
    if name == "synchronous":
        assert all(all(np.array_equal(a, b) for a, b in zip(out[0][2], o[2])) for o in out)


# ---------------------------------------------------------------------------- long runs
LONG_SECONDS = float(os.environ.get("GOSSIP_LONG_RUN_SECONDS", "600"))


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def long_run(peer, seconds):
    x = np.random.default_rng(peer.rank).normal(size=100_000)
    policy = gossip.policies.Asynchronous().attach(peer, [x])
    rng = np.random.default_rng(1000 + peer.rank)
    peer.barrier()
    start = time.monotonic()
    warm = start + min(30.0, seconds / 4)
    samples = []
    steps = 0
    next_sample = start
    while time.monotonic() - start < seconds:
        x -= 1e-4 * (x - peer.rank)                   # a local "gradient step"
        threading.Event().wait(float(rng.exponential(0.004)))   # a random delay
        policy.after_step()
        steps += 1
        now = time.monotonic()
        if now >= next_sample:
            samples.append((now - start, rss_bytes()))
            next_sample = now + 1.0
    policy.quiesce()
    weights = np.array(policy.weights, dtype=np.float64)
    total = weights.copy()
    peer.allreduce(total, op="sum")
    stats = policy.stats()
    peer.barrier()
    policy.close()
    after_warm = [rss for t, rss in samples if t >= warm - start]
    return {"steps": steps, "total_weight": total.tolist(), "rss_warm": after_warm[0],
            "rss_end": after_warm[-1], "rss_max": max(after_warm),
            "absorbed": stats["messages_absorbed"], "rounds": stats["background_rounds"]}


@pytest.mark.slow
# Its own deadline: the run lasts LONG_SECONDS (600 by default), past the suite's --timeout.
@pytest.mark.timeout(LONG_SECONDS + 240)
def test_long_asynchronous_run_memory_is_flat_and_push_sum_mass_is_conserved():
    out = spawn(long_run, n=N, timeout=LONG_SECONDS + 180, args=(LONG_SECONDS,))
    for rank, r in enumerate(out):
        growth = r["rss_end"] - r["rss_warm"]
        print(f"rank {rank}: {r['steps']} steps, {r['rounds']} pushes, {r['absorbed']} "
              f"absorbed; RSS {r['rss_warm'] / 2**20:.1f} MiB after warm-up, "
              f"{r['rss_end'] / 2**20:.1f} MiB at the end (max {r['rss_max'] / 2**20:.1f}); "
              f"total weight {r['total_weight']}")
        assert all(abs(w - N) <= 1e-9 for w in r["total_weight"]), r["total_weight"]
        assert growth <= 16 * 2**20, (rank, growth)
