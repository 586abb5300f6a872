"""The runtime's error tree, re-exported from the layers that raise them.

GossipError is the one base. TopologyError is also a ValueError; the topologies layer (pure
math, numpy only) raises topologies.TopologyError, and gossip re-raises it as this subclass,
which is both, wherever a topology enters the runtime.
"""
from collectives.errors import (AuthenticationError, ExchangeIncomplete, GossipError,
                                OperationTimeout, PeerLost, ProtocolError, RendezvousError)
from topologies.errors import TopologyError as _PureTopologyError

__all__ = ["GossipError", "PeerLost", "ExchangeIncomplete", "OperationTimeout",
           "RendezvousError", "ProtocolError", "AuthenticationError", "TopologyError"]


class TopologyError(_PureTopologyError, GossipError):
    """A topology, its weights or its spec string is invalid (also a ValueError)."""
