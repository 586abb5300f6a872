"""Mixing-weight schemes: how a graph becomes a mixing matrix.

Convention everywhere in this package: W[i, j] is the weight receiver i gives to the value
sent by j, so one gossip round is x_new = W @ x (rows = receivers, columns = senders).

- "metropolis" (Metropolis-Hastings, default for undirected graphs):
  W[i, j] = 1 / (1 + max(deg i, deg j)) for each edge, W[i, i] = 1 - sum of the rest of
  row i. Symmetric and doubly stochastic for any degree sequence, so plain gossip
  converges to the exact average even on irregular graphs.
- "uniform": W[i, j] = 1 / (indeg i + 1) for j in N_in(i) and j = i. Row-stochastic: each
  receiver takes the plain mean of what it holds and hears. On an irregular graph it
  converges to a degree-weighted average, not the mean.
- "push" (default for directed and time-varying graphs): W[i, j] = 1 / (outdeg j + 1) for
  i in N_out(j) and i = j. Column-stochastic: sender j keeps one share and sends one share
  to each out-neighbour, so total mass is conserved; push-sum (SGP) divides by a weight
  that travels the same way to recover the exact average.
"""

from __future__ import annotations

import numpy as np

from topologies.graph import Adjacency, reverse
from topologies.sparse import SparseMatrix

__all__ = [
    "WEIGHT_SCHEMES",
    "metropolis_matrix",
    "uniform_matrix",
    "push_matrix",
    "build",
    "build_sparse",
    "regular_row",
]

WEIGHT_SCHEMES = ("metropolis", "uniform", "push")
"""The mixing-weight schemes' names (see this module's docstring), in the order they are
documented."""


def _edge_arrays(out: Adjacency) -> tuple[np.ndarray, np.ndarray]:
    """(senders, receivers) of every directed edge, as int arrays."""
    counts = np.fromiter((len(recv) for recv in out), dtype=np.int64, count=len(out))
    senders = np.repeat(np.arange(len(out), dtype=np.int64), counts)
    receivers = np.fromiter(
        (i for recv in out for i in recv), dtype=np.int64, count=int(counts.sum())
    )
    return senders, receivers


def _with_diagonal(
    n: int, receivers: np.ndarray, senders: np.ndarray, w: np.ndarray, diagonal: np.ndarray
) -> SparseMatrix:
    ranks = np.arange(n, dtype=np.int64)
    return SparseMatrix.from_entries(
        n,
        np.concatenate([receivers, ranks]),
        np.concatenate([senders, ranks]),
        np.concatenate([w, diagonal]),
    )


def _metropolis(adj: Adjacency) -> SparseMatrix:
    n = len(adj)
    senders, receivers = _edge_arrays(adj)
    deg = np.bincount(senders, minlength=n).astype(np.float64)
    w = 1.0 / (1.0 + np.maximum(deg[receivers], deg[senders]))
    # Self weight last, from the row sum, so every row sums to one to the last ulp we can.
    order = np.lexsort((senders, receivers))
    diagonal = 1.0 - np.bincount(receivers[order], weights=w[order], minlength=n)
    return _with_diagonal(n, receivers, senders, w, diagonal)


def _uniform(out: Adjacency, inn: Adjacency) -> SparseMatrix:
    n = len(out)
    senders, receivers = _edge_arrays(out)
    share = 1.0 / (np.fromiter((len(s) for s in inn), dtype=np.float64, count=n) + 1.0)
    return _with_diagonal(n, receivers, senders, share[receivers], share)


def _push(out: Adjacency) -> SparseMatrix:
    n = len(out)
    senders, receivers = _edge_arrays(out)
    share = 1.0 / (np.fromiter((len(r) for r in out), dtype=np.float64, count=n) + 1.0)
    return _with_diagonal(n, receivers, senders, share[senders], share)


def metropolis_matrix(adj: Adjacency) -> np.ndarray:
    """Metropolis-Hastings weights of an undirected graph (adj symmetric), dense."""
    return _metropolis(adj).to_dense()


def uniform_matrix(inn: Adjacency) -> np.ndarray:
    """Row-stochastic equal weights over each receiver's in-neighbours and itself, dense."""
    return _uniform(reverse(inn), inn).to_dense()


def push_matrix(out: Adjacency) -> np.ndarray:
    """Column-stochastic push weights: each sender splits its value equally; dense."""
    return _push(out).to_dense()


def build_sparse(scheme: str, out: Adjacency, inn: Adjacency) -> SparseMatrix:
    """The mixing matrix of one graph under a canonical scheme name, in sparse rows."""
    if scheme == "metropolis":
        return _metropolis(out)
    if scheme == "uniform":
        return _uniform(out, inn)
    if scheme == "push":
        return _push(out)
    raise ValueError(f"internal: unknown weight scheme {scheme!r}")  # normalised upstream


def build(scheme: str, out: Adjacency, inn: Adjacency) -> np.ndarray:
    """The mixing matrix of one graph under a canonical scheme name, dense."""
    return build_sparse(scheme, out, inn).to_dense()


def regular_row(scheme: str, degree: int) -> tuple[float, float]:
    """(self weight, weight of each neighbour) of a peer in a graph where every peer sends
    to and hears from `degree` others: the row every peer of a ring, torus, complete or
    exponential graph has, under any scheme, computed as `build` computes it."""
    share = 1.0 / (degree + 1.0)
    if scheme != "metropolis":
        return share, share
    total = 0.0
    for _ in range(degree):  # in the order build's row sum adds them (np.bincount's)
        total += share
    return 1.0 - total, share
