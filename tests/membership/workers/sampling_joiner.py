"""usage: sampling_joiner.py LENGTH  (GOSSIP_RENDEZVOUS, GOSSIP_MEMBER_NAME set)

A process joining mid-epoch with an ElasticSampler over LENGTH samples
(tests/membership/test_membership.py): it takes the sampler's cursor with the state and
prints SEEN with the batches it drew in the rest of that epoch (JSON)."""
import json, sys, numpy as np, gossip
from gossip.policies import Synchronous
peer = gossip.init(join=True, timeout=30)
sampler = gossip.ElasticSampler(int(sys.argv[1]), batch_size=4, peer=peer, seed=7)
policy = Synchronous().attach(peer, [np.zeros(10)])   # takes the cursor too
seen, epoch = [], sampler.epoch
sampler.set_epoch(epoch)                                # the epoch in progress
for batch in sampler:
    seen.append([epoch, batch])
    policy.after_step()
print("SEEN", json.dumps(seen), flush=True)
peer.close()
