"""Mixing dynamics of many peers, vectorised: one sparse matrix product per round."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from topologies import SparseMatrix, Topology

__all__ = ["simulate_mixing", "MixingTrace", "MIXING_RULES"]

MIXING_RULES = ("gossip", "push-sum")
"""The rounds `simulate_mixing` runs: "gossip" is x <- W_t x with the topology's weights
(D-PSGD's round, row-stochastic W); "push-sum" sends numerators and weights with the
column-stochastic push weights and reads x / w (SGP's round)."""

_STOCHASTIC_TOL = 1e-9


@dataclass(frozen=True)
class MixingTrace:
    """What `simulate_mixing` measured.

    ``distance[t]`` is the consensus distance after t rounds (``distance[0]`` before any):
    the mean over peers of ||x_i - mean_j x_j||, as `Policy.consensus_distance()` measures
    it on real peers. ``final`` holds every peer's values after the last round (for
    push-sum, the numerators divided by the weights).
    """

    topology: str
    size: int
    period: int
    rule: str
    slem: float
    distance: np.ndarray
    final: np.ndarray
    seconds: float

    @property
    def rounds(self) -> int:
        """Rounds simulated."""
        return len(self.distance) - 1

    def spectral_rate(self) -> float:
        """The topology's predicted factor per round: SLEM ** (1 / period)."""
        return self.slem ** (1.0 / self.period)

    def measured_rate(self, start: int, stop: int) -> float:
        """The factor per round by which the distance shrank from round `start` to `stop`
        (geometric mean); compare with `spectral_rate()` once the slowest mode dominates."""
        if not 0 <= start < stop <= self.rounds:
            raise ValueError(f"need 0 <= start < stop <= {self.rounds}, got {start}, {stop}")
        d0, d1 = float(self.distance[start]), float(self.distance[stop])
        if d0 == 0.0:
            return 0.0
        return (d1 / d0) ** (1.0 / (stop - start))

    def rate_window(self, floor: float = 1e-9) -> tuple[int, int] | None:
        """(start, stop) rounds to measure the asymptotic rate over: the second half of the
        rounds before the distance fell to ``floor`` times where it started (below that,
        float64's rounding is what is left), in whole periods; None if too few."""
        d0 = float(self.distance[0])
        above = [t for t in range(self.rounds + 1) if self.distance[t] > floor * d0]
        stop = above[-1] - above[-1] % (2 * self.period) if above else 0
        return (stop // 2, stop) if stop > 0 else None

    def to_dict(self) -> dict[str, Any]:
        """The trace as JSON-ready values (without the final values)."""
        return {"topology": self.topology, "size": self.size, "period": self.period,
                "rule": self.rule, "slem": self.slem, "rounds": self.rounds,
                "seconds": self.seconds, "distance": [float(d) for d in self.distance]}


def _distance(z: np.ndarray) -> float:
    diff = z - z.mean(axis=0)
    return float(np.sqrt((diff * diff).sum(axis=1)).mean())


def _check(matrix: SparseMatrix, topology: Topology, step: int, rule: str) -> None:
    if rule == "gossip":
        sums = matrix.row_sums()
        what, fix = "row", "use rule='push-sum' or weights='metropolis' / 'uniform'"
    else:
        sums = matrix.column_sums()
        what, fix = "column", "use rule='gossip', or the topology's push weights"
    worst = float(np.abs(sums - 1.0).max())
    if worst > _STOCHASTIC_TOL:
        raise ValueError(f"simulate_mixing(rule={rule!r}): the mixing matrix of {topology!r} "
                         f"at step {step} is not {what}-stochastic (off by {worst:.3g}); {fix}")


def simulate_mixing(topology: Topology, rounds: int, *, rule: str = "gossip", dim: int = 1,
                    seed: int = 0, values: np.ndarray | None = None) -> MixingTrace:
    """Run `rounds` rounds of `rule` over `topology`'s n peers, vectorised.

    Each peer starts with `values[i]` (shape (n,) or (n, d)) or with `dim` standard normal
    numbers drawn from `seed`; round t mixes with the topology's matrix at step t (so a
    time-varying schedule cycles through its phases). Memory is n * dim * 8 bytes a copy
    plus the sparse matrices: 65,536 peers of 100 values each take 50 MiB a copy.
    """
    if rule not in MIXING_RULES:
        raise ValueError(f"simulate_mixing: rule must be one of {MIXING_RULES}, got {rule!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
        raise ValueError(f"simulate_mixing: rounds must be an int >= 0, got {rounds!r}")
    n = topology.size
    if values is None:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"simulate_mixing: dim must be an int >= 1, got {dim!r}")
        x = np.random.default_rng(seed).standard_normal((n, dim))
    else:
        x = np.array(values, dtype=np.float64)
        if x.ndim == 1:
            x = x[:, None]
        if x.ndim != 2 or x.shape[0] != n:
            raise ValueError(f"simulate_mixing: values must have shape ({n},) or ({n}, d) for "
                             f"{topology!r}, got {np.shape(values)}")
    matrices = [topology.sparse_mixing_matrix(p) for p in range(topology.period)]
    for p, m in enumerate(matrices):
        _check(m, topology, p, rule)
    slem = topology.second_eigenvalue()
    started = time.perf_counter()
    weight = np.ones((n, 1))
    distance = np.empty(rounds + 1)
    distance[0] = _distance(x)
    for t in range(rounds):
        m = matrices[t % len(matrices)]
        x = m.matvec(x)
        if rule == "push-sum":
            weight = m.matvec(weight)
            distance[t + 1] = _distance(x / weight)
        else:
            distance[t + 1] = _distance(x)
    final = x / weight if rule == "push-sum" else x
    seconds = time.perf_counter() - started
    if not math.isfinite(float(distance[-1])):
        raise FloatingPointError(f"simulate_mixing: the values of {topology!r} overflowed")
    return MixingTrace(topology=repr(topology), size=n, period=topology.period, rule=rule,
                       slem=slem, distance=distance, final=final, seconds=seconds)
