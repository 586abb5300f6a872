"""Spectral quantities of mixing matrices: how fast gossip reaches consensus.

The second-largest eigenvalue modulus (SLEM) of a stochastic W is the factor by which one
round asymptotically shrinks the disagreement between peers; 1 - SLEM is the spectral gap.

Three ways to it, fastest first: the built-in graph families are Cayley graphs of cyclic
groups (a ring is Z_n with connections +-1, a torus Z_r x Z_c, the exponential graphs Z_n
with powers of two), whose mixing matrices are diagonalised by the discrete Fourier
transform: their spectrum is the FFT of one row (`cayley_spectrum`), O(n log n) for any n.
Other static graphs above `DENSE_MAX` peers go to a sparse eigensolver (`sparse_slem`,
scipy's ARPACK); the rest to a dense eigensolver (`slem`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from topologies.errors import TopologyError
from topologies.sparse import SparseMatrix

__all__ = [
    "slem",
    "spectrum_slem",
    "cayley_spectrum",
    "sparse_slem",
    "period_product",
    "consensus_rounds",
    "DENSE_MAX",
]

# Eigen-solvers return 1e-16 where the exact answer is 0 (complete graph, one-peer
# exponential over a period) and 1 - 1e-16 where it is 1 (a periodic matrix); snapping
# keeps the reported numbers and the round counts exact in those cases.
_ZERO_TOL = 1e-12

DENSE_MAX = 1024
"""Static graphs of more peers than this, that no closed form covers, get their SLEM from a
sparse eigensolver (where scipy is installed) instead of a dense one: a dense eigensolve of
n = 4,096 takes seconds and 128 MiB per matrix copy."""


def _snap(value: float) -> float:
    if value < _ZERO_TOL:
        return 0.0
    if value > 1.0 - _ZERO_TOL:
        return 1.0
    return value


def spectrum_slem(eigenvalues: np.ndarray) -> float:
    """Second-largest modulus among `eigenvalues` (all of a stochastic matrix's, or its
    largest few), snapped to exactly 0 or 1 within 1e-12; 0.0 for fewer than two."""
    moduli = np.sort(np.abs(np.asarray(eigenvalues).ravel()))
    if moduli.size < 2:
        return 0.0
    return _snap(float(moduli[-2]))


def cayley_spectrum(shape: tuple[int, ...], kernel: np.ndarray) -> np.ndarray:
    """Eigenvalues of the matrix W[i, j] = kernel[j - i] on the group Z_shape[0] x ... .

    Ranks are the group's elements in row-major order (rank = numpy.ravel_multi_index(g,
    shape)); `kernel` (of that shape) is row 0 of W, i.e. the weight a peer gives the peer
    at each offset from it. Such a W commutes with every translation, so the characters of
    the group are its eigenvectors and its eigenvalues are the discrete Fourier transform
    of the kernel, one per character (complex for a directed graph).
    """
    k = np.asarray(kernel, dtype=np.float64)
    if k.shape != tuple(shape):
        raise TopologyError(f"cayley_spectrum: kernel of shape {k.shape}, group {shape}")
    return np.fft.fftn(k).ravel()


def sparse_slem(matrix: SparseMatrix) -> float:
    """SLEM of a sparse stochastic matrix from its few largest-modulus eigenvalues (scipy's
    ARPACK: eigsh where the matrix is symmetric, eigs otherwise); the dense `slem` where
    scipy is missing, the matrix is small, or ARPACK does not converge."""
    n = matrix.size
    if n <= 8:
        return slem(matrix.to_dense())
    try:
        from scipy.sparse import linalg
    except ImportError:  # pragma: no cover - scipy comes with the demo extra
        return slem(matrix.to_dense())
    a = matrix.to_scipy()
    k = min(6, n - 2)
    try:
        if matrix.is_symmetric():
            values = linalg.eigsh(a, k=k, which="LM", return_eigenvectors=False, tol=0)
        else:
            values = linalg.eigs(a, k=k, which="LM", return_eigenvectors=False, tol=0)
    except linalg.ArpackNoConvergence:
        return slem(matrix.to_dense())
    return spectrum_slem(values)


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
    return spectrum_slem(moduli)


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
