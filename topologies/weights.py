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

from topologies.graph import Adjacency

__all__ = ["WEIGHT_SCHEMES", "metropolis_matrix", "uniform_matrix", "push_matrix", "build"]

WEIGHT_SCHEMES = ("metropolis", "uniform", "push")
"""The mixing-weight schemes' names (see this module's docstring), in the order they are
documented."""


def _edge_arrays(out: Adjacency) -> tuple[np.ndarray, np.ndarray]:
    """(senders, receivers) of every directed edge, as int arrays."""
    senders = np.fromiter((j for j, recv in enumerate(out) for _ in recv), dtype=np.intp)
    receivers = np.fromiter((i for recv in out for i in recv), dtype=np.intp)
    return senders, receivers


def metropolis_matrix(adj: Adjacency) -> np.ndarray:
    """Metropolis-Hastings weights of an undirected graph (adj symmetric)."""
    n = len(adj)
    deg = np.array([len(a) for a in adj], dtype=np.float64)
    w = np.zeros((n, n), dtype=np.float64)
    senders, receivers = _edge_arrays(adj)
    w[receivers, senders] = 1.0 / (1.0 + np.maximum(deg[receivers], deg[senders]))
    # Self weight last, from the row sum, so every row sums to one to the last ulp we can.
    w[np.arange(n), np.arange(n)] = 1.0 - w.sum(axis=1)
    return w


def uniform_matrix(inn: Adjacency) -> np.ndarray:
    """Row-stochastic equal weights over each receiver's in-neighbours and itself."""
    n = len(inn)
    w = np.zeros((n, n), dtype=np.float64)
    for i, senders in enumerate(inn):
        share = 1.0 / (len(senders) + 1)
        w[i, list(senders)] = share
        w[i, i] = share
    return w


def push_matrix(out: Adjacency) -> np.ndarray:
    """Column-stochastic push weights: each sender splits its value equally."""
    n = len(out)
    w = np.zeros((n, n), dtype=np.float64)
    for j, receivers in enumerate(out):
        share = 1.0 / (len(receivers) + 1)
        w[list(receivers), j] = share
        w[j, j] = share
    return w


def build(scheme: str, out: Adjacency, inn: Adjacency) -> np.ndarray:
    """The mixing matrix of one graph under a canonical scheme name."""
    if scheme == "metropolis":
        return metropolis_matrix(out)
    if scheme == "uniform":
        return uniform_matrix(inn)
    if scheme == "push":
        return push_matrix(out)
    raise ValueError(f"internal: unknown weight scheme {scheme!r}")  # normalised upstream
