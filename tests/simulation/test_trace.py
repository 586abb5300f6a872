"""The trace's sums: exact whatever order the peers report in, past the contributions one
int64 sum holds (a large run with restarts), for parameters at the edge of the fixed point."""
from __future__ import annotations

import numpy as np

from gossip.simulation.trace import TrainingTrace


def _points(order: list[int], parameters: np.ndarray) -> list[dict]:
    trace = TrainingTrace(1, evaluate=lambda model: 0.5, points=1)
    for slot in order:
        trace.record(1, slot, 0, clock=float(slot), model=None, parameters=parameters[slot])
    return trace.points(averaged_accuracy=lambda mean: float(mean[0]))


def test_sums_past_one_partial_are_exact_and_the_same_in_any_order() -> None:
    rng = np.random.default_rng(0)
    count = 2 ** 10 * 2 + 37   # three partial sums
    # Near the fixed point's edge (2^12): one int64 sum of them all would overflow.
    parameters = np.where(rng.random((count, 5)) < 0.5, 1.0, -1.0) * (2.0 ** 12 - 1)
    parameters[:, 0] = 2.0 ** 12 - 1   # the first all alike: their mean is exactly that
    forward = _points(list(range(count)), parameters)
    backward = _points(list(reversed(range(count))), parameters)
    shuffled = _points(rng.permutation(count).tolist(), parameters)
    assert forward == backward == shuffled
    (point,) = forward
    assert point["peers"] == count and point["time"] == count - 1
    assert point["averaged_accuracy"] == 2.0 ** 12 - 1
    mean = parameters.mean(axis=0)
    spread = np.mean(np.sum(parameters ** 2, axis=1)) - float(mean @ mean)
    assert np.isclose(point["consensus_rms"], np.sqrt(spread), rtol=1e-9)
