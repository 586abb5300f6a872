"""Tests of the topologies package.

Property tests draw every family at random sizes and check the invariants the runtime relies
on; closed-form tests pin the spectra that are known exactly; every error path is checked
for a message that says what is wrong. The CLI is tested in test_topology_cli.py.
"""

from __future__ import annotations

import math
import os
import pickle
import subprocess
import sys

import networkx as nx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import topologies
from topologies import (
    Complete,
    Exponential,
    OnePeerExponential,
    RandomGraph,
    Ring,
    Topology,
    Torus,
    from_edges,
    from_matrix,
    from_networkx,
    parse,
)

PROPERTY = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TOL = 1e-12

# ---------------------------------------------------------------------- strategies


def _er_floor(n: int) -> float:
    # Comfortably above the connectivity threshold ln(n)/n, so rejection sampling succeeds.
    return min(1.0, max(0.3, 2 * math.log(n) / n)) if n > 1 else 0.5


@st.composite
def random_graphs(draw, max_n: int = 40) -> RandomGraph:
    seed = draw(st.integers(0, 2**32 - 1))
    if draw(st.booleans()):
        n = draw(st.integers(1, max_n))
        p = draw(st.floats(_er_floor(n), 1.0))
        return RandomGraph(n, p=p, seed=seed)
    n = draw(st.integers(1, max_n))
    if n == 1:
        return RandomGraph(1, degree=0, seed=seed)
    if n == 2:
        return RandomGraph(2, degree=1, seed=seed)
    degree = draw(st.integers(2, n - 1).filter(lambda d: n * d % 2 == 0))
    return RandomGraph(n, degree=degree, seed=seed)


@st.composite
def edge_lists(draw, max_n: int = 40) -> Topology:
    """A connected from_edges graph: a random spanning structure plus extra edges."""
    n = draw(st.integers(1, max_n))
    directed = draw(st.booleans())
    edges: set[tuple[int, int]] = set()
    if directed:
        # A Hamiltonian cycle in random order makes it strongly connected.
        order = draw(st.permutations(range(n)))
        if n > 1:
            edges |= {(order[k], order[(k + 1) % n]) for k in range(n)}
    else:
        for i in range(1, n):
            j = draw(st.integers(0, i - 1))
            edges.add((j, i))
    if n > 1:
        rank = st.integers(0, n - 1)
        extra = draw(st.lists(st.tuples(rank, rank), max_size=2 * n))
        for a, b in extra:
            key = (a, b) if directed else (min(a, b), max(a, b))
            if a != b and key not in edges and (directed or (b, a) not in edges):
                edges.add(key)
    weights = draw(st.sampled_from([None, "uniform"] + ([] if directed else ["push"])))
    return from_edges(n, sorted(edges), directed=directed, weights=weights)


