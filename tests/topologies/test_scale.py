"""Topology math at scale (issue #38, item 3): the built-in families' spectra from the FFT of
one row (they are Cayley graphs of cyclic groups), one rank's neighbours and weights without
every rank's lists, other graphs' SLEM from a sparse eigensolver past DENSE_MAX, and the
sparse form every topology now stores. Each fast path is checked against the dense path it
replaces (the dense mixing matrix, built from every rank's adjacency, and numpy's
eigensolvers), and at 65,536 peers against the closed forms."""
from __future__ import annotations

import math

import numpy as np
import pytest

import topologies as T
from topologies import spectral

SIZES = [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17, 31, 32, 33]
SHAPES = [(1, 1), (1, 5), (2, 2), (2, 3), (3, 3), (2, 5), (4, 4), (3, 7), (5, 6), (8, 8)]


def _families(n: int) -> list[T.Topology]:
    out: list[T.Topology] = []
    for scheme in ("metropolis", "uniform", "push"):
        out += [T.Ring(n, weights=scheme), T.Complete(n, weights=scheme)]
    for scheme in ("uniform", "push"):
        out += [T.Exponential(n, weights=scheme), T.OnePeerExponential(n, weights=scheme)]
    return out


def _torus_family() -> list[T.Topology]:
    return [T.Torus(r, c, weights=s) for r, c in SHAPES for s in ("metropolis", "uniform", "push")]


ALL_SMALL = [t for n in SIZES for t in _families(n)] + _torus_family()


def _dense_slem(t: T.Topology) -> float:
    return T.slem(t.period_matrix())


@pytest.mark.parametrize("t", ALL_SMALL, ids=repr)
def test_fft_spectrum_equals_the_dense_eigensolver(t: T.Topology) -> None:
    assert t.second_eigenvalue() == pytest.approx(_dense_slem(t), abs=1e-12)
    dense_rounds = T.consensus_rounds(_dense_slem(t), period=t.period, size=t.size)
    assert t.rounds_to_reduce() == dense_rounds


@pytest.mark.parametrize("t", ALL_SMALL, ids=repr)
def test_one_ranks_neighbours_and_weights_equal_the_matrix(t: T.Topology) -> None:
    """The per-rank path (group arithmetic) against the dense W built from every rank's
    adjacency: same neighbours, and the same weights to the last bit."""
    for step in range(t.period):
        w = t.mixing_matrix(step)
        for r in range(t.size):
            heard = [j for j in range(t.size) if j != r and w[r, j] != 0]
            told = [i for i in range(t.size) if i != r and w[i, r] != 0]
            assert t.in_neighbors(r, step) == heard
            assert t.out_neighbors(r, step) == told
            self_w, inn = t.weights(r, step)
            assert (self_w, inn) == (w[r, r], {j: w[r, j] for j in heard})
            kept, out = t.push_weights(r, step)
            assert (kept, out) == (w[r, r], {i: w[i, r] for i in told})
            assert t.out_degrees(step)[r] == len(told)


def test_the_sparse_form_is_the_dense_matrix() -> None:
    rng = np.random.default_rng(0)
    for t in [T.Ring(9), T.Torus(3, 4), T.Exponential(11), T.RandomGraph(20, p=0.3),
              T.RandomGraph(20, degree=3, weights="uniform"),
              T.from_matrix(np.full((5, 5), 0.2))]:
        s = t.sparse_mixing_matrix()
        w = t.mixing_matrix()
        assert np.array_equal(s.to_dense(), w)
        assert np.array_equal(s.transpose().to_dense(), w.T)
        assert np.array_equal(s.diagonal(), np.diag(w))
        assert s.is_symmetric() == bool(np.array_equal(w, w.T))
        np.testing.assert_allclose(s.row_sums(), w.sum(axis=1), rtol=0, atol=1e-15)
        np.testing.assert_allclose(s.column_sums(), w.sum(axis=0), rtol=0, atol=1e-15)
        x = rng.standard_normal((t.size, 3))
        np.testing.assert_allclose(s.matvec(x), w @ x, rtol=0, atol=1e-14)
        np.testing.assert_allclose(s.matvec(x[:, 0]), w @ x[:, 0], rtol=0, atol=1e-14)
        for vector in (x, x[:, 0]):
            np.testing.assert_allclose(s.matvec(vector, use_scipy=False), w @ vector,
                                       rtol=0, atol=1e-14)
        assert t.weights(2) == (w[2, 2], {j: w[2, j] for j in t.in_neighbors(2)})
        assert list(t.out_degrees()) == [len(t.out_neighbors(r)) for r in range(t.size)]


