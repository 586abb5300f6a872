"""Policies with compression, among real peers: Synchronous keeps replicas identical with
every codec (torch gradients), LocalSGD with an outer optimizer (DiLoCo) reduces to plain
LocalSGD for SGD(lr=1), codec and outer state survive state_dict() and snapshot round trips
bit for bit, Gossip and ElasticAveraging run compressed, policies that cannot compress say
so, and stats() shows the bytes saved."""
from __future__ import annotations

import numpy as np
import pytest

import gossip
from gossip.policies import (SGD, Asynchronous, ElasticAveraging, Gossip, LocalSGD, PushSum,
                             Synchronous)
from gossip.testing import spawn

LENGTH = 3000


def start(rank: int) -> np.ndarray:
    return np.random.default_rng(rank).standard_normal(LENGTH).astype(np.float32)


def local_steps(x: np.ndarray, rank: int, step: int) -> None:
    """A deterministic local SGD step on f_r(x) = ||x - c_r||^2 / 2 (c_r differs by rank)."""
    c = np.random.default_rng(1000 + rank).standard_normal(x.size).astype(np.float32)
    x -= np.float32(0.1) * (x - c) + np.float32(0.01 * np.sin(step))


def run(peer, policy, steps: int, x=None):
    x = start(0) if x is None else x   # the same start everywhere
    policy.attach(peer, [x])
    for t in range(steps):
        local_steps(x, peer.rank, policy.step)
        policy.after_step()
    return x, policy


# ------------------------------------------------------------------ DiLoCo equivalence
def diloco_equivalence(peer):
    plain, p1 = run(peer, _plain(), 12)
    p1.close()
    outer, p2 = run(peer, LocalSGD(period=1, outer_optimizer=SGD(lr=1)), 12)
    stats = p2.stats()
    p2.close()
    nesterov, p3 = run(peer, LocalSGD(period=4, outer_optimizer="diloco"), 12)
    p3.close()
    return plain, outer, nesterov, stats


def _plain():
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # period=1 warns that it is plain synchronous SGD
        return LocalSGD(1)


def test_local_sgd_with_outer_sgd_lr_1_equals_plain_local_sgd():
    results = spawn(diloco_equivalence, n=3, timeout=90)
    for plain, outer, nesterov, stats in results:
        # anchor - mean(anchor - x_i) against mean(x_i): equal but for float32 rounding.
        np.testing.assert_allclose(outer, plain, rtol=0, atol=2e-6)
        assert stats["outer_optimizer"] == "SGD(lr=1.0, momentum=0.0, nesterov=False)"
    for r in range(1, 3):   # replicas identical after each outer step, momentum or not
        assert np.array_equal(results[r][1], results[0][1])
        assert np.array_equal(results[r][2], results[0][2])
    assert not np.allclose(results[0][2], results[0][0], atol=1e-3)   # Nesterov moves


def diloco_by_hand(peer):
    x, policy = run(peer, LocalSGD(period=2, outer_optimizer=SGD(lr=0.7, momentum=0.9,
                                                                  nesterov=True)), 6)
    policy.close()
    return x


