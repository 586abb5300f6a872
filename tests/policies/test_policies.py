"""Averaging policies on numpy arrays, with real peers: the invariants each update rule
promises (gossip keeps the mean and contracts at the spectral rate, push-sum conserves mass and
de-biases, elastic averaging conserves workers + centre), the schedule of local SGD, and the
API (names, arguments, state dicts, threads stopped by close)."""
from __future__ import annotations

import hashlib
import threading
import warnings

import numpy as np
import pytest

import gossip
import topologies
from gossip.policies import (Asynchronous, BucketSet, ElasticAveraging, Gossip, LocalSGD,
                             PushSum, Synchronous)
from gossip.testing import spawn

ROUNDS = 40
LENGTH = 512


# ---------------------------------------------------------------------------- gossip (D-PSGD)
def gossip_rounds(peer):
    rng = np.random.default_rng(100 + peer.rank)
    x = rng.normal(size=LENGTH)
    ring = Gossip().attach(peer, [x])                       # the peer's topology: Ring(8)
    history = [x.copy()]
    for _ in range(ROUNDS):
        ring.after_step()
        history.append(x.copy())
    ring.close()
    y = rng.normal(size=LENGTH)
    y0 = y.copy()
    exp = Gossip(topology=topologies.OnePeerExponential(peer.world_size)).attach(peer, [y])
    for _ in range(3):
        exp.after_step()
    exp.close()
    return np.array(history), y0, y


def test_gossip_keeps_the_mean_and_contracts_at_the_spectral_rate():
    ring = topologies.Ring(8)
    results = spawn(gossip_rounds, n=8, timeout=60, topology=ring)
    hist = np.stack([r[0] for r in results])            # (peer, round, element)
    mean0 = hist[:, 0].mean(axis=0)
    for t in range(ROUNDS + 1):
        assert np.allclose(hist[:, t].mean(axis=0), mean0, rtol=0, atol=1e-12 * np.abs(
            mean0).max())
    dist = np.sqrt(((hist - hist.mean(axis=0, keepdims=True)) ** 2).sum(axis=(0, 2)))
    # Past the first rounds only the slowest mode is left: the disagreement shrinks by the
    # second eigenvalue of W per round, (1 + 2 cos(2 pi / 8)) / 3 for Metropolis on a ring.
    measured = (dist[ROUNDS] / dist[10]) ** (1 / (ROUNDS - 10))
    predicted = ring.second_eigenvalue()
    assert predicted == pytest.approx((1 + 2 * np.cos(np.pi / 4)) / 3, rel=1e-12)
    assert measured == pytest.approx(predicted, rel=0.02), (measured, predicted)
    # OnePeerExponential(8): three rounds, each peer has the exact average.
    start = np.stack([r[1] for r in results])
    finish = np.stack([r[2] for r in results])
    mean = start.mean(axis=0)
    assert np.allclose(finish, mean[None], rtol=0, atol=1e-13 * np.abs(start).max())


# ---------------------------------------------------------------------------- push-sum
# Directed, strongly connected, out-degrees 3, 2, 1, 1, 1: the push matrix is column- but
# not row-stochastic, so plain gossip (x alone) would converge to a biased average.
DIRECTED_EDGES = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 0), (0, 2), (0, 3), (1, 3)]


def push_sum_rounds(peer, overlap):
    graph = topologies.from_edges(peer.world_size, DIRECTED_EDGES, directed=True)
    rng = np.random.default_rng(7 + peer.rank)
    x = rng.normal(loc=peer.rank, size=LENGTH)
    policy = PushSum(topology=graph, overlap=overlap).attach(peer, [x])
    sums = []
    for step in range(60):
        policy.after_step()
        if overlap and step < 59:
            # An exchange is in flight: its mass is in nobody's numerator yet.
            continue
        policy.flush()       # (overlap) complete the exchange in flight: all mass at home
        z = np.concatenate([policy.numerators[0], [policy.weights[0]]])
        peer.allreduce(z, op="sum")
        sums.append(z)
    numerator = policy.numerators[0].copy()
    weight = policy.weights[0]
    policy.close()
    return np.array(sums), x, numerator, weight


