"""Peer graphs for gossip: pure, immutable, comparable values with mixing weights.

    import topologies
    t = topologies.Torus(4, 4)            # or topologies.parse("torus:4x4")
    t.in_neighbors(0), t.weights(0)       # who rank 0 hears from, and with what weights
    t.mixing_matrix()                     # W[i, j]: weight receiver i gives sender j
    t.spectral_gap(), t.rounds_to_reduce(1000)

This package imports numpy only (networkx lazily, for to_networkx/from_networkx).
"""

from topologies.base import Topology
from topologies.custom import CustomTopology, from_edges, from_matrix
from topologies.errors import TopologyError
from topologies.interop import from_networkx, to_networkx
from topologies.parse import KNOWN_TOPOLOGIES, parse, square_factors
from topologies.random_graph import RandomGraph
from topologies.sparse import SparseMatrix
from topologies.spectral import cayley_spectrum, consensus_rounds, period_product, slem, sparse_slem
from topologies.static import Complete, Exponential, Ring, Torus
from topologies.timevarying import OnePeerExponential
from topologies.weights import WEIGHT_SCHEMES

__all__ = [
    "Topology",
    "Ring",
    "Torus",
    "RandomGraph",
    "Exponential",
    "OnePeerExponential",
    "Complete",
    "CustomTopology",
    "from_edges",
    "from_matrix",
    "from_networkx",
    "to_networkx",
    "parse",
    "KNOWN_TOPOLOGIES",
    "WEIGHT_SCHEMES",
    "square_factors",
    "SparseMatrix",
    "slem",
    "sparse_slem",
    "cayley_spectrum",
    "period_product",
    "consensus_rounds",
    "TopologyError",
]