def test_diloco_outer_step_is_nesterov_momentum_on_the_averaged_pseudo_gradient():
    n = 2
    results = spawn(diloco_by_hand, n=n, timeout=60)
    # The same in one process, by the formulas of the docstring.
    xs = [start(0).copy() for _ in range(n)]
    anchor = start(0).copy()
    buf = None
    for t in range(6):
        for r in range(n):
            local_steps(xs[r], r, t)
        if t % 2 == 1:
            g = np.mean([anchor - x for x in xs], axis=0, dtype=np.float32)
            buf = g.copy() if buf is None else 0.9 * buf + g
            anchor = anchor - 0.7 * (g + 0.9 * buf)
            xs = [anchor.copy() for _ in range(n)]
    np.testing.assert_allclose(results[0], anchor, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ state round trips
def state_round_trip(peer, policy_kind, tmp):
    def make():
        if policy_kind == "diloco-topk":
            return LocalSGD(period=2, outer_optimizer="diloco", compression="topk:0.05")
        return ElasticAveraging(period=1, compression="topk:0.05")

    x, first = run(peer, make(), 5)
    state = first.state_dict()
    saved_x = x.copy()
    snap = gossip.Snapshot.of(params=[x], policy=first)
    snap.save(tmp, shard=peer.rank)
    for t in range(5):
        local_steps(x, peer.rank, first.step)
        first.after_step()
    first.close()
    # A fresh policy from the plain state dict, and one from the snapshot on disk.
    results = [x.copy()]
    for source in ("state_dict", "snapshot"):
        y = saved_x.copy()
        second = make().attach(peer, [y])
        if source == "state_dict":
            second.load_state_dict(state)
        else:
            gossip.Snapshot.load(tmp, shard=peer.rank).restore_into(params=[y], policy=second)
        for t in range(5):
            local_steps(y, peer.rank, second.step)
            second.after_step()
        second.close()
        results.append(y)
    return results, sorted(state), {k: len(v) for k, v in state["residuals"].items()}


@pytest.mark.parametrize("kind", ["diloco-topk", "elastic-topk"])
def test_codec_and_outer_state_survive_state_dict_and_snapshot_round_trips(kind, tmp_path):
    results = spawn(state_round_trip, n=2, timeout=90, args=(kind, str(tmp_path)))
    for (straight, from_state, from_snapshot), keys, residuals in results:
        assert "codec" in keys and "residuals" in keys, keys
        assert residuals == {0: LENGTH}
        if kind == "diloco-topk":
            assert "outer" in keys
        assert np.array_equal(from_state, straight)
        assert np.array_equal(from_snapshot, straight)


# ------------------------------------------------------------------ synchronous (torch)
def synchronous_torch(peer, spec):
    import torch
    from helpers import mlp, regression_batch
    model = mlp(0)
    opt = gossip.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), peer=peer,
                                      policy=Synchronous(compression=spec))
    first = None
    for step in range(15):
        x, y = regression_batch(peer.rank, step)
        loss = ((model(x) - y) ** 2).mean()
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    stats = opt.policy.stats()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()]).numpy().copy()
    state = opt.policy.state_dict()
    opt.policy.close()
    return flat, stats, first, loss.item(), sorted(state["residuals"])


# fp16, bf16 (casts, the int8 path covers the ring) and top-k (gathered: tests/collectives/test_compressed_collectives.py,
# its residuals in tests/membership/test_compression_membership.py) under -m slow: the 10-minute budget.
@pytest.mark.parametrize("spec", [pytest.param("fp16", marks=pytest.mark.slow), pytest.param("bf16", marks=pytest.mark.slow), "int8", pytest.param("topk:0.1", marks=pytest.mark.slow)])
def test_synchronous_with_a_codec_keeps_replicas_identical_and_trains(spec):
    pytest.importorskip("torch")
    results = spawn(synchronous_torch, n=3, timeout=120, args=(spec,), preload=("torch",))
    flat0, stats, first, last, residuals = results[0]
    for flat, *_ in results[1:]:
        assert np.array_equal(flat, flat0)
    assert last < first
    assert stats["compression"] == gossip.policies.Synchronous(compression=spec).compression.name
    assert stats["codec_bytes_per_step"]["encoded_bytes"] < \
        stats["codec_bytes_per_step"]["raw_bytes"]
    assert bool(residuals) == spec.startswith("topk")   # one per gradient bucket


# ------------------------------------------------------------------ gossip and the refusals
def gossip_compressed(peer, spec):
    x, policy = run(peer, Gossip(compression=spec), 20, x=start(peer.rank))
    stats = policy.stats()
    policy.close()
    return x, stats