@st.composite
def named_topologies(draw, max_n: int = 40) -> Topology:
    family = draw(
        st.sampled_from(["ring", "torus", "random", "exponential", "one-peer", "complete"])
    )
    if family == "random":
        t = draw(random_graphs(max_n))
        weights = draw(st.sampled_from([None, "metropolis", "uniform", "push"]))
        if weights is None:
            return t
        return RandomGraph(t.size, p=t.p, degree=t.degree, seed=t.seed, weights=weights)
    directed = family in ("exponential", "one-peer")
    weights = draw(
        st.sampled_from([None, "uniform", "push"] + ([] if directed else ["metropolis"]))
    )
    if family == "torus":
        rows = draw(st.integers(1, 6))
        cols = draw(st.integers(1, max_n // rows))
        return Torus(rows, cols, weights=weights)
    n = draw(st.integers(1, max_n))
    cls = {
        "ring": Ring,
        "exponential": Exponential,
        "one-peer": OnePeerExponential,
        "complete": Complete,
    }[family]
    return cls(n, weights=weights)


any_topology = st.one_of(named_topologies(), edge_lists())

# ---------------------------------------------------------------------- property tests


def _check_stochastic(t: Topology, w: np.ndarray) -> None:
    rows_ok = np.allclose(w.sum(axis=1), 1.0, atol=TOL)
    cols_ok = np.allclose(w.sum(axis=0), 1.0, atol=TOL)
    scheme = t.weight_scheme
    if scheme == "metropolis":
        assert not t.is_directed
        assert np.array_equal(w, w.T) and rows_ok and cols_ok
    elif scheme == "uniform":
        assert rows_ok
    elif scheme == "push":
        assert cols_ok
    else:
        assert scheme == "custom"
        assert cols_ok


def _check_invariants(t: Topology) -> None:
    """What the runtime relies on: stochastic W whose pattern is the neighbour lists."""
    n = t.size
    for step in range(t.period):
        w = t.mixing_matrix(step)
        assert w.shape == (n, n) and w.dtype == np.float64
        assert (w >= 0).all()
        _check_stochastic(t, w)
        for r in range(n):
            ins, outs = t.in_neighbors(r, step), t.out_neighbors(r, step)
            assert ins == sorted(ins) and all(type(j) is int for j in ins + outs)
            assert ins == [j for j in range(n) if j != r and w[r, j] > 0]
            assert outs == [i for i in range(n) if i != r and w[i, r] > 0]
            if not t.is_directed:
                assert ins == outs
            self_w, row = t.weights(r, step)
            assert self_w == w[r, r] and row == {j: w[r, j] for j in ins}
            keep, col = t.push_weights(r, step)
            assert keep == w[r, r] and col == {i: w[i, r] for i in outs}
        # step is taken modulo the period
        assert np.array_equal(t.mixing_matrix(step + 3 * t.period), w)
    union = nx.compose_all([t.to_networkx(step) for step in range(t.period)])
    assert set(union.nodes) == set(range(n)) and nx.number_of_selfloops(union) == 0
    if t.is_directed:
        assert nx.is_strongly_connected(union)
    else:
        assert nx.is_connected(union)


@PROPERTY
@given(any_topology)
def test_mixing_matrices_are_stochastic_and_match_neighbours(t: Topology) -> None:
    _check_invariants(t)


SMALL = (
    [Torus(r, c, weights=w) for r in range(1, 7) for c in range(1, 7) for w in (None, "uniform")]
    + [cls(n) for cls in (Ring, Exponential, OnePeerExponential, Complete) for n in range(1, 13)]
    + [Ring(n, weights=w) for n in range(1, 6) for w in ("uniform", "push")]
    + [
        RandomGraph(n, degree=d, seed=0)
        for n in range(3, 11)
        for d in range(2, n)
        if n * d % 2 == 0
    ]
    + [RandomGraph(n, p=0.5, seed=s) for n in range(1, 8) for s in range(3)]
)


@pytest.mark.parametrize("t", SMALL, ids=repr)
def test_every_family_at_every_small_size(t: Topology) -> None:
    # Exhaustive over the degenerate sizes (1x1, 2xK, n = 1, 2, 3) that random draws may miss.
    _check_invariants(t)
    assert parse(t.spec, t.size) == t


@PROPERTY
@given(any_topology)
def test_spectral_numbers_are_consistent(t: Topology) -> None:
    assert t.rounds_to_reduce() < math.inf
    assert 0.0 <= t.second_eigenvalue() < 1.0
    assert t.spectral_gap() == pytest.approx(1.0 - t.second_eigenvalue())


@PROPERTY
@given(named_topologies())
def test_named_topologies_round_trip_through_spec_and_repr(t: Topology) -> None:
    again = parse(t.spec, t.size)
    assert again == t and hash(again) == hash(t) and repr(again) == repr(t)
    assert eval(repr(t), dict(vars(topologies))) == t  # repr is the constructor call
    assert parse(t.spec.upper().replace(",", " , "), t.size) == t
    assert pickle.loads(pickle.dumps(t)) == t
    assert t != Ring(t.size + 1)


@PROPERTY
@given(edge_lists())
def test_user_graphs_compare_by_value_and_survive_pickling(t: Topology) -> None:
    assert t.spec is None
    copy = pickle.loads(pickle.dumps(t))
    assert copy == t and hash(copy) == hash(t)
    assert np.array_equal(copy.mixing_matrix(), t.mixing_matrix())
    rebuilt = from_networkx(t.to_networkx())
    assert rebuilt.edges() == t.edges() and rebuilt.is_directed == t.is_directed
    if t.weight_scheme != "uniform":  # uniform on an irregular graph is not column-stochastic
        m = from_matrix(t.mixing_matrix())
        assert np.array_equal(m.mixing_matrix(), t.mixing_matrix())
        # Same neighbours; a directed graph whose edges all go both ways comes back undirected.
        assert all(m.out_neighbors(r) == t.out_neighbors(r) for r in range(t.size))
        assert all(m.in_neighbors(r) == t.in_neighbors(r) for r in range(t.size))


def test_fingerprint_is_stable_across_processes() -> None:
    t = RandomGraph(12, degree=3, seed=5)
    assert t.fingerprint == RandomGraph(12, degree=3, seed=5).fingerprint
    assert t.fingerprint != RandomGraph(12, degree=3, seed=6).fingerprint
    assert Ring(6).fingerprint != Ring(6, weights="uniform").fingerprint
    code = "import topologies; print(topologies.RandomGraph(12, degree=3, seed=5).fingerprint)"
    for hash_seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
        )
        assert out.stdout.strip() == t.fingerprint, out.stderr


def test_topologies_are_immutable_and_matrices_cannot_corrupt_the_cache() -> None:
    t = Ring(5)
    with pytest.raises(AttributeError, match="immutable"):
        t.size = 6  # type: ignore[misc]
    w = t.mixing_matrix()
    w[:] = 0
    assert t.mixing_matrix()[0, 0] == pytest.approx(1 / 3)
    t.in_neighbors(0).append(3)
    assert t.in_neighbors(0) == [1, 4]


# ---------------------------------------------------------------------- closed forms


@pytest.mark.parametrize("n", list(range(3, 41)) + [64, 101])
def test_ring_spectrum_matches_the_closed_form(n: int) -> None:
    t = Ring(n)
    w = t.mixing_matrix()
    assert np.allclose(w[w > 0], 1 / 3)
    expected = np.sort((1 + 2 * np.cos(2 * np.pi * np.arange(n) / n)) / 3)
    assert np.allclose(np.linalg.eigvalsh(w), expected, atol=1e-10)
    slem = max(abs((1 + 2 * math.cos(2 * math.pi * k / n)) / 3) for k in range(1, n))
    assert t.second_eigenvalue() == pytest.approx(slem, abs=1e-10)
    assert expected[-2] == pytest.approx((1 + 2 * math.cos(2 * math.pi / n)) / 3)
    assert t.rounds_to_reduce(1000) == math.ceil(math.log(1000) / -math.log(slem) - 1e-9)


def test_small_rings() -> None:
    assert Ring(1).edges() == [] and Ring(1).mixing_matrix().tolist() == [[1.0]]
    assert Ring(2).edges() == [(0, 1)]
    assert np.allclose(Ring(2).mixing_matrix(), 0.5)
    assert Ring(1).rounds_to_reduce() == 0 and Ring(2).rounds_to_reduce() == 1


@pytest.mark.parametrize("rows,cols", [(3, 3), (3, 5), (4, 4), (4, 7), (6, 5), (8, 8)])
def test_torus_spectrum_matches_the_closed_form(rows: int, cols: int) -> None:
    # With r, c >= 3 every peer has degree 4, so MH gives 1/5 everywhere and
    # W = (I + A_r (x) I + I (x) A_c) / 5, whose eigenvalues add the cycles' 2cos(2 pi k/m).
    t = Torus(rows, cols)
    a, b = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    lam = (1 + 2 * np.cos(2 * np.pi * a / rows) + 2 * np.cos(2 * np.pi * b / cols)) / 5
    assert np.allclose(np.linalg.eigvalsh(t.mixing_matrix()), np.sort(lam.ravel()), atol=1e-10)
    moduli = np.sort(np.abs(lam.ravel()))
    assert t.second_eigenvalue() == pytest.approx(moduli[-2], abs=1e-10)


@pytest.mark.parametrize("cols", [3, 4, 5, 8])
def test_degenerate_2xk_torus_against_a_hand_built_matrix(cols: int) -> None:
    # Two rows: the up and down neighbours coincide, so degree 3 and MH weights 1/4.
    t = Torus(2, cols)
    assert all(len(t.in_neighbors(r)) == 3 for r in range(t.size))
    cycle = np.roll(np.eye(cols), 1, axis=1) + np.roll(np.eye(cols), -1, axis=1)
    swap = np.array([[0.0, 1.0], [1.0, 0.0]])
    hand = (np.eye(2 * cols) + np.kron(swap, np.eye(cols)) + np.kron(np.eye(2), cycle)) / 4
    assert np.allclose(t.mixing_matrix(), hand, atol=TOL)
    b = np.arange(cols)
    cos = 2 * np.cos(2 * np.pi * b / cols)
    lam = np.concatenate([(1 + 1 + cos) / 4, (1 - 1 + cos) / 4])  # swap has eigenvalues +-1
    assert np.allclose(np.linalg.eigvalsh(hand), np.sort(lam), atol=1e-10)
    assert t.second_eigenvalue() == pytest.approx(np.sort(np.abs(lam))[-2], abs=1e-10)


def test_degenerate_tori_do_not_double_count_or_self_loop() -> None:
    assert Torus(1, 1).edges() == [] and Torus(1, 1).mixing_matrix().tolist() == [[1.0]]
    assert Torus(2, 1).edges() == [(0, 1)]
    assert Torus(2, 2).edges() == [(0, 1), (0, 2), (1, 3), (2, 3)]  # a 4-cycle
    for k in (3, 5, 9):
        assert np.array_equal(Torus(1, k).mixing_matrix(), Ring(k).mixing_matrix())
        assert np.array_equal(Torus(k, 1).mixing_matrix(), Ring(k).mixing_matrix())


def test_period_product_applies_the_first_step_first() -> None:
    a = np.array([[1.0, 0.5], [0.0, 0.5]])
    b = np.array([[0.5, 0.0], [0.5, 1.0]])
    assert np.array_equal(topologies.period_product([a, b]), b @ a)
    assert not np.array_equal(b @ a, a @ b)


@pytest.mark.parametrize("n", [1, 2, 3, 8, 17])
def test_complete_graph_mixes_in_one_round(n: int) -> None:
    t = Complete(n)
    assert np.allclose(t.mixing_matrix(), np.full((n, n), 1 / n), atol=TOL)
    assert t.second_eigenvalue() == 0.0 and t.spectral_gap() == 1.0
    assert t.rounds_to_reduce() == (0 if n == 1 else 1)


@pytest.mark.parametrize("k", range(1, 7))
def test_one_peer_exponential_averages_exactly_over_a_period(k: int) -> None:
    n = 2**k
    t = OnePeerExponential(n)
    assert t.period == k and t.is_time_varying and t.is_directed
    product = np.eye(n)
    for step in range(k):
        assert all(t.out_neighbors(i, step) == [(i + 2**step) % n] for i in range(n))
        product = t.mixing_matrix(step) @ product
    assert np.allclose(product, np.full((n, n), 1 / n), atol=TOL, rtol=0)
    assert np.allclose(t.period_matrix(), product, atol=TOL, rtol=0)
    assert t.second_eigenvalue() == 0.0 and t.rounds_to_reduce() == k


def test_one_peer_exponential_small_and_non_power_of_two_sizes() -> None:
    assert OnePeerExponential(1).period == 1 and OnePeerExponential(1).edges() == []
    assert OnePeerExponential(2).period == 1 and OnePeerExponential(2).out_neighbors(1) == [0]
    t = OnePeerExponential(6)  # period 3; the product is not exactly 11^T/n
    assert t.period == 3
    per_period = math.ceil(math.log(1000) / -math.log(t.second_eigenvalue()) - 1e-9)
    assert t.rounds_to_reduce() == 3 * per_period
    assert t.out_neighbors(0, step=2) == [4] and t.out_neighbors(0, step=5) == [4]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 12])
