"""The graph a policy runs on: which one ``topology=None`` stands for (``resolve_topology``,
checked against the world size), and the same kind of graph over a new view's size
(``resize_topology``: a ring stays a ring)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from gossip.errors import TopologyError

if TYPE_CHECKING:
    from gossip.policies.base.policy_host import PolicyHost
    from topologies import Topology

__all__ = ["check_topology", "resolve_topology", "resize_topology", "PEER_TOPOLOGY",
           "ONE_PEER_EXPONENTIAL"]

#: Values of a policy's ``default_topology``: what ``topology=None`` stands for.
PEER_TOPOLOGY = "peer"                          # the peer's own graph (peer.topology)
ONE_PEER_EXPONENTIAL = "one-peer-exponential"   # topologies.OnePeerExponential(world size)


def check_topology(topology: Topology, world_size: int) -> Topology:
    """The topology, if it is one for ``world_size`` peers; TopologyError (a ValueError)
    otherwise."""
    for attr in ("weights", "push_weights", "in_neighbors", "out_neighbors", "size"):
        if not hasattr(topology, attr):
            raise TopologyError(f"{topology!r} is not a topology (see the topologies package)")
    if topology.size != world_size:
        raise TopologyError(f"topology {topology!r} has {topology.size} peers but the world "
                            f"size is {world_size}")
    return topology


def resolve_topology(topology: Topology | None, peer: PolicyHost, default: str) -> Topology:
    """The graph a policy runs on: ``topology`` if given (checked against the world size),
    else its class's ``default`` (PEER_TOPOLOGY or ONE_PEER_EXPONENTIAL). The one rule for
    every policy's ``topology=None``."""
    if topology is None:
        if default == PEER_TOPOLOGY:
            topology = peer.topology
        elif default == ONE_PEER_EXPONENTIAL:
            import topologies
            return topologies.OnePeerExponential(peer.world_size)
        else:
            raise ValueError(f"unknown default topology {default!r}")
    return check_topology(topology, peer.world_size)


def resize_topology(topology: Topology, size: int) -> Topology:
    """The same kind of graph over ``size`` peers: its spec again, or, for a spec tied to a
    size (``torus:2x2``), its name alone (torus then picks the most square grid)."""
    import topologies
    from topologies.errors import TopologyError as PureTopologyError

    if topology.size == size:
        return topology
    spec = getattr(topology, "spec", None)
    if not isinstance(spec, str):
        raise PureTopologyError(f"{topology!r} cannot be recomputed for {size} peers: pass a "
                                "topology spec such as 'ring' to a group whose size may change")
    try:
        return topologies.parse(spec, size)
    except PureTopologyError:
        return topologies.parse(spec.split(":")[0].split(",")[0], size)
