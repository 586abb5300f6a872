"""Random connected graphs, reproducible from a seed: Erdos-Renyi and random regular."""

from __future__ import annotations

import math
import numbers

import numpy as np

from topologies._checks import check_int, check_size
from topologies.base import Topology
from topologies.errors import TopologyError
from topologies.graph import Adjacency, components, freeze

__all__ = ["RandomGraph", "MAX_ATTEMPTS"]

# How many graphs are drawn before giving up on a connected one. Near the connectivity
# threshold p = ln(n)/n about a third of G(n, p) draws are connected, so failing 1000 times
# in a row means the parameters, not the luck, are wrong.
MAX_ATTEMPTS = 1000


class RandomGraph(Topology):
    """A random connected undirected graph: Erdos-Renyi G(n, p) or random `degree`-regular.

    Exactly one of `p` and `degree` is given. G(n, p) is conditioned on being connected by
    rejection sampling; the regular graph is drawn by the pairing model (with restarts on
    collisions, and through the complement for dense degrees), again until connected. At
    most MAX_ATTEMPTS graphs are drawn before a TopologyError.

    The graph is a function of (n, p or degree, seed) through numpy's default Generator.
    The seed defaults to 0, not to fresh entropy, because every peer process builds its own
    copy of the topology and they must all get the same graph.
    """

    name = "random"
    _p: float | None
    _degree: int | None
    _seed: int
    _adj: Adjacency

    def __init__(
        self,
        n: int,
        *,
        p: float | None = None,
        degree: int | None = None,
        seed: int = 0,
        weights: str | None = None,
    ) -> None:
        n = check_size(n)
        seed = check_int(seed, "seed", minimum=0)
        if (p is None) == (degree is None):
            raise TopologyError(
                "RandomGraph needs exactly one of p= (edge probability, Erdos-Renyi) and "
                "degree= (random regular graph), e.g. RandomGraph(16, p=0.3) or "
                "RandomGraph(16, degree=3)"
            )
        super().__init__(n, directed=False, weights=weights)
        rng = np.random.default_rng(seed)
        if p is not None:
            p = _check_probability(p)
            adj = _connected_erdos_renyi(n, p, rng)
        else:
            degree = _check_degree(n, degree)
            adj = _connected_regular(n, degree, rng)
        self._freeze_fields(_p=p, _degree=degree, _seed=seed, _adj=adj)

    @property
    def p(self) -> float | None:
        """Edge probability of G(n, p), or None for a regular graph."""
        return self._p

    @property
    def degree(self) -> int | None:
        """Degree of the random regular graph, or None for G(n, p)."""
        return self._degree

    @property
    def seed(self) -> int:
        """Seed of the numpy Generator the graph was drawn with."""
        return self._seed

    def _out(self, phase: int) -> Adjacency:
        return self._adj

    def _params(self) -> tuple:
        return (self._size, self._p, self._degree, self._seed)

    def _options(self, sep: str) -> str:
        kind = f"p={self._p!r}" if self._p is not None else f"degree={self._degree}"
        return f"{kind}{sep}seed={self._seed}"

    @property
    def spec(self) -> str:
        return f"random:{self._options(',')}" + self._weights_suffix()

    def __repr__(self) -> str:
        return f"RandomGraph({self._size}, {self._options(', ')}{self._weights_kwarg()})"


def _check_probability(p: object) -> float:
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0 < float(p) <= 1:
        raise TopologyError(
            f"p must be an edge probability in (0, 1], got {p!r}; "
            f"for a connected graph of n peers use p above ln(n)/n"
        )
    return float(p)


