"""Conversion to and from networkx graphs; networkx is imported only when these are called."""

from __future__ import annotations

from typing import Any

from topologies.base import Topology, require_networkx
from topologies.custom import CustomTopology, from_edges
from topologies.errors import TopologyError

__all__ = ["to_networkx", "from_networkx"]


def to_networkx(topology: Topology, step: int = 0) -> Any:
    """The graph of `topology` at `step` as a networkx Graph, or DiGraph if directed (see
    Topology.to_networkx)."""
    return topology.to_networkx(step)


def from_networkx(graph: Any, *, weights: str | None = None) -> CustomTopology:
    """A static topology from a networkx graph (DiGraph -> directed).

    Nodes 0..n-1 keep their numbers; any other node labels are relabelled 0..n-1 in sorted
    order. Self-loops are taken as what every peer does anyway, keep a share of its own
    value (BlueFog's graphs have one on every node, for its self weight), and add no edge.
    Edge attributes are ignored: to supply your own weights, build the matrix with
    networkx.to_numpy_array and use from_matrix.
    """
    nx = require_networkx()
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
    edges = [(index[a], index[b]) for a, b in graph.edges() if a != b]
    return from_edges(n, edges, directed=graph.is_directed(), weights=weights)
