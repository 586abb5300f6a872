"""usage: gossip_joiner.py SIZE  (GOSSIP_RENDEZVOUS, GOSSIP_MEMBER_NAME set)

A process joining a running Gossip ring (tests/membership/test_membership.py): it takes a
member's model, averages until the view has SIZE members and 40 rounds more, and prints
JOINED with the view's size, the topology and the mean of its x."""
import sys, time, numpy as np, gossip
from gossip.policies import Gossip
size = int(sys.argv[1])
peer = gossip.init(join=True, timeout=30)
x = np.zeros(100)
policy = Gossip().attach(peer, [x])          # takes one member's model
while (policy.step < 60 or peer.world_size != size) and policy.step < 100_000:
    policy.after_step()
    np.ones((96, 96)) @ np.ones((96, 96))   # a step's compute
for _ in range(40):
    policy.after_step()
print("JOINED", peer.world_size, repr(policy.topology), float(x.mean()), flush=True)
peer.close()
