"""The allreduce family: Synchronous (gradients averaged every step, as DDP), LocalSGD
(parameters averaged every ``period`` steps) and its DiLoCo form (an outer optimizer over the
averaged pseudo-gradient: outer_step.py, outer_optimizer.py), on their common base
(allreduce_policy.py: the average, and the group re-formed after a death)."""
from gossip.policies.synchronous.allreduce_policy import AllreducePolicy
from gossip.policies.synchronous.local_sgd import LocalSGD
from gossip.policies.synchronous.outer_optimizer import DILOCO, SGD, resolve_outer_optimizer
from gossip.policies.synchronous.outer_step import OuterStep
from gossip.policies.synchronous.synchronous import FIRST_BUCKET_BYTES, Synchronous

__all__ = ["Synchronous", "LocalSGD", "AllreducePolicy", "OuterStep", "SGD", "DILOCO",
           "resolve_outer_optimizer", "FIRST_BUCKET_BYTES"]