@pytest.mark.parametrize("overlap", [False, True])
def test_push_sum_conserves_mass_and_debiases_on_a_directed_graph(overlap):
    n = 5
    graph = topologies.from_edges(n, DIRECTED_EDGES, directed=True)
    w = graph.mixing_matrix()
    assert np.allclose(w.sum(axis=0), 1) and not np.allclose(w.sum(axis=1), 1)
    results = spawn(push_sum_rounds, n=n, timeout=60, args=(overlap,))
    start = np.stack([np.random.default_rng(7 + r).normal(loc=r, size=LENGTH)
                      for r in range(n)])
    total = start.sum(axis=0)
    sums = results[0][0]                                   # (round, LENGTH + 1), every peer's
    assert np.allclose(sums[:, :-1], total[None], rtol=0, atol=1e-12 * np.abs(total).max())
    assert np.allclose(sums[:, -1], n, rtol=0, atol=1e-12 * n)
    mean = total / n
    debiased = np.stack([r[1] for r in results])
    assert np.allclose(debiased, mean[None], rtol=0, atol=1e-9)
    # The numerators alone are biased: x_i tends to n * pi_i * mean with pi the (non-uniform)
    # stationary distribution of the push matrix.
    weights = np.array([r[3] for r in results])
    assert np.ptp(weights) > 0.2
    bias = max(np.abs(r[2] - mean).max() for r in results)
    assert bias > 0.1


def push_sum_one_peer_exponential(peer):
    x = np.full(8, float(peer.rank))
    policy = PushSum().attach(peer, [x])            # default: OnePeerExponential(4)
    policy.after_step()
    policy.after_step()
    weights = policy.weights
    policy.close()
    return x, weights


def test_push_sum_default_schedule_averages_exactly_in_log2_n_rounds():
    for x, weights in spawn(push_sum_one_peer_exponential, n=4, timeout=60):
        assert np.array_equal(x, np.full(8, 1.5)) and weights == [1.0]


# ---------------------------------------------------------------------------- elastic
def elastic_rounds(peer, center):
    n = peer.world_size
    rng = np.random.default_rng(11 + peer.rank)
    x = rng.normal(size=LENGTH)
    target = rng.normal(size=LENGTH)
    policy = ElasticAveraging(period=2, center=center).attach(peer, [x])
    assert policy.alpha == pytest.approx(0.9 / n)

    def invariant():
        # sum_i x_i + c, with the centre assembled from its shards when sharded.
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

    drift = []
    for step in range(40):
        before = invariant()
        local = 0.05 * (target - x)     # a local "gradient step" towards this peer's target
        x += local
        moved = local.copy()
        peer.allreduce(moved, op="sum")
        policy.after_step()
        after = invariant()
        # The elastic exchange moves mass between workers and centre, never creates it.
        drift.append(np.abs(after - (before + moved)).max() / np.abs(before).max())
    digest = hashlib.sha1(np.ascontiguousarray(policy.center[0]).tobytes()).hexdigest()
    stats = policy.stats(consensus=True)
    peer.barrier()
    policy.close()
    return max(drift), digest, stats


@pytest.mark.parametrize("center", ["replicated", "sharded"])
def test_elastic_averaging_conserves_workers_plus_centre(center):
    results = spawn(elastic_rounds, n=4, timeout=60, args=(center,))
    for drift, _, stats in results:
        assert drift < 1e-13
        assert stats["elastic_rounds"] == 20
    if center == "replicated":
        assert len({digest for _, digest, _ in results}) == 1   # bitwise identical centres
    else:
        assert all(stats["requests_served"] > 0 for _, _, stats in results)


