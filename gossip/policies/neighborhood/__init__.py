"""The neighbourhood machinery of the graph policies (Gossip, Choco, PushSum, Asynchronous)
and of Peer.neighbor_average: the graph a policy runs on and its size after a view change
(policy_graph.py), the round plan of one neighbour exchange with the lost peers folded out
(rounds.py), and the edges healed around a lost neighbour (healing.py)."""
from gossip.policies.neighborhood.policy_graph import (ONE_PEER_EXPONENTIAL, PEER_TOPOLOGY,
                                                check_topology, resize_topology,
                                                resolve_topology)
from gossip.policies.neighborhood.healing import HEAL_CHANNEL, Healer
from gossip.policies.neighborhood.rounds import (Neighborhood, Round, live_mixing_round,
                                                 mixing_round, push_round)

__all__ = ["Round", "Neighborhood", "mixing_round", "live_mixing_round", "push_round",
           "check_topology", "resolve_topology", "resize_topology", "PEER_TOPOLOGY",
           "ONE_PEER_EXPONENTIAL", "Healer", "HEAL_CHANNEL"]