def _check_degree(n: int, degree: object) -> int:
    d = check_int(degree, "degree", minimum=0)
    if d >= n and n > 1:
        raise TopologyError(
            f"degree {d} is too large for {n} peers; a simple graph allows at most "
            f"degree n-1 = {n - 1} (which is Complete({n}))"
        )
    if n == 1:
        if d != 0:
            raise TopologyError(f"a single peer has no neighbours; use degree=0, not {d}")
        return d
    if (n * d) % 2:
        raise TopologyError(
            f"a {d}-regular graph on {n} peers does not exist because n*degree = {n * d} "
            f"is odd (every edge has two ends); use an even n or degree {d + 1}"
        )
    if d == 0 or (d == 1 and n > 2):
        raise TopologyError(f"a {d}-regular graph on {n} peers is never connected; use degree >= 2")
    return d


def _connected(adj: Adjacency) -> bool:
    return len(components(adj)) <= 1


def _connected_erdos_renyi(n: int, p: float, rng: np.random.Generator) -> Adjacency:
    rows, cols = np.triu_indices(n, 1)
    for _ in range(MAX_ATTEMPTS):
        keep = rng.random(rows.size) < p
        out: list[set[int]] = [set() for _ in range(n)]
        for i, j in zip(rows[keep].tolist(), cols[keep].tolist(), strict=True):
            out[i].add(j)
            out[j].add(i)
        adj = freeze(out)
        if _connected(adj):
            return adj
    threshold = math.log(n) / n
    raise TopologyError(
        f"could not draw a connected G(n={n}, p={p}) in {MAX_ATTEMPTS} attempts; "
        f"connectivity needs p above ln(n)/n = {threshold:.3g} (p >= {min(1.0, 2 * threshold):.3g} "
        f"almost always works), or use degree=3 for a connected random regular graph"
    )


def _connected_regular(n: int, d: int, rng: np.random.Generator) -> Adjacency:
    # Dense regular graphs are drawn as the complement of a sparse one: the pairing model
    # collides constantly when d is close to n, but its complement (degree n-1-d) does not.
    dense = d > (n - 1) // 2
    target = n - 1 - d if dense else d
    for _ in range(MAX_ATTEMPTS):
        edges = _pairing(n, target, rng)
        if edges is None:
            continue
        out: list[set[int]] = [set() for _ in range(n)]
        for i, j in edges:
            out[i].add(j)
            out[j].add(i)
        if dense:
            out = [set(range(n)) - out[i] - {i} for i in range(n)]
        adj = freeze(out)
        if _connected(adj):
            return adj
    raise TopologyError(
        f"could not draw a connected {d}-regular graph on {n} peers in {MAX_ATTEMPTS} "
        f"attempts; try a larger degree (3 or more) or another seed"
    )


def _pairing(n: int, d: int, rng: np.random.Generator) -> set[tuple[int, int]] | None:
    """One try of the pairing model with partial restarts (Steger-Wormald style).

    Stubs (d per node) are shuffled and paired; pairs that would make a self-loop or a
    repeated edge go back into the pool and are reshuffled. Returns None when the pool
    can no longer be completed, so the caller starts over.
    """
    edges: set[tuple[int, int]] = set()
    stubs = np.repeat(np.arange(n), d)
    # Each reshuffle almost always places a pair; the bound only stops a pathological loop.
    for _ in range(10 * n * max(d, 1) + 10):
        if stubs.size == 0:
            return edges
        shuffled = rng.permutation(stubs).tolist()
        leftover: list[int] = []
        for a, b in zip(shuffled[0::2], shuffled[1::2], strict=True):
            if a > b:
                a, b = b, a
            if a != b and (a, b) not in edges:
                edges.add((a, b))
            else:
                leftover += [a, b]
        if leftover and not _completable(leftover, edges):
            return None
        stubs = np.array(leftover, dtype=np.intp)
    return None


def _completable(stubs: list[int], edges: set[tuple[int, int]]) -> bool:
    """Whether some two distinct nodes left in the pool may still be joined."""
    nodes = sorted(set(stubs))
    return any((a, b) not in edges for i, a in enumerate(nodes) for b in nodes[i + 1 :])