def test_sparse_matrix_with_empty_rows_and_bad_shapes() -> None:
    s = T.SparseMatrix.from_entries(4, np.array([0, 2, 2]), np.array([1, 0, 3]),
                                    np.array([1.0, 2.0, 3.0]))
    assert s.nnz == 3 and s.row(1) == {} and s.row(2) == {0: 2.0, 3: 3.0}
    for use_scipy in (True, False):
        np.testing.assert_array_equal(s.matvec(np.arange(4.0), use_scipy=use_scipy),
                                      [1.0, 0.0, 9.0, 0.0])
    with pytest.raises(ValueError, match="needs 4 rows"):
        s.matvec(np.zeros(3))
    with pytest.raises(ValueError):
        s.data[0] = 5.0   # immutable, as a topology's cached values are


@pytest.mark.parametrize("t", [
    T.RandomGraph(1100, degree=3, seed=1),
    T.RandomGraph(1100, degree=4, seed=2, weights="uniform"),
    T.RandomGraph(1100, p=0.01, seed=0),
    T.RandomGraph(1100, p=0.01, seed=0, weights="uniform"),   # irregular: not symmetric
    T.RandomGraph(1100, p=0.01, seed=0, weights="push"),
], ids=repr)
def test_sparse_eigensolver_equals_the_dense_one_past_dense_max(t: T.Topology) -> None:
    pytest.importorskip("scipy")
    assert t.size > spectral.DENSE_MAX
    assert t.second_eigenvalue() == pytest.approx(_dense_slem(t), abs=1e-9)


def test_custom_graphs_past_dense_max_take_the_sparse_path() -> None:
    pytest.importorskip("scipy")
    n = 1500
    edges = [(i, (i + 1) % n) for i in range(n)] + [(i, (i + 7) % n) for i in range(0, n, 3)]
    t = T.from_edges(n, edges)
    assert t.second_eigenvalue() == pytest.approx(_dense_slem(t), abs=1e-9)


def test_closed_forms_at_65536_peers() -> None:
    """Ring: eigenvalues 1/3 + 2/3 cos(2 pi k / n); torus r x r: 1/5 + 2/5 (cos a + cos b),
    the second largest at one step of 2 pi / r; one-peer exponential of a power of two:
    exact average every period; complete: exact average every round."""
    n = 65536
    assert T.Ring(n).second_eigenvalue() == pytest.approx(
        1 / 3 + 2 / 3 * math.cos(2 * math.pi / n), abs=1e-14)
    assert T.Torus(256, 256).second_eigenvalue() == pytest.approx(
        1 / 5 + 2 / 5 * (1 + math.cos(2 * math.pi / 256)), abs=1e-14)
    one_peer = T.OnePeerExponential(n)
    assert one_peer.second_eigenvalue() == 0.0 and one_peer.rounds_to_reduce() == 16
    assert T.Complete(n).second_eigenvalue() == 0.0
    ring = T.Ring(n, weights="uniform")
    assert ring.weights(70000 % n) == (1 / 3, {4463: 1 / 3, 4465: 1 / 3})
    assert T.Exponential(n).out_neighbors(0) == [1 << k for k in range(16)]


def test_exponential_slem_at_scale_matches_a_power_of_two_pattern() -> None:
    """The static exponential graph of n = 2^k with push weights: the FFT's answer agrees
    with the dense eigensolver at 1,024 and keeps the spectral gap bounded away from zero
    as n grows (the reason SGP uses it), here to 65,536."""
    assert T.Exponential(1024).second_eigenvalue() == pytest.approx(
        _dense_slem(T.Exponential(1024)), abs=1e-12)
    gaps = [T.Exponential(1 << k).spectral_gap() for k in (10, 12, 14, 16)]
    assert all(g > 0.1 for g in gaps), gaps
