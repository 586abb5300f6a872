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
| choco        | Choco                  | compressed differences to public copies        |

Shared mechanisms, each in one module: ``policy`` (the step, nan guard and failure rule of
every policy), ``neighborhood`` (the default topology and the round plan over live and healed
neighbours: Gossip, PushSum, Peer.neighbor_average), ``worker`` (background threads, error
hand-off and dropped peers: Asynchronous, ElasticAveraging), ``buckets`` (parameter packing);
arrays are touched only through collectives.arrays' adapters.

No module here imports torch at import time; torch is imported where torch tensors are
handled.
"""
from gossip.policies.asynchronous import Asynchronous
from gossip.policies.choco import Choco
from gossip.policies.buckets import DEFAULT_BUCKET_BYTES, Bucket, BucketSet
from gossip.policies.elastic_averaging import ElasticAveraging
from gossip.policies.gossip_policy import Gossip
from gossip.policies.compression import Compression
from gossip.policies.local_sgd import LocalSGD
from gossip.policies.outer_optimizer import DILOCO, SGD
from gossip.policies.policy import Policy
from gossip.policies.push_sum import PushSum
from gossip.policies.registry import POLICIES, make, names, policy_class, resolve
from gossip.policies.synchronous import Synchronous

__all__ = [
    "Policy", "Synchronous", "LocalSGD", "Gossip", "Asynchronous", "PushSum", "Choco",
    "ElasticAveraging", "make", "names", "policy_class", "resolve", "POLICIES", "Bucket",
    "BucketSet", "DEFAULT_BUCKET_BYTES", "SGD", "DILOCO", "Compression",
]
