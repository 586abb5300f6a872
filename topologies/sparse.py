"""A mixing matrix in compressed sparse rows: what a topology of thousands of peers stores.

A peer of a degree-d graph has d + 1 nonzero weights in its row, so W of n peers holds
n * (d + 1) numbers instead of n * n: 4,096 ring peers take 12,288 weights (about 200 KB
with their indices) where the dense matrix takes 128 MiB. Everything a topology derives
(each peer's weights, the dense matrix on request, one round of mixing) reads this form.
numpy only; `to_scipy()` hands it to scipy.sparse where scipy is installed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["SparseMatrix"]


@dataclass(frozen=True, eq=False)
class SparseMatrix:
    """An n x n float64 matrix in compressed sparse rows (CSR), immutable.

    Row i's nonzeros are ``data[indptr[i]:indptr[i + 1]]`` in the columns
    ``indices[indptr[i]:indptr[i + 1]]``, sorted. For a mixing matrix, row i is receiver i
    and column j sender j, as in `Topology.mixing_matrix`.
    """

    size: int
    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray
    # scipy's csr_array of this matrix once matvec made it (False: scipy is not installed).
    _scipy: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for array in (self.indptr, self.indices, self.data):
            array.flags.writeable = False

    @classmethod
    def from_entries(
        cls, size: int, rows: np.ndarray, cols: np.ndarray, values: np.ndarray
    ) -> SparseMatrix:
        """The matrix with ``values[k]`` at ``(rows[k], cols[k])`` (positions distinct)."""
        rows = np.asarray(rows, dtype=np.int64)
        cols = np.asarray(cols, dtype=np.int64)
        values = np.asarray(values, dtype=np.float64)
        order = np.lexsort((cols, rows))
        indptr = np.zeros(size + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=size), out=indptr[1:])
        return cls(size, indptr, cols[order], values[order])

    @classmethod
    def from_dense(cls, matrix: np.ndarray) -> SparseMatrix:
        """The nonzeros of a square dense matrix."""
        w = np.asarray(matrix, dtype=np.float64)
        rows, cols = np.nonzero(w)
        return cls.from_entries(w.shape[0], rows, cols, w[rows, cols])

    @property
    def nnz(self) -> int:
        """Number of stored (nonzero) entries."""
        return int(self.indptr[-1])

    def row(self, i: int) -> dict[int, float]:
        """Row i's nonzeros as {column: value}."""
        lo, hi = int(self.indptr[i]), int(self.indptr[i + 1])
        return dict(zip(self.indices[lo:hi].tolist(), self.data[lo:hi].tolist()))

    def diagonal(self) -> np.ndarray:
        """The n diagonal entries (zeros where none is stored)."""
        rows = np.repeat(np.arange(self.size), np.diff(self.indptr))
        out = np.zeros(self.size)
        on = rows == self.indices
        out[rows[on]] = self.data[on]
        return out

    def row_sums(self) -> np.ndarray:
        """The n sums of each row (a row-stochastic matrix's are all one)."""
        rows = np.repeat(np.arange(self.size), np.diff(self.indptr))
        return np.bincount(rows, weights=self.data, minlength=self.size)

    def column_sums(self) -> np.ndarray:
        """The n sums of each column (a column-stochastic matrix's are all one)."""
        return np.bincount(self.indices, weights=self.data, minlength=self.size)

    def transpose(self) -> SparseMatrix:
        """The transpose (column j of this matrix is row j of the result)."""
        rows = np.repeat(np.arange(self.size, dtype=np.int64), np.diff(self.indptr))
        return SparseMatrix.from_entries(self.size, self.indices, rows, self.data)

    def is_symmetric(self) -> bool:
        """Whether the matrix equals its transpose exactly."""
        t = self.transpose()
        return bool(
            np.array_equal(self.indptr, t.indptr)
            and np.array_equal(self.indices, t.indices)
            and np.array_equal(self.data, t.data)
        )

    def to_dense(self) -> np.ndarray:
        """The n x n float64 array (a fresh, writable copy)."""
        w = np.zeros((self.size, self.size), dtype=np.float64)
        rows = np.repeat(np.arange(self.size), np.diff(self.indptr))
        w[rows, self.indices] = self.data
        return w

    def matvec(self, x: np.ndarray, *, use_scipy: bool = True) -> np.ndarray:
        """W @ x for x of shape (n,) or (n, k): one round of mixing of n peers' values
        (scipy's sparse product where scipy is installed and `use_scipy`, numpy's
        otherwise)."""
        x = np.asarray(x)
        if x.ndim not in (1, 2) or x.shape[0] != self.size:
            raise ValueError(f"matvec needs {self.size} rows, got an array of shape {x.shape}")
        if use_scipy and "csr" not in self._scipy:
            try:
                self._scipy["csr"] = self.to_scipy()
            except ImportError:
                self._scipy["csr"] = False
        if use_scipy and self._scipy["csr"] is not False:   # scipy's kernel: ~25x numpy's reduceat at 2-D
            return np.asarray(self._scipy["csr"] @ x)
        contributions = self.data.reshape((-1,) + (1,) * (x.ndim - 1)) * x[self.indices]
        out = np.zeros((self.size,) + x.shape[1:], dtype=np.result_type(x, np.float64))
        filled = np.diff(self.indptr) > 0
        if self.nnz:
            out[filled] = np.add.reduceat(contributions, self.indptr[:-1][filled], axis=0)
        return out

    def to_scipy(self) -> Any:
        """A scipy.sparse.csr_array of this matrix (needs scipy)."""
        try:
            from scipy import sparse
        except ImportError as exc:  # pragma: no cover - scipy comes with the demo extra
            raise ImportError(
                "SparseMatrix.to_scipy needs scipy: pip install scipy (or gossip[demo])"
            ) from exc
        return sparse.csr_array(
            (self.data, self.indices, self.indptr), shape=(self.size, self.size)
        )

    def __repr__(self) -> str:
        return f"SparseMatrix(size={self.size}, nnz={self.nnz})"
