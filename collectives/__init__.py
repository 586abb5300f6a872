"""Transport and collective algorithms: ZeroMQ channels, wire format, security, rendezvous,
ring allreduce, neighbour exchange, array adapters. Never imports gossip or topologies.

The rooms, from the face down:

- here: the ``Communicator`` (communicator.py: one class, every call of one stream of
  operations, blocking and non-blocking twins) and the ``Engine`` it owns (engine.py: sequence
  numbers, an operation's life and aborts, the worker thread); ``NeighborPlan``
  (neighbor_plan.py: one round of the neighbour exchange as one value); ``Staging`` (flat
  views and contiguous stand-ins), ``Work`` (the handles), settings (config.py), the derived
  defaults (defaults.py), the errors, the rendezvous and the CURVE keys (security.py);
- operations/: the calls with a module of their own (the neighbour exchange and allgather,
  reduce/gather/scatter/all-to-all, coalesced and compressed allreduce, send/recv, the links'
  measurement), each run through the Engine;
- algorithms/: how the data moves for one call (ring, recursive doubling, on-host shared
  memory, two levels across hosts, broadcast, barrier, the neighbour exchanges, NCCL; and
  the ring's order from measured rates, ring_order.py),
  written with the point-to-point primitives of algorithms/p2p.py;
- transport/: messages between two peers (sockets, the I/O loop, the wire's ``Header``, the
  inbox, shared memory, liveness, flow control);
- codecs/: compression of what travels; arrays/: one vocabulary over numpy, torch and cupy;
- membership/: the versioned view of the group and its changes.
"""
from collectives.communicator import COLLECTIVE_CHANNEL, P2P_CHANNEL, Communicator
from collectives.config import TransportConfig
from collectives.errors import (AuthenticationError, ExchangeIncomplete, GossipError,
                                OperationTimeout, PeerLost, ProtocolError, RendezvousError,
                                UnsupportedDtype)
from collectives.neighbor_plan import NeighborPlan
from collectives.operations.link_rates import LinkRates
from collectives.operations.send_recv import Status
from collectives.rendezvous import rendezvous
from collectives.security import ClusterKey, load_cluster_key, write_cluster_key
from collectives.transport.transport import Transport
from collectives.work import Work

__all__ = [
    "Communicator", "COLLECTIVE_CHANNEL", "P2P_CHANNEL", "NeighborPlan", "TransportConfig",
    "Transport", "Work", "LinkRates", "Status",
    "rendezvous", "ClusterKey", "load_cluster_key", "write_cluster_key",
    "GossipError", "PeerLost", "OperationTimeout", "RendezvousError", "ProtocolError",
    "AuthenticationError", "ExchangeIncomplete", "UnsupportedDtype",
]
