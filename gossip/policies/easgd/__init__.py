"""Elastic averaging SGD (EASGD, Zhang, Choromanska, LeCun 2015): ElasticAveraging, its centre
replicated or sharded over the workers, and the re-shard plan that carries a sharded centre
across a membership view change (reshard.py). Registry name "easgd" ("elastic", its older name, too)."""
from gossip.policies.easgd.easgd import (BACKUP_CHANNEL_OFFSET, CENTERS, DEFAULT_BETA,
                                         ElasticAveraging)
from gossip.policies.easgd.reshard import check_plan, reshard_plan

__all__ = ["ElasticAveraging", "CENTERS", "DEFAULT_BETA", "BACKUP_CHANNEL_OFFSET",
           "reshard_plan", "check_plan"]