# ---------------------------------------------------------------------------- local SGD
def test_local_sgd_schedule_and_arguments():
    policy = LocalSGD(3, warmup_steps=2)
    assert [t for t in range(12) if policy.averages_at(t)] == [0, 1, 4, 7, 10]
    with pytest.warns(UserWarning, match="synchronous SGD"):
        LocalSGD(period=1)
    for bad in (0, -1, 2.5, True, "4"):
        with pytest.raises(ValueError, match="period"):
            LocalSGD(bad)
    with pytest.raises(ValueError, match="warmup_steps"):
        LocalSGD(4, warmup_steps=-1)


# ---------------------------------------------------------------------------- API
def test_policy_names_resolve():
    assert gossip.policies.names() == ["synchronous", "local-sgd", "gossip", "asynchronous",
                                       "push-sum", "easgd", "choco"]
    kinds = {"synchronous": Synchronous, "local-sgd": LocalSGD, "gossip": Gossip,
             "asynchronous": Asynchronous, "push-sum": PushSum, "easgd": ElasticAveraging,
             "elastic": ElasticAveraging}   # "elastic": EASGD's earlier name, an alias
    for name, cls in kinds.items():
        assert type(gossip.policies.make(name)) is cls
    assert type(gossip.policies.make("Local_SGD", period=8)) is LocalSGD
    with pytest.raises(ValueError, match="known policies: synchronous, local-sgd, gossip"):
        gossip.policies.make("allreduce")
    with pytest.raises(TypeError, match="instance"):
        gossip.policies.resolve(Gossip)


def test_bad_arguments_raise_clear_errors():
    cases = [
        (lambda: ElasticAveraging(alpha=1.5), "alpha"),
        (lambda: ElasticAveraging(alpha=0.0), "alpha"),
        (lambda: ElasticAveraging(alpha=float("nan")), "alpha"),
        (lambda: ElasticAveraging(period=0), "period"),
        (lambda: ElasticAveraging(center="everywhere"), "center"),
        (lambda: Asynchronous(max_staleness=-1), "max_staleness"),
        (lambda: Asynchronous(channel=0), "channel"),
        (lambda: Asynchronous(poll_interval=0), "poll_interval"),
        (lambda: Gossip(bucket_bytes=0), "bucket_bytes"),
        (lambda: PushSum(timeout=-1), "timeout"),
        (lambda: BucketSet([]), "no parameters"),
        (lambda: BucketSet([np.zeros(3)] * 2), "twice"),
    ]
    for make, match in cases:
        with pytest.raises(ValueError, match=match):
            make()
    with pytest.raises(TypeError, match="floating dtype"):
        BucketSet([np.zeros(3, dtype=np.int64)])
    with pytest.raises(TypeError, match="all torch tensors or all numpy"):
        BucketSet([np.zeros(3), [1.0, 2.0]])
    with pytest.raises(TypeError, match="gossip.Peer"):
        Gossip().attach(object(), [np.zeros(3)])


def test_buckets_pack_by_dtype_and_size_and_round_trip():
    params = [np.arange(10.0), np.ones((3, 4), dtype=np.float32), np.arange(300.0),
              np.zeros(2, dtype=np.float32)]
    buckets = BucketSet(params, bucket_bytes=1024)
    assert [b.numel for b in buckets] == [10, 14, 300]   # 300 float64 alone: over 1 KiB
    assert buckets.numel == 324
    buckets.buckets[0].flat[:] = -1
    buckets.copy_out()
    assert np.array_equal(params[0], np.full(10, -1.0))
    params[2][:] = 5
    buckets.copy_in()
    assert np.array_equal(buckets.buckets[2].flat, np.full(300, 5.0))


def elastic_stability(peer):
    out = []
    for alpha in (0.45, 0.3):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                ElasticAveraging(alpha=alpha).attach(peer, [np.zeros(4)]).close()
                out.append(("ok", [str(w.message) for w in caught]))
            except ValueError as exc:
                out.append(("ValueError", str(exc)))
    policy = PushSum(topology=topologies.Ring(3))
    try:
        policy.attach(peer, [np.zeros(4)])
        out.append("attached")
    except ValueError as exc:
        out.append(str(exc))
    return out


