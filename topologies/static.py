"""Fixed, deterministic graph families: ring, 2-D torus, complete graph, exponential graph."""

from __future__ import annotations

from topologies._checks import check_size
from topologies.base import Topology

__all__ = ["Ring", "Torus", "Complete", "Exponential"]


class Ring(Topology):
    """Peers on a cycle, each talking to rank - 1 and rank + 1 (mod n). Undirected.

    With the default Metropolis-Hastings weights every weight is 1/3 for n >= 3; Ring(2) is
    a single edge (weights 1/2) and Ring(1) has no edges.
    """

    name = "ring"

    def __init__(self, n: int, *, weights: str | None = None) -> None:
        n = check_size(n)
        super().__init__(n, directed=False, weights=weights)

    def _out(self, phase: int) -> list[set[int]]:
        n = self._size
        # A set drops the duplicate for n = 2 and the self-loop for n = 1.
        return [{(i - 1) % n, (i + 1) % n} - {i} for i in range(n)]

    def _cayley(self, phase: int) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
        return (self._size,), [(1,), (-1,)]

    def _params(self) -> tuple:
        return (self._size,)

    @property
    def spec(self) -> str:
        return "ring" + self._weights_suffix()

    def __repr__(self) -> str:
        return f"Ring({self._size}{self._weights_kwarg()})"


class Torus(Topology):
    """A rows x cols grid with wrap-around; rank = row * cols + col. Undirected.

    Each peer talks to the peers above, below, left and right of it (mod the grid). When a
    side has length 2 the two wrap-around neighbours coincide and are counted once; when it
    has length 1 they are the peer itself and are dropped, so 1 x K is a ring and 1 x 1 has
    no edges.
    """

    name = "torus"
    _rows: int
    _cols: int

    def __init__(self, rows: int, cols: int, *, weights: str | None = None) -> None:
        rows = check_size(rows, "torus rows")
        cols = check_size(cols, "torus cols")
        super().__init__(rows * cols, directed=False, weights=weights)
        self._freeze_fields(_rows=rows, _cols=cols)

    @property
    def rows(self) -> int:
        """Number of grid rows."""
        return self._rows

    @property
    def cols(self) -> int:
        """Number of grid columns."""
        return self._cols

    def _out(self, phase: int) -> list[set[int]]:
        rows, cols = self._rows, self._cols
        out = []
        for rank in range(rows * cols):
            r, c = divmod(rank, cols)
            neigh = {
                ((r - 1) % rows) * cols + c,
                ((r + 1) % rows) * cols + c,
                r * cols + (c - 1) % cols,
                r * cols + (c + 1) % cols,
            }
            neigh.discard(rank)
            out.append(neigh)
        return out

    def _cayley(self, phase: int) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
        return (self._rows, self._cols), [(1, 0), (-1, 0), (0, 1), (0, -1)]

    def _params(self) -> tuple:
        return (self._rows, self._cols)

    @property
    def spec(self) -> str:
        return f"torus:{self._rows}x{self._cols}" + self._weights_suffix()

    def __repr__(self) -> str:
        return f"Torus({self._rows}, {self._cols}{self._weights_kwarg()})"


class Complete(Topology):
    """Every peer talks to every other peer. Undirected; with Metropolis-Hastings weights
    W = 11^T / n, so one round gives the exact average (SLEM 0)."""

    name = "complete"

    def __init__(self, n: int, *, weights: str | None = None) -> None:
        n = check_size(n)
        super().__init__(n, directed=False, weights=weights)

    def _out(self, phase: int) -> list[set[int]]:
        everyone = set(range(self._size))
        return [everyone - {i} for i in range(self._size)]

    def _cayley(self, phase: int) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
        return (self._size,), [(k,) for k in range(1, self._size)]

    def _params(self) -> tuple:
        return (self._size,)

    @property
    def spec(self) -> str:
        return "complete" + self._weights_suffix()

    def __repr__(self) -> str:
        return f"Complete({self._size}{self._weights_kwarg()})"


class Exponential(Topology):
    """Static exponential graph: rank i sends to (i + 2^k) mod n for k = 0..ceil(log2 n)-1.

    Directed (i sends to i + 1 but hears from i - 1); duplicate targets are merged and self
    excluded. Degree ~log2 n with a spectral gap that stays large as n grows, the standard
    graph of SGP. Default weights are column-stochastic push weights.
    """

    name = "exponential"

    def __init__(self, n: int, *, weights: str | None = None) -> None:
        n = check_size(n)
        super().__init__(n, directed=True, weights=weights)

    def _out(self, phase: int) -> list[set[int]]:
        n = self._size
        # (n - 1).bit_length() is ceil(log2 n) in exact integer arithmetic (0 for n = 1).
        hops = [1 << k for k in range((n - 1).bit_length())]
        return [{(i + h) % n for h in hops} - {i} for i in range(n)]

    def _cayley(self, phase: int) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
        return (self._size,), [(1 << k,) for k in range((self._size - 1).bit_length())]

    def _params(self) -> tuple:
        return (self._size,)

    @property
    def spec(self) -> str:
        return "exponential" + self._weights_suffix()

    def __repr__(self) -> str:
        return f"Exponential({self._size}{self._weights_kwarg()})"
