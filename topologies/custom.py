"""User-built topologies: from an edge list or from a mixing matrix."""

from __future__ import annotations

import numbers
from collections.abc import Iterable

import numpy as np

from topologies._checks import check_size
from topologies.base import Topology
from topologies.errors import TopologyError
from topologies.graph import Adjacency, connectivity_problem, freeze
from topologies.sparse import SparseMatrix

__all__ = ["CustomTopology", "from_edges", "from_matrix", "STOCHASTIC_TOL"]

# Row/column sums of a user matrix may be off by this much (e.g. 1/3 written to 9 digits)
# and still count as stochastic.
STOCHASTIC_TOL = 1e-9

_CONNECT_HINT = "add edges that join the parts; gossip can only average within a component"


class CustomTopology(Topology):
    """A static graph built by from_edges, from_matrix or from_networkx.

    Build it with those functions, which validate the input; the constructor trusts its
    arguments. With an explicit `matrix` the weights are the user's (weight_scheme
    'custom'); otherwise they follow the usual default for the graph's direction.
    """

    name = "custom"
    _adj: Adjacency
    _matrix_given: np.ndarray | None

    def __init__(
        self,
        size: int,
        out: Adjacency,
        *,
        directed: bool,
        weights: str | None = None,
        matrix: np.ndarray | None = None,
    ) -> None:
        super().__init__(size, directed=directed, weights=weights)
        fields: dict[str, object] = {"_adj": freeze(out), "_matrix_given": None}
        if matrix is not None:
            frozen = np.array(matrix, dtype=np.float64, order="C")
            frozen.flags.writeable = False
            fields.update(_matrix_given=frozen, _scheme="custom", _default_scheme="custom")
        self._freeze_fields(**fields)

    def _out(self, phase: int) -> Adjacency:
        return self._adj

    def _sparse(self, phase: int) -> SparseMatrix:
        if self._matrix_given is not None:
            return SparseMatrix.from_dense(self._matrix_given)
        return super()._sparse(phase)

    def _params(self) -> tuple:
        given = None if self._matrix_given is None else self._matrix_given.tobytes()
        return (self._size, self._directed, self._adj, given)

    def __repr__(self) -> str:
        n = self._size
        if self._matrix_given is not None:
            return f"from_matrix(<{n}x{n} matrix>)"
        edges = self.edges()
        shown = repr(edges) if len(edges) <= 6 else f"<{len(edges)} edges>"
        directed = ", directed=True" if self._directed else ""
        return f"from_edges({n}, {shown}{directed}{self._weights_kwarg()})"