def test_gossip_with_a_dense_codec_mixes_and_sends_fewer_bytes():
    plain = spawn(gossip_compressed, n=4, timeout=90, args=(None,))
    packed = spawn(gossip_compressed, n=4, timeout=90, args=("bf16",))
    for (x, stats), (y, cstats) in zip(plain, packed):
        # bf16 keeps 8 bits: the compressed run follows the exact one to about 1%.
        np.testing.assert_allclose(y, x, rtol=0.05, atol=0.05)
        assert cstats["bytes_per_step"] < 0.6 * stats["bytes_per_step"], (cstats, stats)


def test_policies_that_cannot_compress_say_so():
    with pytest.raises(ValueError, match="Choco"):
        Gossip(compression="topk:0.01")
    with pytest.raises(ValueError, match="PushSum"):
        PushSum(compression="fp16")
    with pytest.raises(ValueError, match="Asynchronous"):
        Asynchronous(compression="fp16")
    with pytest.raises(ValueError, match="replicated"):
        ElasticAveraging(center="sharded", compression="int8")
    with pytest.raises(ValueError, match="unknown codec"):
        LocalSGD(compression="fp8")
    with pytest.raises(TypeError):
        LocalSGD(outer_optimizer="adam")
    assert gossip.policies.make("local-sgd", compression="int8").compression.name == "int8"


# ------------------------------------------------------------------ CHOCO-SGD
def choco_consensus(peer, spec, gamma, rounds):
    x = np.random.default_rng(peer.rank).standard_normal(500)   # float64 parameters
    x0 = x.copy()
    policy = gossip.policies.Choco(consensus_step=gamma, compression=spec).attach(peer, [x])
    for _ in range(rounds):
        policy.after_step()          # lr = 0: no local step, only the consensus
    stats = policy.stats()
    policy.close()
    return x0, x, stats


@pytest.mark.parametrize("spec,gamma,rounds", [("topk:0.1", 0.1, 700), ("int8", 1.0, 120)])
def test_choco_reaches_the_exact_average_with_lr_0(spec, gamma, rounds):
    results = spawn(choco_consensus, n=4, timeout=120, args=(spec, gamma, rounds))
    mean = np.mean([r[0] for r in results], axis=0)
    for x0, x, stats in results:
        assert np.abs(x - mean).max() < 1e-9, np.abs(x - mean).max()
        assert stats["policy"] == "choco" and stats["compression"] == spec


def test_choco_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="contractive"):
        gossip.policies.Choco(compression="fp16")
    with pytest.raises(ValueError, match="codec"):
        gossip.policies.Choco(compression=None)
    with pytest.raises(ValueError, match="consensus_step"):
        gossip.policies.Choco(consensus_step=0)
    assert isinstance(gossip.policies.make("choco"), gossip.policies.Choco)


# ------------------------------------------------------------------ a death, compressed
def compressed_gossip_with_a_death(peer):
    import os
    import signal
    x = np.random.default_rng(peer.rank).normal(size=1000)
    policy = Gossip(compression="int8").attach(peer, [x])
    for step in range(60):
        if peer.rank == 3 and step == 15:
            os.kill(os.getpid(), signal.SIGKILL)
        x -= 0.01 * x
        policy.after_step()
    stats = policy.stats()
    policy.close()
    return stats, x


def test_compressed_gossip_trains_on_when_a_peer_dies():
    import topologies
    out = spawn(compressed_gossip_with_a_death, n=4, timeout=90, tolerate=[3],
                peer_timeout=10, topology=topologies.Ring(4))
    assert out[3] is None
    xs = np.stack([out[r][1] for r in (0, 1, 2)])
    for rank in (0, 1, 2):
        stats, x = out[rank]
        assert stats["steps"] == 60 and np.isfinite(x).all()
        assert rank == 1 or 3 in stats["lost_peers"]    # 0 and 2 are rank 3's neighbours
    # The survivors (a path 0 - 1 - 2) kept mixing, through int8, after rank 3 died.
    start = np.stack([np.random.default_rng(r).normal(size=1000) for r in (0, 1, 2)])
    assert np.ptp(xs, axis=0).max() < 0.05 * np.ptp(start, axis=0).max()
