"""Spectral quantities of mixing matrices: how fast gossip reaches consensus.

The second-largest eigenvalue modulus (SLEM) of a stochastic W is the factor by which one
round asymptotically shrinks the disagreement between peers; 1 - SLEM is the spectral gap.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from topologies.errors import TopologyError

__all__ = ["slem", "period_product", "consensus_rounds"]

# Eigen-solvers return 1e-16 where the exact answer is 0 (complete graph, one-peer
# exponential over a period) and 1 - 1e-16 where it is 1 (a periodic matrix); snapping
# keeps the reported numbers and the round counts exact in those cases.
_ZERO_TOL = 1e-12


def slem(matrix: np.ndarray) -> float:
    """Second-largest eigenvalue modulus of a square stochastic matrix (0.0 for 1 x 1)."""
    w = np.asarray(matrix, dtype=np.float64)
    if w.ndim != 2 or w.shape[0] != w.shape[1]:
        raise TopologyError(f"slem needs a square matrix, got shape {w.shape}")
    if w.shape[0] <= 1:
        return 0.0
    # eigvalsh is faster and exact-real for the symmetric (Metropolis) case.
    if np.array_equal(w, w.T):
        moduli = np.abs(np.linalg.eigvalsh(w))
    else:
        moduli = np.abs(np.linalg.eigvals(w))
    moduli.sort()
    value = float(moduli[-2])
    if value < _ZERO_TOL:
        return 0.0
    if value > 1.0 - _ZERO_TOL:
        return 1.0
    return value


def period_product(matrices: Iterable[np.ndarray]) -> np.ndarray:
    """W_{P-1} ... W_1 W_0: the effect of one period of a time-varying schedule (x <- W_t x)."""
    product: np.ndarray | None = None
    for w in matrices:
        product = w.copy() if product is None else w @ product
    if product is None:
        raise TopologyError("period_product needs at least one matrix")
    return product


def consensus_rounds(
    slem_value: float, *, factor: float = 1000.0, period: int = 1, size: int = 2
) -> int | float:
    """Rounds (steps) for the disagreement to shrink by `factor`, from the SLEM of one period.

    ceil(ln(factor) / -ln(SLEM)) periods, times `period` steps each; math.inf when the SLEM
    is 1 (no consensus), 0 for a single peer (nothing to agree on) or factor 1, and one
    period when the SLEM is 0 (exact average after a period).
    """
    if (
        isinstance(factor, bool)
        or not isinstance(factor, (int, float))
        or not math.isfinite(factor)
    ):
        raise TopologyError(f"factor must be a finite number >= 1, got {factor!r}")
    if factor < 1:
        raise TopologyError(
            f"factor must be >= 1 (the disagreement is divided by it), got {factor!r}; "
            f"for a 1000x reduction pass factor=1000"
        )
    if size <= 1 or factor == 1:
        return 0
    if slem_value >= 1.0:
        return math.inf
    if slem_value <= 0.0:
        return period
    periods = math.log(factor) / -math.log(slem_value)
    # Guard against 2.9999999999999996 -> 3 turning into 4 through the ceiling.
    return max(1, math.ceil(periods - 1e-9)) * period
