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

("easgd" names ElasticAveraging too.)

The rooms, each a package: ``base`` (Policy whole: the step, nan guard, failure rule, stats,
checkpoints and membership hooks; BackgroundPolicy, the threads and error hand-off of
Asynchronous and ElasticAveraging; the PolicyHost contract, what a policy may ask of its peer;
buckets, compression), ``neighborhood`` (the graph a policy runs on and the round plan over
live and healed neighbours: Gossip, Choco, PushSum, Peer.neighbor_average), then one per
family, its membership behaviour in its class: ``synchronous`` (Synchronous, LocalSGD,
DiLoCo's outer step), ``dpsgd`` (Gossip, Choco), ``push_sum`` (PushSum), ``asynchronous``
(Asynchronous), ``easgd`` (ElasticAveraging); ``registry`` finds them by name. Arrays are
touched only through collectives.arrays' adapters.

No module here imports torch at import time; torch is imported where torch tensors are
handled.
"""
from gossip.policies.asynchronous import Asynchronous
from gossip.policies.base import (DEFAULT_BUCKET_BYTES, BackgroundPolicy, Bucket, BucketSet,
                                  Compression, Policy, PolicyHost)
from gossip.policies.dpsgd import Choco, Gossip
from gossip.policies.easgd import ElasticAveraging
from gossip.policies.push_sum import PushSum
from gossip.policies.registry import ALIASES, POLICIES, make, names, policy_class, resolve
from gossip.policies.synchronous import DILOCO, SGD, LocalSGD, Synchronous

__all__ = [
    "Policy", "Synchronous", "LocalSGD", "Gossip", "Asynchronous", "PushSum", "Choco",
    "ElasticAveraging", "make", "names", "policy_class", "resolve", "POLICIES", "ALIASES",
    "Bucket", "BucketSet", "DEFAULT_BUCKET_BYTES", "SGD", "DILOCO", "Compression",
    "BackgroundPolicy", "PolicyHost",
]
