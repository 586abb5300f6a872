"""The Topology base class: neighbours, mixing weights and spectral numbers of a peer graph."""

from __future__ import annotations

import abc
import hashlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import numpy as np

from topologies import spectral
from topologies import weights as weight_schemes
from topologies._checks import check_rank, check_step, normalize_weights
from topologies.errors import TopologyError
from topologies.graph import Adjacency, freeze, reverse
from topologies.sparse import SparseMatrix

__all__ = ["Topology", "require_networkx"]

_T = TypeVar("_T")


class Topology(abc.ABC):
    """An immutable graph of `size` peers with mixing weights, possibly changing per step.

    Conventions (shared by every method taking `step`):

    - Ranks are 0..size-1. Neighbour lists are sorted lists of ints.
    - `mixing_matrix(step)[i, j]` is the weight receiver i gives to the value sent by j, so
      one gossip round is ``x_new = W @ x``. Rows are receivers, columns are senders.
    - `weights(rank)` is row `rank` (what `rank` multiplies each received value by, used by
      plain gossip); `push_weights(rank)` is column `rank` (the share of its value `rank`
      sends to each out-neighbour, used by push-sum).
    - A time-varying topology repeats with `period` steps; `step` is taken modulo it. Its
      spectral numbers describe one whole period.

    Subclasses implement `_out(phase)` (who sends to whom), `_params()` (the constructor
    arguments, for equality and repr) and `spec` (a string `parse` turns back into an
    equal topology). Everything derived is computed once per instance and cached, which is
    safe because instances are immutable.
    """

    #: Family name as used in spec strings ("ring", "torus", ...).
    name: str = "custom"
    #: Whether the neighbour sets change with the step.
    is_time_varying: bool = False

    # The instance's fields, each set once through _freeze_fields (instances are immutable).
    _size: int
    _directed: bool
    _period: int
    _scheme: str
    _default_scheme: str
    _cache: dict[tuple, Any]

    # ------------------------------------------------------------------ construction

    def __init__(
        self, size: int, *, directed: bool, weights: str | None = None, period: int = 1
    ) -> None:
        scheme = normalize_weights(weights)
        default = "push" if (directed or self.is_time_varying) else "metropolis"
        if scheme is None:
            scheme = default
        if scheme == "metropolis" and directed:
            raise TopologyError(
                f"Metropolis-Hastings weights need an undirected graph, but {self.name} is "
                f"directed; use weights='push' (column-stochastic, for push-sum) or "
                f"weights='uniform'"
            )
        self._freeze_fields(
            _size=size,
            _directed=bool(directed),
            _period=period,
            _scheme=scheme,
            _default_scheme=default,
            _cache={},
        )

    def _freeze_fields(self, **fields: object) -> None:
        for key, value in fields.items():
            object.__setattr__(self, key, value)

    def __setattr__(self, key: str, value: object) -> None:
        raise AttributeError(
            f"{type(self).__name__} is immutable; build a new topology instead of setting {key!r}"
        )

    def __delattr__(self, key: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable; cannot delete {key!r}")

    # Pickling (e.g. to spawned peer processes) drops the caches; they are rebuilt on use.
    def __getstate__(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if k != "_cache"}

    def __setstate__(self, state: dict[str, object]) -> None:
        self._freeze_fields(**state, _cache={})

    # ------------------------------------------------------------------ subclass hooks

    @abc.abstractmethod
    def _out(self, phase: int) -> Sequence[Iterable[int]]:
        """Out-neighbours of every rank at `phase` (0 <= phase < period); no self-loops."""

    @abc.abstractmethod
    def _params(self) -> tuple:
        """Constructor arguments that, with the class and weight scheme, define equality."""

    def _sparse(self, phase: int) -> SparseMatrix:
        """The mixing matrix at `phase`; subclasses with explicit weights override this."""
        return weight_schemes.build_sparse(
            self._scheme, self._out_adj(phase), self._in_adj(phase)
        )

    def _cayley(self, phase: int) -> tuple[tuple[int, ...], list[tuple[int, ...]]] | None:
        """(group shape, connection set) when the graph at `phase` is a Cayley graph of
        Z_shape[0] x ...: rank g (row-major in the shape) sends to g + s for each s of the
        set. None (the default) for graphs that are not; families that are say so, and
        their spectra come from an FFT instead of an eigensolver."""
        return None

    def _weights_suffix(self) -> str:
        """',weights=...' when the scheme is not the default, for spec strings."""
        return "" if self._scheme == self._default_scheme else f",weights={self._scheme}"

    def _weights_kwarg(self) -> str:
        """', weights=...' when the scheme is not the default, for reprs."""
        return "" if self._scheme == self._default_scheme else f", weights={self._scheme!r}"

    # ------------------------------------------------------------------ plain attributes

    @property
    def size(self) -> int:
        """Number of peers."""
        return self._size

    @property
    def is_directed(self) -> bool:
        """True if some peer sends to a peer that does not send back (at some step)."""
        return self._directed

    @property
    def period(self) -> int:
        """Steps after which a time-varying schedule repeats (1 for a static topology)."""
        return self._period

    @property
    def weight_scheme(self) -> str:
        """'metropolis', 'uniform', 'push', or 'custom' for a user-supplied matrix."""
        return self._scheme

    @property
    def spec(self) -> str | None:
        """A string that `topologies.parse(spec, size)` turns back into an equal topology.

        None for user-built graphs (from_edges, from_matrix, from_networkx), which have no
        string form.
        """
        return None

    # ------------------------------------------------------------------ caching

    def _memo(self, key: tuple, compute: Callable[[], _T]) -> _T:
        # Two threads may both compute a missing entry; both results are equal, so the
        # race is harmless and cheaper than a lock on every lookup.
        try:
            return self._cache[key]
        except KeyError:
            value = compute()
            self._cache[key] = value
            return value

    def _phase(self, step: object) -> int:
        return check_step(step) % self._period

    def _out_adj(self, phase: int) -> Adjacency:
        return self._memo(("out", phase), lambda: freeze(self._out(phase)))

    def _in_adj(self, phase: int) -> Adjacency:
        if not self._directed:
            return self._out_adj(phase)
        return self._memo(("in", phase), lambda: reverse(self._out_adj(phase)))

    def _group(self, phase: int) -> tuple[tuple[int, ...], list[tuple[int, ...]]] | None:
        if self._scheme not in weight_schemes.WEIGHT_SCHEMES:
            return None
        return self._memo(("group", phase), lambda: self._cayley(phase))

    def _neighbors_of(self, rank: int, phase: int, *, incoming: bool) -> tuple[int, ...]:
        """One rank's in- or out-neighbours, without building every rank's lists where the
        graph is a Cayley graph (a peer of a 65,536-peer complete graph asks for its own)."""
        group = self._group(phase)
        if group is None:
            adj = self._in_adj(phase) if incoming else self._out_adj(phase)
            return adj[rank]

        def compute() -> tuple[int, ...]:
            assert group is not None
            shape, connections = group
            if not connections:
                return ()
            here = np.array(np.unravel_index(rank, shape))
            sign = -1 if incoming else 1
            at = (here + sign * np.array(connections, dtype=np.int64)) % np.array(shape)
            found = np.unique(np.ravel_multi_index(tuple(at.T), shape))
            return tuple(int(j) for j in found if j != rank)

        return self._memo(("in" if incoming else "out", phase, rank), compute)

    def _s(self, phase: int) -> SparseMatrix:
        return self._memo(("S", phase), lambda: self._sparse(phase))

    def _s_t(self, phase: int) -> SparseMatrix:
        return self._memo(("S.T", phase), lambda: self._s(phase).transpose())

    def _w(self, phase: int) -> np.ndarray:
        def compute() -> np.ndarray:
            w = self._s(phase).to_dense()
            w.flags.writeable = False
            return w

        return self._memo(("W", phase), compute)

    # ------------------------------------------------------------------ neighbours and weights

    def in_neighbors(self, rank: int, step: int = 0) -> list[int]:
        """Sorted ranks whose values `rank` receives at `step`."""
        r = check_rank(rank, self._size)
        return list(self._neighbors_of(r, self._phase(step), incoming=True))

    def out_neighbors(self, rank: int, step: int = 0) -> list[int]:
        """Sorted ranks that `rank` sends its value to at `step`."""
        r = check_rank(rank, self._size)
        return list(self._neighbors_of(r, self._phase(step), incoming=False))

    def out_degrees(self, step: int = 0) -> np.ndarray:
        """Every rank's number of out-neighbours at `step` (n ints): the messages each peer
        sends per round. One number repeated for the built-in families, where every peer
        has the same degree; counted from the adjacency otherwise."""
        phase = self._phase(step)
        if self._group(phase) is not None:
            return np.full(self._size, len(self._neighbors_of(0, phase, incoming=False)))
        return np.array([len(out) for out in self._out_adj(phase)], dtype=np.int64)

    def edges(self, step: int = 0) -> list[tuple[int, int]]:
        """(sender, receiver) pairs at `step`; for an undirected graph each edge once, i < j."""
        out = self._out_adj(self._phase(step))
        return [(j, i) for j, recv in enumerate(out) for i in recv if self._directed or j < i]

    def weights(self, rank: int, step: int = 0) -> tuple[float, dict[int, float]]:
        """Row `rank` of the mixing matrix: (self weight, {in-neighbour: weight}).

        Plain gossip computes ``x[rank] <- self_weight * x[rank] + sum(w * x[j])``.
        """
        r = check_rank(rank, self._size)
        phase = self._phase(step)
        heard = self._neighbors_of(r, phase, incoming=True)
        if self._group(phase) is not None:
            self_weight, share = weight_schemes.regular_row(self._scheme, len(heard))
            return self_weight, dict.fromkeys(heard, share)
        row = self._s(phase).row(r)
        return row.get(r, 0.0), {j: row.get(j, 0.0) for j in heard}

    def push_weights(self, rank: int, step: int = 0) -> tuple[float, dict[int, float]]:
        """Column `rank` of the mixing matrix: (share kept, {out-neighbour: share sent}).

        Push-sum sends ``share * x[rank]`` (and the same share of its weight) to each
        out-neighbour; with column-stochastic weights the shares sum to one.
        """
        r = check_rank(rank, self._size)
        phase = self._phase(step)
        told = self._neighbors_of(r, phase, incoming=False)
        if self._group(phase) is not None:
            kept, share = weight_schemes.regular_row(self._scheme, len(told))
            return kept, dict.fromkeys(told, share)
        col = self._s_t(phase).row(r)
        return col.get(r, 0.0), {i: col.get(i, 0.0) for i in told}

    def mixing_matrix(self, step: int = 0) -> np.ndarray:
        """n x n float64 W at `step` (a fresh copy): W[i, j] = weight receiver i gives sender j."""
        return self._w(self._phase(step)).copy()

    def sparse_mixing_matrix(self, step: int = 0) -> SparseMatrix:
        """W at `step` in compressed sparse rows: n * (degree + 1) weights, for graphs of
        thousands of peers (`mixing_matrix` is n x n)."""
        return self._s(self._phase(step))

    def period_matrix(self) -> np.ndarray:
        """W_{P-1} ... W_1 W_0, the effect of one full period (the plain W when static)."""

        def compute() -> np.ndarray:
            product = spectral.period_product(self._w(p) for p in range(self._period))
            product.flags.writeable = False
            return product

        return self._memo(("period",), compute).copy()

    # ------------------------------------------------------------------ spectral numbers

    def second_eigenvalue(self) -> float:
        """Second-largest eigenvalue modulus (SLEM) of W, per period if time-varying.

        For a time-varying topology this is the SLEM of the product over one period,
        W_{P-1} ... W_0, i.e. the disagreement shrinks by this factor every `period` steps.
        """
        return self._memo(("slem",), self._compute_slem)

    def _compute_slem(self) -> float:
        if self._size <= 1:
            return 0.0
        groups = [self._group(p) for p in range(self._period)]
        if all(groups):
            spectrum = np.ones(self._size, dtype=np.complex128)
            for group in groups:
                assert group is not None
                spectrum *= spectral.cayley_spectrum(group[0], self._cayley_kernel(*group))
            return spectral.spectrum_slem(spectrum)
        if self._period == 1 and self._size > spectral.DENSE_MAX:
            return spectral.sparse_slem(self._s(0))
        return spectral.slem(self.period_matrix())

    def _cayley_kernel(
        self, shape: tuple[int, ...], connections: list[tuple[int, ...]]
    ) -> np.ndarray:
        """Row 0 of W for a Cayley graph: the weight a peer gives the peer at each offset."""
        zero = (0,) * len(shape)
        # Peer 0 hears from -s for every connection s; duplicates and 0 itself dropped.
        heard = {tuple(-c % m for c, m in zip(s, shape)) for s in connections} - {zero}
        self_weight, share = weight_schemes.regular_row(self._scheme, len(heard))
        kernel = np.zeros(shape, dtype=np.float64)
        for g in heard:
            kernel[g] = share
        kernel[zero] = self_weight
        return kernel

    def spectral_gap(self) -> float:
        """1 - SLEM: larger is faster mixing. Per period of `period` steps if time-varying."""
        return 1.0 - self.second_eigenvalue()

    def rounds_to_reduce(self, factor: float = 1000.0) -> int | float:
        """Gossip rounds (steps) to shrink the disagreement between peers by `factor`.

        ceil(ln(factor) / -ln(SLEM)), counted in whole periods and reported in steps for a
        time-varying topology; math.inf if the SLEM is 1; 0 for a single peer.
        """
        return spectral.consensus_rounds(
            self.second_eigenvalue(), factor=factor, period=self._period, size=self._size
        )

    # ------------------------------------------------------------------ interop

    def to_networkx(self, step: int = 0) -> Any:
        """A networkx Graph (DiGraph if directed) of the graph at `step`; needs networkx.

        Edge attribute 'weight' is W[receiver, sender]; node attribute 'self_weight' is
        W[i, i]. An undirected graph with asymmetric weights ('uniform' on an irregular
        graph) gets no edge weights, since one number per edge cannot hold both.
        """
        nx = require_networkx()
        w = self.mixing_matrix(step)
        graph = nx.DiGraph() if self.is_directed else nx.Graph()
        graph.graph["name"] = repr(self)
        graph.graph["step"] = step
        for i in range(self.size):
            graph.add_node(i, self_weight=float(w[i, i]))
        symmetric = (w == w.T).all()
        for sender, receiver in self.edges(step):
            if self.is_directed or symmetric:
                graph.add_edge(sender, receiver, weight=float(w[receiver, sender]))
            else:
                graph.add_edge(sender, receiver)
        return graph

    # ------------------------------------------------------------------ value semantics

    def _key(self) -> tuple:
        return (type(self).__name__, self._params(), self._scheme)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Topology):
            return NotImplemented
        return type(self) is type(other) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    @property
    def fingerprint(self) -> str:
        """A short hex digest of the actual graphs and weights, equal in every process.

        Unlike hash(), it does not vary with PYTHONHASHSEED, and it is computed from the
        neighbour lists of every step (not the constructor arguments), so peers can compare
        it at rendezvous and catch e.g. a RandomGraph drawn differently by another numpy.
        """

        def compute() -> str:
            digest = hashlib.sha256()
            header = (type(self).__name__, self._size, self._directed, self._period, self._scheme)
            digest.update(repr(header).encode())
            for phase in range(self._period):
                for rank, neigh in enumerate(self._out_adj(phase)):
                    digest.update(f"{phase}:{rank}:{neigh}".encode())
            given = self.__dict__.get("_matrix_given")
            if given is not None:
                digest.update(given.tobytes())
            return digest.hexdigest()[:16]

        return self._memo(("fingerprint",), compute)

    @abc.abstractmethod
    def __repr__(self) -> str: ...


def require_networkx() -> Any:
    """The networkx module, imported only when a conversion asks for it."""
    try:
        import networkx
    except ImportError:
        raise TopologyError(
            "this needs networkx, which is not installed; pip install networkx"
        ) from None
    return networkx
