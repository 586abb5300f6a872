"""The per-peer simulator (gossip.simulation.simulate_training; issue #38, items 1 and 4): the
real policy classes on SimHosts in one process give the parameters a real multi-process run of
the same loop gives (train_peer on gossip.testing.spawn's peers), bit for bit where the
arithmetic is the same and to float32 rounding where the neighbour combine sums in another
order; two runs are identical; the virtual clock charges what the spec says."""
from __future__ import annotations

import numpy as np
import pytest

from gossip.simulation import TrainingSpec, simulate_training, train_peer
from gossip.testing import spawn

pytest.importorskip("torch")


def real(peer, spec: TrainingSpec):
    import torch
    # One intra-op thread, as every simulated peer (simulate_training): with two, MKL splits
    # some products differently on some CPUs and the last bits differ from the first step on.
    torch.set_num_threads(1)
    result = train_peer(peer, spec)
    return result.parameters, result.accuracy, result.bytes_sent


@pytest.mark.parametrize("policy,topology,n", [
    ("synchronous", "ring", 4), ("gossip", "ring", 4), ("push-sum", "one-peer-exponential", 4),
    ("local-sgd", "ring", 4), ("push-sum overlap", "one-peer-exponential", 4),
    pytest.param("synchronous", "ring", 8, marks=pytest.mark.slow),     # (and in CI's
    pytest.param("gossip", "ring", 8, marks=pytest.mark.slow),          # (and in CI's
    pytest.param("push-sum", "exponential", 8, marks=pytest.mark.slow)])  # second pass)
def test_the_simulated_peers_end_where_real_peers_end(policy: str, topology: str,
                                                      n: int) -> None:
    # "push-sum overlap": its exchange in flight while the next step computes (the
    # simulator's deferred exchange, sim_host._Deferred).
    options = {"overlap": True} if policy.endswith(" overlap") else {}
    spec = TrainingSpec(policy=policy.split()[0], peers=n, steps=30, topology=topology,
                        policy_options=options)
    simulated = simulate_training(spec)
    out = spawn(real, n=n, timeout=300, args=(spec,), preload=("torch",))
    for rank in range(n):
        mine, theirs = simulated.peers[rank].parameters, out[rank][0]
        if policy == "gossip":   # (the neighbour combine sums its terms in another order)
            np.testing.assert_allclose(mine, theirs, rtol=0, atol=1e-6)
        else:
            assert np.array_equal(mine, theirs), (policy, rank)
        assert simulated.peers[rank].accuracy == pytest.approx(out[rank][1], abs=1e-3)
    assert not np.array_equal(simulated.peers[0].parameters, out[0][0] * 0)   # (it trained)


@pytest.mark.parametrize("policy,codec,hidden", [
    ("gossip", "int8", 128),          # one encoding to each neighbour, decoded and combined
    ("synchronous", "topk:0.1", 128),  # every encoding gathered; error feedback
    ("synchronous", "int8", 1024)])    # above 256 KiB: the ring on encodings, re-encoded a hop
def test_the_simulated_codecs_end_where_real_ones_end(policy: str, codec: str,
                                                      hidden: int) -> None:
    spec = TrainingSpec(policy=policy, peers=4, steps=20, hidden=hidden,
                        policy_options={"compression": codec})
    simulated = simulate_training(spec)
    out = spawn(real, n=4, timeout=300, args=(spec,), preload=("torch",))
    for rank in range(4):
        assert np.array_equal(simulated.peers[rank].parameters, out[rank][0]), rank
        if policy == "gossip":   # (the collectives' byte counts model rank 0's broadcast)
            assert simulated.peers[rank].bytes_sent == out[rank][2]
    plain = simulate_training(TrainingSpec(**{**spec.__dict__, "policy_options": {}}))
    assert not np.array_equal(plain.peers[0].parameters, simulated.peers[0].parameters)


def test_two_runs_are_identical() -> None:
    spec = TrainingSpec(policy="gossip", peers=6, steps=20, link="100mbit,5ms",
                        straggler=(5, 3.0))
    a, b = simulate_training(spec), simulate_training(spec)
    for p, q in zip(a.peers, b.peers):
        assert np.array_equal(p.parameters, q.parameters) and p.clocks == q.clocks
    assert a.to_dict() | {"seconds": 0} == b.to_dict() | {"seconds": 0}