def test_elastic_refuses_diverging_settings_and_warns_on_suspicious_ones():
    for result in spawn(elastic_stability, n=4, timeout=60):
        (kind1, text1), (kind2, warned), topo = result
        assert kind1 == "ValueError" and "diverges" in text1 and "alpha + beta >= 2" in text1
        assert kind2 == "ok" and any("beta = n alpha = 1.2" in w for w in warned)
        assert "3 peers but the world size is 4" in topo


# ---------------------------------------------------------------------------- every policy
POLICY_CASES = [
    ("synchronous", {}), ("local-sgd", {"period": 2}), ("gossip", {}), ("push-sum", {}),
    ("push-sum", {"overlap": True}), ("asynchronous", {}),
    ("asynchronous", {"max_staleness": 0}), ("elastic", {"period": 2}),
    ("elastic", {"period": 2, "center": "sharded"}),
]


def every_policy(peer):
    out = {}
    for name, kwargs in POLICY_CASES:
        rng = np.random.default_rng(peer.rank)
        params = [rng.normal(size=(20, 5)), rng.normal(size=7).astype(np.float32)]
        policy = gossip.policies.make(name, **kwargs).attach(peer, params)
        for _ in range(6):
            params[0] *= 0.99
            policy.after_backward()
            policy.after_step()
        state = policy.state_dict()
        policy.load_state_dict(state)
        stats = policy.stats(consensus=True)
        peer.barrier()
        policy.close()
        policy.close()   # idempotent
        threads = [t.name for t in threading.enumerate()
                   if t.name.startswith(("gossip-async", "gossip-easgd"))]
        with pytest.raises(RuntimeError, match="closed"):
            policy.after_step()
        out[f"{name}{kwargs}"] = (stats, state, threads,
                                  all(np.isfinite(p).all() for p in params))
    return out


def test_every_policy_runs_reports_and_stops_its_threads():
    results = spawn(every_policy, n=4, timeout=90)
    for rank, result in enumerate(results):
        for case, (stats, state, threads, finite) in result.items():
            assert threads == [], (case, threads)
            assert finite, case
            assert stats["steps"] == 6 and state["step"] == 6, case
            assert stats["comm_seconds"] > 0 and stats["compute_seconds"] > 0, case
            # The background thread may not have pushed yet; everything else has sent.
            assert stats["bytes_sent"] > 0 or case.startswith("asynchronous"), case
            assert stats["consensus_distance"] >= 0, case
            if case.startswith(("synchronous", "local-sgd")):
                assert stats["consensus_distance"] == 0.0, case
            if "max_staleness" in case:
                # Every step waited for a push that included it: the thread pushed 6 times.
                assert stats["background_rounds"] >= 6 and stats["bytes_sent"] > 0, stats


# ---------------------------------------------------------------------------- issue 5 defects
def wait_any_and_probe(peer, marker):
    import time

    from gossip.errors import PeerLost
    comm = peer.communicator
    others = [r for r in range(peer.world_size) if r != peer.rank]
    if peer.rank == 0:
        assert comm.wait_any(others, 0) is None          # nothing sent yet: just a look
        start = time.monotonic()
        assert comm.wait_any(others, 0.3) is None        # waits out its timeout
        waited = time.monotonic() - start
        peer.barrier()
        src = comm.wait_any(others, 30)                  # woken by rank 2's message
        got = peer.recv(src).tolist()
        peer.barrier()
        # Rank 1 sent one message, then left: the message stays receivable, then the lost
        # source is not ready (probe False) and recv raises PeerLost.
        from gossip.testing import wait_until
        wait_until(lambda: 1 in peer.lost_peers(), 20, what="rank 1 lost")
        queued = peer.probe(1)
        last = peer.recv(1).tolist()
        after = peer.probe(1), comm.wait_any([1], 0)
        try:
            peer.recv(1, timeout=5)
            raised = None
        except PeerLost as exc:
            raised = exc.rank
        return waited, src, got, queued, last, after, raised
    peer.barrier()
    if peer.rank == 2:
        peer.send(0, np.array([2.0, 2.0]))
    peer.barrier()
    if peer.rank == 1:
        peer.send(0, np.array([1.0]))
        peer.close()
    return None


