"""Decentralized parallel SGD over a graph: Gossip (D-PSGD: the parameters mixed with the
neighbours' after every step) and Choco (CHOCO-SGD: compressed differences to public
copies)."""
from gossip.policies.dpsgd.choco import Choco
from gossip.policies.dpsgd.dpsgd import Gossip

__all__ = ["Gossip", "Choco"]