def test_exponential_neighbours(n: int) -> None:
    t = Exponential(n)
    hops = [2**k for k in range(math.ceil(math.log2(n)) if n > 1 else 0)]
    for i in range(n):
        assert t.out_neighbors(i) == sorted({(i + h) % n for h in hops} - {i})
    assert t.is_directed and t.period == 1 and not t.is_time_varying


def test_random_graphs_are_reproducible_from_the_seed() -> None:
    a, b = RandomGraph(20, p=0.3, seed=7), RandomGraph(20, p=0.3, seed=7)
    assert a == b and a.edges() == b.edges()
    assert len({tuple(RandomGraph(20, p=0.3, seed=s).edges()) for s in range(5)}) == 5
    assert RandomGraph(20, degree=3, seed=1).edges() != RandomGraph(20, degree=3, seed=2).edges()
    assert RandomGraph(20, p=0.3).seed == 0  # every peer must build the same graph


@PROPERTY
@given(random_graphs())
def test_random_regular_graphs_are_regular(t: RandomGraph) -> None:
    if t.degree is not None:
        assert {len(t.out_neighbors(r)) for r in range(t.size)} == {t.degree}


def test_random_regular_dense_degrees_go_through_the_complement() -> None:
    t = RandomGraph(30, degree=26, seed=3)
    assert {len(t.in_neighbors(r)) for r in range(30)} == {26}
    assert RandomGraph(9, degree=8).edges() == Complete(9).edges()


