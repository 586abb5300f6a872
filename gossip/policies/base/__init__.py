"""What every policy shares: Policy (the step, its failure rule, stats, checkpoints and the
membership hooks), BackgroundPolicy (threads beside the training loop), the PolicyHost
contract (what a policy may ask of its peer), ParameterSource (what attach takes besides a
list of arrays: a torch module), and the small mechanisms a step uses: buckets
(parameter packing), compression (a codec and its residuals), the nan guard, the failure rule
(failures.py), the clock of stats() and the argument checks."""
from gossip.policies.base.arguments import check_int, check_number
from gossip.policies.base.background import BackgroundPolicy
from gossip.policies.base.buckets import (DEFAULT_BUCKET_BYTES, Bucket, BucketSet, Placement,
                                          is_torch_tensor)
from gossip.policies.base.clock import PolicyClock
from gossip.policies.base.compression import Compression
from gossip.policies.base.policy_host import PolicyHost
from gossip.policies.base.failures import PEER_FAILURES, Attempt, tolerate
from gossip.policies.base.nan_guard import NanGuard
from gossip.policies.base.policy import ParameterSource, Policy

__all__ = ["Policy", "ParameterSource", "BackgroundPolicy", "PolicyHost", "Bucket", "BucketSet",
           "Placement", "DEFAULT_BUCKET_BYTES", "is_torch_tensor", "Compression", "NanGuard",
           "PolicyClock", "PEER_FAILURES", "Attempt", "tolerate", "check_int", "check_number"]
