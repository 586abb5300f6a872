"""Push-sum: PushSum (Stochastic Gradient Push on directed and time-varying graphs, its mass
kept exact across deaths and view changes) and the check of the push-sum weights a state dict
carries (weights_from_state, Asynchronous's too)."""
from gossip.policies.push_sum.push_sum import PushSum, weights_from_state

__all__ = ["PushSum", "weights_from_state"]