def test_uniform_weights_are_row_stochastic_on_irregular_graphs() -> None:
    t = from_edges(4, [(0, 1), (0, 2), (0, 3)], weights="uniform")  # a star
    w = t.mixing_matrix()
    assert np.allclose(w.sum(axis=1), 1) and w[0, 1] == 0.25 and w[1, 0] == 0.5
    mh = from_edges(4, [(0, 1), (0, 2), (0, 3)])
    assert np.allclose(mh.mixing_matrix()[0], [0.25] * 4) and mh.weights(1) == (0.75, {0: 0.25})


def test_user_matrix_keeps_its_weights_and_support() -> None:
    w = np.array([[0.5, 0.0, 0.5], [0.5, 0.5, 0.0], [0.0, 0.5, 0.5]])  # directed 3-cycle
    t = from_matrix(w)
    assert t.is_directed and t.weight_scheme == "custom"
    assert t.out_neighbors(0) == [1] and t.in_neighbors(0) == [2]
    assert t.push_weights(0) == (0.5, {1: 0.5})
    flip = from_matrix([[0.0, 1.0], [1.0, 0.0]])  # periodic: never converges
    assert flip.second_eigenvalue() == 1.0 and flip.rounds_to_reduce() == math.inf


def test_networkx_interop() -> None:
    g = nx.cycle_graph(["c", "a", "d", "b"])  # relabelled in sorted order a, b, c, d
    t = from_networkx(g)
    assert t.edges() == [(0, 2), (0, 3), (1, 2), (1, 3)]
    d = from_networkx(nx.DiGraph([(0, 1), (1, 2), (2, 0)]))
    assert d.is_directed and d.out_neighbors(2) == [0]
    exported = OnePeerExponential(8).to_networkx(step=2)
    assert isinstance(exported, nx.DiGraph) and exported[0][4]["weight"] == 0.5


