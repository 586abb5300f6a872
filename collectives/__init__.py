"""Transport and collective algorithms: ZeroMQ channels, wire format, security, rendezvous,
ring allreduce, neighbour exchange, array adapters. Never imports gossip or topologies."""
from collectives.communicator import COLLECTIVE_CHANNEL, P2P_CHANNEL, Communicator
from collectives.config import TransportConfig
from collectives.errors import (AuthenticationError, ExchangeIncomplete, GossipError,
                                OperationTimeout, PeerLost, ProtocolError, RendezvousError)
from collectives.neighbor_plan import NeighborPlan
from collectives.rendezvous import rendezvous
from collectives.security import ClusterKey, load_cluster_key, write_cluster_key
from collectives.transport.transport import Transport
from collectives.work import Work

__all__ = [
    "Communicator", "COLLECTIVE_CHANNEL", "P2P_CHANNEL", "NeighborPlan", "TransportConfig",
    "Transport", "Work",
    "rendezvous", "ClusterKey", "load_cluster_key", "write_cluster_key",
    "GossipError", "PeerLost", "OperationTimeout", "RendezvousError", "ProtocolError",
    "AuthenticationError", "ExchangeIncomplete",
]
