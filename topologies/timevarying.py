"""Time-varying schedules: graphs whose edges change from one step to the next."""

from __future__ import annotations

from topologies._checks import check_size
from topologies.base import Topology

__all__ = ["OnePeerExponential"]


class OnePeerExponential(Topology):
    """At step t every peer i sends to the single peer (i + 2^(t mod P)) mod n.

    P = period = max(1, ceil(log2 n)). Directed and time-varying; each peer sends one
    message per step, yet for n a power of two the product of the P push matrices is
    exactly 11^T / n: a full average every period at the cost of one peer per step.
    n = 1 has no neighbours. Default weights are push weights (keep 1/2, send 1/2).
    """

    name = "one-peer-exponential"
    is_time_varying = True

    def __init__(self, n: int, *, weights: str | None = None) -> None:
        n = check_size(n)
        period = max(1, (n - 1).bit_length())  # ceil(log2 n) in exact integer arithmetic
        super().__init__(n, directed=True, weights=weights, period=period)

    def _out(self, phase: int) -> list[set[int]]:
        n = self._size
        hop = 1 << phase
        return [{(i + hop) % n} - {i} for i in range(n)]

    def _cayley(self, phase: int) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
        return (self._size,), [(1 << phase,)]

    def _params(self) -> tuple:
        return (self._size,)

    @property
    def spec(self) -> str:
        return "one-peer-exponential" + self._weights_suffix()

    def __repr__(self) -> str:
        return f"OnePeerExponential({self._size}{self._weights_kwarg()})"