def test_the_trace_follows_accuracy_and_consensus_over_simulated_time() -> None:
    """About ten points of a run: the peers' own accuracy, the averaged model's and the
    consensus distance (RMS) against the latest clock; the last point is the run's end.
    Synchronous's replicas are one model at every point; gossip's are not."""
    from gossip.simulation.trace import trace_steps

    assert trace_steps(60) == list(range(6, 61, 6))
    assert trace_steps(45) == list(range(4, 45, 4)) + [45]
    assert trace_steps(60, 20) == list(range(3, 61, 3))
    assert trace_steps(7) == list(range(1, 8)) and trace_steps(0) == []
    for policy in ("gossip", "synchronous"):
        run = simulate_training(TrainingSpec(policy=policy, peers=6, steps=45,
                                             link="100mbit,5ms"))
        points = run.trace
        assert [p["step"] for p in points] == trace_steps(45)
        assert all(p["peers"] == 6 for p in points)
        assert [p["time"] for p in points] == sorted(p["time"] for p in points)
        last = points[-1]
        assert last["time"] == pytest.approx(run.simulated_seconds)
        assert last["accuracy"] == pytest.approx(run.accuracy, abs=1e-12)
        assert last["averaged_accuracy"] == pytest.approx(run.averaged_accuracy, abs=1e-12)
        assert points[0]["accuracy"] < last["accuracy"]
        if policy == "synchronous":
            assert all(p["consensus_rms"] < 1e-6 for p in points)
        else:
            assert all(p["consensus_rms"] > 1e-3 for p in points)
            assert last["consensus_rms"] == pytest.approx(run.consensus, rel=0.2)
        assert run.to_dict()["trace"] == points


def test_the_clock_charges_compute_latency_and_bytes() -> None:
    """Gossip on a ring of 4, no straggler: each step is its compute, then one message to each
    neighbour (latency + bytes / rate, the links free at once); the allreduce of synchronous
    (39 KB: recursive doubling, as the collectives run it below 256 KiB) log2(n) steps of
    latency + bytes / rate."""
    steps, compute, latency, rate = 10, 0.01, 0.005, 1e9 / 8    # 1 Gbit/s
    spec = TrainingSpec(policy="gossip", peers=4, steps=steps, link="1gbit,5ms",
                        step_seconds=compute)
    result = simulate_training(spec)
    nbytes = result.peers[0].parameters.nbytes
    assert result.simulated_seconds == pytest.approx(
        steps * (compute + latency + nbytes / rate), rel=1e-9)
    assert result.peers[0].bytes_sent == steps * 2 * nbytes      # two neighbours a round
    sync = simulate_training(TrainingSpec(policy="synchronous", peers=4, steps=steps,
                                          link="1gbit,5ms", step_seconds=compute))
    # Its gradient allreduce per step (one bucket here) plus the initial broadcast.
    per_step = 2 * (latency + nbytes / rate)
    broadcast = 2 * (latency + nbytes / rate)
    assert sync.simulated_seconds == pytest.approx(
        broadcast + steps * (compute + per_step), rel=1e-9)


def test_the_clock_charges_a_codec_its_encodings_bytes() -> None:
    """Gossip with int8 on a ring of 4: each step is its compute, then one encoding to each
    neighbour; synchronous with int8 on an array below 256 KiB gathers every encoding straight
    from its owner (one step: latency + encoding / rate), above it runs the ring on encodings
    (2(n - 1) steps of one segment's encoding)."""
    from collectives.algorithms.compressed import padded_count
    from collectives.codecs.catalog import parse

    int8 = parse("int8")
    steps, compute, latency, rate, n = 10, 0.01, 0.005, 1e9 / 8, 4
    common = dict(peers=n, steps=steps, link="1gbit,5ms", step_seconds=compute,
                  policy_options={"compression": "int8"})
    run = simulate_training(TrainingSpec(policy="gossip", **common))
    count = run.peers[0].parameters.size
    encoding = int8.encoded_nbytes(count)
    assert run.peers[0].bytes_sent == steps * 2 * encoding
    assert run.simulated_seconds == pytest.approx(
        steps * (compute + latency + encoding / rate), rel=1e-9)
    raw = count * 4
    broadcast = 2 * (latency + raw / rate)   # (the initial one, uncompressed)
    sync = simulate_training(TrainingSpec(policy="synchronous", **common))
    assert sync.simulated_seconds == pytest.approx(
        broadcast + steps * (compute + latency + encoding / rate), rel=1e-9)
    big = simulate_training(TrainingSpec(policy="synchronous", hidden=1024, **common))
    count = big.peers[0].parameters.size
    assert count * 4 > 256 * 1024
    segment = int8.encoded_nbytes(padded_count(count, n))
    broadcast = 2 * (latency + count * 4 / rate)
    assert big.simulated_seconds == pytest.approx(
        broadcast + steps * (compute + 2 * (n - 1) * (latency + segment / rate)), rel=1e-9)


