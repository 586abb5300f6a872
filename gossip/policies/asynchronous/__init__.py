"""Asynchronous gossip (in the spirit of AD-PSGD and asynchronous SGP): push-sum in background
threads, the training loop never waiting on a peer. Asynchronous (asynchronous.py, its
membership view changes with it) posts one Push at a time (push.py) to the next peer of its
Rotation (rotation.py), and folds in what its receiving thread averaged (inbound.py)."""
from gossip.policies.asynchronous.asynchronous import Asynchronous
from gossip.policies.asynchronous.inbound import Arrivals
from gossip.policies.asynchronous.push import Push
from gossip.policies.asynchronous.rotation import Rotation

__all__ = ["Asynchronous", "Arrivals", "Push", "Rotation"]