def _plain(value: object) -> object:
    """numpy integers as Python ints, so messages show (0, 1), not (np.int64(0), ...)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    return value


def _rank_of(value: object, n: int, index: int, edge: tuple) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TopologyError(
            f"edge #{index} {edge!r}: ranks must be integers, got {value!r} "
            f"({type(value).__name__}); relabel the nodes as 0..{n - 1}"
        )
    r = int(value)
    if not 0 <= r < n:
        raise TopologyError(
            f"edge #{index} {edge!r}: rank {r} is out of range for size {n}; "
            f"ranks are 0..{n - 1} (pass a larger n or fix the edge)"
        )
    return r


def from_edges(
    n: int,
    edges: Iterable[tuple[int, int]],
    directed: bool = False,
    *,
    weights: str | None = None,
) -> CustomTopology:
    """A static topology of `n` peers from (a, b) pairs; a directed edge a -> b means a sends to b.

    The graph must be connected (strongly connected if directed), without self-loops
    (every peer always keeps part of its own value through the diagonal of W) and without
    repeated edges. Weights default to Metropolis-Hastings (undirected) or push (directed).
    """
    n = check_size(n)
    if not isinstance(directed, bool):
        raise TopologyError(f"directed must be True or False, got {directed!r}")
    try:
        items = list(edges)
    except TypeError:
        raise TopologyError(
            f"edges must be an iterable of (a, b) pairs, got {type(edges).__name__}"
        ) from None
    out: list[set[int]] = [set() for _ in range(n)]
    seen: dict[tuple[int, int], tuple[int, tuple[int, int]]] = {}
    for index, item in enumerate(items):
        try:
            pair = tuple(_plain(v) for v in item)
        except TypeError:
            pair = (item,)
        if len(pair) != 2:
            raise TopologyError(f"edge #{index} {item!r} is not a pair; give each edge as (a, b)")
        a = _rank_of(pair[0], n, index, pair)
        b = _rank_of(pair[1], n, index, pair)
        if a == b:
            raise TopologyError(
                f"edge #{index} ({a}, {b}) is a self-loop; remove it: a peer always keeps "
                f"part of its own value through the diagonal of the mixing matrix"
            )
        key = (a, b) if directed else (min(a, b), max(a, b))
        if key in seen:
            first, first_pair = seen[key]
            fix = "list each edge once"
            if (a, b) != first_pair:  # only possible when undirected
                fix = (
                    "in an undirected graph (a, b) and (b, a) are the same edge; list each "
                    "edge once, or pass directed=True for one-way edges"
                )
            raise TopologyError(
                f"edge #{index} ({a}, {b}) repeats edge #{first} {first_pair}; {fix}"
            )
        seen[key] = (index, (a, b))
        out[a].add(b)
        if not directed:
            out[b].add(a)
    adj = freeze(out)
    problem = connectivity_problem(adj, directed=directed)
    if problem:
        raise TopologyError(f"{problem}; {_CONNECT_HINT}")
    return CustomTopology(n, adj, directed=directed, weights=weights)


def from_matrix(matrix: object) -> CustomTopology:
    """A static topology whose mixing matrix is `matrix` (W[i, j]: receiver i, sender j).

    W must be square and non-negative. A symmetric W must be doubly stochastic; any other
    W must be column-stochastic (each sender's shares sum to 1, as push-sum needs). The
    graph is the off-diagonal support of W: j sends to i where W[i, j] > 0. It is directed
    unless that support is symmetric, and must be (strongly) connected.
    """
    try:
        w = np.array(matrix, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TopologyError(
            f"the mixing matrix must be a square array of numbers ({exc}); "
            f"pass e.g. a numpy float array of shape (n, n)"
        ) from None
    if w.ndim != 2 or w.shape[0] != w.shape[1] or w.shape[0] < 1:
        raise TopologyError(
            f"the mixing matrix must be square n x n with n >= 1, got shape {w.shape}; "
            f"W[i, j] is the weight receiver i gives to sender j"
        )
    n = w.shape[0]
    if not np.all(np.isfinite(w)):
        i, j = np.argwhere(~np.isfinite(w))[0]
        raise TopologyError(f"W[{i}, {j}] = {w[i, j]} is not finite; use finite weights")
    if np.any(w < 0):
        i, j = np.argwhere(w < 0)[0]
        raise TopologyError(
            f"W[{i}, {j}] = {w[i, j]:.6g} is negative; mixing weights must be >= 0 "
            f"(a weight is a share of a value)"
        )
    symmetric = np.allclose(w, w.T, rtol=0.0, atol=STOCHASTIC_TOL)
    if symmetric:
        sums, what = w.sum(axis=1), "row"
        rule = "a symmetric mixing matrix must be doubly stochastic (rows and columns sum to 1)"
        fix = "W[i, :] /= W[i, :].sum() (keeping W symmetric)"
    else:
        sums, what = w.sum(axis=0), "column"
        rule = (
            "a non-symmetric mixing matrix must be column-stochastic: column j holds the "
            "shares sender j gives away and they must sum to 1"
        )
        fix = "W[:, j] /= W[:, j].sum(), or pass W.T if you wrote rows as senders"
    bad = np.flatnonzero(np.abs(sums - 1.0) > STOCHASTIC_TOL)
    if bad.size:
        k = int(bad[0])
        raise TopologyError(
            f"{what} {k} of the mixing matrix sums to {sums[k]:.12g}, not 1; {rule}; "
            f"fix it with {fix}"
        )
    support = (w > 0) & ~np.eye(n, dtype=bool)
    directed = not np.array_equal(support, support.T)
    out = [np.flatnonzero(support[:, j]).tolist() for j in range(n)]
    adj = freeze(out)
    problem = connectivity_problem(adj, directed=directed)
    if problem:
        raise TopologyError(
            f"{problem} (the graph is where W[i, j] > 0 off the diagonal); {_CONNECT_HINT}"
        )
    return CustomTopology(n, adj, directed=directed, matrix=w)
