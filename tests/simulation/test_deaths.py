"""Deaths in the simulator (gossip/simulation/fabric.py): a peer dies at its scheduled
simulated second, the others count it lost once their clocks pass its detection, and the real
gossip and push-sum policies go on around it (a ring healed by the policy's own proposals)."""
from __future__ import annotations

import numpy as np
import pytest

from gossip.simulation import TrainingSpec, simulate_training

pytest.importorskip("torch")

COMMON = {"peers": 8, "steps": 60, "link": "1gbit,5ms", "step_seconds": 0.01}


@pytest.mark.parametrize("policy", ["gossip", "push-sum"])
def test_a_death_leaves_the_survivors_training_and_two_runs_alike(policy: str) -> None:
    spec = TrainingSpec(policy=policy, deaths=((3, 0.3),), detect_seconds=0.5, **COMMON)
    runs = [simulate_training(spec, timeout=120) for _ in range(2)]
    for run in runs:
        assert run.died == [3] and [p.rank for p in run.peers] == [0, 1, 2, 4, 5, 6, 7]
    for a, b in zip(*(run.peers for run in runs)):
        assert a.clocks == b.clocks and np.array_equal(a.parameters, b.parameters)
    run = runs[0]
    # The survivors waited for the detection (0.3 + 0.5 s) once, and trained on past it.
    assert run.simulated_seconds > 0.8
    whole = simulate_training(TrainingSpec(policy=policy, **COMMON), timeout=120)
    assert run.accuracy > whole.accuracy - 0.05
    assert run.consensus < 3 * whole.consensus + 0.05   # (the graph heals: still mixing)


def test_gossip_heals_the_ring_around_the_dead_peer() -> None:
    # Without healing, rank 3's death cuts the ring of 8 into a line: 2 and 4 would be 6 hops
    # apart. Healed, they are neighbours, and the survivors agree as closely as 7 on a ring.
    spec = TrainingSpec(policy="gossip", deaths=((3, 0.2),), detect_seconds=0.2,
                        **dict(COMMON, steps=150))
    run = simulate_training(spec, timeout=120)
    seven = simulate_training(TrainingSpec(policy="gossip", **dict(COMMON, steps=150,
                                                                   peers=7)), timeout=120)
    assert run.consensus < 1.5 * seven.consensus   # (without healing: 2.1x, measured)


def test_mtbf_draws_deaths_from_the_seed_and_keeps_two_peers() -> None:
    spec = TrainingSpec(policy="gossip", peers=6, mtbf=1.0, seed=5)
    schedule = spec.death_schedule()
    assert schedule == TrainingSpec(policy="gossip", peers=6, mtbf=1.0, seed=5).death_schedule()
    assert len(schedule) == 4 and sorted(schedule.values()) == list(schedule.values())
    assert schedule != TrainingSpec(policy="gossip", peers=6, mtbf=1.0, seed=6).death_schedule()


@pytest.mark.parametrize("kwargs, message", [
    ({"policy": "synchronous", "deaths": ((1, 1.0),)}, "not synchronous"),
    ({"policy": "local-sgd", "mtbf": 10.0}, "not local-sgd"),
    ({"deaths": ((9, 1.0),)}, "pairs of the 4 peers"),
    ({"deaths": ((1, -1.0),)}, "pairs of the 4 peers"),
    ({"deaths": ((1, 1.0), (1, 2.0))}, "dies once"),
    ({"mtbf": 0.0}, "mtbf must be positive"),
    ({"deaths": ((1, 1.0),), "detect_seconds": -1.0}, "detect_seconds"),
])
def test_bad_death_settings_name_the_setting(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        TrainingSpec(**{"policy": "gossip", "peers": 4, **kwargs})