def test_wait_any_wakes_on_a_message_and_probe_is_false_for_a_lost_source(tmp_path):
    out = spawn(wait_any_and_probe, n=3, timeout=60, peer_timeout=10, args=(str(tmp_path),))
    waited, src, got, queued, last, after, raised = out[0]
    assert waited >= 0.3
    assert src == 2 and got == [2.0, 2.0]
    assert queued is True and last == [1.0]
    assert after == (False, None)
    assert raised == 1


def async_idle_and_peer_close(peer):
    import time
    x = np.random.default_rng(peer.rank).normal(size=1000)
    policy = Asynchronous().attach(peer, [x])
    for _ in range(5):
        policy.after_step()
    peer.barrier()
    before = policy.stats()["receiver_wakeups"]
    threading.Event().wait(1.0)     # idle: no steps, so (almost) no messages
    idle_wakeups = policy.stats()["receiver_wakeups"] - before
    peer.barrier()
    start = time.monotonic()
    peer.close()                    # closes the policy first: its threads stop
    took = time.monotonic() - start
    threads = [t.name for t in threading.enumerate() if t.name.startswith("gossip-async")]
    return idle_wakeups, policy.closed, threads, took, peer.policies


def test_asynchronous_thread_sleeps_until_a_message_and_peer_close_stops_it():
    for idle_wakeups, closed, threads, took, left in spawn(async_idle_and_peer_close, n=4,
                                                           timeout=60):
        # A 2 ms poll woke 500 times in that second; the inbox wakes the thread only on an
        # arrival, and a 0.25 s timeout bounds how long it sleeps.
        assert idle_wakeups < 40, idle_wakeups
        assert closed and threads == [] and left == []


def async_move_after_a_fold(peer):
    from gossip.testing import wait_until
    x = np.full(1000, float(peer.rank))
    policy = Asynchronous(exchange="push", push_fraction=0.5).attach(peer, [x])   # (halves)
    move = np.linspace(-1.0, 1.0, x.size)

    def absorbed(count):
        wait_until(lambda: policy.stats()["messages_absorbed"] >= count, 30,
                   what=f"push {count} of the other peer")

    # One push at a time, so what each fold takes is known: pushes leave only from
    # after_step(), and a barrier orders each peer's call after the other's push arrived.
    if peer.rank == 0:
        policy.after_step()             # pushes (0, 1/2), keeps (0, 1/2)
    peer.barrier()
    if peer.rank == 1:                  # after_backward() folds in before the move
        absorbed(1)
        policy.after_backward()         # (1, 1) + (0, 1/2): m = 2/3, w = 3/2
        assert np.allclose(x, 2 / 3, rtol=0, atol=1e-15), x[:3]
        x += move
        policy.after_step()             # no fold (done), pushes (2/3 + move, 3/4)
    peer.barrier()
    if peer.rank == 0:                  # a loop that calls only after_step(): the anchor path
        absorbed(1)
        x += move
        policy.after_step()
    result = x.copy()
    peer.barrier()
    policy.quiesce()
    policy.close()
    return result, move


def test_asynchronous_move_counts_fully_with_or_without_after_backward():
    # Rank 1 folds rank 0's push (0, 1/2) into (1, 1) before its move: 2/3, and the move
    # lands on top, undiluted. Rank 0, after its move, folds rank 1's push (2/3 + move, 3/4)
    # into its pre-move pair (0, 1/2): 3/5 (2/3 + move), and its own move lands on top.
    # Before, both peers pushed at once and a fold could take the other's push early (under
    # load: 2/3 where the test expected 1/2, the other peer's push folded before its own).
    (r0, move), (r1, _) = spawn(async_move_after_a_fold, n=2, timeout=60)
    assert np.allclose(r1, 2 / 3 + move, rtol=0, atol=1e-15)
    assert np.allclose(r0, 0.6 * (2 / 3 + move) + move, rtol=0, atol=1e-14)


