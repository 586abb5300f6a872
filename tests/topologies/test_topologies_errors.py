"""Every way to build a bad topology fails with a TopologyError saying what and how to fix."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from topologies import (
    Exponential,
    RandomGraph,
    Ring,
    TopologyError,
    Torus,
    from_edges,
    from_matrix,
    from_networkx,
    parse,
)

ERRORS = [
    (lambda: Ring(0), "at least 1"),
    (lambda: Ring(True), "must be an integer.*bool"),
    (lambda: Ring(2.0), "must be an integer.*float"),
    (lambda: Torus(0, 3), "torus rows must be at least 1"),
    (lambda: Ring(8).in_neighbors(8), r"rank 8 is out of range for a topology of size 8.*0\.\.7"),
    (lambda: Ring(8).weights(-1), "rank -1 is out of range"),
    (lambda: Ring(8).out_neighbors("0"), "rank must be an integer"),
    (lambda: Ring(8).mixing_matrix(step=-1), "step must be at least 0"),
    (lambda: Ring(8, weights="bogus"), "unknown weight scheme.*use one of"),
    (lambda: Exponential(4, weights="metropolis"), "need an undirected graph.*weights='push'"),
    (lambda: Ring(4).rounds_to_reduce(0.5), "factor must be >= 1"),
    (lambda: RandomGraph(10, p=0.3, degree=3), "exactly one of p= .* and degree="),
    (lambda: RandomGraph(10), "exactly one of p="),
    (lambda: RandomGraph(9, degree=3), "n\\*degree = 27 is odd"),
    (lambda: RandomGraph(5, degree=5), "degree 5 is too large.*at most degree n-1 = 4"),
    (lambda: RandomGraph(6, degree=1), "never connected; use degree >= 2"),
    (lambda: RandomGraph(10, p=0.0), r"p must be an edge probability in \(0, 1\]"),
    (lambda: RandomGraph(10, p=1.5), "edge probability"),
    (
        lambda: RandomGraph(30, p=0.01, seed=1),
        r"could not draw a connected G.*ln\(n\)/n = 0\.113",
    ),
    (lambda: RandomGraph(10, p=0.5, seed=-1), "seed must be at least 0"),
    (lambda: from_edges(0, []), "size n must be at least 1"),
    (
        lambda: from_edges(4, [(0, 1), (2, 3)]),
        r"disconnected.*2 components \{0, 1\}, \{2, 3\}.*add edges",
    ),
    (
        lambda: from_edges(3, [(0, 1), (1, 2)], directed=True),
        "not strongly connected: node 0 cannot be reached from node 1",
    ),
    (lambda: from_edges(2, [(0, 1), (1, 1)]), r"edge #1 \(1, 1\) is a self-loop; remove it"),
    (
        lambda: from_edges(2, [(0, 1), (0, 1)]),
        r"edge #1 \(0, 1\) repeats edge #0.*list each edge once",
    ),
    (lambda: from_edges(2, [(0, 1), (1, 0)]), r"repeats edge #0.*same.*directed=True"),
    (lambda: from_edges(2, [(0, 2)]), r"rank 2 is out of range for size 2.*0\.\.1"),
    (lambda: from_edges(2, [(0, 1.0)]), "ranks must be integers.*float.*relabel"),
    (lambda: from_edges(2, [(0, True)]), "ranks must be integers.*bool"),
    (lambda: from_edges(3, [(0, 1, 2)]), "is not a pair"),
    (lambda: from_edges(3, 5), "iterable of"),
    (lambda: from_matrix(np.ones((2, 3)) / 2), r"square n x n.*shape \(2, 3\)"),
    (lambda: from_matrix([[1.5, -0.5], [-0.5, 1.5]]), r"W\[0, 1\] = -0.5 is negative"),
    (
        lambda: from_matrix([[0.5, 0.5], [0.5, 0.4]]),
        r"row 1 of the mixing matrix sums to 0.9, not 1.*doubly stochastic",
    ),
    (
        lambda: from_matrix([[0.5, 0.5], [0.6, 0.5]]),
        r"column 0 .* sums to 1.1, not 1.*column-stochastic.*W\.T",
    ),
    (lambda: from_matrix(np.eye(2)), "disconnected.*W\\[i, j\\] > 0"),
    (lambda: from_matrix([["a", "b"], ["c", "d"]]), "square array of numbers"),
    (lambda: from_matrix([[np.nan]]), "not finite"),
    (lambda: from_networkx(nx.MultiGraph([(0, 1), (0, 1)])), "multigraphs.*networkx.Graph"),
    (
        lambda: from_networkx(nx.Graph([("a", 1)])),
        "cannot be sorted.*convert_node_labels_to_integers",
    ),
    (lambda: from_networkx(nx.Graph()), "no nodes"),
    (
        lambda: parse("hypercube", 8),
        "unknown topology 'hypercube'.*known topologies: ring, torus, random, exponential, "
        "one-peer-exponential, complete",
    ),
    (lambda: parse("torus:4by4"), "bad torus size '4by4'.*ROWSxCOLS"),
    (lambda: parse("torus:0x4"), "empty side"),
    (lambda: parse("torus:4x4,2x8"), "size twice"),
    (lambda: parse("torus"), "no torus size.*pass n"),
    (lambda: parse("ring"), "needs a number of peers: pass n"),
    (lambda: parse("random:p=0.3"), "pass n"),
    (lambda: parse("random:p=,seed=1", 8), "malformed option 'p='.*KEY=VALUE"),
    (lambda: parse("random:p=0.3,,seed=1", 8), "empty option"),
    (lambda: parse("random:p=abc", 8), "p='abc'.* is not a number"),
    (lambda: parse("random:degree=2.5", 8), "is not an integer"),
    (lambda: parse("random:p=0.3,p=0.4", 8), "appears twice"),
    (lambda: parse("ring:p=0.3", 8), "ring does not take option 'p'.*weights="),
    (lambda: parse("ring:8", 8), "unexpected '8'.*KEY=VALUE"),
    (lambda: parse("torus:4x4", 15), r"describes 16 peers \(4x4\) but n=15; make them agree"),
    (lambda: parse("ring", 0), "n must be at least 1"),
    (lambda: parse(8), "must be a string"),
    (lambda: parse(Ring(4), 5), "has 4 peers but n=5"),
]


@pytest.mark.parametrize("make,message", ERRORS, ids=[m for _, m in ERRORS])
def test_error_messages_say_what_is_wrong(make, message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        make()


def test_topology_error_is_a_value_error() -> None:
    # gossip's CLI turns ValueError into a one-line message and exit code 2.
    assert issubclass(TopologyError, ValueError)
