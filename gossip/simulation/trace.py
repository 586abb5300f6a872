"""A simulated training run's trace over simulated time: at about ten points of the run
(every ``steps // 10`` steps, and the last; TrainingSpec.trace_points, 0 for none: a point
costs each peer an evaluation of its model), the peers' own models' mean test accuracy, the
averaged model's, and the consensus distance, beside the latest clock of the peers that got
there (``TrainingResult.trace``, the JSON's ``trace``).

Every peer reports at each point as its thread passes it, in whatever real order the threads
run, so what is kept must not depend on that order: each peer's parameters go into a sum of
integers (fixed point, 2^-40: exact and associative), its accuracy and squared norm into
scalars by (slot, life), summed in that order at the end. The consensus distance here is the
root mean square of the peers' distances to their average,
``sqrt(mean_i |x_i|^2 - |mean_i x_i|^2)`` (the run's final ``consensus`` is their mean
distance: the two agree when the distances do). A peer counts at a point if it got there,
a life that died later too: the trace is of the fleet as it was at each point. A point where
some peer's parameters diverged (not finite, or past 2^12) has no average and no distance
(None)."""
from __future__ import annotations

import math
import threading
from typing import Any, Callable

import numpy as np

__all__ = ["TrainingTrace", "trace_steps"]

#: The fixed point of the parameters' sum: 2^-40 (parameters below 2^12 in magnitude, sums
#: of up to 2^10 peers below 2^62).
_SCALE = float(2 ** 40)
#: Contributions one int64 partial sum takes (2^10 of under 2^52 each: no overflow); a point
#: with more (a large run with restarts) keeps several, added as exact integers at the end.
_PARTIAL = 2 ** 10


def trace_steps(steps: int, points: int = 10) -> list[int]:
    """The step counts a run of ``steps`` steps is traced after: every ``steps // points``
    (at least 1), and the last."""
    every = max(1, steps // points)
    out = list(range(every, steps + 1, every))
    if steps and (not out or out[-1] != steps):
        out.append(steps)
    return out


class _Partial:
    """One int64 partial sum of a point's parameters (fixed point) and how many it holds."""

    __slots__ = ("total", "held")

    def __init__(self, first: np.ndarray) -> None:
        self.total, self.held = first, 1

    def add(self, fixed: np.ndarray) -> None:
        self.total += fixed
        self.held += 1


class TrainingTrace:
    """The points of one run (thread-safe: record() is called by every simulated peer)."""

    def __init__(self, steps: int, evaluate: Callable[[Any], float], *,
                 points: int = 10) -> None:
        self._steps = set(trace_steps(steps, points)) if points else set()
        self._evaluate = evaluate   # a model's test accuracy
        self._lock = threading.Lock()
        self._sums: dict[int, list[_Partial]] = {}   # step -> its partial sums
        self._scalars: dict[int, dict[tuple[int, int], tuple[float, float]]] = {}
        self._clocks: dict[int, float] = {}               # step -> the latest clock there

    def wants(self, step: int) -> bool:
        """Whether the run is traced after ``step`` steps."""
        return step in self._steps

    def record(self, step: int, slot: int, life: int, clock: float, model: Any,
               parameters: np.ndarray) -> None:
        """Peer ``slot`` (its ``life``-th process) completed ``step`` steps at ``clock``,
        holding ``model`` whose flat parameters are ``parameters``."""
        accuracy = self._evaluate(model)
        values = parameters.astype(np.float64)
        finite = bool(np.all(np.abs(values) < 2 ** 12))   # (a diverged run: no distance)
        fixed = np.rint(values * _SCALE).astype(np.int64) if finite else \
            np.zeros(values.size, dtype=np.int64)
        square = float(np.dot(values, values)) if finite else math.nan
        with self._lock:
            partials = self._sums.setdefault(step, [])
            if partials and partials[-1].held < _PARTIAL:
                partials[-1].add(fixed)
            else:
                partials.append(_Partial(fixed))
            self._scalars.setdefault(step, {})[(slot, life)] = (accuracy, square)
            self._clocks[step] = max(self._clocks.get(step, 0.0), clock)

    def points(self, averaged_accuracy: Callable[[np.ndarray], float]) -> list[dict]:
        """Every point reached, in step order: step, time (the latest clock there), peers
        (how many got there), accuracy (their own models' mean), averaged_accuracy (their
        average's, by ``averaged_accuracy``), consensus_rms."""
        out = []
        with self._lock:
            for step in sorted(self._sums):
                scalars = [self._scalars[step][key] for key in sorted(self._scalars[step])]
                count = len(scalars)
                mean = _exact_sum(self._sums[step]) / _SCALE / count
                squares = math.fsum(s for _, s in scalars) / count
                diverged = math.isnan(squares)
                spread = 0.0 if diverged else max(0.0, squares - float(np.dot(mean, mean)))
                out.append({"step": step, "time": self._clocks[step], "peers": count,
                            "accuracy": math.fsum(a for a, _ in scalars) / count,
                            "averaged_accuracy": None if diverged else averaged_accuracy(mean),
                            "consensus_rms": None if diverged else math.sqrt(spread)})
        return out


def _exact_sum(partials: list[_Partial]) -> np.ndarray:
    """The partial sums' total as float64: one partial as it is; several added as Python
    integers (exact, so the same whatever order the contributions came in), then rounded."""
    if len(partials) == 1:
        return partials[0].total.astype(np.float64)
    total = partials[0].total.astype(object)
    for partial in partials[1:]:
        total = total + partial.total.astype(object)
    return np.array([float(v) for v in total], dtype=np.float64)