def test_networkx_graphs_with_self_loops_as_bluefog_makes_them() -> None:
    # BlueFog's topology_util puts a self-loop on every node (its self weight): it is what a
    # peer does anyway, and the graph comes back as the same topology.
    ring = nx.DiGraph()
    ring.add_weighted_edges_from([(i, j, 1 / 3) for i in range(5) for j in
                                  (i, (i + 1) % 5, (i - 1) % 5)])
    t = from_networkx(ring)
    assert all(t.in_neighbors(r) == sorted({(r - 1) % 5, (r + 1) % 5}) for r in range(5))
    assert np.allclose(t.mixing_matrix(), Ring(5).mixing_matrix(), atol=TOL)
    exp = nx.DiGraph([(i, j) for i in range(8) for j in (i, (i + 1) % 8, (i + 2) % 8,
                                                           (i + 4) % 8)])
    assert from_networkx(exp).out_neighbors(0) == Exponential(8).out_neighbors(0)


def test_parse_accepts_the_documented_forms() -> None:
    assert parse("  TORUS : 4 x 4 ") == Torus(4, 4)
    assert parse("torus", 12) == Torus(3, 4) and parse("torus", 7) == Torus(1, 7)
    assert parse("torus:2x8", 16) == Torus(2, 8)
    assert parse("random: p=0.3, seed=1", 16) == RandomGraph(16, p=0.3, seed=1)
    assert parse("random:degree=3,seed=2", 16) == RandomGraph(16, degree=3, seed=2)
    assert parse("ring,weights=uniform", 5) == Ring(5, weights="uniform")
    assert parse("ring:weights=MH", 5) == Ring(5)
    assert parse("One_Peer_Exponential", 8) == OnePeerExponential(8)
    assert parse("exponential", 8) == Exponential(8) and parse("complete", 3) == Complete(3)
    assert parse(Ring(4), 4) == Ring(4)
    assert Ring(5, weights="uniform").spec == "ring,weights=uniform"


def test_default_weights_follow_the_graph() -> None:
    assert Ring(4).weight_scheme == "metropolis" and Torus(2, 3).weight_scheme == "metropolis"
    assert Exponential(4).weight_scheme == "push"
    assert OnePeerExponential(4).weight_scheme == "push"
    assert from_edges(2, [(0, 1), (1, 0)], directed=True).weight_scheme == "push"
    assert Ring(4, weights="metropolis") == Ring(4) and Ring(4, weights="push") != Ring(4)