def quiesce_beside_a_user_send(peer):
    n, r = peer.world_size, peer.rank
    x = np.full(100, float(r))
    policy = Asynchronous().attach(peer, [x])
    for _ in range(5):
        policy.after_step()
    # The user's own message, of the very dtype and size of quiesce()'s counts, still waiting
    # on the peer's communicator: quiesce() must neither take it for a count nor consume it.
    peer.send((r + 1) % n, np.array([999], dtype=np.int64))
    policy.quiesce(timeout=20)
    mine = peer.recv((r - 1) % n, np.zeros(1, dtype=np.int64))
    policy.close()
    return int(mine[0])


def test_quiesce_leaves_the_users_own_messages_alone():
    # Before quiesce() had a communicator of its own, it took the 999 for a count and waited
    # for 999 pushes until its timeout.
    assert spawn(quiesce_beside_a_user_send, n=3, timeout=90, peer_timeout=30) == [999] * 3


def send_to_a_peer_that_never_was(peer, marker):
    import os
    import signal
    import time

    from gossip.errors import OperationTimeout, PeerLost
    from gossip.testing import wait_until
    if peer.rank == 1:
        with open(marker, "w") as f:
            f.write(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)

    def dead():
        try:
            pid = int(open(marker).read())
        except (OSError, ValueError):
            return False
        try:
            return open(f"/proc/{pid}/stat").read().split(")")[-1].split()[0] in "ZX"
        except OSError:
            return True
    wait_until(dead, 30, what="rank 1's death")
    pid = int(open(marker).read())
    try:
        state = open(f"/proc/{pid}/stat").read()
    except OSError as exc:
        state = repr(exc)
    outcomes = [(peer.transport.reached(1), peer.transport.address(1), peer.lost_peers(),
                 pid, state[:80])]
    for size in (3, 1 << 20):            # an untracked small message and a tracked big one
        start = time.monotonic()
        try:
            peer.send(1, np.ones(size), timeout=2.0)
            outcomes.append(("sent", time.monotonic() - start))
        except (PeerLost, OperationTimeout) as exc:
            outcomes.append((type(exc).__name__, time.monotonic() - start, exc.rank))
    return outcomes


def test_a_send_to_a_peer_dead_before_any_connection_raises_within_the_timeout(tmp_path):
    out = spawn(send_to_a_peer_that_never_was, n=2, timeout=60, tolerate=[1],
                args=(str(tmp_path / "pid"),))
    for outcome in out[0][1:]:
        assert outcome[0] in ("PeerLost", "OperationTimeout"), out[0]
        assert outcome[2] == 1
        assert outcome[1] < 2.0 + 3.0, out[0]   # the send's own timeout bounds it


def test_round_plans_fold_lost_peers_and_merge_healed_edges():
    from gossip.policies.neighborhood import mixing_round, push_round

    ring = topologies.Ring(4)
    third = 1 / 3
    plan = mixing_round(ring, 0, 0)
    assert plan.src_weights == pytest.approx({1: third, 3: third})
    assert sorted(plan.dst_ranks) == [1, 3] and plan.dst_weights is None
    # Rank 1 lost, an edge to rank 2 healed around it with weight 0.25.
    plan = mixing_round(ring, 0, 0, lost={1: "gone"}, healed={2: 0.25})
    assert plan.self_weight == pytest.approx(2 * third - 0.25)
    assert plan.src_weights == pytest.approx({3: third, 2: 0.25})
    assert sorted(plan.dst_ranks) == [2, 3]
    assert plan.self_weight + sum(plan.src_weights.values()) == pytest.approx(1.0)
    # Push-sum weighs the destinations: the share meant for the lost one is kept.
    plan = push_round(ring, 0, 0, lost={3: "gone"})
    assert plan.self_weight == pytest.approx(2 * third)
    assert plan.dst_weights == pytest.approx({1: third})
    assert plan.dst_ranks == [1] and plan.src_weights == {1: 1.0}
    # The topology's own dicts are never modified.
    assert ring.weights(0, 0)[1] == pytest.approx({1: third, 3: third})
