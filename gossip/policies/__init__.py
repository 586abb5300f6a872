"""Averaging policies: how peers combine their models during training.

    import gossip
    policy = gossip.policies.Gossip().attach(peer, list(model.parameters()))
    # or by name, e.g. in gossip.DistributedOptimizer(opt, peer=peer, policy="push-sum")
    policy = gossip.policies.make("local-sgd", period=8)

| name         | class                  | communication per step                         |
|--------------|------------------------|------------------------------------------------|
| synchronous  | Synchronous            | allreduce of the gradients, during backward    |
| local-sgd    | LocalSGD(period)       | allreduce of the parameters every period steps |
| gossip       | Gossip                 | parameters mixed with the neighbours' (D-PSGD) |
| asynchronous | Asynchronous           | push-sum in a background thread, never waits   |
| push-sum     | PushSum                | push-sum (SGP), directed / time-varying graphs |
| elastic      | ElasticAveraging       | elastic pull to a centre every period steps    |

No module here imports torch at import time; torch is imported where torch tensors are
handled.
"""
from gossip.policies.asynchronous import Asynchronous
from gossip.policies.base import Policy
from gossip.policies.buckets import DEFAULT_BUCKET_BYTES, Bucket, BucketSet
from gossip.policies.decentralized import Gossip
from gossip.policies.elastic import ElasticAveraging
from gossip.policies.local_sgd import LocalSGD
from gossip.policies.push_sum import PushSum
from gossip.policies.registry import POLICIES, make, names, resolve
from gossip.policies.synchronous import Synchronous

__all__ = [
    "Policy", "Synchronous", "LocalSGD", "Gossip", "Asynchronous", "PushSum",
    "ElasticAveraging", "make", "names", "resolve", "POLICIES", "Bucket", "BucketSet",
    "DEFAULT_BUCKET_BYTES",
]
