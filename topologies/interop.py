"""Conversion to and from networkx graphs; networkx is imported only when these are called."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from topologies.custom import CustomTopology, from_edges
from topologies.errors import TopologyError

if TYPE_CHECKING:  # pragma: no cover - for annotations only
    from topologies.base import Topology

__all__ = ["to_networkx", "from_networkx"]


def _networkx() -> Any:
    try:
        import networkx
    except ImportError:
        raise TopologyError(
            "this needs networkx, which is not installed; pip install networkx"
        ) from None
    return networkx


def to_networkx(topology: Topology, step: int = 0) -> Any:
    """The graph of `topology` at `step` as a networkx Graph, or DiGraph if directed.

    Nodes are ranks 0..n-1 with attribute 'self_weight' = W[i, i]. A directed edge j -> i
    carries 'weight' = W[i, j] (the share j sends to i). An undirected edge carries the
    weight only when W is symmetric, since one number cannot hold two different weights.
    """
    nx = _networkx()
    w = topology.mixing_matrix(step)
    graph = nx.DiGraph() if topology.is_directed else nx.Graph()
    graph.graph["name"] = repr(topology)
    graph.graph["step"] = step
    for i in range(topology.size):
        graph.add_node(i, self_weight=float(w[i, i]))
    symmetric = (w == w.T).all()
    for sender, receiver in topology.edges(step):
        if topology.is_directed or symmetric:
            graph.add_edge(sender, receiver, weight=float(w[receiver, sender]))
        else:
            graph.add_edge(sender, receiver)
    return graph


def from_networkx(graph: Any, *, weights: str | None = None) -> CustomTopology:
    """A static topology from a networkx graph (DiGraph -> directed).

    Nodes 0..n-1 keep their numbers; any other node labels are relabelled 0..n-1 in sorted
    order. Edge attributes are ignored: to supply your own weights, build the matrix with
    networkx.to_numpy_array and use from_matrix.
    """
    nx = _networkx()
    if not isinstance(graph, (nx.Graph, nx.DiGraph)):
        raise TopologyError(
            f"from_networkx needs a networkx Graph or DiGraph, got {type(graph).__name__}"
        )
    if graph.is_multigraph():
        raise TopologyError(
            "from_networkx does not take multigraphs (parallel edges); convert with "
            "networkx.Graph(g) or networkx.DiGraph(g) first"
        )
    nodes = list(graph.nodes)
    n = len(nodes)
    if n == 0:
        raise TopologyError("the networkx graph has no nodes; a topology needs at least one peer")
    if set(nodes) == set(range(n)) and all(type(v) is int for v in nodes):
        index = {v: v for v in nodes}
    else:
        try:
            ordered = sorted(nodes)
        except TypeError:
            raise TopologyError(
                "the networkx node labels are not 0..n-1 and cannot be sorted to relabel "
                "them; relabel with networkx.convert_node_labels_to_integers(g) first"
            ) from None
        index = {v: i for i, v in enumerate(ordered)}
    edges = [(index[a], index[b]) for a, b in graph.edges()]
    return from_edges(n, edges, directed=graph.is_directed(), weights=weights)
