"""Which order of the peers makes the fastest ring, given what each directed link carries
(issue #37: "a ring ordered by measured bandwidth when links differ", as prime orders its
ring). Pure functions of a rate matrix: no I/O.

A ring allreduce sends the same bytes over every link ``ring[k] -> ring[k + 1]`` at once, so it
takes as long as its slowest link: the best order is the directed Hamiltonian cycle whose
slowest link is fastest (the bottleneck travelling-salesman problem), ties broken by the
smallest sum of 1 / rate (the cycle's links, each weighted by the time a byte takes on it).
Up to ``EXACT_PEERS`` peers every cycle is tried (8! = 40,320 at nine); above, a greedy walk
from each of the first few peers (always on to the fastest link not yet used), then single
peers moved to other places while that improves the ring.

The order starts at rank 0 (a ring has no start; this makes it one list on every peer), and it
stays the rank order unless the best ring's slowest link is faster than the rank order's by
more than ``margin`` (default 10%): measurements are noisy, and a ring that changes on noise
changes how every call rounds for no gain.
"""
from __future__ import annotations

import itertools
import math
from typing import Sequence

__all__ = ["best_ring", "ring_bottleneck", "ring_key", "EXACT_PEERS", "DEFAULT_MARGIN"]

#: Up to this many peers every ring is tried.
EXACT_PEERS = 9
#: How much faster (as a fraction) the best ring's slowest link must be than the rank order's
#: for the rank order to be left.
DEFAULT_MARGIN = 0.1
_GREEDY_STARTS = 8
_IMPROVE_PEERS = 32   # above, the greedy ring is kept as it is (each pass is n^3)


def ring_bottleneck(rates: Sequence[Sequence[float]], ring: Sequence[int]) -> float:
    """The rate of the slowest link ``ring[k] -> ring[k + 1]`` (wrapping round); infinite for
    a ring of one."""
    n = len(ring)
    if n < 2:
        return math.inf
    return min(float(rates[ring[k]][ring[(k + 1) % n]]) for k in range(n))


def ring_key(rates: Sequence[Sequence[float]], ring: Sequence[int]) -> tuple[float, float]:
    """What makes one ring better than another (larger is better): its slowest link's rate,
    then minus the sum of 1 / rate over its links."""
    n = len(ring)
    if n < 2:
        return (math.inf, 0.0)
    links = [float(rates[ring[k]][ring[(k + 1) % n]]) for k in range(n)]
    return (min(links), -sum(1.0 / v if v > 0 else math.inf for v in links))


def best_ring(rates: Sequence[Sequence[float]], margin: float = DEFAULT_MARGIN) -> list[int]:
    """The ranks in ring order (starting at 0) for the rate matrix ``rates`` (``rates[i][j]``:
    bytes/s from rank i to rank j; the diagonal is ignored): the rank order unless a ring
    whose slowest link is more than ``margin`` faster exists (module docstring)."""
    n = len(rates)
    if any(len(row) != n for row in rates):
        raise ValueError(f"the rate matrix must be square, got {n} rows of lengths "
                         f"{sorted({len(row) for row in rates})}")
    if margin < 0:
        raise ValueError(f"margin must be at least 0, got {margin}")
    identity = list(range(n))
    if n < 3:   # one ring only
        return identity
    found = _exact(rates, n) if n <= EXACT_PEERS else _heuristic(rates, n)
    if ring_bottleneck(rates, found) > (1 + margin) * ring_bottleneck(rates, identity):
        return found
    return identity


def _exact(rates: Sequence[Sequence[float]], n: int) -> list[int]:
    best, best_key = list(range(n)), ring_key(rates, list(range(n)))
    for rest in itertools.permutations(range(1, n)):
        ring = [0, *rest]
        key = ring_key(rates, ring)
        if key > best_key:
            best, best_key = ring, key
    return best


def _heuristic(rates: Sequence[Sequence[float]], n: int) -> list[int]:
    best: list[int] | None = None
    best_key = (-math.inf, -math.inf)
    for start in range(min(n, _GREEDY_STARTS)):
        ring = _greedy(rates, n, start)
        if n <= _IMPROVE_PEERS:
            ring = _improve(rates, ring)
        key = ring_key(rates, ring)
        if best is None or key > best_key:
            best, best_key = ring, key
    assert best is not None
    k = best.index(0)
    return best[k:] + best[:k]


def _greedy(rates: Sequence[Sequence[float]], n: int, start: int) -> list[int]:
    """From ``start``, always on to the peer not yet in the ring with the fastest link from
    the last one (the lowest rank among equals)."""
    ring, left = [start], set(range(n)) - {start}
    while left:
        last = ring[-1]
        nxt = max(sorted(left), key=lambda j: float(rates[last][j]))
        ring.append(nxt)
        left.remove(nxt)
    return ring


def _improve(rates: Sequence[Sequence[float]], ring: list[int]) -> list[int]:
    """Move single peers to other places in the ring while that makes it better (at most n
    passes)."""
    n = len(ring)
    key = ring_key(rates, ring)
    for _ in range(n):
        improved = False
        for i in range(n):
            peer = ring[i]
            rest = ring[:i] + ring[i + 1:]
            for j in range(n):
                if j == i:
                    continue
                candidate = rest[:j] + [peer] + rest[j:]
                candidate_key = ring_key(rates, candidate)
                if candidate_key > key:
                    ring, key, improved = candidate, candidate_key, True
                    break
        if not improved:
            break
    return ring