@pytest.mark.parametrize("compute", [0.01, 0.002])
def test_push_sum_overlap_hides_its_exchange_behind_the_next_step(compute: float) -> None:
    """Push-sum with overlap=True on one-peer-exponential of 4: each step's exchange (one
    message: the parameters and the weight, latency + bytes / rate) leaves at the step's end
    and is absorbed at the next step's end, after its compute: a step takes the longer of the
    two, where without overlap it takes both; the last one completes at close()."""
    steps, latency, rate = 10, 0.005, 1e9 / 8
    spec = TrainingSpec(policy="push-sum", peers=4, steps=steps, link="1gbit,5ms",
                        topology="one-peer-exponential", step_seconds=compute,
                        policy_options={"overlap": True})
    run = simulate_training(spec)
    message = run.peers[0].bytes_sent / steps
    exchange = latency + message / rate
    assert message == run.peers[0].parameters.nbytes + 4   # (the weight, a float32)
    for p in run.peers:
        assert p.clocks == pytest.approx(
            [compute + k * max(compute, exchange) for k in range(steps)], rel=1e-9)
    assert run.simulated_seconds == pytest.approx(run.peers[0].clocks[-1] + exchange, rel=1e-9)
    plain = simulate_training(TrainingSpec(**{**spec.__dict__, "policy_options": {}}))
    assert plain.peers[0].clocks[-1] == pytest.approx(steps * (compute + exchange), rel=1e-9)


def test_a_straggler_sets_the_pace_of_the_lockstep_policies() -> None:
    fast = simulate_training(TrainingSpec(policy="synchronous", peers=4, steps=10))
    slow = simulate_training(TrainingSpec(policy="synchronous", peers=4, steps=10,
                                          straggler=(2, 4.0)))
    assert slow.simulated_seconds == pytest.approx(4 * fast.simulated_seconds, rel=1e-9)
    assert all(p.clocks[-1] == slow.simulated_seconds for p in slow.peers)


@pytest.mark.parametrize("kwargs,message", [
    ({"policy": "easgd"}, "policy 'easgd' is not simulated"),
    ({"peers": 0}, "peers must be an int >= 1"),
    ({"trace_points": -1}, "trace_points must be an int >= 0"),
    ({"straggler": (9, 2.0)}, "straggler must be"),
    ({"link": "fast"}, "link='fast'"),
])
def test_bad_specs_name_the_setting(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TrainingSpec(**kwargs)


def test_a_failing_peer_stops_the_others_at_once() -> None:
    """A peer whose policy fails (here: a graph of the wrong size for gossip) ends the run with
    its error; the others do not wait for it until their timeout."""
    spec = TrainingSpec(policy="gossip", peers=4, steps=5, topology="torus:2x3")
    with pytest.raises(Exception, match="6|size|peers"):
        simulate_training(spec, timeout=60)


def test_jittered_compute_draws_alike_moves_the_clocks_and_not_the_numbers() -> None:
    common = {"policy": "gossip", "peers": 4, "steps": 8, "link": "1gbit,1ms",
              "step_seconds": 0.01}
    steady = simulate_training(TrainingSpec(**common))
    jittered = [simulate_training(TrainingSpec(**common, step_jitter=0.8)) for _ in range(2)]
    assert [p.clocks for p in jittered[0].peers] == [p.clocks for p in jittered[1].peers]
    assert jittered[0].simulated_seconds != steady.simulated_seconds
    for a, b in zip(jittered[0].peers, steady.peers):   # (a lockstep policy: same numbers)
        assert np.array_equal(a.parameters, b.parameters)
    with pytest.raises(ValueError, match="step_jitter"):
        TrainingSpec(step_jitter=-1)
