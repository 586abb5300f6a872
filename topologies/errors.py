"""The one error type of the topologies layer."""
__all__ = ["TopologyError"]


class TopologyError(ValueError):
    """A graph, a weight matrix or a topology spec is invalid; the message says how to fix it.

    The topologies layer imports numpy only, so this class cannot derive from
    gossip.GossipError; gossip.TopologyError derives from both and is what the runtime raises.
    """
